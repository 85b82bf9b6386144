package identity

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"lock.dev/internal/serve"
)

// NewListener serves mutual TLS on ln with cfg (Source.ServerConfig). Its
// connections are *Conn: each learns its peer's SPIFFE ID once, after the
// handshake, however many requests it carries.
func NewListener(ln net.Listener, cfg *tls.Config) net.Listener {
	return &listener{Listener: ln, cfg: cfg}
}

type listener struct {
	net.Listener
	cfg *tls.Config
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: tls.Server(c, l.cfg)}, nil
}

// Conn is a server's mutual-TLS connection. The handshake happens on the first
// read, within the server's read deadline.
type Conn struct {
	*tls.Conn

	once  sync.Once
	state *tls.ConnectionState
	id    spiffeid.ID
	err   error
}

func (c *Conn) learn() {
	c.once.Do(func() {
		if err := c.Conn.Handshake(); err != nil {
			c.err = fmt.Errorf("TLS handshake: %w", err)
			return
		}
		st := c.Conn.ConnectionState()
		c.state = &st
		if len(st.PeerCertificates) == 0 {
			c.err = ErrNoPeer
			return
		}
		c.id, c.err = x509svid.IDFromCert(st.PeerCertificates[0])
	})
}

// PeerID is the SPIFFE ID of the connection's verified peer.
func (c *Conn) PeerID() (spiffeid.ID, error) {
	c.learn()
	return c.id, c.err
}

// TLSState is the connection's state after the handshake, computed once and
// shared by every request on it (callers must not change it); nil when the
// handshake failed.
func (c *Conn) TLSState() *tls.ConnectionState {
	c.learn()
	return c.state
}

// NetConn is the connection under TLS.
func (c *Conn) NetConn() net.Conn { return c.Conn.NetConn() }

// PeerID is the verified SPIFFE ID of r's caller: from r.TLS when the server set
// it (fastserve sets it from the connection's state), else from the *Conn the
// server put in r's context (serve.Serve, whose connections are wrapped beyond
// *tls.Conn and so carry no r.TLS). With neither it is ErrNoPeer: a request
// whose caller cannot be named is refused, never believed.
func PeerID(r *http.Request) (spiffeid.ID, error) {
	if r.TLS != nil {
		if len(r.TLS.PeerCertificates) == 0 {
			return spiffeid.ID{}, ErrNoPeer
		}
		return x509svid.IDFromCert(r.TLS.PeerCertificates[0])
	}
	c := serve.ConnFrom(r.Context())
	for c != nil {
		if ic, ok := c.(*Conn); ok {
			return ic.PeerID()
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	return spiffeid.ID{}, ErrNoPeer
}

// Secure is what a server does with its listener at start: auth_enabled
// announced (Announce, with why when not enabled), and — with src — ln serving
// mutual TLS with src's SVID, re-read on change until ctx ends, logged as
// tls_enabled with attrs. Without src it is ln itself, plaintext.
func Secure(ctx context.Context, ln net.Listener, src *Source, reg prometheus.Registerer, logger *slog.Logger,
	enabled bool, why string, attrs ...any) net.Listener {
	Announce(ctx, reg, logger, enabled, why)
	if src == nil {
		return ln
	}
	go src.Watch(ctx)
	logger.Info("serving mutual TLS", append([]any{"event", "tls_enabled", "id", src.ID().String()}, attrs...)...)
	return NewListener(ln, src.ServerConfig())
}
