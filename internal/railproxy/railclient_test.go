package railproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hopConfig is a rail client's configuration for rawRail's URL.
func hopConfig(url string) Config {
	c := DefaultConfig()
	c.RailBaseURL = url
	c.RailConnectTimeout = 500 * time.Millisecond
	c.RailReadTimeout = 500 * time.Millisecond
	return c
}

// rawRail is a TCP server whose every connection is handled by serve, counting
// the connections it accepted.
type rawRail struct {
	URL   string
	mu    sync.Mutex
	conns int
}

func newRawRail(t *testing.T, serve func(conn net.Conn)) *rawRail {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rawRail{URL: "http://" + ln.Addr().String()}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns++
			r.mu.Unlock()
			go func() {
				defer conn.Close()
				serve(conn)
			}()
		}
	}()
	return r
}

func (r *rawRail) connCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns
}

// The payment hop on its own, without paydb: one call, one request on the wire,
// whatever happens to the connection; UNSENT only when no connection was
// obtained; the reply bound.
func TestRailHop(t *testing.T) {
	t.Parallel()
	pay := func(c *railClient, ref string) RailCall {
		return c.Pay(context.Background(), railPayment{Reference: ref, AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}.payment())
	}

	t.Run("a reused connection the rail closes is one request, ambiguous, counted stale", func(t *testing.T) {
		t.Parallel()
		rail := newClosingRail(t) // answers the first request, closes on the second
		c := newRailClient(hopConfig(rail.URL))
		defer c.close()
		if rc := pay(c, "h-1"); rc.Result != RailAccepted {
			t.Fatalf("first: %+v", rc)
		}
		rc := pay(c, "h-2")
		if rc.Result != RailAmbiguous || rc.Cause != CauseConnectionDropped || !rc.StaleConn {
			t.Fatalf("second, on the reused connection: %+v", rc)
		}
		time.Sleep(100 * time.Millisecond)
		n, conns := rail.count("h-2"), rail.connCount()
		if n != 1 || conns != 1 {
			t.Fatalf("the rail read h-2 %d times over %d connections; want exactly once, on the first connection", n, conns)
		}
	})

	t.Run("a fresh connection dropped after the request is ambiguous, not stale", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		read := 0
		rail := newRawRail(t, func(conn net.Conn) {
			if _, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
				mu.Lock()
				read++
				mu.Unlock()
			}
		})
		c := newRailClient(hopConfig(rail.URL))
		defer c.close()
		rc := pay(c, "h-3")
		if rc.Result != RailAmbiguous || rc.Cause != CauseConnectionDropped || rc.StaleConn {
			t.Fatalf("answer: %+v", rc)
		}
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if read != 1 || rail.connCount() != 1 {
			t.Fatalf("the rail read %d requests over %d connections, want 1 over 1", read, rail.connCount())
		}
	})

	t.Run("no reply within the read bound is a timeout", func(t *testing.T) {
		t.Parallel()
		rail := newRawRail(t, func(conn net.Conn) {
			_, _ = http.ReadRequest(bufio.NewReader(conn))
			time.Sleep(2 * time.Second)
		})
		c := newRailClient(hopConfig(rail.URL))
		defer c.close()
		rc := pay(c, "h-4")
		if rc.Result != RailAmbiguous || rc.Cause != CauseTimeout || !errors.Is(rc.Err, errReadTimeout) {
			t.Fatalf("answer: %+v", rc)
		}
		if rc.Elapsed > 1500*time.Millisecond {
			t.Fatalf("the call lasted %s with a 500ms read bound", rc.Elapsed)
		}
	})

	t.Run("a dial that fails is unsent", func(t *testing.T) {
		t.Parallel()
		cfg := hopConfig("http://rail.invalid:8084")
		var dials atomic.Int32
		cfg.RailDial = func(context.Context, string, string) (net.Conn, error) {
			dials.Add(1)
			return nil, errors.New("connect: connection refused (test)")
		}
		c := newRailClient(cfg)
		defer c.close()
		if rc := pay(c, "h-5"); rc.Result != RailUnsent || dials.Load() != 1 {
			t.Fatalf("answer: %+v after %d dials, want UNSENT after exactly one", rc, dials.Load())
		}
	})

	t.Run("a reply over 64 KiB is a bad response", func(t *testing.T) {
		t.Parallel()
		big := `{"status":"ACCEPTED","railReference":"RS-1","pad":"` + strings.Repeat("x", maxRailReply) + `"}`
		rail := newRawRail(t, func(conn net.Conn) {
			if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
				return
			}
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(big), big)
		})
		c := newRailClient(hopConfig(rail.URL))
		defer c.close()
		if rc := pay(c, "h-6"); rc.Result != RailAmbiguous || rc.Cause != CauseBadResponse {
			t.Fatalf("answer: %+v", rc)
		}
	})

	t.Run("the request on the wire", func(t *testing.T) {
		t.Parallel()
		reqs := make(chan *http.Request, 1)
		bodies := make(chan []byte, 1)
		rail := newRawRail(t, func(conn net.Conn) {
			req, err := http.ReadRequest(bufio.NewReader(conn))
			if err != nil {
				return
			}
			b, _ := io.ReadAll(req.Body)
			reqs <- req
			bodies <- b
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 46\r\n\r\n{\"status\":\"ACCEPTED\",\"railReference\":\"RS-777\"}")
		})
		c := newRailClient(hopConfig(rail.URL))
		defer c.close()
		rc := pay(c, "h-7")
		if rc.Result != RailAccepted || rc.RailReference != "RS-777" {
			t.Fatalf("answer: %+v", rc)
		}
		req, body := <-reqs, <-bodies
		if req.Method != http.MethodPost || req.URL.Path != "/rail/v1/payments" || req.Header.Get("Content-Type") != "application/json" ||
			req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != "" {
			t.Fatalf("request: %s %s %v", req.Method, req.URL, req.Header)
		}
		if want := `{"reference":"h-7","accountId":"a","amountMinor":1,"currency":"EUR","beneficiary":"b"}`; !bytes.Equal(body, []byte(want)) {
			t.Fatalf("body %s, want %s", body, want)
		}
	})
}

// Pay's context can end a call sooner than its bounds, and never makes it happen
// twice: a context done before the call opens no connection (UNSENT); one
// cancelled while the rail holds the request ends the call ambiguous
// (interrupted), and one whose deadline passes first ends it ambiguous
// (timeout) — each over exactly one connection. The read bound is one the test
// never reaches, so only the context can end these calls.
func TestPayHonoursItsContext(t *testing.T) {
	t.Parallel()
	payment := railPayment{Reference: "c-1", AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}.payment()
	// holdingRaw is a rail that reads each request, says so on got, and answers
	// nothing until the test ends.
	holdingRaw := func(t *testing.T) (*railClient, *rawRail, <-chan struct{}) {
		got := make(chan struct{}, 4)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		rail := newRawRail(t, func(conn net.Conn) {
			if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
				return
			}
			got <- struct{}{}
			<-release
		})
		cfg := hopConfig(rail.URL)
		cfg.RailReadTimeout = 10 * time.Minute
		c := newRailClient(cfg)
		t.Cleanup(c.close)
		return c, rail, got
	}

	t.Run("a context done before the call opens no connection", func(t *testing.T) {
		t.Parallel()
		c, rail, _ := holdingRaw(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if rc := c.Pay(ctx, payment); rc.Result != RailUnsent || !errors.Is(rc.Err, context.Canceled) {
			t.Fatalf("answer: %+v", rc)
		}
		if n := rail.connCount(); n != 0 {
			t.Fatalf("the rail accepted %d connections, want none", n)
		}
	})

	for _, c := range []struct {
		name  string
		cause string
		err   error
		// ctx is the call's context, given got, on which the rail says it has
		// read the request.
		ctx func(got <-chan struct{}) (context.Context, context.CancelFunc)
	}{
		{
			name: "a cancellation while the rail holds the request is ambiguous, interrupted", cause: CauseInterrupted, err: context.Canceled,
			ctx: func(got <-chan struct{}) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				go func() {
					<-got
					cancel()
				}()
				return ctx, cancel
			},
		},
		{
			name: "a deadline passing while the call is held is ambiguous, timeout", cause: CauseTimeout, err: context.DeadlineExceeded,
			ctx: func(<-chan struct{}) (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 200*time.Millisecond)
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			client, rail, got := holdingRaw(t)
			ctx, cancel := c.ctx(got)
			defer cancel()
			rc := client.Pay(ctx, payment)
			if rc.Result != RailAmbiguous || rc.Cause != c.cause || !errors.Is(rc.Err, c.err) {
				t.Fatalf("answer: %+v", rc)
			}
			if n := rail.connCount(); n != 1 {
				t.Fatalf("the rail accepted %d connections, want 1", n)
			}
		})
	}
}
