package serve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/fastserve"
	"lock.dev/internal/serve"
)

// Both servers every service runs — net/http (lock-server, payment-resource,
// executor, reconciler) and fasthttp (rail-proxy, rail-stub) — take a request
// head just under serve.MaxHeaderBytes and refuse one just over it the same
// way: 400 problem+json INVALID_REQUEST with the one fault "headers", the
// handler never run.
func TestOneHeaderLimitAnsweredAlike(t *testing.T) {
	servers := map[string]func(context.Context, net.Listener, http.Handler, *serve.Health, *slog.Logger) error{
		"net/http": serve.Serve,
		"fasthttp": fastserve.ServeFast,
	}
	for name, run := range servers {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			var served atomic.Int32
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				served.Add(1)
				w.WriteHeader(http.StatusNoContent)
			})
			go func() { done <- run(ctx, ln, h, serve.NewHealth(), slog.New(slog.DiscardHandler)) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("serve: %v", err)
				}
			})
			head := func(size int) string {
				const start = "GET /x HTTP/1.1\r\nHost: h\r\nX-Pad: "
				const end = "\r\n\r\n"
				return start + strings.Repeat("a", size-len(start)-len(end)) + end
			}
			for _, c := range []struct {
				size   int
				status int
			}{
				{serve.MaxHeaderBytes - 64, http.StatusNoContent},
				{serve.MaxHeaderBytes + 64, http.StatusBadRequest},
				{4 * serve.MaxHeaderBytes, http.StatusBadRequest},
			} {
				resp, body := roundTrip(t, ln.Addr().String(), head(c.size))
				if resp.StatusCode != c.status {
					t.Errorf("a %d-byte head: %d %s, want %d", c.size, resp.StatusCode, body, c.status)
					continue
				}
				if c.status != http.StatusBadRequest {
					continue
				}
				var p struct {
					Status int    `json:"status"`
					Code   string `json:"code"`
					Errors []struct{ Field, Problem string }
				}
				if err := json.Unmarshal(body, &p); err != nil || resp.Header.Get("Content-Type") != "application/problem+json" ||
					p.Status != 400 || p.Code != "INVALID_REQUEST" || len(p.Errors) != 1 || p.Errors[0].Field != "headers" ||
					!strings.Contains(p.Errors[0].Problem, "8192 bytes") {
					t.Errorf("a %d-byte head: %s %s, want problem+json INVALID_REQUEST with the fault headers", c.size, resp.Header.Get("Content-Type"), body)
				}
			}
			if n := served.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want once (the head under the limit)", n)
			}
		})
	}
}

// roundTrip sends raw on a new connection and reads one answer.
func roundTrip(t *testing.T, addr, raw string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}
