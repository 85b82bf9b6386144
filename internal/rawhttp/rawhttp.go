// Package rawhttp sends one HTTP/1.1 request the way most clients send one — the
// whole request written before the answer is read — on a connection of its own,
// from a send buffer the size a client across a network has in flight. Tests use
// it to check that a server's answer to a body it refuses survives the
// connection's close (no reset in its place).
package rawhttp

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// SendWhole sends method rawURL with header h and body (chunked: with no
// Content-Length) and returns the answer's status, header and body. The whole
// exchange is bounded by 30 s.
func SendWhole(method, rawURL string, h http.Header, body []byte, chunked bool) (int, http.Header, []byte, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, nil, nil, err
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		return 0, nil, nil, err
	}
	defer conn.Close()
	// Not the megabytes loopback allows: the body cannot all be handed to the
	// kernel before the server reads it.
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(32 << 10)
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(r) // unknown length: sent chunked
	}
	req, err := http.NewRequest(method, rawURL, r)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header = h.Clone()
	if err := req.Write(conn); err != nil {
		return 0, nil, nil, fmt.Errorf("writing the request: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("reading the answer: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("reading the answer: %w", err)
	}
	return resp.StatusCode, resp.Header, b, nil
}
