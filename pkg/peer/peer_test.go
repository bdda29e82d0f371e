package peer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

var (
	n1 = Identity{Namespace: "csi-fastblk", ServiceAccount: "csi-fastblk-node", Node: "n1"}
	n2 = Identity{Namespace: "csi-fastblk", ServiceAccount: "csi-fastblk-node", Node: "n2"}
	n3 = Identity{Namespace: "csi-fastblk", ServiceAccount: "csi-fastblk-node", Node: "n3"}
)

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func newCreds(t *testing.T, ca *CA, id Identity) *Credentials {
	t.Helper()
	c, err := NewCredentials(ca, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recorder is a Handler that answers every call and remembers what it got
// and from whom.
type recorder struct {
	mu      sync.Mutex
	calls   []any
	callers []Identity
	block   bool // wait for the call's end instead of answering
	// files are the sources OpenSource serves, by ID, after delay.
	files map[string]string
	delay time.Duration
	panic bool // panic in every call
}

func (r *recorder) note(ctx context.Context, req any) error {
	id, _ := Caller(ctx)
	r.mu.Lock()
	r.calls, r.callers = append(r.calls, req), append(r.callers, id)
	r.mu.Unlock()
	if r.panic {
		panic("a bug")
	}
	if r.block {
		if _, ok := ctx.Deadline(); !ok {
			return status.Error(codes.Internal, "no deadline reached the peer")
		}
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	return nil
}

func (r *recorder) ModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if err := r.note(ctx, req); err != nil {
		return nil, err
	}
	if req.GetMutableParameters()["refuse"] != "" {
		return nil, status.Errorf(codes.InvalidArgument, "modify volume %s on node n1: refused", req.GetVolumeId())
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

func (r *recorder) ExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if err := r.note(ctx, req); err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
}

func (r *recorder) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := r.note(ctx, req); err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "v1-n1", CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}}, nil
}

func (r *recorder) OpenSource(ctx context.Context, req *ReadRequest) (*os.File, int64, error) {
	if err := r.note(ctx, req); err != nil {
		return nil, 0, err
	}
	time.Sleep(r.delay)
	path, ok := r.files[req.ID]
	if !ok {
		return nil, 0, status.Errorf(codes.NotFound, "no source %q", req.ID)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// serve runs a peer server of h with creds on 127.0.0.1 and returns its
// address.
func serve(t *testing.T, creds *Credentials, h Handler, opts ...grpc.ServerOption) string {
	t.Helper()
	addr, _ := serveWithin(t, creds, h, Limits{}, opts...)
	return addr
}

// serveWithin is serve within lim; it returns the server too.
func serveWithin(t *testing.T, creds *Credentials, h Handler, lim Limits, opts ...grpc.ServerOption) (string, *Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	srv := NewServerWith(creds, h, lim, opts...)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String(), srv
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestForward: a call reaches the peer of the tag over mutual TLS, with
// its answer (success or refusal, code and message) returned as the peer
// gave it, secrets left behind, and the caller's identity known there.
func TestForward(t *testing.T) {
	ca := newCA(t)
	h := &recorder{}
	addr := serve(t, newCreds(t, ca, n1), h)
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	ctx := callCtx(t)

	if _, err := c.ModifyVolume(ctx, "n1", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n1",
		MutableParameters: map[string]string{"maxIOPS": "10"}, Secrets: map[string]string{"token": "s3cret"}}); err != nil {
		t.Fatalf("ModifyVolume: %v", err)
	}
	resp, err := c.ExpandVolume(ctx, "n1", &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n1", CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}})
	if err != nil || resp.GetCapacityBytes() != 8<<20 || !resp.GetNodeExpansionRequired() {
		t.Fatalf("ExpandVolume: %v, %v; want the peer's answer", resp, err)
	}
	_, err = c.ModifyVolume(ctx, "n1", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n1", MutableParameters: map[string]string{"refuse": "1"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "modify volume v1-n1 on node n1: refused") {
		t.Errorf("refused ModifyVolume: %v, want the peer's InvalidArgument", err)
	}
	cresp, err := c.CreateVolume(ctx, "n1", &csi.CreateVolumeRequest{Name: "pvc-1", CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20},
		Secrets: map[string]string{"token": "s3cret"}})
	if err != nil || cresp.GetVolume().GetVolumeId() != "v1-n1" || cresp.GetVolume().GetCapacityBytes() != 4<<20 {
		t.Fatalf("CreateVolume: %v, %v; want the peer's answer", cresp, err)
	}
	if h.count() != 4 {
		t.Fatalf("peer got %d calls, want 4", h.count())
	}
	if s := h.calls[0].(*csi.ControllerModifyVolumeRequest).GetSecrets(); len(s) != 0 {
		t.Errorf("secrets reached the peer: %v", s)
	}
	if s := h.calls[3].(*csi.CreateVolumeRequest).GetSecrets(); len(s) != 0 {
		t.Errorf("secrets of CreateVolume reached the peer: %v", s)
	}
	if h.callers[0] != n2 {
		t.Errorf("caller %v, want %v", h.callers[0], n2)
	}
	if _, err := c.ModifyVolume(ctx, "n3", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n3"}); status.Code(err) != codes.Unavailable {
		t.Errorf("call to a node without a plugin: %v, want Unavailable", err)
	}
}

// TestDeadlineTravels: the caller's deadline reaches the peer, and a call
// that outlives it ends with DeadlineExceeded at the caller, on time.
func TestDeadlineTravels(t *testing.T) {
	ca := newCA(t)
	h := &recorder{block: true}
	addr := serve(t, newCreds(t, ca, n1), h)
	c := NewClient(newCreds(t, ca, n2), Static{"n1": {Node: "n1", Addr: addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.ExpandVolume(ctx, "n1", &csi.ControllerExpandVolumeRequest{VolumeId: "v1-n1", CapacityRange: &csi.CapacityRange{RequiredBytes: 1}})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("blocked call: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("blocked call ended after %v", d)
	}
	if h.count() != 1 {
		t.Errorf("peer got %d calls, want 1", h.count())
	}
}

// rawCall calls ModifyVolume on addr with a TLS configuration of the
// test's making, as a client of another installation or an attacker would.
func rawCall(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.Invoke(callCtx(t), methodModify, &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n1"}, new(csi.ControllerModifyVolumeResponse))
}

// TestRefusedClients: the server refuses, before any handler runs, a
// client without a certificate, with a certificate of another CA, with an
// expired one, and with one of its own CA naming another namespace or
// service account, or no identity at all; plain text too.
func TestRefusedClients(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	h := &recorder{}
	addr := serve(t, newCreds(t, ca, n1), h)
	good := newCreds(t, ca, n2)
	now := time.Now()
	issued := func(ca *CA, id Identity, from, to time.Time) *tls.Certificate {
		cert, err := ca.Issue(id, from, to)
		if err != nil {
			t.Fatal(err)
		}
		return &cert
	}
	noURI := func() *tls.Certificate {
		// A certificate of the CA for something else: no identity URI.
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "n2"}, NotBefore: now.Add(-time.Minute),
			NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, DNSNames: []string{ServerName}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	with := func(cert *tls.Certificate) *tls.Config {
		cfg := good.ClientConfig("n1")
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		return cfg
	}
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"no certificate", func() *tls.Config { c := good.ClientConfig("n1"); c.GetClientCertificate = nil; return c }()},
		{"another CA", with(issued(other, n2, now.Add(-time.Minute), now.Add(time.Hour)))},
		{"expired", with(issued(ca, n2, now.Add(-48*time.Hour), now.Add(-24*time.Hour)))},
		{"not yet valid", with(issued(ca, n2, now.Add(24*time.Hour), now.Add(48*time.Hour)))},
		{"another namespace", with(issued(ca, Identity{Namespace: "tenant", ServiceAccount: n2.ServiceAccount, Node: "n2"}, now.Add(-time.Minute), now.Add(time.Hour)))},
		{"another service account", with(issued(ca, Identity{Namespace: n2.Namespace, ServiceAccount: "default", Node: "n2"}, now.Add(-time.Minute), now.Add(time.Hour)))},
		{"no identity", with(noURI())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := rawCall(t, addr, tc.cfg); status.Code(err) != codes.Unavailable {
				t.Errorf("call: %v, want Unavailable (handshake refused)", err)
			}
		})
	}
	t.Run("plain text", func(t *testing.T) {
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		err = conn.Invoke(callCtx(t), methodModify, &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n1"}, new(csi.ControllerModifyVolumeResponse))
		if status.Code(err) != codes.Unavailable {
			t.Errorf("plain-text call: %v, want Unavailable", err)
		}
	})
	if h.count() != 0 {
		t.Fatalf("a refused client reached the handler %d times", h.count())
	}
	if err := rawCall(t, addr, good.ClientConfig("n1")); err != nil {
		t.Fatalf("the good client after the refusals: %v", err)
	}
}

// TestRefusedServers: the client refuses a server with a certificate of
// another CA, of another installation (namespace or service account), or
// of another node than the one it asked for (a stale address now taken
// by another node's plugin), before sending anything.
func TestRefusedServers(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	client := newCreds(t, ca, n2)
	for _, tc := range []struct {
		name  string
		creds *Credentials
	}{
		{"another CA", newCreds(t, other, n1)},
		{"another namespace", newCreds(t, ca, Identity{Namespace: "tenant", ServiceAccount: n1.ServiceAccount, Node: "n1"})},
		{"another service account", newCreds(t, ca, Identity{Namespace: n1.Namespace, ServiceAccount: "default", Node: "n1"})},
		{"another node", newCreds(t, ca, Identity{Namespace: n1.Namespace, ServiceAccount: n1.ServiceAccount, Node: "n3"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &recorder{}
			addr := serve(t, tc.creds, h)
			c := NewClient(client, Static{"n1": {Node: "n1", Addr: addr}})
			_, err := c.ModifyVolume(callCtx(t), "n1", &csi.ControllerModifyVolumeRequest{VolumeId: "v1-n1"})
			if status.Code(err) != codes.Unavailable {
				t.Errorf("call: %v, want Unavailable", err)
			}
			if h.count() != 0 {
				t.Errorf("the client sent %d calls to a server it should refuse", h.count())
			}
		})
	}
}

// TestCredentialsRenew: a plugin's certificate is renewed once half its
// lifetime has passed, and is valid for the clock's present.
func TestCredentialsRenew(t *testing.T) {
	ca := newCA(t)
	now := time.Now()
	c, err := NewCredentials(ca, n1, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	first, _ := c.certificate()
	if again, _ := c.certificate(); again != first {
		t.Error("certificate reissued before half its lifetime")
	}
	now = now.Add(leafLifetime/2 + time.Minute)
	renewed, err := c.certificate()
	if err != nil || renewed == first {
		t.Fatalf("certificate not renewed after half its lifetime: %v", err)
	}
	if l := renewed.Leaf; now.Before(l.NotBefore) || now.After(l.NotAfter) {
		t.Errorf("renewed certificate valid %v..%v, not at %v", l.NotBefore, l.NotAfter, now)
	}
	if id, err := IdentityOf(renewed.Leaf); err != nil || id != n1 {
		t.Errorf("renewed certificate names %v, %v", id, err)
	}
}
