package fastserve

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"lock.dev/internal/jsonbody"
	"lock.dev/internal/rawhttp"
	"lock.dev/lockapi"
)

// startFast serves h on a fresh listener the way the binaries do and returns its
// address and its set of chunked-header copies.
func startFast(t *testing.T, h http.Handler) (string, *chunkedHeaders) {
	t.Helper()
	srv, chunked := newFastServer(h, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String(), chunked
}

// jsonRoute reads its body as every JSON endpoint does; any other path is a route
// that takes no body and answers 418 without reading it.
var jsonRoute = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/json" {
		w.WriteHeader(http.StatusTeapot)
		return
	}
	if _, fault := jsonbody.ReadJSONBody(r); fault != nil {
		lockapi.WriteInvalid(w, fault.Status, fault.Errors)
		return
	}
	w.WriteHeader(http.StatusNoContent)
})

// A body over 64 KiB, which fasthttp does not read, is answered as the handler
// answers it, in the contract's order: 415 for a content type that is not JSON before 413
// for the size, and a route that takes no body answers as it always does. This
// holds for a chunked body too, whose request fasthttp resets before its error
// handler runs. Each request is written whole before its answer is read, from a
// client whose send buffer cannot hold the body, so the answer must survive the
// connection's close (the refused body is drained first).
func TestRefusedBodyAnsweredAsTheHandlerWould(t *testing.T) {
	t.Parallel()
	addr, chunked := startFast(t, jsonRoute)
	big := []byte(`{"payoutId":"` + strings.Repeat("x", 300<<10) + `"}`)
	small := []byte(`{"payoutId":"p-1"}`)
	for _, c := range []struct {
		name, path, contentType string
		body                    []byte
		chunked                 bool
		status                  int
	}{
		{"too large", "/json", "application/json", big, false, 413},
		{"too large, chunked", "/json", "application/json", big, true, 413},
		{"not JSON and too large", "/json", "text/plain", big, false, 415},
		{"not JSON and too large, chunked", "/json", "text/plain", big, true, 415},
		{"no-body route, too large", "/other", "application/json", big, false, 418},
		{"no-body route, too large, chunked", "/other", "application/json", big, true, 418},
		{"within the limit, chunked", "/json", "application/json", small, true, 204},
		{"within the limit", "/json", "application/json", small, false, 204},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i := range 5 {
				status, _, body, err := rawhttp.SendWhole(http.MethodPost, "http://"+addr+c.path,
					http.Header{"Content-Type": {c.contentType}}, c.body, c.chunked)
				if err != nil {
					t.Fatalf("try %d: %v", i+1, err)
				}
				if status != c.status {
					t.Fatalf("try %d: answer %d %s, want %d", i+1, status, body, c.status)
				}
				if status == 413 || status == 415 {
					var p struct {
						Status int    `json:"status"`
						Code   string `json:"code"`
					}
					if err := json.Unmarshal(body, &p); err != nil || p.Status != status || p.Code != lockapi.CodeInvalidRequest {
						t.Fatalf("try %d: problem %s", i+1, body)
					}
				}
			}
		})
	}
	// An empty chunked body leaves a length of 0, not -1.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /other HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusTeapot {
		t.Fatalf("empty chunked body: %v %v", resp, err)
	}
	if n := keptCopies(chunked); n != 0 {
		t.Fatalf("%d chunked-header copies kept after every request was answered", n)
	}
}

func keptCopies(c *chunkedHeaders) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// The copies of chunked headers are bounded: copies left behind by clients that
// went away mid-body cannot pile up. A copy taken back is the header as it came.
func TestChunkedHeaderCopiesAreBounded(t *testing.T) {
	t.Parallel()
	var c chunkedHeaders
	headers := make([]*fasthttp.RequestHeader, 3*maxChunkedHeaders)
	for i := range headers {
		h := &fasthttp.RequestHeader{}
		if err := h.Read(bufio.NewReader(strings.NewReader(fmt.Sprintf(
			"POST /r/%d HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n", i)))); err != nil {
			t.Fatal(err)
		}
		headers[i] = h
		c.keep(h)
		if n := keptCopies(&c); n > maxChunkedHeaders {
			t.Fatalf("%d copies kept, bound %d", n, maxChunkedHeaders)
		}
	}
	last := headers[len(headers)-1]
	cp := c.take(last)
	if cp == nil || string(cp.RequestURI()) != string(last.RequestURI()) || string(cp.ContentType()) != "text/plain" || cp.ContentLength() != -1 {
		t.Fatalf("copy %v of %s", cp, last.RequestURI())
	}
	if c.take(last) != nil {
		t.Fatal("a copy was taken back twice")
	}
	// A request with a Content-Length needs no copy.
	h := &fasthttp.RequestHeader{}
	if err := h.Read(bufio.NewReader(strings.NewReader("POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n"))); err != nil {
		t.Fatal(err)
	}
	c.keep(h)
	if c.take(h) != nil {
		t.Fatal("a request with a Content-Length was copied")
	}
}

// A request waiting in its handler — a submission waiting on the rail — holds no
// read buffer: its body was read whole before the handler and the connection's
// buffer went back to the pool (2,000 of them within 64 MiB).
// A streamed body would keep the 4 KiB buffer until the handler returned. The
// figure is the heap in use per waiting request, both ends of each connection
// included, after a collection.
func TestWaitingRequestsHoldNoReadBuffer(t *testing.T) {
	const n = 400
	release := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(n)
	addr, _ := startFast(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, fault := jsonbody.ReadJSONBody(r); fault != nil {
			lockapi.WriteInvalid(w, fault.Status, fault.Errors)
			return
		}
		entered.Done()
		<-release
		w.WriteHeader(http.StatusNoContent)
	}))
	body := `{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`
	request := "POST /v1/rail/submissions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Fencing-Token: 42\r\n" +
		"X-Owner-Id: w1\r\nX-Idempotency-Key: p-1001:42\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			close(release)
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, request); err != nil {
			close(release)
			t.Fatal(err)
		}
	}
	entered.Wait()
	perRequest := (float64(heap()) - float64(before)) / n
	close(release)
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("answer %v %v", resp, err)
		}
	}
	t.Logf("%.0f bytes of heap per waiting request", perRequest)
	// About 4 KiB now, 8 KiB with the body streamed.
	if perRequest > 6<<10 {
		t.Fatalf("%.0f bytes of heap per waiting request, want at most 6 KiB (a read buffer is 4 KiB)", perRequest)
	}
}
