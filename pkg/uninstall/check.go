package uninstall

import (
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

// serviceAccountDir is where the kubelet mounts a pod's service account
// token and the cluster's CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// topologyKey is the node label of the driver's volumes' node affinity.
const topologyKey = "topology.fastblk.csi.io/node"

// Client lists objects from the Kubernetes API server.
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
	token, err := os.ReadFile(filepath.Join(serviceAccountDir, "token"))
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(serviceAccountDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("service account CA: %w", err)
	}
	return NewClient("https://"+net.JoinHostPort(host, port), strings.TrimSpace(string(token)), ca)
}

// errNotFound is what get returns for an object that does not exist.
var errNotFound = errors.New("not found")

// get GETs path (with query q) and returns the body of a 200 answer.
func (c *Client) get(ctx context.Context, path string, q url.Values) ([]byte, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return body, nil
	case http.StatusNotFound:
		return nil, errNotFound
	}
	return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
}

// list GETs every page of the collection at path and calls add with the
// raw items of each.
func (c *Client) list(ctx context.Context, path string, add func(items json.RawMessage) error) error {
	cont := ""
	for {
		q := url.Values{"limit": {"500"}}
		if cont != "" {
			q.Set("continue", cont)
		}
		body, err := c.get(ctx, path, q)
		if err != nil {
			return fmt.Errorf("list %s: %w", path, err)
		}
		var page struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
			Items json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return fmt.Errorf("list %s: decode: %w", path, err)
		}
		if err := add(page.Items); err != nil {
			return fmt.Errorf("list %s: decode items: %w", path, err)
		}
		if cont = page.Metadata.Continue; cont == "" {
			return nil
		}
	}
}
