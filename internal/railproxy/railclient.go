package railproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// RailResult is what one call to the rail came to.
type RailResult int

// The four ways a rail call can end.
const (
	RailAccepted  RailResult = iota + 1 // 200 ACCEPTED: money moved
	RailDeclined                        // 422 DECLINED: no money moved
	RailUnsent                          // no connection was ever obtained: nothing left the proxy
	RailAmbiguous                       // anything after a connection was obtained: the rail may have acted
)

// Causes of an ambiguous call (rail_ambiguous.cause, docs/contracts/observability.md).
const (
	CauseTimeout           = "timeout"
	CauseConnectionDropped = "connection_dropped"
	CauseBadResponse       = "bad_response"
	CauseInterrupted       = "interrupted"
)

// DeclineUnspecified is the decline_reason recorded when the rail declined
// without saying why.
const DeclineUnspecified = "unspecified"

// RailCall is the record of one call.
type RailCall struct {
	Result        RailResult
	RailReference string  // RailAccepted
	DeclineReason *string // RailDeclined; DeclineUnspecified when the rail gave none
	Cause         string  // RailAmbiguous
	Err           error   // RailUnsent, RailAmbiguous: what happened
	Elapsed       time.Duration
	// StaleConn: the call failed on a reused (pooled) connection before a single
	// byte of reply arrived — most often a connection the rail had just closed as
	// idle. It is still ambiguous (the rail may have read the request); it is
	// counted so an operator can see it and tune RAIL_IDLE_CONN_TIMEOUT.
	StaleConn bool
}

// railPayment is the rail's request body (docs/contracts/rail-stub.md): reference = payoutId.
type railPayment struct {
	Reference   string `json:"reference"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	Beneficiary string `json:"beneficiary"`
}

// railReply covers both the accept and the decline body.
type railReply struct {
	Status        string  `json:"status"`
	RailReference string  `json:"railReference"`
	Reason        *string `json:"reason"`
}

// maxRailReply bounds how much of a reply is read; a longer one is not a
// well-formed accept or decline.
const maxRailReply = 64 << 10

var (
	errReadTimeout  = errors.New("read timeout: no whole reply within RAIL_READ_TIMEOUT of the request being written")
	errConnectBound = errors.New("connect timeout: no connection obtained and request written within RAIL_CONNECT_TIMEOUT")
	errBodyRewind   = errors.New("rail request must not be rewindable")
)

// railClient forwards payments to the rail: POST only, one attempt, no retry.
//
// The payment hop runs on fasthttp (fastrail.go): fasthttp's HostClient keeps the
// pool of connections, dials through our hook and frames HTTP/1.1 (Request.Write,
// Response.ReadLimitBody); the one round trip per payment is ours, so there is no
// retry loop anywhere on the path — not even one a setting could turn on — and the
// proxy knows exactly whether a connection was obtained (UNSENT) and whether it was
// a reused one. It costs no goroutine per call (net/http's transport runs two per
// connection) and its buffers are pooled between calls.
//
// Reuse has one cost no client can remove: a pooled connection the rail closes
// just as a request is written turns a payment the rail never read into an
// ambiguous one (TIMEOUT). Idle connections are therefore dropped after
// RAIL_IDLE_CONN_TIMEOUT, chosen below the rail's own idle timeout, and 0 turns
// reuse off altogether.
//
// The health probe and the statement reads (GET, no money moves) stay on
// net/http (newRailTransport).
type railClient struct {
	paymentsURL    string
	healthURL      string
	hop            *fasthttp.HostClient // the payment hop; nil in a zero railClient
	health         *http.Client
	connectTimeout time.Duration
	readTimeout    time.Duration
	idleTimeout    time.Duration // RAIL_IDLE_CONN_TIMEOUT; 0: a fresh connection per call
}

// newRailClient builds the client from rail-proxy's settings: RAIL_BASE_URL, the
// connect and read bounds, RAIL_IDLE_CONN_TIMEOUT, and the RailDial test hook.
func newRailClient(cfg Config) *railClient {
	base := strings.TrimSuffix(cfg.RailBaseURL, "/")
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &railClient{
		paymentsURL: base + "/rail/v1/payments",
		healthURL:   base + "/rail/v1/health",
		hop:         newRailHop(cfg),
		health: &http.Client{Transport: newRailTransport(HealthTimeout, cfg.RailIdleConnTimeout, 2, cfg.RailDial),
			CheckRedirect: noRedirect, Timeout: HealthTimeout},
		connectTimeout: cfg.RailConnectTimeout,
		readTimeout:    cfg.RailReadTimeout,
		idleTimeout:    cfg.RailIdleConnTimeout,
	}
}

// newRailTransport is the net/http transport of the rail's GET endpoints (health,
// statement). A GET moves no money; still, nothing is retried on purpose.
func newRailTransport(connectTimeout, idleTimeout time.Duration, idle int,
	dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	if dial == nil {
		dial = (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		TLSHandshakeTimeout: connectTimeout, // part of obtaining the connection
		MaxIdleConns:        idle,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     idleTimeout,
		DisableKeepAlives:   idleTimeout == 0,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		WriteBufferSize:     2 << 10,
		ReadBufferSize:      2 << 10,
	}
}

// The Go transport hazard (docs/contracts/rail-proxy.md): net/http silently resends a request on a reused
// connection that the server closed when it deems the request replayable — an
// idempotent method, or an Idempotency-Key / X-Idempotency-Key header on a
// request whose body can be re-read (GetBody set, which http.NewRequest does for
// in-memory bodies). newRailRequest is the net/http form of the rail request,
// built so that none of that can apply (a POST, neither header, a body wrapper
// http.NewRequest does not recognise); the payment hop itself no longer goes
// through net/http (fastrail.go), and has no retry path at all.

// onceReader hides the *bytes.Reader from http.NewRequest, which would otherwise
// set GetBody and make the request rewindable.
type onceReader struct{ r io.Reader }

func (o onceReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func (c *railClient) newRailRequest(ctx context.Context, p railPayment) (*http.Request, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encoding rail payment: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.paymentsURL, onceReader{bytes.NewReader(body)})
	if err != nil {
		return nil, fmt.Errorf("building rail request: %w", err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if req.GetBody != nil || req.Method != http.MethodPost ||
		req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != "" {
		return nil, errBodyRewind
	}
	return req, nil
}

// Healthy is the railStub readiness check: GET {RAIL_BASE_URL}/rail/v1/health
// within 1 s, DOWN on any failure. A GET here moves no money, so its transport is
// a separate one.
func (c *railClient) Healthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, HealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.healthURL, nil)
	if err != nil {
		return err
	}
	resp, err := c.health.Do(req)
	if err != nil {
		return fmt.Errorf("rail health: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("rail health: status %d", resp.StatusCode)
	}
	return nil
}

func (c *railClient) close() {
	if c.hop != nil {
		c.hop.CloseIdleConnections()
	}
	c.health.CloseIdleConnections()
}
