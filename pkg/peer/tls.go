package peer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"
)

// leafLifetime is how long a plugin's own certificate is valid; it issues
// itself a new one when half of it has passed, so a stolen certificate
// (not the CA key) is worth a day at most.
const leafLifetime = 24 * time.Hour

// clockSkew backdates certificates so that a peer whose clock is a little
// behind still accepts them.
const clockSkew = 5 * time.Minute

// Credentials are a plugin's TLS identity on the peer channel: its own
// certificate, issued from the CA and renewed before it expires, and the
// CA that peers' certificates must chain to.
type Credentials struct {
	self  Identity
	ca    *CA
	pool  *x509.CertPool
	now   func() time.Time
	mu    sync.Mutex
	cert  *tls.Certificate
	renew time.Time
}

// NewCredentials returns the credentials of self under ca; now is the
// clock (nil: time.Now).
func NewCredentials(ca *CA, self Identity, now func() time.Time) (*Credentials, error) {
	if err := self.Check(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	c := &Credentials{self: self, ca: ca, pool: pool, now: now}
	if _, err := c.certificate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Self is the identity these credentials speak for.
func (c *Credentials) Self() Identity { return c.self }

// certificate returns the current certificate, issuing a new one when
// half of its lifetime has passed.
func (c *Credentials) certificate() (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.cert != nil && now.Before(c.renew) {
		return c.cert, nil
	}
	cert, err := c.ca.Issue(c.self, now.Add(-clockSkew), now.Add(leafLifetime))
	if err != nil {
		return nil, err
	}
	c.cert, c.renew = &cert, now.Add(leafLifetime/2)
	return c.cert, nil
}

// ServerConfig is the TLS configuration of a peer server: TLS 1.3, a
// client certificate required, chained to the CA, and naming this
// installation's namespace and service account.
func (c *Credentials) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      c.pool,
		Time:           c.now,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := c.checkPeer(cs, "")
			return err
		},
		NextProtos: []string{"h2"},
	}
}

// ClientConfig is the TLS configuration of a connection to the plugin of
// node: the server's certificate must chain to the CA and name this
// installation's namespace, service account and that node.
func (c *Credentials) ClientConfig(node string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              c.pool,
		ServerName:           ServerName,
		Time:                 c.now,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := c.checkPeer(cs, node)
			return err
		},
		NextProtos: []string{"h2"},
	}
}

// ErrNotPeer is the class of every refusal of a verified certificate
// whose identity is not a peer's.
var ErrNotPeer = errors.New("not a peer of this installation")

// checkPeer reads the identity of the verified certificate in cs and
// refuses it unless it is of this installation (and of node, if given).
// The chain and validity were checked by crypto/tls before this runs.
func (c *Credentials) checkPeer(cs tls.ConnectionState, node string) (Identity, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return Identity{}, fmt.Errorf("%w: no verified certificate", ErrNotPeer)
	}
	id, err := IdentityOf(cs.PeerCertificates[0])
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrNotPeer, err)
	}
	if id.Namespace != c.self.Namespace || id.ServiceAccount != c.self.ServiceAccount {
		return id, fmt.Errorf("%w: %s is not of %s/%s", ErrNotPeer, id, c.self.Namespace, c.self.ServiceAccount)
	}
	if node != "" && id.Node != node {
		return id, fmt.Errorf("%w: %s answered for node %s", ErrNotPeer, id, node)
	}
	return id, nil
}

// IdentityOf reads the identity of a peer certificate: exactly one
// identity URI.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	if len(cert.URIs) != 1 {
		return Identity{}, fmt.Errorf("certificate %q has %d URIs, want one peer identity", cert.Subject.CommonName, len(cert.URIs))
	}
	return ParseIdentity(cert.URIs[0])
}
