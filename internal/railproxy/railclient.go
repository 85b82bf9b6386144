package railproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"lock.dev/internal/service"
	"lock.dev/lockapi"
	"lock.dev/rail"
)

// This file is the rail call: railClient.Pay presents one payment to the rail,
// once (step 4 of the admission, admission.go). The rest of it is what Pay is
// made of — the payment hop on fasthttp and its one round trip — and the rail's
// two GET endpoints (health, and the statement's transport), which move no money.
//
// What the rail's language says — the request's method, path, headers and body,
// and what a reply means — is the adapter's (lock.dev/rail, RAIL_PROTOCOL); every
// rule about when and how often the rail is called, and what an answer the gate
// can record looks like, is this file's, whatever the adapter.

// RailResult is what one call to the rail came to.
type RailResult int

// The four ways a rail call can end.
const (
	RailAccepted  RailResult = iota + 1 // a well-formed accept (rail-stub: 200 ACCEPTED): money moved
	RailDeclined                        // a well-formed decline (rail-stub: 422 DECLINED): no money moved
	RailUnsent                          // nothing reached the rail's application: no connection was obtained, or its TLS handshake was refused (railtls.go)
	RailAmbiguous                       // anything after a connection was obtained: the rail may have acted
)

// Causes of an ambiguous call (rail_ambiguous.cause, docs/contracts/observability.md):
// a closed set. No metric is labelled by it; the log line carries it.
const (
	CauseTimeout           = "timeout"
	CauseConnectionDropped = "connection_dropped"
	CauseBadResponse       = "bad_response"
	CauseInterrupted       = "interrupted"
	// CausePending: the rail answered that it has the payment and has not
	// decided (ISO 20022's ACCP, ACTC, RCVD, PDNG). The statement settles it.
	CausePending = "pending"
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

// maxRailReply bounds how much of a reply is read; a longer one is not a
// well-formed accept or decline.
const maxRailReply = 64 << 10

var (
	errReadTimeout   = errors.New("read timeout: no whole reply within RAIL_READ_TIMEOUT of the request being written")
	errConnectBound  = errors.New("connect timeout: no connection obtained and request written within RAIL_CONNECT_TIMEOUT")
	errReplyTooLarge = fmt.Errorf("rail reply exceeds %d bytes", maxRailReply)
)

// railClient forwards payments to the rail: POST only, one attempt, no retry.
//
// The payment hop runs on fasthttp: fasthttp.HostClient keeps the pool of
// connections, dials through our hook (newRailHop) and lends its pooled buffers;
// Request.Write and Response.ReadLimitBody frame HTTP/1.1. The round trip itself
// (roundTrip) is written out here, with fasthttp's exported parts, instead of
// going through HostClient.Do, for three reasons that docs/contracts/rail-proxy.md
// ("The rail call") guarantees:
//
//   - Exactly one forward. HostClient.Do is a retry loop (for a POST it stops
//     after one attempt unless a RetryIf says otherwise); roundTrip has no loop
//     around the request at all. The only thing ever repeated is taking a
//     connection from the pool — before a byte is written, when the one taken has
//     been idle longer than RAIL_IDLE_CONN_TIMEOUT and is closed unused.
//   - UNSENT only when no connection was obtained: AcquireConn failing (the dial
//     failed or ran out of RAIL_CONNECT_TIMEOUT; the TLS handshake, the rail's
//     identity checked, is part of the dial). From the moment a connection is
//     held, every failure is ambiguous — but one: on a fresh TLS connection, a
//     handshake-class alert from the rail read before any byte of a reply (the
//     rail refused our certificate after we wrote, as TLS 1.3 allows) is UNSENT
//     too: the rail's application never had the connection (railtls.go).
//   - Two bounds, one after the other: obtaining the connection and writing the
//     request within RAIL_CONNECT_TIMEOUT of the call's start (the dial's own
//     bound, then the write deadline); from the request written, the whole reply
//     within RAIL_READ_TIMEOUT (one read deadline for headers and body).
//
// The hop's retry settings are still set to "never" (MaxIdemponentCallAttempts 1,
// RetryIfErr false), so that nobody who calls HostClient.Do on it gets a retry by
// default. It costs no goroutine per call and its buffers are pooled between
// calls.
//
// Reuse has one cost no client can remove: a pooled connection the rail closes
// just as a request is written turns a payment the rail never read into an
// ambiguous one (TIMEOUT). Idle connections are therefore dropped after
// RAIL_IDLE_CONN_TIMEOUT, chosen below the rail's own idle timeout, and 0 turns
// reuse off altogether (TestRailIdleConnTimeout).
//
// The health probe and the statement reads (GET, no money moves) stay on
// net/http (newRailTransport).
type railClient struct {
	// base is RAIL_BASE_URL without a trailing slash: every request's path,
	// as the adapter builds it, is appended to it.
	base string
	// adapter speaks the rail's language (RAIL_PROTOCOL, or Config.Adapter).
	adapter        rail.Adapter
	hop            *fasthttp.HostClient // the payment hop; nil in a zero railClient
	health         *http.Client
	connectTimeout time.Duration
	readTimeout    time.Duration
	idleTimeout    time.Duration // RAIL_IDLE_CONN_TIMEOUT; 0: a fresh connection per call
	// tls is the TLS configuration of every call to the rail (railTLSConfig);
	// nil: plaintext, or an https rail verified by its URL's host name.
	tls *tls.Config
}

// newRailClientFor builds the client of a running proxy: its settings and the
// TLS of the hop to the rail, made from the proxy's identity (railTLSConfig;
// an error names the setting).
func newRailClientFor(cfg Config, sv *service.Service) (*railClient, error) {
	tc, err := railTLSConfig(cfg, sv)
	if err != nil {
		return nil, err
	}
	return newRailClientTLS(cfg, tc), nil
}

// newRailClient builds the client from rail-proxy's settings: RAIL_BASE_URL,
// RAIL_PROTOCOL (or Config.Adapter), the connect and read bounds,
// RAIL_IDLE_CONN_TIMEOUT, and the RailDial test hook.
func newRailClient(cfg Config) *railClient { return newRailClientTLS(cfg, nil) }

// newRailClientTLS is newRailClient speaking TLS with tc to the rail (nil: as
// RAIL_BASE_URL's scheme says, an https host verified by its name).
func newRailClientTLS(cfg Config, tc *tls.Config) *railClient {
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &railClient{
		base:    strings.TrimSuffix(cfg.RailBaseURL, "/"),
		adapter: cfg.adapter(),
		hop:     newRailHop(cfg, tc),
		health: &http.Client{Transport: newRailTransport(HealthTimeout, cfg.RailIdleConnTimeout, 2, cfg.RailDial, tc),
			CheckRedirect: noRedirect, Timeout: HealthTimeout},
		connectTimeout: cfg.RailConnectTimeout,
		readTimeout:    cfg.RailReadTimeout,
		idleTimeout:    cfg.RailIdleConnTimeout,
		tls:            tc,
	}
}

// Pay presents one payment to the rail, once, and says what became of it.
//
// The adapter builds the request and reads the reply; Pay keeps the rest. Only
// an Accepted with a reference paydb can store and show as it is (and a Declined
// whose reason, if any, is such text) resolves the call; an Accepted without
// one, or anything the adapter did not understand, is ambiguous, cause
// bad_response; Pending is ambiguous, cause pending.
//
// UNSENT is decided by whether a connection was obtained, never by an error's
// text: no connection means no byte of the request left the proxy. Once a
// connection was obtained, every failure is ambiguous — the request may have
// been written, and the rail may have moved money — but one: the rail's TLS
// refusing the handshake of a fresh connection after the request was written
// (a handshake-class alert before any byte of reply, railtls.go), when its
// application never had the request.
//
// ctx may end the call sooner than its two bounds; it never makes it longer and
// never makes it happen twice. A ctx done before the call opens no connection
// (UNSENT). Once a connection is held, ctx's end — its deadline or its
// cancellation — ends the call as a bound does: ambiguous, cause timeout or
// interrupted, the row TIMEOUT, never retried. The dial itself is bounded by
// RAIL_CONNECT_TIMEOUT alone (the pool's dial hook has no per-call context); a
// ctx that ends during it ends the call as soon as the connection is held. The
// admitter passes a context that is never done — the caller's cancellation never
// aborts a rail call (Submit) — and for such a context Pay asks it nothing but
// Done (TestPayHonoursItsContext).
func (c *railClient) Pay(ctx context.Context, p rail.Payment) RailCall {
	start := time.Now()
	done := func(rc RailCall) RailCall {
		rc.Elapsed = time.Since(start)
		return rc
	}
	if c.adapter == nil {
		return done(RailCall{Result: RailUnsent, Err: errors.New("rail client not configured")})
	}
	pr, err := paymentRequest(c.adapter, p)
	if err != nil {
		// Nothing was attempted.
		return done(RailCall{Result: RailUnsent, Err: fmt.Errorf("building the rail payment: %w", err)})
	}
	// The request is released once written and the response taken once the
	// reply has begun (roundTrip): a call waiting for the rail holds neither.
	req := fasthttp.AcquireRequest()
	setRequestURI(req, c.base, pr.Path)
	req.Header.SetMethod(pr.Method)
	if pr.ContentType != "" {
		req.Header.SetContentType(pr.ContentType)
	}
	if pr.Accept != "" {
		req.Header.Set("Accept", pr.Accept)
	}
	req.SetBodyRaw(pr.Body)

	resp, st, err := c.roundTrip(ctx, req, start)
	if resp != nil {
		defer fasthttp.ReleaseResponse(resp)
	}
	switch {
	case err == nil:
	case !st.gotConn || st.refused:
		return done(RailCall{Result: RailUnsent, Err: err})
	case errors.Is(err, errReplyTooLarge):
		return done(RailCall{Result: RailAmbiguous, Cause: CauseBadResponse, Err: err})
	default:
		cause := CauseConnectionDropped
		switch {
		case errors.Is(err, errReadTimeout) || errors.Is(err, errConnectBound) || errors.Is(err, context.DeadlineExceeded):
			cause = CauseTimeout
		case errors.Is(err, context.Canceled):
			cause = CauseInterrupted
		}
		return done(RailCall{Result: RailAmbiguous, Cause: cause, Err: err,
			StaleConn: st.reused && !st.replyByte})
	}

	status := resp.StatusCode()
	bad := func(why string) RailCall {
		return done(RailCall{Result: RailAmbiguous, Cause: CauseBadResponse,
			Err: fmt.Errorf("rail answered %d: %s", status, why)})
	}
	// The reply's body is lent to the adapter for the call only: what it keeps
	// it copies (its strings do), and the response goes back to its pool.
	ans := readAnswer(c.adapter, p, rail.Reply{Status: status, ContentType: contentType(resp.Header.ContentType()), Body: resp.Body()})
	switch ans.Verdict {
	case rail.Accepted:
		// An accept whose reference paydb cannot store and show as it is would
		// be answered 200 and then recorded as something else (or not at all):
		// it is no well-formed accept (docs/contracts/rail-proxy.md), whatever
		// the adapter made of it.
		if ans.RailReference == "" {
			return bad("accepted without a rail reference")
		}
		if p := lockapi.StorableTextProblem(ans.RailReference, lockapi.MaxRailReferenceLen); p != "" {
			return bad("railReference " + p)
		}
		return done(RailCall{Result: RailAccepted, RailReference: ans.RailReference})
	case rail.Declined:
		// A decline is a decline with or without its reason; the row records
		// that none was given rather than a NULL that reads like a lost one.
		reason := DeclineUnspecified
		if ans.DeclineReason != "" {
			// The same for a decline: its reason is recorded and answered as
			// given, or the decline is no well-formed one.
			if p := lockapi.StorableTextProblem(ans.DeclineReason, lockapi.MaxDeclineReasonLen); p != "" {
				return bad("reason " + p)
			}
			reason = ans.DeclineReason
		}
		return done(RailCall{Result: RailDeclined, DeclineReason: &reason})
	case rail.Pending:
		// The rail has the payment and has not decided: it may yet move money.
		return done(RailCall{Result: RailAmbiguous, Cause: CausePending,
			Err: fmt.Errorf("rail answered %d: pending, not decided: %s", status, whyOr(ans.Why, "no reason given"))})
	default:
		return bad(whyOr(ans.Why, "not understood by the "+c.adapter.Protocol()+" adapter"))
	}
}

// paymentRequest is a.PaymentRequest(p); an adapter that panics has built no
// request, and nothing is sent.
func paymentRequest(a rail.Adapter, p rail.Payment) (r rail.Request, err error) {
	defer func() {
		if v := recover(); v != nil {
			r, err = rail.Request{}, fmt.Errorf("the %s adapter panicked: %v", a.Protocol(), v)
		}
	}()
	return a.PaymentRequest(p)
}

// readAnswer is a.ReadAnswer(p, r); an adapter that panics has not understood
// the reply — which may still mean money moved, so the call is ambiguous, the
// row TIMEOUT, never a process gone with its intent unresolved.
func readAnswer(a rail.Adapter, p rail.Payment, r rail.Reply) (ans rail.Answer) {
	defer func() {
		if v := recover(); v != nil {
			ans = rail.Answer{Verdict: rail.NotUnderstood, Why: fmt.Sprintf("the %s adapter panicked: %v", a.Protocol(), v)}
		}
	}()
	return a.ReadAnswer(p, r)
}

// safely is f, called off the payment path, with an adapter's panic made an
// error.
func safely[T any](a rail.Adapter, f func() (T, error)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			var zero T
			v, err = zero, fmt.Errorf("the %s adapter panicked: %v", a.Protocol(), r)
		}
	}()
	return f()
}

func whyOr(why, otherwise string) string {
	if why == "" {
		return otherwise
	}
	return why
}

// setRequestURI sets req's URI to base followed by path without building the
// string: the bytes are copied into req's own buffer. Not inlined, so that its
// buffer is not part of Pay's frame, which a call holds while the rail answers
// (TestInflightSubmissionsKeepSmallStacks).
//
//go:noinline
func setRequestURI(req *fasthttp.Request, base, path string) {
	var buf [256]byte
	req.SetRequestURIBytes(append(append(buf[:0], base...), path...))
}

// contentType is a reply's Content-Type as a string, without allocating one for
// the types rails answer with.
func contentType(b []byte) string {
	switch {
	case len(b) == 0:
		return ""
	case bytes.Equal(b, []byte("application/json")):
		return "application/json"
	case bytes.Equal(b, []byte("application/xml")):
		return "application/xml"
	case bytes.Equal(b, []byte("application/json; charset=utf-8")):
		return "application/json; charset=utf-8"
	case bytes.Equal(b, []byte("application/xml; charset=utf-8")):
		return "application/xml; charset=utf-8"
	case bytes.Equal(b, []byte("text/xml")):
		return "text/xml"
	}
	return string(b)
}

// hopState is what a round trip came to, besides its error (which wraps
// errConnectBound or errReadTimeout when a deadline ended it): whether a
// connection was obtained, whether it was a reused one, whether any byte of
// the reply arrived, and whether the rail refused the TLS handshake of a fresh
// connection after the request was written (handshakeAlert).
type hopState struct {
	gotConn   bool
	reused    bool
	replyByte bool
	refused   bool
}

// roundTrip sends req once on one connection and reads the reply into a
// response it acquires once the reply has begun, which the caller releases
// (nil when no reply was read). It takes req and releases it once written.
// ctx ends it early as Pay says; a ctx that is never done costs one call of
// its Done.
func (c *railClient) roundTrip(ctx context.Context, req *fasthttp.Request, start time.Time) (*fasthttp.Response, hopState, error) {
	var st hopState
	reqHeld := true
	defer func() {
		if reqHeld {
			fasthttp.ReleaseRequest(req)
		}
	}()
	if c.hop == nil {
		return nil, st, errors.New("rail client not configured")
	}
	endable := ctx.Done() != nil
	if endable {
		if err := ctx.Err(); err != nil {
			// No connection taken: nothing left the proxy.
			return nil, st, fmt.Errorf("rail call not started: %w", err)
		}
	}
	noReuse := c.idleTimeout == 0
	phaseOne := start.Add(c.connectTimeout)
	// Taking a connection writes nothing. A pooled one idle for longer than
	// RAIL_IDLE_CONN_TIMEOUT (the pool's cleaner runs on its own clock) is closed
	// unused and another taken: the rail may be closing it right now.
	cc, err := c.hop.AcquireConn(c.connectTimeout, noReuse)
	for err == nil && !cc.LastUseTime().IsZero() && time.Since(cc.LastUseTime()) > c.idleTimeout {
		c.hop.CloseConn(cc)
		cc, err = c.hop.AcquireConn(time.Until(phaseOne), noReuse)
	}
	if err != nil {
		// No connection: nothing left the proxy.
		if time.Now().After(phaseOne) {
			err = fmt.Errorf("%w (%v)", errConnectBound, err)
		}
		return nil, st, err
	}
	st.gotConn = true
	// A connection fresh from the dial has never been put back into the pool:
	// it has no last use.
	st.reused = !cc.LastUseTime().IsZero()
	conn := cc.Conn()
	// phase is the bound of the phase the call is in: a deadline that fires is
	// that bound, or ctx's end when ctx has ended.
	phase := errConnectBound
	fail := func(err error) (*fasthttp.Response, hopState, error) {
		c.hop.CloseConn(cc)
		var te interface{ Timeout() bool }
		if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &te) && te.Timeout()) {
			bound := phase
			if endable && ctx.Err() != nil {
				bound = ctx.Err()
			}
			err = fmt.Errorf("%w (%v)", bound, err)
		}
		return nil, st, err
	}
	// ctx's end moves the connection's deadlines to the past, so that the write
	// or read in progress fails as a bound would. context.AfterFunc does that
	// once; a deadline set below after ctx has ended is therefore moved to the
	// past again at once.
	var stop func() bool
	if endable {
		stop = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(pastDeadline) })
		defer stop()
	}

	// Phase one, continued: the request written before RAIL_CONNECT_TIMEOUT
	// from the start, or the call ends (ambiguous: part of it may be out).
	if err := conn.SetWriteDeadline(phaseOne); err != nil {
		return fail(err)
	}
	if endable && ctx.Err() != nil {
		_ = conn.SetDeadline(pastDeadline)
	}
	if noReuse {
		req.SetConnectionClose()
	}
	bw := c.hop.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	c.hop.ReleaseWriter(bw)
	fasthttp.ReleaseRequest(req)
	reqHeld = false
	if err != nil {
		return fail(err)
	}

	// Phase two: from the request written, the whole reply within
	// RAIL_READ_TIMEOUT.
	phase = errReadTimeout
	if err := conn.SetReadDeadline(time.Now().Add(c.readTimeout)); err != nil {
		return fail(err)
	}
	if endable && ctx.Err() != nil {
		_ = conn.SetDeadline(pastDeadline)
	}
	// The first byte of the reply is waited for with no buffer held (a call
	// spends nearly all its life here, and a pooled reader held for that wait
	// is held once per call in flight); the pooled reader is taken once the reply
	// has begun.
	first := &firstByteConn{conn: conn}
	if _, err := conn.Read(first.b[:]); err != nil {
		// Under TLS 1.3 the client's handshake ends with its Finished, so a
		// rail that refuses our certificate says so only now, after the request
		// was written: a handshake-class alert on a connection that never
		// carried a request before means the rail's application never had it.
		// On a reused connection the handshake was long accepted: no such rule.
		if a, ok := handshakeAlert(err); ok && !st.reused {
			st.refused = true
			c.hop.CloseConn(cc)
			return nil, st, refusedError(a, err)
		}
		return fail(err)
	}
	st.replyByte = true
	first.has = true
	br := acquireHopReader(first)
	defer releaseHopReader(br)
	resp := fasthttp.AcquireResponse()
	if err := resp.ReadLimitBody(br, maxRailReply); err != nil {
		fasthttp.ReleaseResponse(resp)
		if errors.Is(err, fasthttp.ErrBodyTooLarge) {
			c.hop.CloseConn(cc)
			return nil, st, errReplyTooLarge
		}
		return fail(err)
	}
	// A connection whose deadlines ctx's end may be moving right now is not
	// handed on to another call.
	if noReuse || resp.ConnectionClose() || br.Buffered() > 0 || first.has || (endable && !stop()) {
		// Bytes beyond the reply are not ours to keep on a connection.
		c.hop.CloseConn(cc)
	} else {
		c.hop.ReleaseConn(cc)
	}
	return resp, st, nil
}

// pastDeadline is a deadline already passed: set on a connection, it fails the
// read or write in progress at once.
var pastDeadline = time.Unix(1, 0)

// firstByteConn reads the byte already taken off conn, then conn.
type firstByteConn struct {
	conn net.Conn
	b    [1]byte
	has  bool
}

func (f *firstByteConn) Read(p []byte) (int, error) {
	if f.has && len(p) > 0 {
		f.has = false
		p[0] = f.b[0]
		return 1, nil
	}
	return f.conn.Read(p)
}

var hopReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, railHopBuffer) }}

func acquireHopReader(r io.Reader) *bufio.Reader {
	br := hopReaders.Get().(*bufio.Reader)
	br.Reset(r)
	return br
}

func releaseHopReader(br *bufio.Reader) {
	br.Reset(nil)
	hopReaders.Put(br)
}

// railHopBuffer is the size of a connection's pooled read and write buffers:
// the rail's reply headers must fit in it (4 KiB, fasthttp's default).
const railHopBuffer = 4 << 10

// newRailHop builds the HostClient of the payment hop from the settings and
// the hop's TLS configuration (nil: a host name verified, as the URL says).
func newRailHop(cfg Config, tc *tls.Config) *fasthttp.HostClient {
	u, err := url.Parse(cfg.RailBaseURL)
	if err != nil || u.Host == "" {
		// Config.Validate refuses such a URL; a zero client fails every call UNSENT.
		u = &url.URL{Scheme: "http", Host: "rail.invalid"}
	}
	isTLS := u.Scheme == "https"
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if isTLS {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	dial := cfg.RailDial
	if dial == nil {
		dial = (&net.Dialer{Timeout: cfg.RailConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	connect := cfg.RailConnectTimeout
	// One configuration for every connection (crypto/tls never changes it), so
	// its session cache is shared: a new connection resumes the last session.
	// go-spiffe's callbacks in it ask the identity at each handshake.
	if tc != nil {
		tc = tc.Clone()
	} else {
		tc = &tls.Config{ClientSessionCache: tls.NewLRUClientSessionCache(64)}
	}
	if tc.ServerName == "" {
		tc.ServerName = u.Hostname()
	}
	tc.NextProtos = []string{"http/1.1"}
	idle := cfg.RailIdleConnTimeout
	if idle <= 0 {
		idle = time.Second // unused: with reuse off every connection is closed after its call
	}
	return &fasthttp.HostClient{
		Addr:  addr,
		IsTLS: isTLS,
		// The dial, TLS handshake included, is part of obtaining the connection:
		// bounded by RAIL_CONNECT_TIMEOUT. A dial error here is what UNSENT is.
		//
		// It runs on a goroutine of its own, which ends with it: the dial is the
		// deepest call a submission makes (net's dialer, then connect), and on
		// the submission's goroutine it would grow that goroutine's stack for
		// good, kept while the goroutine waits for the rail
		// (TestInflightSubmissionsKeepSmallStacks).
		Dial: func(addr string) (net.Conn, error) {
			done := make(chan dialed, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), connect)
				defer cancel()
				c, err := dialHop(ctx, dial, addr, isTLS, tc)
				done <- dialed{c, err}
			}()
			d := <-done
			return d.conn, d.err
		},
		// Unbounded like net/http's transport: a call never waits for another's
		// connection (a wait would be UNSENT time spent for nothing).
		MaxConns:                  math.MaxInt32,
		MaxIdleConnDuration:       idle,
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		ReadBufferSize:            railHopBuffer,
		WriteBufferSize:           railHopBuffer,
		MaxResponseBodySize:       maxRailReply,
		NoDefaultUserAgentHeader:  true,
		ConnPoolStrategy:          fasthttp.LIFO, // the most recently used connection: the least likely to be stale
	}
}

// dialed is what a dial on its own goroutine came to.
type dialed struct {
	conn net.Conn
	err  error
}

// dialHop opens one connection to the rail, with its TLS handshake when isTLS:
// a handshake that fails (the rail's identity refused included) is a dial that
// failed, and nothing was sent.
func dialHop(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr string, isTLS bool, tc *tls.Config) (net.Conn, error) {
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if !isTLS {
		return conn, nil
	}
	c := tls.Client(conn, tc)
	if err := c.HandshakeContext(ctx); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("TLS handshake with the rail: %w", err)
	}
	return c, nil
}

// newRailTransport is the net/http transport of the rail's GET endpoints (health,
// statement), speaking TLS with tc (nil: as the URL says). A GET moves no
// money; still, nothing is retried on purpose.
func newRailTransport(connectTimeout, idleTimeout time.Duration, idle int,
	dial func(ctx context.Context, network, addr string) (net.Conn, error), tc *tls.Config) *http.Transport {
	if dial == nil {
		dial = (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		TLSClientConfig:     tc,
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

// Healthy is the railStub readiness check: the adapter's health request
// (rail-stub: GET {RAIL_BASE_URL}/rail/v1/health) answered 2xx within 1 s, DOWN
// on any failure. A GET here moves no money, so its transport is a separate one.
func (c *railClient) Healthy(ctx context.Context) error {
	if c.adapter == nil {
		return errors.New("rail client not configured")
	}
	ctx, cancel := context.WithTimeout(ctx, HealthTimeout)
	defer cancel()
	hr, err := safely(c.adapter, func() (rail.Request, error) { return c.adapter.HealthRequest(), nil })
	if err != nil {
		return err
	}
	req, err := c.request(ctx, hr)
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

// request is r as a net/http request to the rail, for its GET endpoints.
func (c *railClient) request(ctx context.Context, r rail.Request) (*http.Request, error) {
	var body io.Reader
	if len(r.Body) > 0 {
		body = bytes.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, c.base+r.Path, body)
	if err != nil {
		return nil, err
	}
	if r.ContentType != "" {
		req.Header.Set("Content-Type", r.ContentType)
	}
	if r.Accept != "" {
		req.Header.Set("Accept", r.Accept)
	}
	return req, nil
}

func (c *railClient) close() {
	if c.hop != nil {
		c.hop.CloseIdleConnections()
	}
	c.health.CloseIdleConnections()
}
