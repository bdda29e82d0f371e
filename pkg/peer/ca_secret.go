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

// SecretType is the type of the CA Secret. Only the chart's peer-ca Job
// makes it (EnsureCA); the plugins only read it (ReadCA) and take no
// Secret of another type, so a Secret that someone else made under the
// name (an Opaque one, which any account allowed to create Secrets in the
// namespace can make) is never taken for the CA.
const SecretType = "fastblk.csi.io/peer-ca"

// ErrSecretType is what ReadCA returns for a Secret of another type.
var ErrSecretType = errors.New("not a peer CA Secret")

// EnsureCA returns the installation's CA from the Secret name in
// namespace, making both when there is none. It runs apart from the
// plugins (the chart's post-install and pre-upgrade Job, `csi-fastblk
// peer-ca`), whose account alone may create Secrets. A Secret of that name
// and another type (the Opaque one plugins made before) is replaced: its
// key was on every node. Two runs that race both make one; the API server
// keeps the first, and the second reads it.
func EnsureCA(ctx context.Context, api *kubeapi.Client, namespace, name string, labels map[string]string) (*CA, error) {
	ca, err := ReadCA(ctx, api, namespace, name)
	if errors.Is(err, ErrSecretType) {
		if err := api.Delete(ctx, secretPath(namespace, name)); err != nil && !errors.Is(err, kubeapi.ErrNotFound) {
			return nil, fmt.Errorf("replace peer CA secret %s/%s: %w", namespace, name, err)
		}
	} else if !errors.Is(err, kubeapi.ErrNotFound) {
		return ca, err
	}
	made, err := NewCA(namespace+"/"+name, time.Now())
	if err != nil {
		return nil, err
	}
	secret := map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": SecretType,
		"metadata": map[string]any{"name": name, "namespace": namespace, "labels": labels},
		"data":     map[string][]byte{secretCert: made.CertPEM, secretKey: made.KeyPEM},
	}
	err = api.Create(ctx, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/secrets", secret)
	if errors.Is(err, kubeapi.ErrAlreadyExists) {
		return ReadCA(ctx, api, namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("create peer CA secret %s/%s: %w", namespace, name, err)
	}
	return made, nil
}

func secretPath(namespace, name string) string {
	return "/api/v1/namespaces/" + url.PathEscape(namespace) + "/secrets/" + url.PathEscape(name)
}

// ReadCA reads the installation's CA from the Secret name in namespace,
// which must be of SecretType (else the error wraps ErrSecretType; a
// missing Secret is kubeapi.ErrNotFound).
func ReadCA(ctx context.Context, api *kubeapi.Client, namespace, name string) (*CA, error) {
	body, err := api.Get(ctx, secretPath(namespace, name), nil)
	if err != nil {
		return nil, fmt.Errorf("get peer CA secret %s/%s: %w", namespace, name, err)
	}
	var s struct {
		Type string            `json:"type"`
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("peer CA secret %s/%s: %w", namespace, name, err)
	}
	if s.Type != SecretType {
		return nil, fmt.Errorf("peer CA secret %s/%s is of type %q, not %s: %w", namespace, name, s.Type, SecretType, ErrSecretType)
	}
	ca, err := ParseCA(s.Data[secretCert], s.Data[secretKey])
	if err != nil {
		return nil, fmt.Errorf("peer CA secret %s/%s: %w", namespace, name, err)
	}
	return ca, nil
}
