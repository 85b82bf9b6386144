package reconcile_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"lock.dev/internal/railstub"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

// Each exception kind, planted, is recorded exactly once across
// repeated passes — with the payout and statement seq that locate it — logged once,
// and settles or unsettles nothing.
func TestEachExceptionKindRecordedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	e.cfg.SettleAfter = 2 * time.Second
	ctx := context.Background()
	direct := func(ref, account string, amount int64) {
		t.Helper()
		reply, err := e.rail.Pay(ctx, railstub.PaymentRequest{Reference: ref, AccountID: account, AmountMinor: amount,
			Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
		if err != nil || reply.Status != railstub.ResultAccepted {
			t.Fatalf("direct call for %s: %+v %v", ref, reply, err)
		}
	}

	// PRESENTED_TWICE: paid through the proxy (seq 1), then again directly (seq 2).
	if got := e.drive(t, e.st.ProxyURL, payoutReq("p-twice", "acct-1", 100)); got != lockapi.StatusPaid {
		t.Fatalf("p-twice posted %s", got)
	}
	direct("p-twice", "acct-1", 100)
	// LINE_CONTRADICTS_PAYOUT: declined through the proxy (seq 3), then accepted
	// directly (seq 4): money moved for a payout the books call DECLINED.
	e.chaos(t, 0, 1, 0)
	if got := e.drive(t, e.st.ProxyURL, payoutReq("p-declined", "acct-2", 200)); got != lockapi.StatusDeclined {
		t.Fatalf("p-declined posted %s", got)
	}
	e.chaos(t, 0, 0, 0)
	direct("p-declined", "acct-2", 200)
	// AMOUNT_MISMATCH: an AMBIGUOUS payout (its call never reached the rail) whose
	// only line (seq 5) is for another amount: it must stay AMBIGUOUS.
	if got := e.drive(t, e.blackholeProxy(t), payoutReq("p-amount", "acct-3", 300)); got != lockapi.StatusAmbiguous {
		t.Fatalf("p-amount posted %s", got)
	}
	direct("p-amount", "acct-3", 301)
	// UNKNOWN_REFERENCE: a payment for no payout (seq 6).
	direct("nobody-1", "acct-9", 999)
	// BENEFICIARY_MISMATCH: an AMBIGUOUS payout whose only line (seq 7) paid
	// someone else; it must stay AMBIGUOUS.
	if got := e.drive(t, e.blackholeProxy(t), payoutReq("p-benef", "acct-5", 500)); got != lockapi.StatusAmbiguous {
		t.Fatalf("p-benef posted %s", got)
	}
	if reply, err := e.rail.Pay(ctx, railstub.PaymentRequest{Reference: "p-benef", AccountID: "acct-5", AmountMinor: 500,
		Currency: "EUR", Beneficiary: "GB29NWBK60161331926819"}); err != nil || reply.Status != railstub.ResultAccepted {
		t.Fatalf("direct call for p-benef: %+v %v", reply, err)
	}
	// PAID_WITHOUT_LINE: a rail that said ACCEPTED and never booked the payment:
	// PAID as the audit trail recorded it, and no line on the statement.
	if got := e.drive(t, e.liarProxy(t, "RS-GHOST"), payoutReq("p-ghost", "acct-4", 400)); got != lockapi.StatusPaid {
		t.Fatalf("p-ghost posted %s", got)
	}
	// ATTEMPT_MISMATCH: its own holder presented it with another beneficiary;
	// the books refused it, no line, and it stays CLAIMED.
	attempt := payoutReq("p-attempt", "acct-6", 600)
	presented := attempt
	presented.Beneficiary = "GB29NWBK60161331926819"
	e.refusedAttempt(t, attempt, presented, lockapi.MismatchBeneficiary)

	before := map[string]string{}
	for _, id := range []string{"p-twice", "p-declined", "p-amount", "p-benef", "p-ghost", "p-attempt"} {
		before[id] = e.status(t, id)
	}
	total := map[string]int{}
	add := func(rep reconcile.PassReport) {
		for k, n := range rep.Exceptions {
			total[k] += n
		}
		if len(rep.Settled) != 0 {
			t.Fatalf("a pass settled %v; each AMBIGUOUS payout has a mismatching line", rep.Settled)
		}
	}

	// Inside the settle window PAID_WITHOUT_LINE is not due yet.
	add(e.pass(t))
	if slices.ContainsFunc(e.exceptions(t), func(s string) bool { return s == "PAID_WITHOUT_LINE p-ghost -" }) {
		t.Fatal("PAID_WITHOUT_LINE recorded inside the settle window")
	}
	e.waitWindow(t)
	for range 3 {
		add(e.pass(t))
	}

	want := []string{
		"AMOUNT_MISMATCH p-amount 5",
		"ATTEMPT_MISMATCH p-attempt -",
		"BENEFICIARY_MISMATCH p-benef 7",
		"LINE_CONTRADICTS_PAYOUT p-declined 4",
		"PAID_WITHOUT_LINE p-ghost -",
		"PRESENTED_TWICE p-twice 2",
		"UNKNOWN_REFERENCE - 6",
	}
	got := e.exceptions(t)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("exceptions = %v\nwant        %v", got, want)
	}
	for _, k := range reconcile.Kinds {
		if k == reconcile.KindUnstorableLine {
			continue // planted by TestUnstorableLineIsAnException: rail-stub writes only storable text
		}
		if k == reconcile.KindStatementFileChanged {
			continue // statement files only: TestStatementFilesImportedOnceInNameOrder
		}
		if total[k] != 1 {
			t.Errorf("passes reported %d new %s, want 1 over all passes", total[k], k)
		}
	}
	if n := len(e.logs.Events("reconciliation_exception")); n != len(want) {
		t.Errorf("%d reconciliation_exception log lines, want %d", n, len(want))
	}
	for id, s := range before {
		if now := e.status(t, id); now != s {
			t.Errorf("%s went from %s to %s: an exception never settles or unsettles", id, s, now)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line`); n != 7 {
		t.Errorf("%d statement lines copied, want 7 (each once)", n)
	}
}
