package railproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// alertConn is the proxy's end of a rail connection that reports, on the first
// read after the request numbered alertOn was written, the alert alert as
// received from the rail — as crypto/tls reports one.
type alertConn struct {
	net.Conn
	alertOn int32 // 1: the first request on the connection
	alert   tls.AlertError

	mu       sync.Mutex
	requests int32 // writes that began a request: one per request on this hop
	writing  bool
}

func (c *alertConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.writing {
		c.writing = true
		c.requests++
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *alertConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.writing = false
	alert := c.requests == c.alertOn
	c.mu.Unlock()
	if alert {
		return 0, &net.OpError{Op: "remote error", Err: c.alert}
	}
	return c.Conn.Read(p)
}

// A handshake-class alert means the rail's application never had the request
// only on a fresh connection: on a reused one the handshake was accepted long
// before, the rail may have read this request, and the call stays ambiguous —
// an UNSENT there could pay twice. The same alert on a fresh connection is
// UNSENT, so the fake is read as the rule says.
func TestHandshakeAlertOnAReusedConnectionStaysAmbiguous(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		alertOn int32
		want    RailResult
	}{
		{"fresh connection", 1, RailUnsent},
		{"reused connection", 2, RailAmbiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var read atomic.Int32
			rail := newRawRail(t, func(conn net.Conn) {
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					read.Add(1)
					_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 46\r\n\r\n{\"status\":\"ACCEPTED\",\"railReference\":\"RS-777\"}")
				}
			})
			cfg := hopConfig(rail.URL)
			cfg.RailDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &alertConn{Conn: c, alertOn: tc.alertOn, alert: 42}, nil // bad_certificate
			}
			c := newRailClient(cfg)
			defer c.close()
			pay := func(ref string) RailCall {
				return c.Pay(context.Background(), railPayment{Reference: ref, AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}.payment())
			}
			if tc.alertOn == 2 {
				if rc := pay("a-1"); rc.Result != RailAccepted {
					t.Fatalf("first call: %+v", rc)
				}
			}
			if rc := pay("a-2"); rc.Result != tc.want {
				t.Fatalf("call answered by a bad_certificate alert: %+v, want result %d", rc, tc.want)
			}
			// The rail counts a connection once its accept loop has taken it,
			// which may be after the call ended (the fresh connection's ends at
			// its first read).
			eventually(t, 10*time.Second, "the rail's connection counted", func() bool { return rail.connCount() > 0 })
			if rail.connCount() != 1 {
				t.Fatalf("%d connections, want one", rail.connCount())
			}
		})
	}
}
