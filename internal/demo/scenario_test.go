package demo

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/invariants"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/stack"
)

func TestMain(m *testing.M) {
	// The rail-proxy the scenario crashes is this test binary started again.
	stack.ChildMain(nil)
	os.Exit(pgtest.Main(m))
}

// shortConfig is a shortened scenario with the full chaos (pauses past the
// lease, drops, declines, slow-rail windows, one rail-proxy crash), and more
// pauses than the default so that stale holders are sure to show up.
func shortConfig() Config {
	cfg := DefaultConfig()
	cfg.Payouts, cfg.Accounts = 60, 4
	cfg.Executors, cfg.Workers = 2, 2
	cfg.PauseProbability = 0.2
	cfg.Seed = 7
	cfg.MaxDuration = 60 * time.Second
	return cfg
}

func runShort(t *testing.T, fencing bool) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := runScenario(ctx, shortConfig(), fencing, target{
		paydbURL: pgtest.PaydbURL(t), lockdbURL: pgtest.LockdbURL(t), log: io.Discard,
		keysDir: filepath.Join(t.TempDir(), "keys"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Grants || !r.Identities {
		t.Errorf("the run does not sign and verify grants (%t) or run with identities (%t)", r.Grants, r.Identities)
	}
	if r.Crashes != 1 || r.Pauses == 0 {
		t.Errorf("the chaos did not happen: %d crashes, %d pauses", r.Crashes, r.Pauses)
	}
	if !r.Settled {
		t.Errorf("not every payout settled within %s", shortConfig().MaxDuration)
	}
	if r.Report.Payouts.Total != 60 || r.Report.RailCalls.Total == 0 {
		t.Errorf("report does not describe the run: %+v", r.Report.Payouts)
	}
	return r
}

// TestFencedScenarioHoldsEveryInvariant runs the whole system under chaos with
// fencing on and asserts, from ground truth, that every invariant held.
func TestFencedScenarioHoldsEveryInvariant(t *testing.T) {
	t.Parallel()
	r := runShort(t, true)
	for _, v := range r.Report.Invariants {
		if !v.Held {
			t.Errorf("invariant %d (%s) broken %d times", v.Invariant, v.Name, v.Violations)
		}
	}
	if !r.Report.OK() {
		t.Errorf("violations: %v", r.Report.Violations)
	}
	if r.Report.Count(invariants.CheckStaleAdmission) != 0 {
		t.Error("a stale admission with fencing on")
	}
	if m := r.Report.MoneyAtRisk; m.Presentations != 0 || len(m.Amounts) != 0 {
		t.Errorf("money at risk with fencing on: %+v", m)
	}
	// The fenced run checks the books, as users run the system, and invariant 8
	// is judged: only the books moved money.
	if !r.BooksChecked || !slices.ContainsFunc(r.Report.Invariants, func(v invariants.Verdict) bool { return v.Invariant == 8 && v.Held }) {
		t.Errorf("books checked %t; invariant 8 not judged and held: %+v", r.BooksChecked, r.Report.Invariants)
	}
	// The reconciler's final pass closed the books (invariant 7).
	if rec := r.Report.Reconciliation; !r.Report.Held(7) || rec == nil || rec.AmbiguousLeft != 0 || rec.ExceptionTotal() != 0 ||
		r.Report.Payouts.Ambiguous != 0 {
		t.Errorf("the books did not close: held %t, %+v", r.Report.Held(7), rec)
	}
	for _, m := range r.Report.Money {
		if m.Booked != m.AcceptedForPayouts {
			t.Errorf("%s: booked %d, the rail accepted %d for our payouts", m.Currency, m.Booked, m.AcceptedForPayouts)
		}
	}
	if t.Failed() {
		var b strings.Builder
		_ = r.Report.WriteTable(&b)
		t.Log("\n" + b.String())
	}
}

// TestUnfencedScenarioAdmitsStaleHolders runs the same seeded chaos with the
// fencing switch off: the paused holders' stale tokens reach the rail, and the
// checker counts them, so it can fail.
func TestUnfencedScenarioAdmitsStaleHolders(t *testing.T) {
	t.Parallel()
	r := runShort(t, false)
	if n := r.Report.Count(invariants.CheckStaleAdmission); n == 0 {
		var b strings.Builder
		_ = r.Report.WriteTable(&b)
		t.Fatalf("no stale admission with fencing off (%d pauses):\n%s", r.Pauses, b.String())
	}
	t.Logf("%d stale admissions from %d pauses", r.Report.Count(invariants.CheckStaleAdmission), r.Pauses)
	// What they cost: every stale admission but an UNSENT one put its amount in
	// front of the rail on a superseded lease. lockdemo never amends a payout, so
	// none presented a superseded instruction.
	stale, unsent := r.Report.Count(invariants.CheckStaleAdmission), 0
	for _, f := range r.Report.Violations {
		if f.Check == invariants.CheckStaleAdmission && strings.Contains(f.Detail, "(UNSENT)") {
			unsent++
		}
	}
	m := r.Report.MoneyAtRisk
	var sum int64
	for _, a := range m.Amounts {
		sum += a.AmountMinor
	}
	if m.Presentations != stale-unsent || (m.Presentations > 0) != (sum > 0) || m.Accepted > m.Presentations || m.Superseded != 0 {
		t.Errorf("money at risk %+v from %d stale admissions (%d UNSENT)", m, stale, unsent)
	}
	t.Log(r.Report.MoneyAtRiskLine())
	if r.Report.OK() || r.Report.Held(1) {
		t.Error("the report passes a run with stale admissions")
	}
	if r.Report.Submissions.Fenced != 0 || r.Report.Count(invariants.CheckFencingSwitch) != 0 {
		t.Error("the switch did not bypass the fence: FENCED rows with fencing off")
	}
	// What the fence alone prevents: the books are not checked either, so no
	// superseded holder is refused by them.
	if r.BooksChecked || r.Report.Submissions.Unbooked != 0 {
		t.Errorf("books checked %t, %d UNBOOKED rows: the fencing-off run must check neither fence nor books",
			r.BooksChecked, r.Report.Submissions.Unbooked)
	}
}

// TestFailoverScenarioHoldsEveryInvariant is lockdemo --failover, shortened: the
// same chaos on paydb and lockdb of a primary with a synchronous standby; mid-run
// a commit waits for the held standby, the primary is killed (SIGKILL) and the
// standby promoted. The run crossed the failover (tokens were handed out and
// submissions admitted after the kill) and every invariant held, the tokens
// handed out judged against lock_grant included.
func TestFailoverScenarioHoldsEveryInvariant(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := shortConfig()
	cfg.Payouts, cfg.Failover, cfg.Compare, cfg.Attack = 40, FailoverPromote, false, false
	r, err := runScenario(ctx, cfg, true, target{replicated: true, log: io.Discard, keysDir: filepath.Join(t.TempDir(), "keys")})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f := r.Failover
	if f == nil {
		t.Fatal("the run ended without a failover")
	}
	if f.FirstAdmittedMs < 0 || f.AfterKill == 0 {
		t.Errorf("nothing admitted or granted after the kill: %+v", f)
	}
	if !r.Report.OK() || !r.Report.Held(6) || !slices.ContainsFunc(r.Report.Checks, func(c invariants.Check) bool {
		return c.ID == invariants.CheckTokenIssuedTwice
	}) {
		var b strings.Builder
		_ = r.Report.WriteTable(&b)
		t.Errorf("across the failover (tokens judged: the check must be in the table):\n%s", b.String())
	}
	var b strings.Builder
	writeFailover(&b, []*Result{r})
	for _, want := range []string{"kill → first admitted submission", "503 answers meanwhile", "invariants across it: 1 held"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the failover section lacks %q:\n%s", want, b.String())
		}
	}
	t.Logf("\n%s", b.String())
}
