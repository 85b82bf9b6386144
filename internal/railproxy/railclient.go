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
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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

// Causes of an ambiguous call (C4 rail_ambiguous.cause).
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

// railPayment is the rail's request body (C3 #ct3-railstub): reference = payoutId.
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
// The Go transport hazard (C3): net/http silently resends a request on a reused
// connection that the server closed when it deems the request replayable — an
// idempotent method, or an Idempotency-Key / X-Idempotency-Key header on a
// request whose body can be re-read (GetBody set, which http.NewRequest does for
// in-memory bodies). A resent payment is a second payment. So every request here
// is a POST, carries neither header, and has a body wrapper http.NewRequest does
// not recognise, which leaves GetBody nil; newRailRequest checks all three. With
// that, keep-alive connections are safe to reuse, and reusing them spares a TCP
// handshake per payment. Redirects are not followed (a 307/308 would resend the
// body) and no environment proxy is used (it could retry on its own).
//
// Reuse has one cost no client can remove: a pooled connection the rail closes
// just as a request is written turns a payment the rail never read into an
// ambiguous one (TIMEOUT). Idle connections are therefore dropped after
// RAIL_IDLE_CONN_TIMEOUT, chosen below the rail's own idle timeout, and 0 turns
// reuse off altogether.
type railClient struct {
	paymentsURL    string
	healthURL      string
	http           *http.Client
	health         *http.Client
	connectTimeout time.Duration
	readTimeout    time.Duration
}

// newRailClient builds the client from rail-proxy's settings: RAIL_BASE_URL, the
// connect and read bounds, RAIL_IDLE_CONN_TIMEOUT, and the RailDial test hook.
func newRailClient(cfg Config) *railClient {
	base := strings.TrimSuffix(cfg.RailBaseURL, "/")
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &railClient{
		paymentsURL: base + "/rail/v1/payments",
		healthURL:   base + "/rail/v1/health",
		http: &http.Client{Transport: newRailTransport(cfg.RailConnectTimeout, cfg.RailIdleConnTimeout, 256, cfg.RailDial),
			CheckRedirect: noRedirect},
		health: &http.Client{Transport: newRailTransport(HealthTimeout, cfg.RailIdleConnTimeout, 2, cfg.RailDial),
			CheckRedirect: noRedirect, Timeout: HealthTimeout},
		connectTimeout: cfg.RailConnectTimeout,
		readTimeout:    cfg.RailReadTimeout,
	}
}

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
		// RAIL_IDLE_CONN_TIMEOUT, below the rail's own idle timeout, so a pooled
		// connection is rarely one the rail is about to close (a request written
		// into such a connection is ambiguous, never resent). Zero: no reuse.
		IdleConnTimeout:    idleTimeout,
		DisableKeepAlives:  idleTimeout == 0,
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
		// HTTP/1.1 only: one request per connection at a time, and the retry
		// rules analysed above are the HTTP/1 transport's.
		TLSNextProto:    map[string]func(string, *tls.Conn) http.RoundTripper{},
		WriteBufferSize: 2 << 10,
		ReadBufferSize:  2 << 10,
	}
}

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

// Pay presents one payment to the rail, once. The caller's context is not used
// for cancellation: an admitted payment is carried through to its answer (or its
// bounds) even when the caller has gone away — only ctx's values are kept.
//
// Timing: connecting is bounded by RAIL_CONNECT_TIMEOUT; from the moment the
// request has been written, the whole reply must be read within
// RAIL_READ_TIMEOUT, a bound of its own.
//
// UNSENT is decided by httptrace alone: GotConn never fired means no connection
// was ever obtained, so no byte of the request left the proxy. Once a connection
// was obtained, every failure is ambiguous — the request may have been written,
// and the rail may have moved money — whatever the error text says.
func (c *railClient) Pay(ctx context.Context, p railPayment) RailCall {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)

	// Two phases, two bounds, one after the other, so a submission is never in
	// flight longer than RAIL_CONNECT_TIMEOUT + RAIL_READ_TIMEOUT — the figure the
	// janitor's RAIL_PROXY_INTERRUPTED_AFTER is checked against. Phase one,
	// obtaining a connection and writing the request, is bounded by the connect
	// timeout (the dialer has the same bound; this one also covers a write that
	// stalls). Phase two starts when the request has been written: the whole reply
	// must be read within the read timeout.
	var (
		gotConn   atomic.Bool
		reused    atomic.Bool
		replyByte atomic.Bool
		mu        sync.Mutex
		readT     *time.Timer
	)
	connectT := time.AfterFunc(c.connectTimeout, func() { cancel(errConnectBound) })
	trace := &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			reused.Store(info.Reused)
			gotConn.Store(true)
		},
		GotFirstResponseByte: func() { replyByte.Store(true) },
		WroteRequest: func(httptrace.WroteRequestInfo) {
			connectT.Stop()
			mu.Lock()
			defer mu.Unlock()
			if readT == nil {
				readT = time.AfterFunc(c.readTimeout, func() { cancel(errReadTimeout) })
			}
		},
	}
	defer func() {
		connectT.Stop()
		mu.Lock()
		if readT != nil {
			readT.Stop()
		}
		mu.Unlock()
	}()

	done := func(rc RailCall) RailCall {
		rc.Elapsed = time.Since(start)
		return rc
	}
	ambiguous := func(err error) RailCall {
		cause := CauseConnectionDropped
		if ce := context.Cause(ctx); errors.Is(ce, errReadTimeout) || errors.Is(ce, errConnectBound) {
			cause, err = CauseTimeout, fmt.Errorf("%w (%v)", ce, err)
		}
		return done(RailCall{Result: RailAmbiguous, Cause: cause, Err: err,
			StaleConn: reused.Load() && !replyByte.Load()})
	}

	req, err := c.newRailRequest(httptrace.WithClientTrace(ctx, trace), p)
	if err != nil {
		// Nothing was attempted.
		return done(RailCall{Result: RailUnsent, Err: err})
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if !gotConn.Load() {
			return done(RailCall{Result: RailUnsent, Err: err})
		}
		return ambiguous(err)
	}
	body, err := readReply(resp)
	if err != nil {
		if errors.Is(err, errReplyTooLarge) {
			return done(RailCall{Result: RailAmbiguous, Cause: CauseBadResponse, Err: err})
		}
		return ambiguous(err)
	}
	var r railReply
	bad := func(why string) RailCall {
		return done(RailCall{Result: RailAmbiguous, Cause: CauseBadResponse,
			Err: fmt.Errorf("rail answered %d: %s", resp.StatusCode, why)})
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return bad("reply is not JSON")
	}
	switch {
	case resp.StatusCode == http.StatusOK && r.Status == "ACCEPTED" && r.RailReference != "":
		return done(RailCall{Result: RailAccepted, RailReference: r.RailReference})
	case resp.StatusCode == http.StatusUnprocessableEntity && r.Status == "DECLINED":
		// A decline is a decline with or without its reason; the row records
		// that none was given rather than a NULL that reads like a lost one.
		reason := DeclineUnspecified
		if r.Reason != nil && *r.Reason != "" {
			reason = *r.Reason
		}
		return done(RailCall{Result: RailDeclined, DeclineReason: &reason})
	case resp.StatusCode == http.StatusOK:
		return bad("not a well-formed accept")
	case resp.StatusCode == http.StatusUnprocessableEntity:
		return bad("not a well-formed decline")
	default:
		return bad("unexpected status")
	}
}

var errReplyTooLarge = fmt.Errorf("rail reply exceeds %d bytes", maxRailReply)

func readReply(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxRailReply+1))
	if err != nil {
		return nil, fmt.Errorf("reading rail reply: %w", err)
	}
	if len(b) > maxRailReply {
		return nil, errReplyTooLarge
	}
	return b, nil
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
	c.http.CloseIdleConnections()
	c.health.CloseIdleConnections()
}
