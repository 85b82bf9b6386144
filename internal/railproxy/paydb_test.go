package railproxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// pgForwarder is a TCP relay between the proxy and PostgreSQL that the test can
// cut: paydb becomes unreachable (every connection closed, new ones refused), or
// one COMMIT is lost on the way in or on the way out.
type pgForwarder struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	fault string // "", "before" (drop the COMMIT), "after" (deliver it, drop the answer), "after-down" (and go down), "after-stall" (and stall)
	conns []net.Conn
	// stall: paydb hangs — connections stay open and nothing is answered on any
	// of them (a black-holed host, a stuck server), until setStall(false).
	stall   bool
	stalled []net.Conn
	// held: with fault "after-hold", the COMMIT waits here until closed.
	held chan struct{}
}

// commitMsg is a simple-protocol Query message carrying "COMMIT": how the
// admission transaction's COMMIT travels.
var commitMsg = []byte("Q\x00\x00\x00\x0bCOMMIT\x00")

func newPGForwarder(t testing.TB, dbURL string) (*pgForwarder, string) {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &pgForwarder{ln: ln, target: u.Host}
	t.Cleanup(func() {
		_ = ln.Close()
		f.cut()
	})
	go f.accept()
	u.Host = ln.Addr().String()
	return f, u.String()
}

func (f *pgForwarder) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		down, stall := f.down, f.stall
		if stall {
			f.stalled = append(f.stalled, c)
		}
		f.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		if stall {
			continue
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, s)
		f.mu.Unlock()
		go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		go f.upstream(c, s)
	}
}

// upstream relays client→server, watching for the COMMIT when a fault is armed.
func (f *pgForwarder) upstream(c, s net.Conn) {
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			f.mu.Lock()
			fault := f.fault
			if fault != "" && bytes.Contains(chunk, commitMsg) {
				f.fault = ""
			} else {
				fault = ""
			}
			f.mu.Unlock()
			switch fault {
			case "before":
				_ = c.Close()
				return
			case "after", "after-down", "after-stall", "after-hold":
				if fault == "after-stall" {
					// paydb hangs from this moment: every other connection keeps
					// its client side open with nothing behind it.
					f.mu.Lock()
					f.stall = true
					var servers []net.Conn
					for i, o := range f.conns {
						if i%2 == 1 && o != s { // conns holds client, server pairs
							servers = append(servers, o)
						} else if i%2 == 0 && o != c {
							f.stalled = append(f.stalled, o)
						}
					}
					f.conns = nil
					f.mu.Unlock()
					for _, o := range servers {
						_ = o.Close()
					}
				}
				if fault == "after-down" {
					// paydb out of reach from this moment: every other
					// connection cut, new ones refused (until setDown(false)).
					f.mu.Lock()
					f.down = true
					others := make([]net.Conn, 0, len(f.conns))
					for _, o := range f.conns {
						if o != c && o != s {
							others = append(others, o)
						}
					}
					f.conns = nil
					f.mu.Unlock()
					for _, o := range others {
						_ = o.Close()
					}
				}
				// The client's side goes first, so the server's answer has
				// nowhere to go; then the COMMIT is delivered and the server
				// commits — a moment later, as when the connection breaks in
				// front of a server that has yet to read it: the proxy must
				// not take the row it does not find yet for one never written.
				_ = c.Close()
				if fault == "after" {
					time.Sleep(100 * time.Millisecond)
				}
				if fault == "after-hold" {
					f.mu.Lock()
					held := f.held
					f.mu.Unlock()
					<-held
				}
				_, _ = s.Write(chunk)
				time.Sleep(300 * time.Millisecond)
				return
			}
			if _, err := s.Write(chunk); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *pgForwarder) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	for _, c := range f.stalled {
		_ = c.Close()
	}
	f.conns, f.stalled = nil, nil
}

func (f *pgForwarder) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
	if down {
		f.cut()
	}
}

// setStall(false) ends a stall: the connections it held are closed (their
// clients see paydb gone and connect again), and new ones are relayed.
func (f *pgForwarder) setStall(stall bool) {
	f.mu.Lock()
	f.stall = stall
	held := f.stalled
	if !stall {
		f.stalled = nil
	}
	f.mu.Unlock()
	if !stall {
		for _, c := range held {
			_ = c.Close()
		}
	}
}

// armHold arms fault "after-hold": the next COMMIT's answer is lost (the
// proxy's side of the connection is closed) and the COMMIT itself is held until
// release is called, when it lands.
func (f *pgForwarder) armHold() (release func()) {
	held := make(chan struct{})
	var once sync.Once
	f.mu.Lock()
	f.fault, f.held = "after-hold", held
	f.mu.Unlock()
	return func() { once.Do(func() { close(held) }) }
}

func (f *pgForwarder) arm(fault string) {
	f.mu.Lock()
	f.fault = fault
	f.mu.Unlock()
}

// paydb out of reach is 503 RAIL_UNAVAILABLE
// stage intent_commit, no row, no rail call; readiness is DOWN (db) while liveness
// stays UP; when paydb is back, the same payout is admitted.
func TestPaydbUnreachable(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	p := startProxy(t, testConfig(viaURL, rail.URL))
	if a := get(t, p.URL+"/readyz"); a.Status != http.StatusOK {
		t.Fatalf("readiness before: %+v", a)
	}

	fwd.setDown(true)
	a := submit(t, p.URL, 3, newPayout("p-nodb", "acct-nodb"))
	if a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("answer: %+v", a)
	}
	if _, ok := a.Body["submissionId"]; ok {
		t.Fatalf("no row exists, yet the answer names one: %+v", a.Body)
	}
	if n := countRows(t, db); n != 0 {
		t.Fatalf("%d rows written", n)
	}
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("rail calls: %+v", c)
	}
	if ev := p.Logs.events("rail_unavailable"); len(ev) != 1 || ev[0]["stage"] != "intent_commit" {
		t.Fatalf("rail_unavailable: %v", ev)
	}
	ready := get(t, p.URL+"/readyz")
	comps, _ := ready.Body["components"].(map[string]any)
	dbc, _ := comps["db"].(map[string]any)
	if ready.Status != http.StatusServiceUnavailable || dbc["status"] != "DOWN" {
		t.Fatalf("readiness with paydb down: %+v", ready.Body)
	}
	if live := get(t, p.URL+"/livez"); live.Status != http.StatusOK {
		t.Fatalf("liveness: %+v", live)
	}
	// The audit read is a plain 503 UNAVAILABLE.
	if a := get(t, p.URL+"/v1/rail/submissions?payoutId=p-nodb"); a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeUnavailable {
		t.Fatalf("audit read: %+v", a)
	}

	fwd.setDown(false)
	if a := submit(t, p.URL, 3, newPayout("p-nodb", "acct-nodb")); a.Status != http.StatusOK {
		t.Fatalf("after paydb is back: %+v", a)
	}
}

// A COMMIT whose answer is lost: the intent may exist. This process knows it
// opened no socket, so when the row turns out to exist it resolves it UNSENT and
// names it; when the COMMIT never arrived there is no row. Either way: 503
// intent_commit and no rail call.
func TestIntentCommitLost(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	p := startProxy(t, testConfig(viaURL, rail.URL))

	fwd.arm("after")
	a := submit(t, p.URL, 1, newPayout("p-lost-answer", "acct-lost"))
	if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" || a.int("submissionId") <= 0 {
		t.Fatalf("commit answer lost: %+v", a)
	}
	rs := rowsOf(t, db, "p-lost-answer")
	if len(rs) != 1 || outcomeOf(rs[0]) != "UNSENT" || rs[0].ID != a.int("submissionId") {
		t.Fatalf("rows: %+v", rs)
	}

	fwd.arm("before")
	a = submit(t, p.URL, 2, newPayout("p-lost-commit", "acct-lost"))
	if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("commit lost: %+v", a)
	}
	if _, ok := a.Body["submissionId"]; ok {
		t.Fatalf("no row exists, yet the answer names one: %+v", a.Body)
	}
	if rs := rowsOf(t, db, "p-lost-commit"); len(rs) != 0 {
		t.Fatalf("rows: %+v", rs)
	}
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("rail calls: %+v", c)
	}
	// Neither left the payout blocked: an UNSENT row is outside the unique index.
	if a := submit(t, p.URL, 3, newPayout("p-lost-answer", "acct-lost")); a.Status != http.StatusOK {
		t.Fatalf("resubmission: %+v", a)
	}
}

// The admission transaction is bounded by 2 s in all, waiting for a pool
// connection included: a fence blocked on the account's row lock, and a second
// submission waiting for the only pool connection, both answer 503
// intent_commit, write nothing and call nothing.
func TestAdmissionBound(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, rail.URL)
	cfg.PaydbMaxConns = 1
	p := startProxy(t, cfg)
	if a := submit(t, p.URL, 1, newPayout("p-b0", "acct-b")); a.Status != http.StatusOK {
		t.Fatalf("warm-up: %+v", a)
	}
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM rail_high_water WHERE account_id = 'acct-b' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i := range 2 {
		wg.Go(func() {
			if i == 1 {
				time.Sleep(100 * time.Millisecond)
			}
			answers[i] = trySubmit(p.URL, int64(10+i), newPayout("p-b"+string(rune('1'+i)), "acct-b"))
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" {
			t.Fatalf("submission %d: %+v", i, a)
		}
	}
	_ = tx.Rollback(ctx)
	if n := countRows(t, db); n != 1 {
		t.Fatalf("%d rows, want only the warm-up's", n)
	}
	if n := len(rail.calls(t)); n != 1 {
		t.Fatalf("%d rail calls, want only the warm-up's", n)
	}
	if got := mark(t, db, "acct-b"); got != 1 {
		t.Fatalf("mark %d, want 1 (nothing committed)", got)
	}
}
