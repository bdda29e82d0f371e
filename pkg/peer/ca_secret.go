package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// Keys of the CA Secret's data.
const (
	secretCert = "ca.crt"
	secretKey  = "ca.key"
)

// EnsureCA returns the installation's CA from the Secret name in
// namespace, making both when there is none: the first plugin to start
// creates it, the others (and every later start, upgrades included) read
// it. Two plugins that start together both make one; the API server keeps
// the first, and the second reads it.
func EnsureCA(ctx context.Context, api *kubeapi.Client, namespace, name string, labels map[string]string) (*CA, error) {
	ca, err := readCA(ctx, api, namespace, name)
	if !errors.Is(err, kubeapi.ErrNotFound) {
		return ca, err
	}
	made, err := NewCA(namespace+"/"+name, time.Now())
	if err != nil {
		return nil, err
	}
	secret := map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": name, "namespace": namespace, "labels": labels},
		"data":     map[string][]byte{secretCert: made.CertPEM, secretKey: made.KeyPEM},
	}
	err = api.Create(ctx, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/secrets", secret)
	if errors.Is(err, kubeapi.ErrAlreadyExists) {
		return readCA(ctx, api, namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("create peer CA secret %s/%s: %w", namespace, name, err)
	}
	return made, nil
}

func readCA(ctx context.Context, api *kubeapi.Client, namespace, name string) (*CA, error) {
	body, err := api.Get(ctx, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/secrets/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, fmt.Errorf("get peer CA secret %s/%s: %w", namespace, name, err)
	}
	var s struct {
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("peer CA secret %s/%s: %w", namespace, name, err)
	}
	ca, err := ParseCA(s.Data[secretCert], s.Data[secretKey])
	if err != nil {
		return nil, fmt.Errorf("peer CA secret %s/%s: %w", namespace, name, err)
	}
	return ca, nil
}
