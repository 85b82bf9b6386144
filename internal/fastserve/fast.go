// Package fastserve serves an http.Handler with fasthttp's server. It is the
// server of the services on the payout path: rail-proxy, and rail-stub, which
// stands in for the rail beside it. Every other service serves with net/http
// (internal/serve), and both answer alike.
//
// Why fasthttp: one goroutine per connection and no background reader (net/http
// runs two goroutines per connection), its buffers pooled, and an answer written
// in one write. Every route still runs through the same net/http handlers
// (serve.Handler around the mux: 404/405, panics → 500, request_refused logging),
// handed an *http.Request and an http.ResponseWriter of our own (toHTTPRequest,
// fastWriter) on the connection's own goroutine — fasthttpadaptor is not used: it
// buffers the whole request body (no bound) and runs each handler on a goroutine
// of its own.
//
// The server rules of docs/contracts/README.md (HTTP conventions), as net/http
// has them:
//   - the request headers within 5 s (ReadTimeout, from the first byte), the body
//     within a further 10 s (HeaderReceived), idle connections closed after 60 s;
//   - a body of at most 64 KiB is read whole before the handler runs, and the
//     connection's read buffer goes back to the pool before it runs
//     (ReduceMemoryUsage): a request waiting in its handler — a submission
//     waiting on the rail — holds no read buffer. A streamed body would hold
//     the connection's read buffer until the handler returned;
//   - a larger body is not read: the request still goes through the handler,
//     whose body read fails as over the limit (refusedBody), so the order of the
//     refusals holds unchanged (415 before 413, a route that reads no body
//     answers as it would); the body is then drained within a bound and the
//     connection closed (fastbody.go);
//   - graceful drain: no new connections, in-flight requests finish within
//     serve.ShutdownGrace.
//
// What net/http has and this does not: a request's context is not cancelled when
// its client goes away (fasthttp does not watch the connection while the handler
// runs), so a handler that waits learns of it only when it writes.
package fastserve

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"

	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// serverReadBuffer is the per-connection read buffer: a request's head must fit
// in it, so it is the one head limit of every service (serve.MaxHeaderBytes).
const serverReadBuffer = serve.MaxHeaderBytes

// ServeFast serves h on ln until ctx is cancelled, then drains: readiness DOWN,
// no new connections, in-flight requests get serve.ShutdownGrace to finish. It
// returns nil after a clean drain.
func ServeFast(ctx context.Context, ln net.Listener, h http.Handler, health *serve.Health, logger *slog.Logger) error {
	srv := NewFastServer(h, logger)
	health.SetLogger(logger)
	return serve.Until(ctx, ln, health, logger, srv.Serve, srv.ShutdownWithContext, nil)
}

// NewFastServer is the server ServeFast runs, for tests that serve a handler the
// way the binary does.
func NewFastServer(h http.Handler, logger *slog.Logger) *fasthttp.Server {
	srv, _ := newFastServer(h, logger)
	return srv
}

func newFastServer(h http.Handler, logger *slog.Logger) (*fasthttp.Server, *chunkedHeaders) {
	chunked := &chunkedHeaders{}
	return &fasthttp.Server{
		Handler:     fastHandler(h, logger, chunked),
		ReadTimeout: serve.ReadHeaderTimeout,
		HeaderReceived: func(hdr *fasthttp.RequestHeader) fasthttp.RequestConfig {
			chunked.keep(hdr)
			return fasthttp.RequestConfig{ReadTimeout: serve.ReadTimeout - serve.ReadHeaderTimeout}
		},
		IdleTimeout:                   serve.IdleTimeout,
		ReduceMemoryUsage:             true,
		MaxRequestBodySize:            lockapi.MaxBodyBytes,
		ReadBufferSize:                serverReadBuffer,
		DisablePreParseMultipartForm:  true,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		DisableHeaderNamesNormalizing: true, // toHTTPRequest canonicalises, as net/http does
		CloseOnShutdown:               true,
		ErrorHandler:                  fastError(h, logger, chunked),
		Logger:                        fastLogger{logger},
	}, chunked
}

// fastLogger sends fasthttp's own messages to the service's log.
type fastLogger struct{ l *slog.Logger }

func (f fastLogger) Printf(format string, args ...any) {
	f.l.Warn("http server: " + fmt.Sprintf(format, args...))
}

// fastError answers a request fasthttp did not hand to the handler. A body over
// MaxRequestBodySize still goes through the handler (serveRefused). A read that
// timed out gets no answer, as under net/http: fasthttp would answer it 400 even
// on a new connection on which nothing arrived within ReadTimeout (a client's
// spare pooled connection), and a client sending its request at that moment
// would take the 400 for the answer to a request the server never read. A
// request fasthttp could not read (malformed, headers too large) is answered as
// problem+json, like every other refusal. fasthttp writes whatever this leaves
// in the response, then closes the connection.
func fastError(h http.Handler, logger *slog.Logger, chunked *chunkedHeaders) func(*fasthttp.RequestCtx, error) {
	return func(fc *fasthttp.RequestCtx, err error) {
		saved := chunked.take(&fc.Request.Header)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			_ = fc.Conn().Close()
			return
		}
		if errors.Is(err, fasthttp.ErrBodyTooLarge) && serveRefused(fc, h, logger, saved) {
			return
		}
		// INVALID_REQUEST is 400, 413 or 415 and always lists its faults
		// (docs/contracts/README.md, HTTP conventions):
		// headers too large for the read buffer are a 400 fault of the headers
		// (not net/http's 431, which the contract does not have).
		status, fault := http.StatusBadRequest, lockapi.FieldError{Field: "request", Problem: "could not be read as HTTP/1.1"}
		var small *fasthttp.ErrSmallBuffer
		switch {
		case errors.As(err, &small):
			fault = serve.HeadersFault()
			// The rest of the request is still on its way or unread: closing on
			// it would reset the connection, and a reset can discard the answer
			// in the client's receive queue. Read a bounded amount first, as
			// jsonbody does for an oversized body.
			drainConn(fc.Conn())
		case errors.Is(err, fasthttp.ErrBodyTooLarge):
			// Only when the header of a chunked request is lost (see
			// chunkedHeaders): the body alone decides.
			status, fault = http.StatusRequestEntityTooLarge, lockapi.FieldError{Field: "body", Problem: fmt.Sprintf("must be at most %d bytes", lockapi.MaxBodyBytes)}
			drainRefused(fc.Conn(), -1)
		}
		w := &fastWriter{fc: fc}
		lockapi.WriteInvalid(w, status, []lockapi.FieldError{fault})
		fc.SetConnectionClose()
	}
}

// drainConn reads and discards what the client is still sending, at most
// drainLimit bytes or for drainWait, whichever ends first.
func drainConn(c net.Conn) {
	if c == nil {
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(drainWait))
	_, _ = io.CopyN(io.Discard, c, drainLimit)
}

const (
	drainLimit = 64 << 10
	drainWait  = 500 * time.Millisecond
)

// fastHandler runs h for each request on the connection's goroutine.
func fastHandler(h http.Handler, logger *slog.Logger, chunked *chunkedHeaders) fasthttp.RequestHandler {
	return func(fc *fasthttp.RequestCtx) {
		// A chunked body read whole leaves a length of -1, or 0 when it was empty.
		if fc.Request.Header.ContentLength() <= 0 {
			chunked.take(&fc.Request.Header) // its body was read: no copy is needed
		}
		serveHTTP(fc, h, logger, false)
	}
}

// serveHTTP runs h for the request of fc; refused: its body was over the limit and
// not read.
func serveHTTP(fc *fasthttp.RequestCtx, h http.Handler, logger *slog.Logger, refused bool) {
	w := &fastWriter{fc: fc}
	defer func() {
		// Handler answers a handler's panic 500; what reaches here
		// (http.ErrAbortHandler, or a panic in Handler itself) ends the
		// connection, as net/http would.
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				logger.Error("handler panic", "method", string(fc.Method()), "panic", fmt.Sprint(v))
			}
			fc.Response.Reset()
			fc.SetStatusCode(http.StatusInternalServerError)
			fc.SetConnectionClose()
		}
	}()
	r, err := toHTTPRequest(fc, refused)
	if err != nil {
		lockapi.WriteInvalid(w, http.StatusBadRequest, []lockapi.FieldError{{Field: "target", Problem: "is not a valid request URI"}})
		return
	}
	h.ServeHTTP(w, r)
	w.finish()
}

// toHTTPRequest is the *http.Request of fc as net/http's server would build it:
// every header line, in order, under its canonical name (a repeated header keeps
// all its values — a second Content-Type or fencing header is refused), Host
// apart, and the body fasthttp read (refusedBody when it refused to read it).
func toHTTPRequest(fc *fasthttp.RequestCtx, refused bool) (*http.Request, error) {
	uri := string(fc.RequestURI())
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, err
	}
	r := &http.Request{
		Method:     methodString(fc.Method()),
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, 8),
		Host:       string(fc.Host()),
		RequestURI: uri,
		RemoteAddr: fc.RemoteAddr().String(),
	}
	if !fc.Request.Header.IsHTTP11() {
		r.Proto, r.ProtoMinor = "HTTP/1.0", 0
	}
	// A mutual-TLS connection (identity.NewListener) hands its state, computed
	// once per connection, to every request on it, as net/http would; without
	// it r.TLS stays nil and a service that requires a peer refuses the caller.
	if sc, ok := fc.Conn().(interface{ TLSState() *tls.ConnectionState }); ok {
		r.TLS = sc.TLSState()
	}
	parseRawHeaders(fc.Request.Header.RawHeaders(), r.Header)
	delete(r.Header, "Host")
	switch n := fc.Request.Header.ContentLength(); {
	case n >= 0:
		r.ContentLength = int64(n)
	case n == -1: // chunked
		r.ContentLength = -1
		r.TransferEncoding = []string{"chunked"}
	}
	switch {
	case refused:
		r.Body = refusedBody{}
	case r.ContentLength == 0:
		r.Body = http.NoBody
	default:
		r.Body = io.NopCloser(bytes.NewReader(fc.Request.Body()))
	}
	return r, nil
}

// methodString avoids an allocation for the methods the API has.
func methodString(m []byte) string {
	switch string(m) {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodPost:
		return http.MethodPost
	case http.MethodPut:
		return http.MethodPut
	case http.MethodHead:
		return http.MethodHead
	case http.MethodDelete:
		return http.MethodDelete
	}
	return string(m)
}

// parseRawHeaders adds every "Name: value" line of raw (the header block as
// received, request line excluded) to h, the name canonicalised and the value
// trimmed of surrounding blanks, as net/textproto does.
func parseRawHeaders(raw []byte, h http.Header) {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimRight(line, "\r")
		k, v, ok := bytes.Cut(line, []byte{':'})
		if !ok || len(k) == 0 {
			continue
		}
		key := http.CanonicalHeaderKey(string(k))
		h[key] = append(h[key], string(bytes.Trim(v, " \t")))
	}
}

// fastWriter is the http.ResponseWriter of one request: the status and headers
// go to fasthttp's response when the handler writes, the body is buffered, and
// fasthttp writes the whole answer at once when the handler returns — unless the
// handler hijacked the connection.
type fastWriter struct {
	fc     *fasthttp.RequestCtx
	header http.Header
	wrote  bool
}

func (w *fastWriter) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header, 4)
	}
	return w.header
}

func (w *fastWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	w.fc.SetStatusCode(status)
	for k, vs := range w.header {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection":
			// fasthttp frames the answer itself.
			continue
		case "Content-Type":
			if len(vs) > 0 {
				w.fc.Response.Header.SetContentType(vs[0])
			}
			continue
		}
		for _, v := range vs {
			w.fc.Response.Header.Add(k, v)
		}
	}
}

func (w *fastWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.fc.Response.AppendBody(b)
	return len(b), nil
}

// Hijack hands the handler the connection (http.Hijacker, which
// http.ResponseController uses): fasthttp then writes no answer on it and closes
// it once the handler has returned. Bytes fasthttp had already read past this
// request (a pipelined next one) are not in the returned reader.
func (w *fastWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c := w.fc.Conn()
	if c == nil {
		return nil, nil, errors.New("no connection to hijack")
	}
	w.fc.HijackSetNoResponse(true)
	w.fc.Hijack(func(net.Conn) {})
	return c, bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c)), nil
}

// finish answers 200 with no body when the handler wrote nothing, as net/http does.
func (w *fastWriter) finish() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
}
