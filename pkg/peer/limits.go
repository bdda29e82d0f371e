package peer

import (
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// A peer is a plugin of the same installation, but its node may be broken
// or taken: what it can hold of a server is bounded (docs/peer.md,
// "Bounded peers"). gRPC's own settings bound connections and their
// streams; Limits bound the data streams, which hold a source (and for a
// volume, a copy of it) and the disk's bandwidth.

// Limits bound what peers may hold of a plugin's peer server. A zero
// field takes its value from DefaultLimits.
type Limits struct {
	// MaxStreams is the most data streams (ReadData) the server sends
	// at once, MaxStreamsPerPeer the most to one calling node. Beyond
	// either a stream is ResourceExhausted.
	MaxStreams, MaxStreamsPerPeer int
	// MinRate (bytes per second) is the slowest a stream is sent: a
	// request for less is sent at MinRate, and a stream ends
	// DeadlineExceeded once it has taken its source's size ÷ MinRate
	// and streamSlack.
	MinRate int64
	// MaxConnsPerAddr is the most connections open at once from one
	// address (a peer is a pod, with an address of its own).
	MaxConnsPerAddr int
	// RefuseData refuses every data stream (PermissionDenied): the
	// server then serves only forwarded calls and handoffs.
	RefuseData bool
}

// DefaultLimits are the limits of the plugin's flags' defaults. The rate
// floor is the least a class may ask (transferRate 1Mi), so that no class's
// copy is sped up by it.
var DefaultLimits = Limits{MaxStreams: 16, MaxStreamsPerPeer: 4, MinRate: 1 << 20, MaxConnsPerAddr: 64}

// withDefaults fills l's zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxStreams <= 0 {
		l.MaxStreams = d.MaxStreams
	}
	if l.MaxStreamsPerPeer <= 0 {
		l.MaxStreamsPerPeer = d.MaxStreamsPerPeer
	}
	if l.MinRate <= 0 {
		l.MinRate = d.MinRate
	}
	if l.MaxConnsPerAddr <= 0 {
		l.MaxConnsPerAddr = d.MaxConnsPerAddr
	}
	return l
}

// gRPC's settings of the server. Variables for tests.
var (
	// handshakeTimeout bounds a connection's TLS and HTTP/2 setup
	// (gRPC's default is 120 s).
	handshakeTimeout = 10 * time.Second
	// idleConnection closes a connection without calls for this long.
	idleConnection = 5 * time.Minute
	// streamSlack is added to a stream's deadline (size ÷ MinRate) for
	// the time the source takes to open and the network's round trips.
	streamSlack = 2 * time.Minute
)

// maxStreamsPerConn bounds the calls and streams of one connection; a
// Client makes a connection per call.
const maxStreamsPerConn = 16

// maxHeaderList bounds the headers of a call or an answer (gRPC's default
// is 16 MiB): a token of at most maxTokenLen and a few names.
const maxHeaderList = 32 << 10

// grpcLimits are the server options that bound connections.
func grpcLimits() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.MaxHeaderListSize(maxHeaderList),
		grpc.ConnectionTimeout(handshakeTimeout),
		// Clients do not ping; one that pings more than twice a
		// minute, or without a call open, is cut (GOAWAY).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: false}),
		// The server pings a connection quiet for a minute and cuts it
		// if the answer takes 20 s: a peer gone without a word does not
		// hold its streams until TCP gives up.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idleConnection, Time: time.Minute, Timeout: 20 * time.Second}),
	}
}

// streamCounts admits data streams within the limits.
type streamCounts struct {
	lim    Limits
	mu     sync.Mutex
	total  int
	byPeer map[string]int
}

// admit takes a place for a stream to node, or says which limit is full;
// release gives the place back.
func (c *streamCounts) admit(node string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byPeer[node] >= c.lim.MaxStreamsPerPeer {
		return nil, status.Errorf(codes.ResourceExhausted, "node %s already has %d data streams of this node, the most one peer may have (--peer-max-streams-per-peer); retry later",
			node, c.byPeer[node])
	}
	if c.total >= c.lim.MaxStreams {
		return nil, status.Errorf(codes.ResourceExhausted, "this node already sends %d data streams, its most (--peer-max-streams); retry later", c.total)
	}
	if c.byPeer == nil {
		c.byPeer = map[string]int{}
	}
	c.total++
	c.byPeer[node]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.total--
			if c.byPeer[node]--; c.byPeer[node] == 0 {
				delete(c.byPeer, node)
			}
		})
	}, nil
}

// active is the number of streams admitted and not yet released.
func (c *streamCounts) active() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// streamDeadline is how long a stream of a source of size bytes may take.
func (l Limits) streamDeadline(size int64) time.Duration {
	return time.Duration(float64(size)/float64(l.MinRate)*float64(time.Second)) + streamSlack
}

// connLimiter is a listener that closes at once a connection from an
// address that already has max open, before its handshake.
type connLimiter struct {
	net.Listener
	max    int
	mu     sync.Mutex
	byAddr map[string]int
}

func limitConns(lis net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: lis, max: max, byAddr: map[string]int{}}
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host, _, err := net.SplitHostPort(c.RemoteAddr().String())
		if err != nil {
			host = c.RemoteAddr().String()
		}
		l.mu.Lock()
		full := l.byAddr[host] >= l.max
		if !full {
			l.byAddr[host]++
		}
		l.mu.Unlock()
		if full {
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(host) }}, nil
	}
}

func (l *connLimiter) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byAddr[host]--; l.byAddr[host] <= 0 {
		delete(l.byAddr, host)
	}
}

// limitedConn gives its place back when it is closed, once.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// String names the limits for logs.
func (l Limits) String() string {
	return fmt.Sprintf("streams %d (%d per peer), min rate %d B/s, connections per address %d, data served %v",
		l.MaxStreams, l.MaxStreamsPerPeer, l.MinRate, l.MaxConnsPerAddr, !l.RefuseData)
}
