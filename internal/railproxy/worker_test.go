package railproxy

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// submitWithin is trySubmit bounded by ctx: a submission that would wait for
// ever (for a worker that is gone) comes back as an error instead of a hang.
func submitWithin(ctx context.Context, baseURL string, token int64, p payout) answer {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	h.Set(lockapi.HeaderOwnerID, "worker-1")
	h.Set(lockapi.HeaderIdempotencyKey, p.PayoutID+":"+strconv.FormatInt(token, 10))
	a, err := tryPost(ctx, baseURL, h, p.body())
	if err != nil {
		return answer{Err: err}
	}
	return a
}

// panicOnce returns a hook that panics the first time it is called for payout.
func panicOnce(payout string, fired *atomic.Bool) func(string) {
	return func(id string) {
		if id == payout && !fired.Swap(true) {
			panic("injected panic for " + payout)
		}
	}
}

// A panic in the admission worker or the resolution worker does not take the
// queue down: the member in the worker's hands is answered as its facts say —
// 503 stage intent_commit with nothing written and nothing presented when the
// panic came before its transaction; its committed admission, forwarded and
// resolved, when it came after; the rail's answer and its outcome written in the
// background when the resolving statement panicked — the next submissions are
// admitted (each bounded by a context deadline: a hang is an error, not a wait),
// and each panic is logged at ERROR (worker_panicked) and counted in
// rail_proxy_worker_panic_total{worker}.
func TestWorkerPanicAnswersItsMembersAndTheQueueGoesOn(t *testing.T) {
	t.Parallel()
	rail := newHoldingRail(t) // answers every call ACCEPTED, reference RS-{payoutId}
	rail.release()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, rail.URL)
	cfg.MaxGroup = DefaultMaxGroup
	var before, after, resolving atomic.Bool
	beforeHook := panicOnce("p-panic-before", &before)
	afterHook := panicOnce("p-panic-after", &after)
	resolveHook := panicOnce("p-panic-resolve", &resolving)
	cfg.hooks = &hooks{
		admitGroup: func(subs []Submission) {
			for _, s := range subs {
				beforeHook(s.PayoutID)
			}
		},
		admitted: func(subs []Submission, res []MemberResult) {
			for i, r := range res {
				if r.Err == nil && r.Admission.Verdict == Admitted {
					afterHook(subs[i].PayoutID)
				}
			}
		},
		resolveGroup: func(res []resolution) {
			for _, r := range res {
				if r.outcome == lockapi.OutcomeAcked && r.railRef != nil && *r.railRef == "RS-p-panic-resolve" {
					resolveHook("p-panic-resolve")
				}
			}
		},
	}
	p := startProxy(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	next := func(id string, token int64) {
		t.Helper()
		if a := submitWithin(ctx, p.URL, token, newPayout(id, "acct-next-"+id)); a.Err != nil || a.Status != http.StatusOK {
			t.Fatalf("the next submission (%s) after a panic: %d %v %v; want 200 (the queue goes on)", id, a.Status, a.Body, a.Err)
		}
	}
	panics := func(worker string) float64 {
		return metric(t, p, `rail_proxy_worker_panic_total{worker="`+worker+`"}`)
	}
	if panics(workerAdmission) != 0 || panics(workerResolution) != 0 {
		t.Fatalf("panic counters not zero from start-up")
	}

	// 1. The admission worker panics before the member's transaction.
	a := submitWithin(ctx, p.URL, 1, newPayout("p-panic-before", "acct-panic"))
	if a.Err != nil || a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("member of the panicked admission: %d %v %v; want 503 RAIL_UNAVAILABLE intent_commit", a.Status, a.Body, a.Err)
	}
	if _, named := a.Body["submissionId"]; named {
		t.Errorf("nothing was written, yet the answer names a row: %v", a.Body)
	}
	if rs := rowsOf(t, db, "p-panic-before"); len(rs) != 0 {
		t.Errorf("rows of the panicked member: %+v; want none", rs)
	}
	if !before.Load() {
		t.Fatal("the admission hook never panicked")
	}
	next("p-next-1", 1)
	if v := panics(workerAdmission); v != 1 {
		t.Errorf("admission panics = %v, want 1", v)
	}

	// 2. It panics after the member's transaction committed: the member gets its
	// committed admission and is forwarded and resolved as usual.
	a = submitWithin(ctx, p.URL, 2, newPayout("p-panic-after", "acct-panic"))
	if a.Err != nil || a.Status != http.StatusOK || a.str("railReference") != "RS-p-panic-after" {
		t.Fatalf("member whose admission committed before the panic: %d %v %v; want 200 ACKED", a.Status, a.Body, a.Err)
	}
	if !after.Load() {
		t.Fatal("the after-admission hook never panicked")
	}
	if rs := rowsOf(t, db, "p-panic-after"); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeAcked {
		t.Errorf("rows: %+v; want one ACKED", rs)
	}
	next("p-next-2", 1)
	if v := panics(workerAdmission); v != 2 {
		t.Errorf("admission panics = %v, want 2", v)
	}

	// 3. The resolution worker panics on the member's resolving write: the caller
	// gets the rail's answer, and the write is made in the background.
	a = submitWithin(ctx, p.URL, 3, newPayout("p-panic-resolve", "acct-panic"))
	if a.Err != nil || a.Status != http.StatusOK || a.str("railReference") != "RS-p-panic-resolve" {
		t.Fatalf("member of the panicked resolution: %d %v %v; want 200 ACKED", a.Status, a.Body, a.Err)
	}
	if !resolving.Load() {
		t.Fatal("the resolution hook never panicked")
	}
	eventually(t, 30*time.Second, "the panicked member's row to be resolved and counted", func() bool {
		rs := rowsOf(t, db, "p-panic-resolve")
		return len(rs) == 1 && rs[0].Outcome != nil && metric(t, p, "rail_resolution_late_total") == 1
	})
	if rs := rowsOf(t, db, "p-panic-resolve"); outcomeOf(rs[0]) != lockapi.OutcomeAcked {
		t.Errorf("row: %+v; want ACKED", rs[0])
	}
	next("p-next-3", 1)
	if v := panics(workerResolution); v != 1 {
		t.Errorf("resolution panics = %v, want 1", v)
	}

	// Every submission counted once, under its row's outcome; the rail called
	// once per forwarded payout and never for the first member.
	for series, want := range map[string]float64{
		`rail_submission_total{outcome="acked"}`:       5,
		`rail_submission_total{outcome="unavailable"}`: 1,
		`rail_submission_total{outcome="ambiguous"}`:   0,
	} {
		if v := metric(t, p, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	for id, want := range map[string]int{"p-panic-before": 0, "p-panic-after": 1, "p-panic-resolve": 1} {
		if n := rail.count(id); n != want {
			t.Errorf("rail calls for %s: %d, want %d", id, n, want)
		}
	}
	ev := p.Logs.events("worker_panicked")
	if len(ev) != 3 {
		t.Fatalf("worker_panicked lines: %v; want 3", ev)
	}
	for i, want := range []string{workerAdmission, workerAdmission, workerResolution} {
		if ev[i]["level"] != "ERROR" || ev[i]["worker"] != want || ev[i]["panic"] == nil {
			t.Errorf("worker_panicked %d: %v; want ERROR, worker %s, the panic", i, ev[i], want)
		}
	}
}
