package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ServiceAccountDir is where the kubelet mounts a pod's service account
// token, namespace and the cluster's CA.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// ErrNotFound is what Get returns for an object that does not exist.
var ErrNotFound = errors.New("not found")

// ErrAlreadyExists is what Create returns for an object that exists.
var ErrAlreadyExists = errors.New("already exists")

// maxBody bounds what the client reads of an answer.
const maxBody = 64 << 20

// Client talks to the Kubernetes API server.
type Client struct {
	base  string // https://host:port
	token string
	hc    *http.Client
}

// NewClient returns a client of the API server at base (https://host:port)
// with a bearer token, trusting the PEM CA certificates in caPEM.
func NewClient(base, token string, caPEM []byte) (*Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("api server CA: no certificate in PEM data")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &Client{base: strings.TrimSuffix(base, "/"), token: token,
		hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}, nil
}

// InCluster returns a client of the cluster the pod runs in, from the
// environment the kubelet sets and the service account files it mounts.
func InCluster() (*Client, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset")
	}
	token, err := os.ReadFile(filepath.Join(ServiceAccountDir, "token"))
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(ServiceAccountDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("service account CA: %w", err)
	}
	return NewClient("https://"+net.JoinHostPort(host, port), strings.TrimSpace(string(token)), ca)
}

// Get GETs path (with query q) and returns the body of a 200 answer; a
// 404 is ErrNotFound.
func (c *Client) Get(ctx context.Context, path string, q url.Values) ([]byte, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return c.do(ctx, http.MethodGet, u, nil, "")
}

// Create POSTs the object obj to the collection at path; an object of the
// same name is ErrAlreadyExists.
func (c *Client) Create(ctx context.Context, path string, obj any) error {
	body, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("create in %s: %w", path, err)
	}
	_, err = c.do(ctx, http.MethodPost, c.base+path, body, "application/json")
	return err
}

// Post POSTs obj to path and returns the body of the answer: for the
// API's reviews (TokenReview), whose answer is the object with its status.
func (c *Client) Post(ctx context.Context, path string, obj any) ([]byte, error) {
	body, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("post to %s: %w", path, err)
	}
	return c.do(ctx, http.MethodPost, c.base+path, body, "application/json")
}

// Delete deletes the object at path; one that does not exist is
// ErrNotFound.
func (c *Client) Delete(ctx context.Context, path string) error {
	_, err := c.do(ctx, http.MethodDelete, c.base+path, nil, "")
	return err
}

// MergePatch applies the JSON merge patch (RFC 7386) patch to the object
// at path; an object that does not exist is ErrNotFound.
func (c *Client) MergePatch(ctx context.Context, path string, patch any) error {
	body, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("patch %s: %w", path, err)
	}
	_, err = c.do(ctx, http.MethodPatch, c.base+path, body, "application/merge-patch+json")
	return err
}

// do sends a request with body (nil for none) of contentType.
func (c *Client) do(ctx context.Context, method, u string, body []byte, contentType string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
		return out, nil
	case http.StatusNotFound:
		return nil, ErrNotFound
	case http.StatusConflict:
		return nil, ErrAlreadyExists
	}
	return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(out)))
}

// List GETs every page of the collection at path (with query q, which may
// be nil) and calls add with the raw items of each.
func (c *Client) List(ctx context.Context, path string, q url.Values, add func(items json.RawMessage) error) error {
	cont := ""
	for {
		page := url.Values{"limit": {"500"}}
		for k, v := range q {
			page[k] = v
		}
		if cont != "" {
			page.Set("continue", cont)
		}
		body, err := c.Get(ctx, path, page)
		if err != nil {
			return fmt.Errorf("list %s: %w", path, err)
		}
		var l struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
			Items json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &l); err != nil {
			return fmt.Errorf("list %s: decode: %w", path, err)
		}
		if err := add(l.Items); err != nil {
			return fmt.Errorf("list %s: decode items: %w", path, err)
		}
		if cont = l.Metadata.Continue; cont == "" {
			return nil
		}
	}
}
