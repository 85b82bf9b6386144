package executor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// booksOff runs rail-proxy without its books check (docs/contracts/books.md):
// for a test that needs the gate to admit what the books would refuse — an
// insider's submission of a payout with another beneficiary — or that shows
// what the fence alone does. payment-resource keeps its checks on.
var booksOff = map[string]map[string]string{"rail-proxy": {"RAIL_PROXY_BOOKS_CHECK": "false"}}

// mallory is the beneficiary an insider redirects a payout to.
const mallory = "NL66MALL0123456789"

// present submits req to rail-proxy as a workload of the executor's kind
// holding lease would (its token and grant), and returns the answer's status
// and problem code ("" for a 200).
func present(t *testing.T, st stackT, req lockapi.SubmissionRequest, lease *lockclient.Lease, owner string) (int, string) {
	t.Helper()
	body, _ := json.Marshal(req)
	hr, _ := http.NewRequest(http.MethodPost, st.ProxyURL+"/v1/rail/submissions", io.NopCloser(bytes.NewReader(body)))
	hr.ContentLength = int64(len(body))
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set(lockapi.HeaderFencingToken, fmt.Sprint(lease.Token()))
	hr.Header.Set(lockapi.HeaderOwnerID, owner)
	hr.Header.Set(lockapi.HeaderIdempotencyKey, fmt.Sprintf("%s:%d", req.PayoutID, lease.Token()))
	if g := lease.Grant(); g != "" {
		hr.Header.Set(lockapi.HeaderFencingGrant, g)
	}
	resp, err := st.HTTPClient(identity.NameExecutor, identity.NameRailProxy).Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(b, &p)
	return resp.StatusCode, p.Code
}

// requestOf is the submission of payout p as booked.
func requestOf(p lockapi.Payout) lockapi.SubmissionRequest {
	return lockapi.SubmissionRequest{PayoutID: p.PayoutID, AccountID: p.AccountID, AmountMinor: p.AmountMinor,
		Currency: p.Currency, Beneficiary: p.Beneficiary}
}

// waitPasses waits until r has run n more reconcile passes (logged at debug)
// after the call, each of them with a payout awaiting a person.
func waitPasses(t *testing.T, r *runningExecutor, n int) {
	t.Helper()
	from := r.logs.eventCount("reconcile_pass")
	testkit.EventuallyState(t, 30*time.Second, fmt.Sprintf("%s to run %d more reconcile passes", r.owner, n), func() (bool, string) {
		got := r.logs.eventCount("reconcile_pass") - from
		return got >= n, fmt.Sprintf("%d passes", got)
	})
}

// waitStaleSeen waits until a reconcile pass of r has listed a stale payout
// (the test's one), then for n more passes: what the pass does with the
// payout has been done n times over.
func waitStaleSeen(t *testing.T, r *runningExecutor, n int) {
	t.Helper()
	testkit.EventuallyState(t, 30*time.Second, r.owner+"'s reconcile pass to list the stale payout", func() (bool, string) {
		return r.logs.contains(`"event":"reconcile_pass"`, `"stale":1`), ""
	})
	waitPasses(t, r, n)
}

// claimant is who the payout row says claimed it.
func claimant(r payoutRow) string {
	if r.claimedBy == nil {
		return "nobody"
	}
	return *r.claimedBy
}

// debugLogs makes an executor log its reconcile passes.
func debugLogs(c *executor.Config) { c.LogLevel = "debug" }

// results reads every executor_payout_total result of r that is not 0.
func results(t *testing.T, r *runningExecutor) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, res := range []string{"paid", "declined", "ambiguous", "fenced", "duplicate", "unavailable", "skipped", "unbooked", "mismatch"} {
		if v := paidCount(t, r, res); v != 0 {
			out[res] = v
		}
	}
	return out
}

// A superseded holder (A, paused past its lease) wakes after a newer holder B
// re-claimed P but before B submitted: the fence admits A's token (the mark is
// still below it), the books refuse it — P is claimed under B's token.
// NOT_IN_BOOKS (token) is FENCED_OUT's twin: A posts nothing and counts
// `fenced`; the rail never sees A's attempt, and B pays P.
func TestNotInBooksForANewerClaimIsFencedOut(t *testing.T) {
	t.Parallel()
	st, a, gateA, p, t1 := staleSetup(t, "nb1", 0)
	b, gateB, t2 := reclaimFrozen(t, st, p, t1)
	gateA.release()
	testkit.EventuallyState(t, 30*time.Second, "A's submission to be answered", func() (bool, string) {
		return a.logs.contains(`"event":"submission_answered"`, p), fmt.Sprint(attempts(t, st, p))
	})
	if !a.logs.contains(`"event":"submission_answered"`, `"answer":"not_in_books"`, `"mismatch":"token"`, `"result":"fenced"`) {
		t.Fatalf("A's submission was not answered NOT_IN_BOOKS (token) and counted fenced:\n%s", a.logs.String())
	}
	if got := results(t, a); fmt.Sprint(got) != "map[fenced:1]" {
		t.Fatalf("A counted %v, want only fenced 1", got)
	}
	if want := fmt.Sprintf("[UNBOOKED@%d(stale-a)]", t1); fmt.Sprint(attempts(t, st, p)) != want {
		t.Fatalf("P's attempts %v, want %s", attempts(t, st, p), want)
	}
	if c := railCalls(t, st)[p]; len(c) != 0 {
		t.Fatalf("A's refused submission reached the rail: %+v", c)
	}
	gateB.release()
	testkit.EventuallyState(t, 30*time.Second, "B to pay P", func() (bool, string) {
		r := payout(t, st, p)
		return r.status == lockapi.StatusPaid, r.status
	})
	a.stop(t)
	b.stop(t)
	row := checkPaidOnce(t, st, p)
	if row.fenceToken != t2 {
		t.Fatalf("P was posted under %d, want B's %d", row.fenceToken, t2)
	}
	if a.logs.contains(`"event":"payout_posted"`) || a.logs.contains(`"event":"post_refused"`) ||
		a.logs.contains(`"event":"unbooked_own_payout"`) {
		t.Fatalf("A posted, or reported its refusal as its own payout's:\n%s", a.logs.String())
	}
}

// The books change under a holder: A claims P and, paused before its
// submission, the payout row's beneficiary is changed in paydb. A presents P as
// it was claimed; the books refuse its own fields (beneficiary). A posts
// nothing, logs unbooked_own_payout at ERROR and counts `unbooked`; P stays
// CLAIMED by A for a person. Neither A's reconcile pass nor another executor's
// re-claims or presents P again, pass after pass; the other executor reports it
// once.
func TestUnbookedOwnPayoutIsLeftForAPerson(t *testing.T) {
	t.Parallel()
	st, _ := startStack(t, nil)
	ps := createPayouts(t, st, "nb2", 1, 1)
	p := ps[0].PayoutID
	gateA := newGate(p)
	a := startExecutor(t, st, "holder-a", func(c *executor.Config) {
		c.Workers = 1
		c.LeaseTTL = time.Second
		c.PauseProbability = 1
		c.PauseHook = gateA.hook
		debugLogs(c)
	})
	gateA.waitEntered(t, "executor A")
	t1 := payout(t, st, p).fenceToken
	if _, err := st.Paydb.Exec(context.Background(), `UPDATE payout SET beneficiary = $2 WHERE payout_id = $1`, p, "NL02ABNA0123456789"); err != nil {
		t.Fatal(err)
	}
	gateA.release()
	testkit.EventuallyState(t, 30*time.Second, "A to count its payout unbooked", func() (bool, string) {
		return paidCount(t, a, "unbooked") == 1, fmt.Sprint(attempts(t, st, p))
	})
	if !a.logs.contains(`"level":"ERROR"`, `"event":"unbooked_own_payout"`, `"mismatch":"beneficiary"`, p) {
		t.Fatalf("no unbooked_own_payout at ERROR naming the mismatch:\n%s", a.logs.String())
	}
	if strings.Contains(a.logs.String(), ps[0].Beneficiary) {
		t.Fatalf("a beneficiary was logged in full:\n%s", a.logs.String())
	}

	// Another executor, and A's own reconcile pass, find P stale: left alone.
	b := startExecutor(t, st, "other-b", func(c *executor.Config) { c.Workers = 1; c.LeaseTTL = time.Second; debugLogs(c) })
	waitStaleSeen(t, b, 5)
	waitStaleSeen(t, a, 5)

	r := payout(t, st, p)
	if r.status != lockapi.StatusClaimed || r.fenceToken != t1 || r.claimedBy == nil || *r.claimedBy != "holder-a" {
		t.Fatalf("P is %s with token %d by %s, want still CLAIMED with %d by holder-a", r.status, r.fenceToken, claimant(r), t1)
	}
	if want := fmt.Sprintf("[UNBOOKED@%d(holder-a)]", t1); fmt.Sprint(attempts(t, st, p)) != want {
		t.Fatalf("P's attempts %v, want only %s", attempts(t, st, p), want)
	}
	if c := railCalls(t, st)[p]; len(c) != 0 {
		t.Fatalf("P reached the rail: %+v", c)
	}
	if got := results(t, a); fmt.Sprint(got) != "map[unbooked:1]" {
		t.Errorf("A counted %v, want only unbooked 1 (its reconcile pass reports nothing again)", got)
	}
	if got := results(t, b); fmt.Sprint(got) != "map[unbooked:1]" {
		t.Errorf("B counted %v, want only unbooked 1 (reported once)", got)
	}
	if n := b.logs.eventCount("unbooked_own_payout"); n != 1 {
		t.Errorf("B logged unbooked_own_payout %d times, want once", n)
	}
	if n := b.logs.eventCount("reconcile_left_for_person") + a.logs.eventCount("reconcile_left_for_person"); n != 2 {
		t.Errorf("P was looked at %d times by the two passes, want once each (then passed over without a call)", n)
	}
	if a.logs.contains(`"event":"reconcile_claimed"`) || b.logs.contains(`"event":"reconcile_claimed"`) {
		t.Errorf("a reconcile pass re-claimed P")
	}
	if !b.logs.contains(`"level":"ERROR"`, `"event":"unbooked_own_payout"`, p) {
		t.Errorf("B did not report P at ERROR")
	}
}

// An insider holding a genuine lease presents P first with its own beneficiary
// (rail-proxy's books check is off here: with it on, the insider's submission is
// refused NOT_IN_BOOKS and never reaches the rail). The executor then claims P
// and gets DUPLICATE_SUBMISSION whose first attempt, ACKED, presented another
// beneficiary: it adopts nothing, logs duplicate_mismatch at ERROR and counts
// `mismatch`; P stays CLAIMED for a person, and the executor's reconcile pass
// leaves it so.
func TestDuplicateOfAnotherBeneficiaryIsNotAdopted(t *testing.T) {
	t.Parallel()
	st, _ := startStack(t, booksOff)
	ctx := context.Background()
	ps := createPayouts(t, st, "nb3", 1, 1)
	p := ps[0]
	locks, _ := locksAs(t, st, identity.NameExecutor)
	lease, err := locks.Acquire(ctx, lockapi.AccountLockName(p.AccountID), "insider", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	redirected := requestOf(p)
	redirected.Beneficiary = mallory
	if status, code := present(t, st, redirected, lease, "insider"); status != http.StatusOK {
		t.Fatalf("the insider's submission was answered %d %s, want 200 with the books off", status, code)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	e := startExecutor(t, st, "honest", func(c *executor.Config) { c.Workers = 1; c.LeaseTTL = time.Second; debugLogs(c) })
	testkit.EventuallyState(t, 30*time.Second, "the executor to count the mismatch", func() (bool, string) {
		return paidCount(t, e, "mismatch") == 1, fmt.Sprint(attempts(t, st, p.PayoutID))
	})
	if !e.logs.contains(`"level":"ERROR"`, `"event":"duplicate_mismatch"`, `"source":"duplicate answer"`, `"differs":["beneficiary"]`, p.PayoutID) {
		t.Fatalf("no duplicate_mismatch at ERROR naming the beneficiary:\n%s", e.logs.String())
	}
	if s := e.logs.String(); strings.Contains(s, mallory) || strings.Contains(s, p.Beneficiary) {
		t.Fatalf("a beneficiary was logged in full:\n%s", s)
	}
	waitStaleSeen(t, e, 5)
	r := payout(t, st, p.PayoutID)
	if r.status != lockapi.StatusClaimed || r.claimedBy == nil || *r.claimedBy != "honest" {
		t.Fatalf("P is %s by %s, want still CLAIMED by the executor", r.status, claimant(r))
	}
	if got := results(t, e); fmt.Sprint(got) != "map[mismatch:1]" {
		t.Errorf("the executor counted %v, want only mismatch 1", got)
	}
	if want := fmt.Sprintf("[ACKED@%d(insider) DUPLICATE@%d(honest)]", lease.Token(), r.fenceToken); fmt.Sprint(attempts(t, st, p.PayoutID)) != want {
		t.Errorf("P's attempts %v, want %s", attempts(t, st, p.PayoutID), want)
	}
	if l := ledger(t, st, p.PayoutID)[p.PayoutID]; len(l) != 0 {
		t.Errorf("P has ledger entries %+v", l)
	}
	if e.logs.contains(`"event":"payout_posted"`) || e.logs.contains(`"event":"post_not_recorded"`) ||
		e.logs.contains(`"event":"post_refused"`) || e.logs.contains(`"event":"reconcile_claimed"`) {
		t.Errorf("the executor tried to post, or re-claimed P:\n%s", e.logs.String())
	}
	if !e.logs.contains(`"event":"reconcile_left_for_person"`, p.PayoutID) {
		t.Errorf("the pass did not say it left P for a person")
	}
}

// A holder that died left P CLAIMED with an attempt on record that presented
// another beneficiary (rail-proxy's books check off, as above: with it on the
// attempt would be UNBOOKED). The reconcile pass does not adopt the recorded
// outcome: it does not re-claim P, posts nothing, reports duplicate_mismatch
// once and counts `mismatch` once, pass after pass.
func TestReconcileDoesNotAdoptAMismatchingRecordedOutcome(t *testing.T) {
	t.Parallel()
	st, _ := startStack(t, booksOff)
	ctx := context.Background()
	p := createPayouts(t, st, "nb4", 1, 1)[0]
	locks, pauser := locksAs(t, st, identity.NameExecutor)
	lease, err := locks.Acquire(ctx, lockapi.AccountLockName(p.AccountID), "ghost", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := paymentsAs(st, identity.NameExecutor).ClaimWithGrant(ctx, p.PayoutID, lease.Token(), lease.Grant(), "ghost"); err != nil {
		t.Fatal(err)
	}
	redirected := requestOf(p)
	redirected.Beneficiary = mallory
	if status, code := present(t, st, redirected, lease, "ghost"); status != http.StatusOK {
		t.Fatalf("the ghost's submission was answered %d %s, want 200 with the books off", status, code)
	}
	pauser.Freeze(lease) // the holder is gone: no renewal, no release

	r := startExecutor(t, st, "rescuer", func(c *executor.Config) { c.Workers = 1; c.LeaseTTL = time.Second; debugLogs(c) })
	waitStaleSeen(t, r, 5)
	row := payout(t, st, p.PayoutID)
	if row.status != lockapi.StatusClaimed || row.fenceToken != lease.Token() || row.claimedBy == nil || *row.claimedBy != "ghost" {
		t.Fatalf("P is %s with token %d by %s, want still CLAIMED with %d by the ghost", row.status, row.fenceToken, claimant(row), lease.Token())
	}
	if !r.logs.contains(`"level":"ERROR"`, `"event":"duplicate_mismatch"`, `"source":"audit trail"`, `"differs":["beneficiary"]`, p.PayoutID) {
		t.Fatalf("no duplicate_mismatch at ERROR from the audit trail:\n%s", r.logs.String())
	}
	if !r.logs.contains(`"event":"reconcile_left_for_person"`, p.PayoutID) {
		t.Errorf("the pass did not say it left P for a person")
	}
	if got := results(t, r); fmt.Sprint(got) != "map[mismatch:1]" {
		t.Errorf("the rescuer counted %v, want only mismatch 1", got)
	}
	if n := r.logs.eventCount("duplicate_mismatch"); n != 1 {
		t.Errorf("duplicate_mismatch logged %d times, want once", n)
	}
	if want := fmt.Sprintf("[ACKED@%d(ghost)]", lease.Token()); fmt.Sprint(attempts(t, st, p.PayoutID)) != want {
		t.Errorf("P's attempts %v, want %s", attempts(t, st, p.PayoutID), want)
	}
	if r.logs.contains(`"event":"payout_posted"`) || r.logs.contains(`"event":"reconcile_claimed"`) || r.logs.contains(`"event":"post_refused"`) {
		t.Errorf("the rescuer re-claimed or posted P:\n%s", r.logs.String())
	}
}
