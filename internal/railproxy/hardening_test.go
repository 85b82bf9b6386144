package railproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// interruptWindow is interrupt_at − submitted_at of a payout's rows, nil for a
// row that has none.
func interruptWindow(t *testing.T, db dbq, payoutID string) []*time.Duration {
	t.Helper()
	rs, err := db.Query(context.Background(), `SELECT (extract(epoch FROM interrupt_at - submitted_at) * 1000)::bigint
	  FROM rail_submission WHERE payout_id = $1 ORDER BY submission_id`, payoutID)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []*time.Duration
	for rs.Next() {
		var ms *int64
		if err := rs.Scan(&ms); err != nil {
			t.Fatal(err)
		}
		if ms == nil {
			out = append(out, nil)
			continue
		}
		d := time.Duration(*ms) * time.Millisecond
		out = append(out, &d)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Replicas with different timeouts on one paydb. Replica A reads
// the rail for up to 30 s (so its RAIL_PROXY_INTERRUPTED_AFTER is 37 s); replica B
// has the default timeouts and the shortest bound they allow (9 s), and sweeps
// every 100 ms. The rail holds A's call for 10 s — past B's own bound. B's janitor
// judges the row by the interrupt_at A gave it, not by its own bound, so A's call
// ends ACKED, never TIMEOUT. FENCED rows carry no interrupt_at.
func TestReplicasKeepTheirOwnInterruptAt(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	slow := testConfig(dbURL, hold.URL)
	slow.RailReadTimeout = 30 * time.Second
	slow.InterruptedAfter = slow.InFlightBound() + InterruptMargin
	slow.JanitorInterval = 100 * time.Millisecond
	quick := testConfig(dbURL, hold.URL)
	quick.InterruptedAfter = quick.InFlightBound() + InterruptMargin
	quick.JanitorInterval = 100 * time.Millisecond
	a := startProxy(t, slow)
	b := startProxy(t, quick)

	done := make(chan answer, 1)
	go func() { done <- trySubmit(a.URL, 5, newPayout("p-slow", "acct-slow")) }()
	hold.waitCalls(t, 1)
	if w := interruptWindow(t, db, "p-slow"); len(w) != 1 || w[0] == nil ||
		*w[0] < slow.InterruptedAfter-50*time.Millisecond || *w[0] > slow.InterruptedAfter+50*time.Millisecond {
		t.Fatalf("interrupt_at − submitted_at of A's intent: %v, want A's own %s", w, slow.InterruptedAfter)
	}
	if f := submit(t, b.URL, 5, newPayout("p-slow-replay", "acct-slow")); f.code() != lockapi.CodeFencedOut {
		t.Fatalf("replay: %+v", f)
	}
	if w := interruptWindow(t, db, "p-slow-replay"); len(w) != 1 || w[0] != nil {
		t.Fatalf("a FENCED row has interrupt_at %v, want NULL", w)
	}

	time.Sleep(quick.InterruptedAfter + time.Second) // B's janitor sweeps all along
	if rs := rowsOf(t, db, "p-slow"); len(rs) != 1 || rs[0].Outcome != nil {
		t.Fatalf("A's call, still in flight, was resolved: %+v", rs)
	}
	hold.release()
	ans := <-done
	if ans.Status != http.StatusOK || ans.str("railReference") != "RS-p-slow" {
		t.Fatalf("A's answer: %+v", ans)
	}
	if rs := rowsOf(t, db, "p-slow"); len(rs) != 1 || outcomeOf(rs[0]) != "ACKED" {
		t.Fatalf("rows: %+v", rs)
	}
	for name, p := range map[string]*proxy{"A": a, "B": b} {
		if ev := p.Logs.events("rail_ambiguous"); len(ev) != 0 {
			t.Errorf("replica %s logged rail_ambiguous: %v", name, ev)
		}
	}
}

// A known outcome is never lost to the janitor. paydb
// refuses every write from the moment the rail answers (or the dial fails, or
// the admission's COMMIT answer is lost) until 3 s after the caller was
// answered; the janitor of this very proxy sweeps every 100 ms with the shortest
// bound its timeouts allow. The caller gets the rail's answer without waiting for
// paydb; the proxy keeps trying in the background, and the row ends with what the
// proxy knew — never TIMEOUT. Each submission is counted once, under its row's
// outcome, and the late write is counted.
func TestKnownOutcomeOutlivesPaydbOutage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, outcome, metric string
		status                int
	}{
		{"acked", lockapi.OutcomeAcked, metricAcked, http.StatusOK},
		{"rejected", lockapi.OutcomeRejected, metricRejected, http.StatusUnprocessableEntity},
		{"unsent", lockapi.OutcomeUnsent, metricUnavailable, http.StatusServiceUnavailable},
		{"lost commit", lockapi.OutcomeUnsent, metricUnavailable, http.StatusServiceUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.PaydbURL(t)
			db := pgtest.Pool(t, dbURL)
			fwd, viaURL := newPGForwarder(t, dbURL)
			hold := newHoldingRail(t)
			if c.outcome == lockapi.OutcomeRejected {
				hold.reply = func(w http.ResponseWriter, _ string) {
					w.WriteHeader(http.StatusUnprocessableEntity)
					_, _ = io.WriteString(w, `{"status":"DECLINED","reason":"insufficient funds"}`)
				}
			}
			cfg := testConfig(viaURL, hold.URL)
			cfg.InterruptedAfter = cfg.InFlightBound() + InterruptMargin
			cfg.JanitorInterval = 100 * time.Millisecond
			dialing, failDial := make(chan struct{}), make(chan struct{})
			if c.name == "unsent" {
				var once sync.Once
				cfg.RailDial = func(ctx context.Context, _, _ string) (net.Conn, error) {
					once.Do(func() { close(dialing) })
					select {
					case <-failDial:
					case <-ctx.Done():
					}
					return nil, errors.New("connect: connection refused (test)")
				}
			}
			p := startProxy(t, cfg)

			done := make(chan answer, 1)
			switch c.name {
			case "lost commit":
				fwd.arm("after-down") // the COMMIT lands, its answer is lost, paydb goes
				go func() { done <- trySubmit(p.URL, 1, newPayout("p-out", "acct-out")) }()
			case "unsent":
				go func() { done <- trySubmit(p.URL, 1, newPayout("p-out", "acct-out")) }()
				select {
				case <-dialing:
				case <-time.After(10 * time.Second):
					t.Fatal("the proxy never dialled the rail")
				}
				fwd.setDown(true)
				close(failDial)
			default:
				go func() { done <- trySubmit(p.URL, 1, newPayout("p-out", "acct-out")) }()
				hold.waitCalls(t, 1)
				fwd.setDown(true)
				hold.release()
			}
			a := <-done
			if a.Status != c.status {
				t.Fatalf("answer: %+v", a)
			}
			switch c.name {
			case "acked":
				if a.str("railReference") != "RS-p-out" {
					t.Fatalf("answer: %+v", a)
				}
			case "rejected":
				if a.str("declineReason") != "insufficient funds" {
					t.Fatalf("answer: %+v", a)
				}
			case "unsent":
				if a.str("stage") != "dial" {
					t.Fatalf("answer: %+v", a)
				}
			case "lost commit":
				if a.str("stage") != "intent_commit" {
					t.Fatalf("answer: %+v", a)
				}
			}
			if c.name == "lost commit" {
				// The forwarder closes the proxy's side before it delivers the
				// COMMIT, so the 503 can be answered before paydb has committed.
				eventually(t, 5*time.Second, "the lost COMMIT to land", func() bool {
					return len(rowsOf(t, db, "p-out")) > 0
				})
			}
			if rs := rowsOf(t, db, "p-out"); len(rs) != 1 || rs[0].Outcome != nil {
				t.Fatalf("rows while paydb refuses writes: %+v", rs)
			}

			time.Sleep(3 * time.Second)
			fwd.setDown(false)
			eventually(t, 3*cfg.InterruptedAfter, "the row to be resolved", func() bool {
				rs := rowsOf(t, db, "p-out")
				return len(rs) == 1 && rs[0].Outcome != nil
			})
			rs := rowsOf(t, db, "p-out")
			if outcomeOf(rs[0]) != c.outcome {
				t.Fatalf("row resolved %s, want %s (the outcome the proxy knew): %+v", outcomeOf(rs[0]), c.outcome, rs[0])
			}
			if c.outcome == lockapi.OutcomeRejected && (rs[0].DeclineReason == nil || *rs[0].DeclineReason != "insufficient funds") {
				t.Fatalf("decline reason: %+v", rs[0])
			}
			if c.outcome == lockapi.OutcomeAcked && (rs[0].RailReference == nil || *rs[0].RailReference != "RS-p-out") {
				t.Fatalf("rail reference: %+v", rs[0])
			}
			// Past the row's interrupt_at, with the janitor sweeping: it stays.
			time.Sleep(time.Until(rs[0].SubmittedAt.Add(cfg.InterruptedAfter + 500*time.Millisecond)))
			if again := rowsOf(t, db, "p-out"); outcomeOf(again[0]) != c.outcome {
				t.Fatalf("row changed to %s", outcomeOf(again[0]))
			}
			for series, want := range map[string]float64{
				"rail_resolution_late_total":                                 1,
				fmt.Sprintf(`rail_submission_total{outcome="%s"}`, c.metric): 1,
				`rail_submission_total{outcome="ambiguous"}`:                 0,
			} {
				if v := metric(t, p, series); v != want {
					t.Errorf("%s = %v, want %v", series, v, want)
				}
			}
			if n := hold.count("p-out"); c.outcome == lockapi.OutcomeUnsent && n != 0 || c.outcome != lockapi.OutcomeUnsent && n != 1 {
				t.Fatalf("rail calls: %d", n)
			}
		})
	}
}

// A COMMIT whose answer is lost while paydb hangs is answered
// 503 intent_commit at once — the UNSENT write of the row that may exist does
// not hold the caller for its 2 s bound — and that write is made in the
// background once paydb answers again.
func TestLostCommitAnsweredWithoutWaitingForPaydb(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	rail := startStub(t, 0)
	cfg := testConfig(viaURL, rail.URL)
	cfg.InterruptedAfter = cfg.InFlightBound() + InterruptMargin
	p := startProxy(t, cfg)

	fwd.arm("after-stall") // the COMMIT lands, its answer is lost, paydb hangs
	start := time.Now()
	a := trySubmit(p.URL, 1, newPayout("p-hang", "acct-hang"))
	took := time.Since(start)
	if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("answer: %+v", a)
	}
	// The admission itself ends when its COMMIT's answer is lost; what is measured
	// is whether the answer then waited for a write to a hanging paydb (2 s).
	if took >= ResolveBound {
		t.Errorf("the 503 took %s: the caller waited for the UNSENT write (bound %s)", took, ResolveBound)
	}
	if _, ok := a.Body["submissionId"]; ok {
		t.Errorf("the answer names a row nobody could read: %+v", a.Body)
	}
	eventually(t, 5*time.Second, "the lost COMMIT to land", func() bool { return len(rowsOf(t, db, "p-hang")) == 1 })
	time.Sleep(500 * time.Millisecond)
	fwd.setStall(false)
	// The proxy counts a late write after it commits (late first, then the
	// submission), so the counts are waited for with the row.
	eventually(t, cfg.InterruptedAfter, "the row to be resolved and counted", func() bool {
		rs := rowsOf(t, db, "p-hang")
		return len(rs) == 1 && rs[0].Outcome != nil && metric(t, p, "rail_resolution_late_total") > 0 &&
			metric(t, p, `rail_submission_total{outcome="unavailable"}`) > 0
	})
	if rs := rowsOf(t, db, "p-hang"); outcomeOf(rs[0]) != lockapi.OutcomeUnsent {
		t.Fatalf("row resolved %s, want UNSENT: %+v", outcomeOf(rs[0]), rs[0])
	}
	for series, want := range map[string]float64{
		"rail_resolution_late_total":                   1,
		`rail_submission_total{outcome="unavailable"}`: 1,
	} {
		if v := metric(t, p, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("rail calls: %+v", c)
	}
}

// When paydb stays out of reach past the row's
// interrupt_at, the proxy stops trying shortly before it and the janitor
// resolves the row TIMEOUT once paydb is back. The submission — answered
// ACKED — is then counted once, as ambiguous by the janitor, not also as acked.
func TestKnownOutcomeLostOnlyPastInterruptAtCountedOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	hold := newHoldingRail(t)
	cfg := testConfig(viaURL, hold.URL)
	cfg.InterruptedAfter = cfg.InFlightBound() + InterruptMargin
	cfg.JanitorInterval = 100 * time.Millisecond
	p := startProxy(t, cfg)
	done := make(chan answer, 1)
	go func() { done <- trySubmit(p.URL, 1, newPayout("p-gone", "acct-gone")) }()
	hold.waitCalls(t, 1)
	fwd.setDown(true)
	hold.release()
	if a := <-done; a.Status != http.StatusOK {
		t.Fatalf("answer: %+v", a)
	}
	eventually(t, 2*cfg.InterruptedAfter, "the proxy to give up shortly before interrupt_at", func() bool {
		return len(p.Logs.filter(func(m map[string]any) bool {
			msg, _ := m["msg"].(string)
			return strings.HasPrefix(msg, "resolving write still failing")
		})) == 1
	})
	fwd.setDown(false)
	// The janitor counts a row after its statement commits, so the count is
	// waited for with the row.
	eventually(t, 2*cfg.InterruptedAfter, "the janitor to resolve the row and count it", func() bool {
		rs := rowsOf(t, db, "p-gone")
		return len(rs) == 1 && rs[0].Outcome != nil && metric(t, p, `rail_submission_total{outcome="ambiguous"}`) > 0
	})
	if rs := rowsOf(t, db, "p-gone"); outcomeOf(rs[0]) != lockapi.OutcomeTimeout {
		t.Fatalf("row: %+v", rs[0])
	}
	for series, want := range map[string]float64{
		`rail_submission_total{outcome="acked"}`:     0,
		`rail_submission_total{outcome="ambiguous"}`: 1,
		"rail_resolution_late_total":                 0,
	} {
		if v := metric(t, p, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
}

// A stopping proxy does not abandon an outcome it knows. Run
// returns only once the write paydb refused has been made.
func TestDrainWaitsForLateResolution(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	fwd, viaURL := newPGForwarder(t, dbURL)
	hold := newHoldingRail(t)
	p := startProxy(t, testConfig(viaURL, hold.URL))
	done := make(chan answer, 1)
	go func() { done <- trySubmit(p.URL, 1, newPayout("p-stop", "acct-stop")) }()
	hold.waitCalls(t, 1)
	fwd.setDown(true)
	hold.release()
	if a := <-done; a.Status != http.StatusOK {
		t.Fatalf("answer: %+v", a)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop() }()
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) while the outcome it knew was still unwritten", err)
	case <-time.After(1500 * time.Millisecond):
	}
	fwd.setDown(false)
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rs := rowsOf(t, db, "p-stop"); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeAcked {
		t.Fatalf("rows after Run returned: %+v", rs)
	}
}

// A decline without a reason is recorded, and answered, as
// "unspecified" — never a NULL reason that reads like a lost one.
func TestDeclineWithoutReasonIsUnspecified(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	hold.reply = func(w http.ResponseWriter, _ string) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"status":"DECLINED"}`)
	}
	hold.release()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, hold.URL))
	a := submit(t, p.URL, 1, newPayout("p-why", "acct-why"))
	if a.code() != lockapi.CodeRailRejected || a.str("declineReason") != DeclineUnspecified {
		t.Fatalf("answer: %+v", a)
	}
	if rs := rowsOf(t, db, "p-why"); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeRejected ||
		rs[0].DeclineReason == nil || *rs[0].DeclineReason != DeclineUnspecified {
		t.Fatalf("rows: %+v", rs)
	}
}

// The audit trail comes in pages of at most 100 rows, oldest
// first, each with the submissionId to pass as after for the next (null on the
// last); after is parsed strictly.
func TestAuditTrailPages(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	// 250 attempts of one payout, interleaved with another payout's.
	if _, err := db.Exec(context.Background(), `
		INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
		                             currency, beneficiary, outcome, resolved_at)
		SELECT CASE WHEN g % 3 = 0 THEN 'p-other' ELSE 'p-long' END, 'acct-long', g, 'w', 'k', 1, 'EUR', 'b', 'FENCED', clock_timestamp()
		  FROM generate_series(1, 375) g`); err != nil {
		t.Fatal(err)
	}
	var want []int64
	for _, r := range rowsOf(t, db, "p-long") {
		want = append(want, r.ID)
	}
	if len(want) != 250 {
		t.Fatalf("%d rows of p-long", len(want))
	}
	p := startProxy(t, testConfig(dbURL, rail.URL))
	base := p.URL + "/v1/rail/submissions?payoutId=p-long"
	var got []int64
	sizes := []int{}
	u := base
	for range 5 {
		a := get(t, u)
		if a.Status != http.StatusOK {
			t.Fatalf("GET %s: %+v", u, a)
		}
		list, _ := a.Body["submissions"].([]any)
		sizes = append(sizes, len(list))
		for _, e := range list {
			id, _ := e.(map[string]any)["submissionId"].(json.Number).Int64()
			got = append(got, id)
		}
		next, present := a.Body["next"]
		if !present {
			t.Fatalf("answer without next: %+v", a.Body)
		}
		if next == nil {
			break
		}
		n, _ := next.(json.Number).Int64()
		if n != got[len(got)-1] {
			t.Fatalf("next %d, last row of the page %d", n, got[len(got)-1])
		}
		u = fmt.Sprintf("%s&after=%d", base, n)
	}
	if fmt.Sprint(sizes) != "[100 100 50]" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages of %v rows; ids %v, want %v", sizes, got, want)
	}
	if a := get(t, fmt.Sprintf("%s&after=%d", base, want[len(want)-1])); a.Status != http.StatusOK ||
		len(a.Body["submissions"].([]any)) != 0 || a.Body["next"] != nil {
		t.Fatalf("after the last row: %+v", a)
	}
	for _, bad := range []string{"after=0", "after=-1", "after=01", "after=abc", "after=1.5", "after=", "after=1&after=2",
		"after=99999999999999999999", "after=%201"} {
		a := get(t, base+"&"+bad)
		errs, _ := a.Body["errors"].([]any)
		if a.Status != http.StatusBadRequest || a.code() != lockapi.CodeInvalidRequest || len(errs) != 1 ||
			errs[0].(map[string]any)["field"] != "after" {
			t.Errorf("%s: %+v", bad, a)
		}
	}
}

// With a million rows in rail_submission the audit-trail read is
// an index range scan of rail_submission_payout_idx, not a scan of the table.
// The rows are made by one SQL statement (payout ids in index order, so the
// insert takes seconds, not minutes). Not parallel: the insert loads the test
// cluster that the package's other tests share, and their 2 s bounds would feel
// it; it runs before they start, and the rows go when it ends.
func TestAuditTrailReadIsIndexedOnAMillionRows(t *testing.T) {
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	ctx := context.Background()
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), "TRUNCATE rail_submission") })
	if _, err := db.Exec(ctx, `
		INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
		                             currency, beneficiary, outcome, resolved_at)
		SELECT 'filler-' || lpad(g::text, 7, '0'), 'acct-filler', g, 'w', 'k', 1, 'EUR', 'b', 'FENCED', now()
		  FROM generate_series(1, 1000000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "ANALYZE rail_submission"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, "EXPLAIN "+listSQL, "filler-0000777", int64(0), MaxListPage+1)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "rail_submission_payout_idx") || strings.Contains(text, "Seq Scan") {
		t.Fatalf("the audit-trail read is not an index scan of rail_submission_payout_idx:\n%s", text)
	}
	rail := startStub(t, 0)
	p := startProxy(t, testConfig(dbURL, rail.URL))
	a := get(t, p.URL+"/v1/rail/submissions?payoutId=filler-0000777")
	if list, _ := a.Body["submissions"].([]any); a.Status != http.StatusOK || len(list) != 1 {
		t.Fatalf("audit read: %+v", a)
	}
}

// A password in RAIL_BASE_URL or PAYDB_URL never appears in an
// exit message, a log line or an answer, and readiness says DOWN without the
// database's or the rail's details (those go to the log, passwords redacted).
func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pw"
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for name, value := range map[string]string{
		"RAIL_BASE_URL": "http://rail-user:" + secret + "@127.0.0.1:1/?x=1",
		"PAYDB_URL":     "postgres://postgres:" + secret + "@[::1",
	} {
		_, _, err := ParseConfigTo(nil, env(map[string]string{name: value}), io.Discard)
		var stderr strings.Builder
		if code := serve.ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), name) || strings.Contains(stderr.String(), secret) {
			t.Errorf("%s with a password: exit %d, %q", name, code, stderr.String())
		}
	}

	dbURL := pgtest.PaydbURL(t)
	fwd, viaURL := newPGForwarder(t, dbURL)
	u, err := url.Parse(viaURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), secret) // the test cluster trusts: any password will do
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	railURL := "http://rail-user:" + secret + "@" + dead.Addr().String()
	_ = dead.Close()
	p := startProxy(t, testConfig(u.String(), railURL))

	var answers []string
	record := func(resp *http.Response, err error) {
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answers = append(answers, string(b))
	}
	a := submit(t, p.URL, 1, newPayout("p-secret", "acct-secret"))
	if a.str("stage") != "dial" {
		t.Fatalf("answer: %+v", a)
	}
	answers = append(answers, fmt.Sprint(a.Body))
	record(testHTTP.Get(p.URL + "/readyz"))
	fwd.setDown(true)
	record(testHTTP.Get(p.URL + "/readyz"))
	record(testHTTP.Get(p.URL + "/v1/rail/submissions?payoutId=p-secret"))
	a = submit(t, p.URL, 2, newPayout("p-secret-2", "acct-secret"))
	answers = append(answers, fmt.Sprint(a.Body))

	for _, ans := range answers {
		for _, leak := range []string{secret, "rail-user", "postgres", u.Host, "dial tcp"} {
			if strings.Contains(ans, leak) {
				t.Errorf("an answer shows %q: %s", leak, ans)
			}
		}
	}
	var r struct {
		Components map[string]struct{ Status, Detail string }
	}
	_ = json.Unmarshal([]byte(answers[len(answers)-3]), &r)
	if r.Components["db"].Status != "DOWN" || r.Components["railStub"].Status != "DOWN" {
		t.Fatalf("readiness: %s", answers[len(answers)-3])
	}
	logs := p.Logs.String()
	if strings.Contains(logs, secret) {
		t.Errorf("the log shows the password:\n%s", logs)
	}
	// The reasons are in the log, for the operator.
	for _, comp := range []string{"db", "railStub"} {
		ev := p.Logs.filter(func(m map[string]any) bool { return m["event"] == "readiness_down" && m["component"] == comp })
		if len(ev) == 0 || ev[0]["error"] == "" {
			t.Errorf("no readiness_down log line for %s with its reason", comp)
		}
	}
}

// idleClosingRail answers every request, except one that arrives on a connection
// left idle longer than idle: that connection it closes without reading the
// request — a server's idle timeout firing just as a request arrives, which
// no client can tell from a request the server read and then dropped. It counts
// the requests it read, and the connections.
type idleClosingRail struct {
	URL   string
	idle  time.Duration
	mu    sync.Mutex
	refs  map[string]int
	conns int
}

func newIdleClosingRail(t testing.TB, idle time.Duration) *idleClosingRail {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &idleClosingRail{URL: "http://" + ln.Addr().String(), idle: idle, refs: map[string]int{}}
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
			go r.serve(conn)
		}
	}()
	return r
}

func (r *idleClosingRail) serve(conn net.Conn) {
	defer conn.Close()
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
	return r.refs[ref], r.conns
}

// RAIL_IDLE_CONN_TIMEOUT. A rail that closes connections idle
// for more than 500 ms; two submissions 1.5 s apart. With an idle timeout above
// the rail's, the second goes out on the pooled connection the rail closes
// unread, and a payment the rail never received ends TIMEOUT — counted in
// rail_reused_conn_failure_total so an operator can see it. Below the rail's,
// or 0 (no reuse), the second gets a connection of its own and is ACKED.
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
