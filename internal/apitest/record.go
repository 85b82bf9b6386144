package apitest

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
)

// recorder passes an answer through to the real writer and keeps a copy.
type recorder struct {
	inner    http.ResponseWriter
	header   http.Header
	status   int
	body     bytes.Buffer
	hijacked bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
	r.inner.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.inner.Write(b)
	r.body.Write(b[:n]) // what the client got: net/http refuses a body on 204 and 304
	return n, err
}

// Hijack lets a handler drop the connection (rail-stub's chaos does): there is
// then no answer to check.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(r.inner).Hijack()
	if err == nil {
		r.hijacked = true
	}
	return conn, rw, err
}

func (r *recorder) Flush() { _ = http.NewResponseController(r.inner).Flush() }

// Unwrap lets http.ResponseController reach the real writer's deadlines.
func (r *recorder) Unwrap() http.ResponseWriter { return r.inner }
