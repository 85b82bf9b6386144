package railproxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// idleClosingRail answers every request, except one that arrives on a connection
// left idle longer than idle: that connection it closes without reading the
// request — a server's idle timeout firing just as a request arrives, which
// no client can tell from a request the server read and then dropped. It counts
// the requests it read, and the connections.
type idleClosingRail struct {
	*rawRail
	idle time.Duration
	mu   sync.Mutex
	refs map[string]int
}

func newIdleClosingRail(t *testing.T, idle time.Duration) *idleClosingRail {
	r := &idleClosingRail{idle: idle, refs: map[string]int{}}
	r.rawRail = newRawRail(t, r.serve)
	return r
}

func (r *idleClosingRail) serve(conn net.Conn) {
	br := bufio.NewReader(conn)
	last := time.Now()
	for {
		if _, err := br.Peek(1); err != nil {
			return
		}
		if time.Since(last) > r.idle {
			return // idle too long: closed, the request unread
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		var p railPayment
		_ = json.NewDecoder(req.Body).Decode(&p)
		r.mu.Lock()
		r.refs[p.Reference]++
		r.mu.Unlock()
		reply := fmt.Sprintf(`{"status":"ACCEPTED","railReference":"RS-%s"}`, p.Reference)
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(reply), reply)
		last = time.Now()
	}
}

func (r *idleClosingRail) stats(ref string) (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refs[ref], r.connCount()
}

// RAIL_IDLE_CONN_TIMEOUT, against a rail that closes connections idle for more
// than 500 ms; two submissions 1.5 s apart. With an idle timeout above the
// rail's, the second goes out on the pooled connection the rail closes unread,
// and a payment the rail never received ends TIMEOUT — counted in
// rail_reused_conn_failure_total so an operator can see it. Below the rail's, or
// 0 (no reuse), the second gets a connection of its own and is ACKED.
func TestRailIdleConnTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name         string
		idle         time.Duration
		second       string // code, or "" for 200
		received     int    // times the rail read the second payment
		conns        int
		reusedFailed float64
	}{
		{"above the rail's idle timeout", 30 * time.Second, lockapi.CodeRailAmbiguous, 0, 1, 1},
		{"below the rail's idle timeout", 100 * time.Millisecond, "", 1, 2, 0},
		{"reuse off", 0, "", 1, 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rail := newIdleClosingRail(t, 500*time.Millisecond)
			dbURL := pgtest.PaydbURL(t)
			db := pgtest.Pool(t, dbURL)
			cfg := testConfig(dbURL, rail.URL)
			cfg.RailIdleConnTimeout = c.idle
			p := startProxy(t, cfg)
			if a := submit(t, p.URL, 1, newPayout("p-idle-1", "acct-idle")); a.Status != http.StatusOK {
				t.Fatalf("first: %+v", a)
			}
			time.Sleep(1500 * time.Millisecond)
			a := submit(t, p.URL, 2, newPayout("p-idle-2", "acct-idle"))
			if (c.second == "" && a.Status != http.StatusOK) || (c.second != "" && a.code() != c.second) {
				t.Fatalf("second: %+v", a)
			}
			if received, conns := rail.stats("p-idle-2"); received != c.received || conns != c.conns {
				t.Fatalf("the rail read the second payment %d times over %d connections, want %d over %d",
					received, conns, c.received, c.conns)
			}
			if v := metric(t, p, "rail_reused_conn_failure_total"); v != c.reusedFailed {
				t.Fatalf("rail_reused_conn_failure_total = %v, want %v", v, c.reusedFailed)
			}
			want := lockapi.OutcomeAcked
			if c.second != "" {
				want = lockapi.OutcomeTimeout
			}
			if rs := rowsOf(t, db, "p-idle-2"); len(rs) != 1 || outcomeOf(rs[0]) != want {
				t.Fatalf("rows: %+v", rs)
			}
		})
	}
}
