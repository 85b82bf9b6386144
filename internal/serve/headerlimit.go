package serve

import (
	"bytes"
	"fmt"
	"net"
	"net/http"

	"lock.dev/lockapi"
)

// MaxHeaderBytes bounds a request's head — its request line and header fields,
// up to the blank line — on every service, whichever HTTP server it runs
// (docs/contracts/README.md, HTTP conventions). A larger head is answered 400
// INVALID_REQUEST with the fault "headers", as problem+json, and the connection
// is closed. 8 KiB is the common bound of HTTP servers and proxies; the
// project's own requests carry well under 1 KiB of headers (a grant is about
// 300 bytes).
//
// fasthttp (rail-proxy, rail-stub) needs the head to fit in its per-connection
// read buffer, which is therefore this size. net/http (the other services)
// reads up to its MaxHeaderBytes plus a fixed 4096 bytes of bufio slop before
// it refuses, so it is given MaxHeaderBytes−4096 to refuse at the same size.
const MaxHeaderBytes = 8 << 10

// netHTTPSlop is what net/http reads beyond Server.MaxHeaderBytes before it
// refuses a head as too large.
const netHTTPSlop = 4096

// HeadersFault is the one fault of a head over MaxHeaderBytes, whichever server
// refused it.
func HeadersFault() lockapi.FieldError {
	return lockapi.FieldError{Field: "headers", Problem: fmt.Sprintf("the request line and headers must fit in %d bytes", MaxHeaderBytes)}
}

// netHTTPTooLarge is the answer net/http writes, itself and on the raw
// connection, to a head over its limit: 431 in text/plain, not problem+json.
// No hook lets a handler answer instead, so the connection rewrites it.
const netHTTPTooLarge = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"

// headLimitListener hands net/http connections that answer a head over the
// limit as the fasthttp servers do (400 INVALID_REQUEST, fault "headers").
type headLimitListener struct {
	net.Listener
	answer []byte
}

func newHeadLimitListener(ln net.Listener) net.Listener {
	w := &rawWriter{header: http.Header{}}
	lockapi.WriteInvalid(w, http.StatusBadRequest, []lockapi.FieldError{HeadersFault()})
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", w.status, http.StatusText(w.status))
	w.header.Set("Connection", "close")
	w.header.Set("Content-Length", fmt.Sprint(w.body.Len()))
	_ = w.header.Write(&b)
	b.WriteString("\r\n")
	b.Write(w.body.Bytes())
	return &headLimitListener{Listener: ln, answer: b.Bytes()}
}

func (l *headLimitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &headLimitConn{Conn: c, answer: l.answer}, nil
}

// headLimitConn passes everything through but net/http's own 431, which it
// replaces with answer. Only net/http writes those exact bytes in one write; a
// handler's answer always carries a Date header and is never equal to them.
type headLimitConn struct {
	net.Conn
	answer []byte
}

func (c *headLimitConn) Write(p []byte) (int, error) {
	if len(p) == len(netHTTPTooLarge) && string(p) == netHTTPTooLarge {
		if _, err := c.Conn.Write(c.answer); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// NetConn is the connection beneath: a mutual-TLS connection's peer is named
// from it (identity.PeerID).
func (c *headLimitConn) NetConn() net.Conn { return c.Conn }

// CloseWrite keeps net/http's half-close after such an answer (it lets the
// client read the answer before the connection goes).
func (c *headLimitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// rawWriter records one answer.
type rawWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *rawWriter) Header() http.Header         { return w.header }
func (w *rawWriter) WriteHeader(status int)      { w.status = status }
func (w *rawWriter) Write(p []byte) (int, error) { return w.body.Write(p) }
