package fastserve

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A connection on which no whole request arrives within the read timeout is
// closed without an answer, as net/http closes it: an unsolicited 400 on a
// client's spare pooled connection would be read as the answer to the next
// request the client sends on it, a request the server never read. A request
// that cannot be parsed still gets its problem document.
func TestReadTimeoutClosesWithoutAnswer(t *testing.T) {
	t.Parallel()
	srv := NewFastServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}), slog.New(slog.NewJSONHandler(io.Discard, nil)))
	srv.ReadTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })

	exchange := func(t *testing.T, send string) (string, time.Duration) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		if send != "" {
			if _, err := io.WriteString(c, send); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("reading: %v (got %q)", err, got)
		}
		return string(got), time.Since(start)
	}

	for _, c := range []struct{ name, send string }{
		{"nothing sent on a new connection", ""},
		{"headers never finished", "POST /v1/rail/submissions HTTP/1.1\r\nHost: x\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, took := exchange(t, c.send)
			if got != "" {
				t.Fatalf("the server answered a request it never read: %q", got)
			}
			if took < 250*time.Millisecond {
				t.Fatalf("closed after %s, before the read timeout", took)
			}
		})
	}

	t.Run("kept-alive connection idle past the read timeout", func(t *testing.T) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("first request: %v %v", resp, err)
		}
		_ = resp.Body.Close()
		// Nothing more is sent: the idle connection stays open (IdleTimeout, 60 s),
		// and nothing unsolicited arrives on it.
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if b, err := br.ReadByte(); err == nil {
			t.Fatalf("unsolicited byte %q on an idle connection", b)
		}
	})

	// A request the server cannot read is still answered with the INVALID_REQUEST
	// shape: 400 (never 431, which the contract does not have) and the faults listed.
	for _, c := range []struct{ name, send, field string }{
		{"malformed request still answered", "NOT-HTTP\r\n\r\n", "request"},
		{"headers over the read buffer", "POST /v1/rail/submissions HTTP/1.1\r\nHost: x\r\nX-Big: " +
			strings.Repeat("a", 2*serverReadBuffer) + "\r\n\r\n", "headers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, _ := exchange(t, c.send)
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
			if err != nil {
				t.Fatalf("answer %q: %v", got, err)
			}
			var p struct {
				Status int    `json:"status"`
				Code   string `json:"code"`
				Errors []struct {
					Field, Problem string
				} `json:"errors"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Fatalf("answer %q: %v", got, err)
			}
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" ||
				p.Status != 400 || p.Code != "INVALID_REQUEST" || len(p.Errors) != 1 || p.Errors[0].Field != c.field {
				t.Fatalf("answer: %q", got)
			}
		})
	}
}
