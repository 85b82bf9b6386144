package fastserve

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"lock.dev/internal/jsonbody"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// A request whose body is over lockapi.MaxBodyBytes is not read by fasthttp: it
// calls the ErrorHandler instead of the handler. The contract still wants the answer the
// handler would give — content type (415) before size (413), and a route that
// takes no body answering as it always does — so the request is served all the
// same, with a body that cannot be read (refusedBody), and its bytes are thrown
// away afterwards (drainRefused).

// serveRefused serves the request of fc, whose body fasthttp refused as too
// large, and drains that body. saved is the copy of its header when it was
// chunked (fasthttp has reset the request by then). It reports false when the
// header is lost, and the caller answers from the body's size alone.
func serveRefused(fc *fasthttp.RequestCtx, h http.Handler, logger *slog.Logger, saved *fasthttp.RequestHeader) bool {
	if len(fc.Request.Header.RawHeaders()) == 0 {
		if saved == nil {
			return false
		}
		saved.CopyTo(&fc.Request.Header)
	}
	serveHTTP(fc, h, logger, true)
	drainRefused(fc.Conn(), fc.Request.Header.ContentLength())
	fc.SetConnectionClose()
	return true
}

// refusedBody is the body of a request fasthttp refused to read: reading it fails
// as a read through http.MaxBytesReader fails past its limit, which
// jsonbody.ReadJSONBody answers 413.
type refusedBody struct{}

func (refusedBody) Read([]byte) (int, error) {
	return 0, &http.MaxBytesError{Limit: lockapi.MaxBodyBytes}
}

func (refusedBody) Close() error { return nil }

// drainRefused reads and throws away the rest of a refused body, at most
// jsonbody.MaxDrainBytes of it and within the body's read bound, so that closing
// the connection after the answer does not reset it and discard the answer (see
// jsonbody.MaxDrainBytes; a body announced larger is not read). contentLength is
// -1 for a chunked body.
//
// fasthttp had read past the headers into the connection's buffer and let the
// buffer go with the request, so up to a buffer's worth of the body never comes
// again: once all but that much has come (or at any point of a chunked body,
// whose end cannot be counted), a read that waits drainIdle with nothing arriving
// ends the drain. A chunked body ends sooner, at its last chunk. drainIdle is long
// against a client that has all of its body in hand: its last bytes are in its
// kernel's send buffer by then, or need only its writing goroutine to run once.
func drainRefused(c net.Conn, contentLength int) {
	if c == nil || contentLength > jsonbody.MaxDrainBytes {
		return
	}
	end := time.Now().Add(serve.ReadTimeout - serve.ReadHeaderTimeout)
	buf := make([]byte, 32<<10)
	for n := 0; n < jsonbody.MaxDrainBytes; {
		deadline := end
		if idle := time.Now().Add(drainIdle); (contentLength < 0 || n >= contentLength-serverReadBuffer) && idle.Before(end) {
			deadline = idle
		}
		_ = c.SetReadDeadline(deadline)
		k, err := c.Read(buf)
		n += k
		if err != nil || (contentLength >= 0 && n >= contentLength) || (contentLength < 0 && bytes.HasSuffix(buf[:k], lastChunk)) {
			return
		}
	}
}

// lastChunk ends a chunked body that has no trailer.
var lastChunk = []byte("\r\n0\r\n\r\n")

const drainIdle = 250 * time.Millisecond

// chunkedHeaders keeps a copy of the header of each chunked request while fasthttp
// reads its body. When a chunked body runs past MaxRequestBodySize, fasthttp
// resets the whole request, header included, before it calls the ErrorHandler,
// and the answer the contract gives depends on the route and the content type. A request
// with a Content-Length over the limit keeps its header and needs no copy.
//
// A copy is taken back when the handler or the ErrorHandler runs. One is left
// behind only when the client went away in the middle of the body; the set keeps
// at most maxChunkedHeaders, so those cannot pile up, and a request whose copy
// was pushed out is answered 413 from its size alone.
type chunkedHeaders struct {
	mu sync.Mutex
	m  map[*fasthttp.RequestHeader]*fasthttp.RequestHeader
}

const maxChunkedHeaders = 64

// keep copies h if its request is chunked.
func (c *chunkedHeaders) keep(h *fasthttp.RequestHeader) {
	if h.ContentLength() != -1 {
		return
	}
	cp := &fasthttp.RequestHeader{}
	h.CopyTo(cp)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[*fasthttp.RequestHeader]*fasthttp.RequestHeader)
	}
	if _, ok := c.m[h]; !ok && len(c.m) >= maxChunkedHeaders {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[h] = cp
}

// take removes and returns the copy kept for h, or nil.
func (c *chunkedHeaders) take(h *fasthttp.RequestHeader) *fasthttp.RequestHeader {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp := c.m[h]
	delete(c.m, h)
	return cp
}
