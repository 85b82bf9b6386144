package railproxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

type dbq = *pgxpool.Pool

// A strictly greater token is admitted and becomes the mark; a
// lower or an equal one is FENCED_OUT with a FENCED row, and the rail-stub's own
// call log shows no call for it. Fence first: a repeat payout whose token does
// not pass is FENCED_OUT, not DUPLICATE_SUBMISSION.
func TestFenceAdmitsGreaterRefusesLowerAndEqual(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, rail.URL))

	ok := submit(t, p.URL, 42, newPayout("p-1001", "acct-7"))
	if ok.Status != http.StatusOK || ok.str("outcome") != "ACKED" || ok.int("presentedToken") != 42 ||
		ok.str("payoutId") != "p-1001" || ok.str("accountId") != "acct-7" || ok.str("railReference") == "" || ok.int("submissionId") <= 0 {
		t.Fatalf("token 42: %+v", ok)
	}
	if got := mark(t, db, "acct-7"); got != 42 {
		t.Fatalf("mark after 42 = %d, want 42", got)
	}
	calls := rail.calls(t)
	if len(calls) != 1 || calls[0].Reference != "p-1001" || calls[0].RailReference != ok.str("railReference") {
		t.Fatalf("stub calls after the admitted submission: %+v", calls)
	}

	for _, c := range []struct {
		token  int64
		payout string
	}{{41, "p-1002"}, {42, "p-1003"}, {1, "p-1001"}, {42, "p-1001"}} {
		a := submit(t, p.URL, c.token, newPayout(c.payout, "acct-7"))
		if a.Status != http.StatusConflict || a.code() != lockapi.CodeFencedOut ||
			a.int("presentedToken") != c.token || a.int("highestToken") != 42 || a.int("submissionId") <= 0 {
			t.Fatalf("token %d payout %s: %+v", c.token, c.payout, a)
		}
		rs := rowsOf(t, db, c.payout)
		last := rs[len(rs)-1]
		if last.ID != a.int("submissionId") || outcomeOf(last) != "FENCED" || last.Token != c.token || last.ResolvedAt == nil {
			t.Fatalf("row of fenced %s/%d: %+v", c.payout, c.token, last)
		}
	}
	if got := mark(t, db, "acct-7"); got != 42 {
		t.Fatalf("mark after fenced tokens = %d, want 42", got)
	}
	// The ground truth: the rail was presented the one admitted payout, nothing else.
	if calls := rail.calls(t); len(calls) != 1 {
		t.Fatalf("stub saw %d calls, want 1: %+v", len(calls), calls)
	}
	ev := p.Logs.events("fenced_out")
	if len(ev) != 4 {
		t.Fatalf("fenced_out log lines = %d, want 4", len(ev))
	}
	for _, f := range []string{"resource", "accountId", "payoutId", "presentedToken", "highestToken", "ownerId", "idempotencyKey", "submissionId", "service"} {
		if _, ok := ev[0][f]; !ok {
			t.Errorf("fenced_out lacks %s: %v", f, ev[0])
		}
	}
	if ev[0]["level"] != "WARN" || ev[0]["resource"] != "rail" {
		t.Errorf("fenced_out: %v", ev[0])
	}
	if v := metric(t, p, `rail_submission_total{outcome="fenced"}`); v != 4 {
		t.Errorf("rail_submission_total{fenced} = %v, want 4", v)
	}
	if v := metric(t, p, `lock_fenced_out_total{resource="rail"}`); v != 4 {
		t.Errorf("lock_fenced_out_total{rail} = %v, want 4", v)
	}
	if v := metric(t, p, `rail_submission_total{outcome="acked"}`); v != 1 {
		t.Errorf("rail_submission_total{acked} = %v, want 1", v)
	}
	res := p.Logs.events("submission_resolved")
	if len(res) != 1 || res[0]["level"] != "INFO" || res[0]["outcome"] != "ACKED" || res[0]["railReference"] != ok.str("railReference") {
		t.Fatalf("submission_resolved: %v", res)
	}
	for _, f := range []string{"payoutId", "accountId", "submissionId", "outcome", "railReference", "elapsedMs"} {
		if _, ok := res[0][f]; !ok {
			t.Errorf("submission_resolved lacks %s", f)
		}
	}
	// The beneficiary is personal data: no log line carries it.
	if strings.Contains(p.Logs.String(), "NL91ABNA0417164300") {
		t.Error("a log line carries the beneficiary")
	}
}

// A repeat payout with a token that passes the fence is
// DUPLICATE_SUBMISSION carrying the first attempt's facts; the mark still moves;
// the duplicate counter and log record it; the rail sees the payout once.
func TestDuplicateAnswersFirstAttempt(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, rail.URL))

	first := submit(t, p.URL, 10, newPayout("p-dup", "acct-1"))
	if first.Status != http.StatusOK {
		t.Fatalf("first: %+v", first)
	}
	dup := submit(t, p.URL, 11, newPayout("p-dup", "acct-1"))
	if dup.Status != http.StatusConflict || dup.code() != lockapi.CodeDuplicateSubmission {
		t.Fatalf("repeat: %+v", dup)
	}
	rs := rowsOf(t, db, "p-dup")
	if len(rs) != 2 || outcomeOf(rs[1]) != "DUPLICATE" || rs[1].ResolvedAt == nil || rs[1].Token != 11 {
		t.Fatalf("rows: %+v", rs)
	}
	if dup.int("submissionId") != rs[1].ID || dup.int("firstSubmissionId") != first.int("submissionId") ||
		dup.str("firstOutcome") != "ACKED" || dup.str("firstRailReference") != first.str("railReference") {
		t.Fatalf("duplicate answer: %+v", dup.Body)
	}
	at, err := time.Parse(time.RFC3339Nano, dup.str("firstSubmittedAt"))
	if err != nil || !at.Equal(rs[0].SubmittedAt) || at.Location() != time.UTC {
		t.Fatalf("firstSubmittedAt %q (%v), row %v", dup.str("firstSubmittedAt"), err, rs[0].SubmittedAt)
	}
	if got := mark(t, db, "acct-1"); got != 11 {
		t.Fatalf("a DUPLICATE passed the fence, so the mark is its token: got %d, want 11", got)
	}
	if n := rail.callsFor(t, "p-dup"); n != 1 {
		t.Fatalf("rail saw p-dup %d times", n)
	}
	if v := metric(t, p, "rail_duplicate_attempted_total"); v != 1 {
		t.Fatalf("rail_duplicate_attempted_total = %v", v)
	}
	if v := metric(t, p, `rail_submission_total{outcome="duplicate"}`); v != 1 {
		t.Fatalf("rail_submission_total{duplicate} = %v", v)
	}
	ev := p.Logs.events("duplicate_rail_submission_attempted")
	if len(ev) != 1 || ev[0]["level"] != "WARN" {
		t.Fatalf("duplicate log: %v", ev)
	}
	for _, f := range []string{"payoutId", "accountId", "presentedToken", "ownerId", "submissionId", "firstSubmissionId", "firstSubmittedAt", "firstOutcome"} {
		if _, ok := ev[0][f]; !ok {
			t.Errorf("duplicate log lacks %s: %v", f, ev[0])
		}
	}
	if ev[0]["firstSubmittedAt"] != dup.str("firstSubmittedAt") {
		t.Errorf("log firstSubmittedAt %v, answer %v", ev[0]["firstSubmittedAt"], dup.str("firstSubmittedAt"))
	}
	// Fence first: the same payout with a token that does not pass is FENCED_OUT.
	if a := submit(t, p.URL, 5, newPayout("p-dup", "acct-1")); a.code() != lockapi.CodeFencedOut {
		t.Fatalf("stale repeat: %+v", a)
	}
}

// While the first attempt is in flight its outcome is unknown: the DUPLICATE
// answer says firstOutcome null (and no rail reference).
func TestDuplicateWhileFirstInFlight(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	p := startProxy(t, testConfig(dbURL, hold.URL))

	firstDone := make(chan answer, 1)
	go func() { firstDone <- trySubmit(p.URL, 1, newPayout("p-hold", "acct-h")) }()
	hold.waitCalls(t, 1)
	dup := submit(t, p.URL, 2, newPayout("p-hold", "acct-h"))
	if dup.code() != lockapi.CodeDuplicateSubmission {
		t.Fatalf("repeat while in flight: %+v", dup)
	}
	if v, present := dup.Body["firstOutcome"]; !present || v != nil {
		t.Fatalf("firstOutcome = %v (present %v), want null", v, present)
	}
	if v, present := dup.Body["firstRailReference"]; !present || v != nil {
		t.Fatalf("firstRailReference = %v, want null", v)
	}
	hold.release()
	if a := <-firstDone; a.Status != http.StatusOK {
		t.Fatalf("first: %+v", a)
	}
	if n := hold.count("p-hold"); n != 1 {
		t.Fatalf("rail received p-hold %d times", n)
	}
}

// Many submissions of one payout at once, every token
// passing its own account's fence, so only the unique index stands between them
// and the rail. Exactly one is forwarded.
func TestConcurrentSamePayoutForwardedOnce(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 20)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, rail.URL))

	const n = 24
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			answers <- trySubmit(p.URL, 1, newPayout("p-race", fmt.Sprintf("acct-r%d", i)))
		})
	}
	close(start)
	wg.Wait()
	close(answers)
	acked, dups := 0, 0
	for a := range answers {
		switch {
		case a.Status == http.StatusOK:
			acked++
		case a.code() == lockapi.CodeDuplicateSubmission:
			dups++
		default:
			t.Errorf("unexpected answer %+v", a)
		}
	}
	if acked != 1 || dups != n-1 {
		t.Fatalf("acked %d, duplicates %d; want 1 and %d", acked, dups, n-1)
	}
	if c := rail.callsFor(t, "p-race"); c != 1 {
		t.Fatalf("rail received p-race %d times", c)
	}
	if rs := rowsOf(t, db, "p-race"); len(rs) != n {
		t.Fatalf("%d rows, want %d (one per attempt)", len(rs), n)
	}
}

// A rail slower than the read timeout, and a rail that drops the
// connection, are both RAIL_AMBIGUOUS with one TIMEOUT row, resolved_at set; the
// rail receives the call once, and a later submission of the same payout is a
// DUPLICATE, never a second call.
func TestTimeoutAndDropAreAmbiguousNeverRetried(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, rail.URL)
	cfg.RailReadTimeout = 400 * time.Millisecond
	p := startProxy(t, cfg)

	cases := []struct {
		payout    string
		latencyMs int
		dropRate  float64
		cause     string
	}{
		{"p-slow", 1200, 0, CauseTimeout},
		{"p-drop", 0, 1, CauseConnectionDropped},
	}
	for i, c := range cases {
		rail.chaos(t, c.latencyMs, 0, c.dropRate)
		a := submit(t, p.URL, int64(10+i), newPayout(c.payout, "acct-amb"))
		if a.Status != http.StatusConflict || a.code() != lockapi.CodeRailAmbiguous || a.int("submissionId") <= 0 {
			t.Fatalf("%s: %+v", c.payout, a)
		}
		rs := rowsOf(t, db, c.payout)
		if len(rs) != 1 || outcomeOf(rs[0]) != "TIMEOUT" || rs[0].ResolvedAt == nil || rs[0].ID != a.int("submissionId") {
			t.Fatalf("%s rows: %+v", c.payout, rs)
		}
		ev := p.Logs.events("rail_ambiguous")
		if len(ev) != i+1 || ev[i]["cause"] != c.cause || ev[i]["level"] != "ERROR" || ev[i]["payoutId"] != c.payout {
			t.Fatalf("rail_ambiguous log: %v", ev)
		}
		for _, f := range []string{"payoutId", "accountId", "presentedToken", "ownerId", "submissionId", "elapsedMs", "cause"} {
			if _, ok := ev[i][f]; !ok {
				t.Errorf("rail_ambiguous lacks %s", f)
			}
		}
	}
	rail.chaos(t, 0, 0, 0)
	// Let the slow reply land: a second call, had there been one, would be in the log by now.
	time.Sleep(1300 * time.Millisecond)
	for _, c := range cases {
		if n := rail.callsFor(t, c.payout); n != 1 {
			t.Fatalf("rail received %s %d times, want exactly 1", c.payout, n)
		}
		if a := submit(t, p.URL, 99, newPayout(c.payout, "acct-amb2-"+c.payout)); a.code() != lockapi.CodeDuplicateSubmission || a.str("firstOutcome") != "TIMEOUT" {
			t.Fatalf("resubmitting ambiguous %s: %+v", c.payout, a)
		}
		if n := rail.callsFor(t, c.payout); n != 1 {
			t.Fatalf("after resubmission the rail received %s %d times", c.payout, n)
		}
	}
	if v := metric(t, p, `rail_submission_total{outcome="ambiguous"}`); v != 2 {
		t.Fatalf("ambiguous = %v", v)
	}
}

// A declined payment is REJECTED, 422, with the rail's reason; no money moved.
func TestDeclineIsRejected(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, rail.URL))
	rail.chaos(t, 0, 1, 0)
	a := submit(t, p.URL, 3, newPayout("p-dec", "acct-d"))
	if a.Status != http.StatusUnprocessableEntity || a.code() != lockapi.CodeRailRejected || a.str("declineReason") == "" {
		t.Fatalf("decline: %+v", a)
	}
	rs := rowsOf(t, db, "p-dec")
	if len(rs) != 1 || outcomeOf(rs[0]) != "REJECTED" || rs[0].DeclineReason == nil || *rs[0].DeclineReason != a.str("declineReason") {
		t.Fatalf("rows: %+v", rs)
	}
	if v := metric(t, p, `rail_submission_total{outcome="rejected"}`); v != 1 {
		t.Fatalf("rejected = %v", v)
	}
}

// The mark lives in paydb, so a restarted proxy still refuses the
// lower token.
func TestRestartDoesNotReadmitLowerToken(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, rail.URL)

	p1 := startProxy(t, cfg)
	if a := submit(t, p1.URL, 42, newPayout("p-r1", "acct-restart")); a.Status != http.StatusOK {
		t.Fatalf("before restart: %+v", a)
	}
	if err := p1.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	p2 := startProxy(t, cfg)
	a := submit(t, p2.URL, 41, newPayout("p-r2", "acct-restart"))
	if a.code() != lockapi.CodeFencedOut || a.int("highestToken") != 42 {
		t.Fatalf("after restart: %+v", a)
	}
	if rs := rowsOf(t, db, "p-r2"); len(rs) != 1 || outcomeOf(rs[0]) != "FENCED" {
		t.Fatalf("rows: %+v", rs)
	}
	if n := rail.callsFor(t, "p-r2"); n != 0 {
		t.Fatalf("rail received the fenced payout %d times", n)
	}
}

// The audit trail: every attempt of a payout, oldest first; an unknown payout
// is an empty list; a malformed query is INVALID_REQUEST.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	p := startProxy(t, testConfig(dbURL, rail.URL))
	submit(t, p.URL, 5, newPayout("p-audit", "acct-a"))
	submit(t, p.URL, 4, newPayout("p-audit", "acct-a"))
	submit(t, p.URL, 6, newPayout("p-audit", "acct-a"))

	a := get(t, p.URL+"/v1/rail/submissions?payoutId=p-audit")
	list, _ := a.Body["submissions"].([]any)
	if a.Status != http.StatusOK || len(list) != 3 {
		t.Fatalf("audit: %+v", a)
	}
	want := []struct {
		token   string
		outcome string
	}{{"5", "ACKED"}, {"4", "FENCED"}, {"6", "DUPLICATE"}}
	var prev int64
	for i, e := range list {
		m := e.(map[string]any)
		if fmt.Sprint(m["presentedToken"]) != want[i].token || m["outcome"] != want[i].outcome || m["ownerId"] != "worker-1" ||
			m["payoutId"] != "p-audit" || m["accountId"] != "acct-a" || m["submittedAt"] == nil || m["resolvedAt"] == nil {
			t.Fatalf("entry %d: %v", i, m)
		}
		if _, ok := m["declineReason"]; !ok {
			t.Fatalf("entry %d lacks declineReason: %v", i, m)
		}
		id := answer{Body: m}.int("submissionId")
		if id <= prev {
			t.Fatalf("not oldest first: %v", list)
		}
		prev = id
	}
	if e := list[0].(map[string]any); e["railReference"] == nil {
		t.Fatalf("ACKED entry lacks railReference: %v", e)
	}
	if a := get(t, p.URL+"/v1/rail/submissions?payoutId=nobody"); a.Status != http.StatusOK || len(a.Body["submissions"].([]any)) != 0 {
		t.Fatalf("unknown payout: %+v", a)
	}
	for _, q := range []string{"", "?payoutId=", "?payoutId=a%20b", "?payoutId=x&payoutId=y", "?payoutId=x&other=1", "?payoutId=%zz"} {
		if a := get(t, p.URL+"/v1/rail/submissions"+q); a.Status != http.StatusBadRequest || a.code() != lockapi.CodeInvalidRequest {
			t.Fatalf("query %q: %+v", q, a)
		}
	}
}

// The caller going away never aborts an admitted rail call or its resolution.
func TestCallerCancellationDoesNotAbortRailCall(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, hold.URL))

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set(lockapi.HeaderFencingToken, "7")
		h.Set(lockapi.HeaderOwnerID, "w")
		h.Set(lockapi.HeaderIdempotencyKey, "k")
		_, err := tryPost(ctx, p.URL, h, newPayout("p-gone", "acct-g").body())
		errc <- err
	}()
	hold.waitCalls(t, 1)
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the caller's request was expected to fail after cancellation")
	}
	hold.release()
	eventually(t, 5*time.Second, "the row to be resolved", func() bool {
		rs := rowsOf(t, db, "p-gone")
		return len(rs) == 1 && rs[0].Outcome != nil
	})
	if rs := rowsOf(t, db, "p-gone"); outcomeOf(rs[0]) != "ACKED" || rs[0].RailReference == nil {
		t.Fatalf("row: %+v", rs[0])
	}
	if n := hold.count("p-gone"); n != 1 {
		t.Fatalf("rail received p-gone %d times", n)
	}
}

// If the row was resolved by someone else (the janitor) before the proxy's own
// resolution, the answer is what the row says, not what the rail said.
func TestResolutionFindsRowAlreadyResolved(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, hold.URL))

	done := make(chan answer, 1)
	go func() { done <- trySubmit(p.URL, 1, newPayout("p-jan", "acct-j")) }()
	hold.waitCalls(t, 1)
	// The janitor's own statement, standing in for a janitor that judged the row
	// interrupted: its interrupt_at is moved into the past first.
	if _, err := db.Exec(context.Background(),
		`UPDATE rail_submission SET interrupt_at = clock_timestamp() - interval '1 second' WHERE payout_id = 'p-jan'`); err != nil {
		t.Fatal(err)
	}
	st := &Store{pool: db}
	got, err := st.ResolveInterrupted(context.Background(), time.Hour, 10)
	if err != nil || len(got) != 1 || got[0].PayoutID != "p-jan" {
		t.Fatalf("janitor statement: %v %+v", err, got)
	}
	hold.release()
	a := <-done
	if a.Status != http.StatusConflict || a.code() != lockapi.CodeRailAmbiguous || a.int("submissionId") != got[0].SubmissionID {
		t.Fatalf("answer: %+v", a)
	}
	if rs := rowsOf(t, db, "p-jan"); len(rs) != 1 || outcomeOf(rs[0]) != "TIMEOUT" {
		t.Fatalf("row: %+v", rs)
	}
}

// The mark is advanced before the rail is called, not after: while token 10's
// call for one payout is still held at the rail, another payout of the same
// account presented with 10 (a replay) or 9 (an older holder) is already fenced,
// and the rail sees only the one call. A proxy that advanced the mark when the
// rail answered would admit both here.
func TestMarkAdvancedBeforeRailAnswers(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, hold.URL))

	firstDone := make(chan answer, 1)
	go func() { firstDone <- trySubmit(p.URL, 10, newPayout("p-a", "acct-m")) }()
	hold.waitCalls(t, 1)
	if m := mark(t, db, "acct-m"); m != 10 {
		t.Fatalf("mark while the rail holds the call = %d, want 10", m)
	}
	for _, tok := range []int64{10, 9} {
		a := submit(t, p.URL, tok, newPayout("p-b", "acct-m"))
		if a.Status != http.StatusConflict || a.code() != lockapi.CodeFencedOut {
			t.Fatalf("token %d while 10 is in flight: %d %s, want 409 FENCED_OUT", tok, a.Status, a.code())
		}
	}
	hold.release()
	if a := <-firstDone; a.Status != http.StatusOK {
		t.Fatalf("first: %+v", a)
	}
	hold.mu.Lock()
	calls := len(hold.refs)
	hold.mu.Unlock()
	if calls != 1 {
		t.Fatalf("rail received %d calls, want 1", calls)
	}
}
