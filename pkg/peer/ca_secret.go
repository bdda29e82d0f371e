package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

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
func EnsureCA(ctx context.Context, api dynamic.Interface, namespace, name string, labels map[string]string) (*CA, error) {
	ca, err := ReadCA(ctx, api, namespace, name)
	if errors.Is(err, ErrSecretType) {
		if err := api.Resource(kubeapi.Secrets).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("replace peer CA secret %s/%s: %w", namespace, name, err)
		}
	} else if !apierrors.IsNotFound(err) {
		return ca, err
	}
	made, err := NewCA(namespace+"/"+name, time.Now())
	if err != nil {
		return nil, err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Type:       SecretType,
		Data:       map[string][]byte{secretCert: made.CertPEM, secretKey: made.KeyPEM},
	}
	_, err = kubeapi.Create(ctx, api, kubeapi.Secrets, namespace, secret)
	if apierrors.IsAlreadyExists(err) {
		return ReadCA(ctx, api, namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("create peer CA secret %s/%s: %w", namespace, name, err)
	}
	return made, nil
}

// ReadCA reads the installation's CA from the Secret name in namespace,
// which must be of SecretType (else the error wraps ErrSecretType; for a
// missing Secret apierrors.IsNotFound holds).
func ReadCA(ctx context.Context, api dynamic.Interface, namespace, name string) (*CA, error) {
	s, err := kubeapi.Get[corev1.Secret](ctx, api, kubeapi.Secrets, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("get peer CA secret %s/%s: %w", namespace, name, err)
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
