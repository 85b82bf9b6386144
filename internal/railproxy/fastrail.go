package railproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"lock.dev/lockapi"
)

// The payment hop on fasthttp. fasthttp.HostClient pools the connections, dials
// through dialRail and lends its pooled buffers; Request.Write and
// Response.ReadLimitBody frame HTTP/1.1. The round trip itself (roundTrip) is
// written out here, with fasthttp's exported parts, instead of going through
// HostClient.Do, for three reasons that docs/contracts/rail-proxy.md guarantees:
//
//   - Exactly one forward. HostClient.Do is a retry loop (for a POST it stops
//     after one attempt unless a RetryIf says otherwise); roundTrip has no loop
//     around the request at all. The only thing ever repeated is taking a
//     connection from the pool — before a byte is written, when the one taken has
//     been idle longer than RAIL_IDLE_CONN_TIMEOUT and is closed unused.
//   - UNSENT only when no connection was obtained: AcquireConn failing (the dial
//     failed or ran out of RAIL_CONNECT_TIMEOUT) is the one UNSENT path. From the
//     moment a connection is held, every failure is ambiguous.
//   - Two bounds, one after the other: obtaining the connection and writing the
//     request within RAIL_CONNECT_TIMEOUT of the call's start (the dial's own
//     bound, then the write deadline); from the request written, the whole reply
//     within RAIL_READ_TIMEOUT (one read deadline for headers and body).
//
// The hop's retry settings are still set to "never" (MaxIdemponentCallAttempts 1,
// RetryIfErr false), so that nobody who later calls HostClient.Do on it gets a
// retry by default.

// railHopBuffer is the size of a connection's pooled read and write buffers:
// the rail's reply headers must fit in it (4 KiB, fasthttp's default).
const railHopBuffer = 4 << 10

// newRailHop builds the HostClient of the payment hop from the settings.
func newRailHop(cfg Config) *fasthttp.HostClient {
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
	serverName := u.Hostname()
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
		// It runs on a goroutine of its own, which ends with it. The dial is the
		// deepest call a submission makes (net's dialer, then connect), and on
		// the submission's goroutine it grew that goroutine's stack from 8 to
		// 16 KiB for good — kept while the goroutine waits for the rail, 2,000
		// times over in the bench's burst of new accounts.
		Dial: func(addr string) (net.Conn, error) {
			done := make(chan dialed, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), connect)
				defer cancel()
				c, err := dialHop(ctx, dial, addr, isTLS, serverName)
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

// dialHop opens one connection to the rail, with its TLS handshake when isTLS.
func dialHop(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr string, isTLS bool, serverName string) (net.Conn, error) {
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if !isTLS {
		return conn, nil
	}
	tc := tls.Client(conn, &tls.Config{ServerName: serverName, NextProtos: []string{"http/1.1"}})
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return tc, nil
}

// hopState is what a round trip came to, besides its error (which wraps
// errConnectBound or errReadTimeout when a deadline ended it): whether a
// connection was obtained, whether it was a reused one, and whether any byte of
// the reply arrived.
type hopState struct {
	gotConn   bool
	reused    bool
	replyByte bool
}

// roundTrip sends req once on one connection and reads the reply into a
// response it acquires once the reply has begun, which the caller releases
// (nil when no reply was read). It takes req and releases it once written.
func (c *railClient) roundTrip(req *fasthttp.Request, start time.Time) (*fasthttp.Response, hopState, error) {
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
	// that bound.
	phase := errConnectBound
	fail := func(err error) (*fasthttp.Response, hopState, error) {
		c.hop.CloseConn(cc)
		var te interface{ Timeout() bool }
		if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &te) && te.Timeout()) {
			err = fmt.Errorf("%w (%v)", phase, err)
		}
		return nil, st, err
	}

	// Phase one, continued: the request written before RAIL_CONNECT_TIMEOUT
	// from the start, or the call ends (ambiguous: part of it may be out).
	if err := conn.SetWriteDeadline(phaseOne); err != nil {
		return fail(err)
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
	// The first byte of the reply is waited for with no buffer held (a call
	// spends nearly all its life here: with 2,000 in flight, 4 KiB each is 8 MiB);
	// the pooled reader is taken once the reply has begun.
	first := &firstByteConn{conn: conn}
	if _, err := conn.Read(first.b[:]); err != nil {
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
	if noReuse || resp.ConnectionClose() || br.Buffered() > 0 || first.has {
		// Bytes beyond the reply are not ours to keep on a connection.
		c.hop.CloseConn(cc)
	} else {
		c.hop.ReleaseConn(cc)
	}
	return resp, st, nil
}

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

// Pay presents one payment to the rail, once. The caller's context is not used
// for cancellation: an admitted payment is carried through to its answer (or its
// bounds) even when the caller has gone away.
//
// UNSENT is decided by whether a connection was obtained, never by an error's
// text: no connection means no byte of the request left the proxy. Once a
// connection was obtained, every failure is ambiguous — the request may have
// been written, and the rail may have moved money.
func (c *railClient) Pay(_ context.Context, p railPayment) RailCall {
	start := time.Now()
	done := func(rc RailCall) RailCall {
		rc.Elapsed = time.Since(start)
		return rc
	}
	body, err := json.Marshal(p)
	if err != nil {
		// Nothing was attempted.
		return done(RailCall{Result: RailUnsent, Err: fmt.Errorf("encoding rail payment: %w", err)})
	}
	// The request is released once written and the response taken once the
	// reply has begun (roundTrip): a call waiting for the rail holds neither.
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(c.paymentsURL)
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("Accept", "application/json")
	req.SetBodyRaw(body)

	resp, st, err := c.roundTrip(req, start)
	if resp != nil {
		defer fasthttp.ReleaseResponse(resp)
	}
	switch {
	case err == nil:
	case !st.gotConn:
		return done(RailCall{Result: RailUnsent, Err: err})
	case errors.Is(err, errReplyTooLarge):
		return done(RailCall{Result: RailAmbiguous, Cause: CauseBadResponse, Err: err})
	default:
		cause := CauseConnectionDropped
		if errors.Is(err, errReadTimeout) || errors.Is(err, errConnectBound) {
			cause = CauseTimeout
		}
		return done(RailCall{Result: RailAmbiguous, Cause: cause, Err: err,
			StaleConn: st.reused && !st.replyByte})
	}

	status := resp.StatusCode()
	var r railReply
	bad := func(why string) RailCall {
		return done(RailCall{Result: RailAmbiguous, Cause: CauseBadResponse,
			Err: fmt.Errorf("rail answered %d: %s", status, why)})
	}
	if err := json.Unmarshal(resp.Body(), &r); err != nil {
		return bad("reply is not JSON")
	}
	switch {
	case status == http.StatusOK && r.Status == "ACCEPTED" && r.RailReference != "":
		// An accept whose reference paydb cannot store and show as it is would
		// be answered 200 and then recorded as something else (or not at all):
		// it is no well-formed accept (docs/contracts/rail-proxy.md).
		if p := lockapi.StorableTextProblem(r.RailReference, lockapi.MaxRailReferenceLen); p != "" {
			return bad("railReference " + p)
		}
		return done(RailCall{Result: RailAccepted, RailReference: r.RailReference})
	case status == http.StatusUnprocessableEntity && r.Status == "DECLINED":
		// A decline is a decline with or without its reason; the row records
		// that none was given rather than a NULL that reads like a lost one.
		reason := DeclineUnspecified
		if r.Reason != nil && *r.Reason != "" {
			// The same for a decline: its reason is recorded and answered as
			// given, or the decline is no well-formed one.
			if p := lockapi.StorableTextProblem(*r.Reason, lockapi.MaxDeclineReasonLen); p != "" {
				return bad("reason " + p)
			}
			reason = *r.Reason
		}
		return done(RailCall{Result: RailDeclined, DeclineReason: &reason})
	case status == http.StatusOK:
		return bad("not a well-formed accept")
	case status == http.StatusUnprocessableEntity:
		return bad("not a well-formed decline")
	default:
		return bad("unexpected status")
	}
}

var errReplyTooLarge = fmt.Errorf("rail reply exceeds %d bytes", maxRailReply)
