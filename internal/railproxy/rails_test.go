package railproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// holdingRail is a rail of our own for conditions the stub cannot make: it
// records every call, then holds its reply until released, then accepts.
type holdingRail struct {
	URL      string
	mu       sync.Mutex
	refs     []string
	headers  []http.Header
	methods  []string
	released chan struct{}
	relOnce  sync.Once
	onCall   func(ref string) // optional, runs when a call arrives, before holding
	// reply, when set before the first call, answers instead of accepting.
	reply func(w http.ResponseWriter, ref string)
}

func newHoldingRail(t testing.TB) *holdingRail {
	h := &holdingRail{released: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rail/v1/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/rail/v1/payments", func(w http.ResponseWriter, r *http.Request) {
		var p railPayment
		_ = json.NewDecoder(r.Body).Decode(&p)
		h.mu.Lock()
		h.refs = append(h.refs, p.Reference)
		h.headers = append(h.headers, r.Header.Clone())
		h.methods = append(h.methods, r.Method)
		on, reply := h.onCall, h.reply
		h.mu.Unlock()
		if on != nil {
			on(p.Reference)
		}
		<-h.released
		w.Header().Set("Content-Type", "application/json")
		if reply != nil {
			reply(w, p.Reference)
			return
		}
		fmt.Fprintf(w, `{"status":"ACCEPTED","railReference":"RS-%s"}`, p.Reference)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		h.release()
		srv.Close()
	})
	h.URL = srv.URL
	return h
}

func (h *holdingRail) release() { h.relOnce.Do(func() { close(h.released) }) }

func (h *holdingRail) count(ref string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.refs {
		if r == ref {
			n++
		}
	}
	return n
}

func (h *holdingRail) waitCalls(t testing.TB, n int) {
	t.Helper()
	eventually(t, 10*time.Second, "calls at the rail", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.refs) >= n
	})
}

// Intent before socket, proven from the rail's side: at the
// moment the rail receives a call, its rail_submission row is already committed
// (visible to another connection) with outcome NULL. The rail also checks what
// it is sent: a POST without any idempotency header.
func TestIntentCommittedBeforeRailReceivesCall(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	rail := newHoldingRail(t)
	rail.release() // answer at once; the check runs in onCall
	var mu sync.Mutex
	seen := map[string]string{}
	rail.onCall = func(ref string) { // on the rail's goroutine: no t.Fatal here
		rs, err := tryRowsOf(db, ref)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			seen[ref] = "unreadable: " + err.Error()
		case len(rs) == 1:
			seen[ref] = outcomeOf(rs[0])
		default:
			seen[ref] = fmt.Sprintf("%d rows", len(rs))
		}
	}
	p := startProxy(t, testConfig(dbURL, rail.URL))
	const n = 10
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if a := trySubmit(p.URL, int64(i+1), newPayout(fmt.Sprintf("p-ibs-%d", i), fmt.Sprintf("acct-ibs-%d", i))); a.Status != http.StatusOK {
				t.Errorf("submission %d: %+v", i, a)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("rail saw %d payouts, want %d", len(seen), n)
	}
	for ref, o := range seen {
		if o != "NULL" {
			t.Errorf("%s: when the rail received it, its row was %q, want one committed row with outcome NULL", ref, o)
		}
	}
	rail.mu.Lock()
	defer rail.mu.Unlock()
	for i, h := range rail.headers {
		if rail.methods[i] != http.MethodPost || h.Get("Idempotency-Key") != "" || h.Get("X-Idempotency-Key") != "" ||
			h.Get(lockapi.HeaderFencingToken) != "" || h.Get(lockapi.HeaderOwnerID) != "" {
			t.Errorf("call %d: method %s headers %v", i, rail.methods[i], h)
		}
	}
}

// closingRail speaks HTTP/1.1 over raw TCP: on every connection it answers the
// first request and keeps the connection alive, then reads the second request
// in full and closes the connection without a byte of reply — a server closing
// a kept-alive connection just as a request arrives. It counts every request it
// reads, per reference, and every connection.
type closingRail struct {
	*rawRail
	mu   sync.Mutex
	refs map[string]int
}

func newClosingRail(t *testing.T) *closingRail {
	c := &closingRail{refs: map[string]int{}}
	c.rawRail = newRawRail(t, c.serve)
	return c
}

func (c *closingRail) serve(conn net.Conn) {
	br := bufio.NewReader(conn)
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		var p railPayment
		_ = json.Unmarshal(body, &p)
		c.mu.Lock()
		c.refs[p.Reference]++
		c.mu.Unlock()
		if i >= 1 {
			return // close without replying
		}
		reply := fmt.Sprintf(`{"status":"ACCEPTED","railReference":"RS-%s"}`, p.Reference)
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(reply), reply)
	}
}

func (c *closingRail) count(ref string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refs[ref]
}

// A rail that closes a kept-alive connection never receives a
// request twice. The control half shows the hazard is real and that this rail
// detects it: Go's own client, sending a rewindable body with an idempotency
// header, does resend.
func TestKeptAliveConnectionClosedIsNeverReplayed(t *testing.T) {
	t.Parallel()
	t.Run("control: a replayable request is resent by net/http", func(t *testing.T) {
		rail := newClosingRail(t)
		hc := &http.Client{Transport: &http.Transport{}}
		defer hc.CloseIdleConnections()
		for _, ref := range []string{"c-1", "c-2"} {
			body, _ := json.Marshal(railPayment{Reference: ref})
			req, _ := http.NewRequest(http.MethodPost, rail.URL+"/rail/v1/payments", bytes.NewReader(body))
			req.Header.Set("X-Idempotency-Key", ref)
			if resp, err := hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body) // so the connection goes back to the pool
				resp.Body.Close()
			}
		}
		if n := rail.count("c-2"); n < 2 {
			t.Fatalf("the control request reached the rail %d times; the hazard did not show, so the test below would prove nothing", n)
		}
	})
	t.Run("rail-proxy", func(t *testing.T) {
		rail := newClosingRail(t)
		dbURL := pgtest.PaydbURL(t)
		db := pgtest.Pool(t, dbURL)
		p := startProxy(t, testConfig(dbURL, rail.URL))
		if a := submit(t, p.URL, 1, newPayout("p-ka-1", "acct-ka")); a.Status != http.StatusOK {
			t.Fatalf("first: %+v", a)
		}
		a := submit(t, p.URL, 2, newPayout("p-ka-2", "acct-ka"))
		if a.code() != lockapi.CodeRailAmbiguous {
			t.Fatalf("second, on the closed kept-alive connection: %+v", a)
		}
		if conns := rail.connCount(); conns != 1 {
			t.Fatalf("the rail saw %d connections; the second request was meant to reuse the first's", conns)
		}
		time.Sleep(200 * time.Millisecond)
		if n := rail.count("p-ka-2"); n != 1 {
			t.Fatalf("the rail received p-ka-2 %d times, want exactly 1", n)
		}
		if rs := rowsOf(t, db, "p-ka-2"); len(rs) != 1 || outcomeOf(rs[0]) != "TIMEOUT" {
			t.Fatalf("rows: %+v", rs)
		}
		if ev := p.Logs.events("rail_ambiguous"); len(ev) != 1 || ev[0]["cause"] != CauseConnectionDropped {
			t.Fatalf("rail_ambiguous: %v", ev)
		}
		// A failure on a reused connection before any byte of reply is counted.
		if v := metric(t, p, "rail_reused_conn_failure_total"); v != 1 {
			t.Fatalf("rail_reused_conn_failure_total = %v, want 1", v)
		}
	})
}

// Replies that are neither a well-formed accept nor a well-formed decline are
// ambiguous (bad_response): the rail may have acted.
func TestMalformedRailReplyIsAmbiguous(t *testing.T) {
	t.Parallel()
	replies := []struct {
		status int
		body   string
	}{
		{200, `not json`},
		{200, `{"status":"ACCEPTED"}`},
		{200, `{"status":"DECLINED","reason":"x"}`},
		{422, `{"status":"ACCEPTED","railReference":"RS-1"}`},
		{500, `{"status":"ACCEPTED","railReference":"RS-1"}`},
		{307, ``},
	}
	var mu sync.Mutex
	next := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rail/v1/health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("POST /rail/v1/payments", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		r := replies[next]
		next++
		mu.Unlock()
		if r.status == 307 {
			w.Header().Set("Location", "/rail/v1/payments")
		}
		w.WriteHeader(r.status)
		_, _ = io.WriteString(w, r.body)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, srv.URL))
	for i := range replies {
		ref := "p-bad-" + strconv.Itoa(i)
		a := submit(t, p.URL, int64(i+1), newPayout(ref, "acct-bad"))
		if a.code() != lockapi.CodeRailAmbiguous {
			t.Fatalf("reply %d: %+v", i, a)
		}
		if rs := rowsOf(t, db, ref); len(rs) != 1 || outcomeOf(rs[0]) != "TIMEOUT" {
			t.Fatalf("reply %d rows: %+v", i, rs)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if next != len(replies) {
		t.Fatalf("rail saw %d calls, want %d (a redirect must not be followed)", next, len(replies))
	}
	for _, e := range p.Logs.events("rail_ambiguous") {
		if e["cause"] != CauseBadResponse {
			t.Fatalf("cause: %v", e)
		}
	}
}

// A rail that is not listening is 503 RAIL_UNAVAILABLE
// stage dial with an UNSENT row (the dial failed: no connection was obtained), and
// readiness is DOWN; the payout is admitted later with a newer token.
func TestRailNotListeningIsUnsent(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String()
	_ = ln.Close()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, deadURL))

	ready := get(t, p.URL+"/readyz")
	comps, _ := ready.Body["components"].(map[string]any)
	rs, _ := comps["railStub"].(map[string]any)
	if ready.Status != http.StatusServiceUnavailable || rs["status"] != "DOWN" {
		t.Fatalf("readiness with the rail down: %+v", ready)
	}
	if live := get(t, p.URL+"/livez"); live.Status != http.StatusOK {
		t.Fatalf("liveness: %+v", live)
	}

	a := submit(t, p.URL, 5, newPayout("p-dial", "acct-dial"))
	if a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "dial" || a.int("submissionId") <= 0 {
		t.Fatalf("answer: %+v", a)
	}
	rows := rowsOf(t, db, "p-dial")
	if len(rows) != 1 || outcomeOf(rows[0]) != "UNSENT" || rows[0].ID != a.int("submissionId") {
		t.Fatalf("rows: %+v", rows)
	}
	if ev := p.Logs.events("rail_unavailable"); len(ev) != 1 || ev[0]["stage"] != "dial" || ev[0]["error"] == nil {
		t.Fatalf("rail_unavailable: %v", ev)
	}
	if v := metric(t, p, `rail_submission_total{outcome="unavailable"}`); v != 1 {
		t.Fatalf("unavailable = %v", v)
	}
	// UNSENT is outside the unique index: the payout can still be presented —
	// with a newer token (the same one is a replay).
	rail := startStub(t, 0)
	p2 := startProxy(t, testConfig(dbURL, rail.URL))
	if a := submit(t, p2.URL, 5, newPayout("p-dial", "acct-dial")); a.code() != lockapi.CodeFencedOut {
		t.Fatalf("same token again: %+v", a)
	}
	if a := submit(t, p2.URL, 6, newPayout("p-dial", "acct-dial")); a.Status != http.StatusOK {
		t.Fatalf("newer token: %+v", a)
	}
	if n := rail.callsFor(t, "p-dial"); n != 1 {
		t.Fatalf("rail calls: %d", n)
	}
}

// A rail that never completes the TCP handshake: the connect bound
// (RAIL_CONNECT_TIMEOUT) ends the call, GotConn never fired, so the row is UNSENT
// and the answer 503 stage dial. The hanging dial is the RailDial hook — a dial
// that returns only when its context is done — so the test does not depend on how
// a kernel treats a full listen backlog, and always runs.
func TestConnectTimeoutIsUnsent(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, "http://rail.invalid:8084")
	cfg.RailConnectTimeout = 300 * time.Millisecond
	var dials atomic.Int32
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	cfg.RailDial = func(ctx context.Context, _, _ string) (net.Conn, error) {
		dials.Add(1)
		// Go's transport lets a dial outlive the request that started it, so
		// this one also ends with the test.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-stop:
			return nil, errors.New("test over")
		}
	}
	p := startProxy(t, cfg)
	start := time.Now()
	a := submit(t, p.URL, 1, newPayout("p-hang", "acct-hang"))
	elapsed := time.Since(start)
	if a.Status != http.StatusServiceUnavailable || a.str("stage") != "dial" {
		t.Fatalf("answer: %+v", a)
	}
	if rs := rowsOf(t, db, "p-hang"); len(rs) != 1 || outcomeOf(rs[0]) != "UNSENT" {
		t.Fatalf("rows: %+v", rs)
	}
	if elapsed < cfg.RailConnectTimeout || dials.Load() == 0 {
		t.Fatalf("answered after %s (connect bound %s), %d dials: the dial did not hang", elapsed, cfg.RailConnectTimeout, dials.Load())
	}
	if ev := p.Logs.events("rail_unavailable"); len(ev) != 1 || ev[0]["stage"] != "dial" {
		t.Fatalf("rail_unavailable: %v", ev)
	}
}
