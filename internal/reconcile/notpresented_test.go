package reconcile_test

import (
	"context"
	"testing"
	"time"

	"lock.dev/internal/railstub"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

// NOT_PRESENTED is safe. An attempt whose call never reached the
// rail (its rail accepted the connection and never read) ends TIMEOUT and the
// payout AMBIGUOUS. A pass before the settle window leaves it AMBIGUOUS; a pass
// after it settles NOT_PRESENTED, with no ledger entry. A call for that reference
// that reaches the rail afterwards is a LINE_CONTRADICTS_PAYOUT exception, recorded
// once however many passes see it, and nothing books it.
func TestNotPresentedOnlyPastTheWindowAndNeverBooked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	e.cfg.SettleAfter = 2 * time.Second
	void := e.blackholeProxy(t)
	p := payoutReq("p-void", "acct-1", 4200)
	if got := e.drive(t, void, p); got != lockapi.StatusAmbiguous {
		t.Fatalf("through the blackhole the payout was posted %s, want AMBIGUOUS", got)
	}
	if n := e.count(t, `SELECT count(*) FROM rail_submission WHERE payout_id = 'p-void' AND outcome = 'TIMEOUT'`); n != 1 {
		t.Fatalf("%d TIMEOUT rows, want 1", n)
	}
	if cs := e.calls(t); len(cs) != 0 {
		t.Fatalf("the rail saw %d calls; the blackhole must keep it from seeing any", len(cs))
	}

	// Inside the window: the call may still be on its way into the rail's books.
	rep := e.pass(t)
	if len(rep.Settled) != 0 || e.status(t, "p-void") != lockapi.StatusAmbiguous || rep.Ambiguous != 1 {
		t.Fatalf("inside the settle window: settled %v, payout %s, %d AMBIGUOUS left; want nothing settled",
			rep.Settled, e.status(t, "p-void"), rep.Ambiguous)
	}

	e.waitWindow(t)
	rep = e.pass(t)
	if rep.Settled["p-void"] != lockapi.StatusNotPresented || e.status(t, "p-void") != lockapi.StatusNotPresented {
		t.Fatalf("past the settle window: settled %v, payout %s; want NOT_PRESENTED", rep.Settled, e.status(t, "p-void"))
	}
	if rep.Ambiguous != 0 {
		t.Fatalf("%d AMBIGUOUS left", rep.Ambiguous)
	}
	if n := e.count(t, `SELECT count(*) FROM ledger_entry`); n != 0 {
		t.Fatalf("%d ledger entries for a payout never presented", n)
	}
	if n := e.count(t, `SELECT count(*) FROM payout_settlement WHERE payout_id = 'p-void' AND outcome = 'NOT_PRESENTED' AND statement_seq IS NULL`); n != 1 {
		t.Fatal("the settle is not recorded as NOT_PRESENTED without a statement seq")
	}

	// The call turns up after all (here: made to the rail directly).
	reply, err := e.rail.Pay(context.Background(), railstub.PaymentRequest{Reference: p.PayoutID, AccountID: p.AccountID,
		AmountMinor: p.AmountMinor, Currency: p.Currency, Beneficiary: p.Beneficiary})
	if err != nil || reply.Status != railstub.ResultAccepted {
		t.Fatalf("late call: %+v %v", reply, err)
	}
	for range 3 {
		e.pass(t)
	}
	if got := e.exceptions(t); len(got) != 1 || got[0] != "LINE_CONTRADICTS_PAYOUT p-void 1" {
		t.Fatalf("exceptions = %v, want exactly [LINE_CONTRADICTS_PAYOUT p-void 1]", got)
	}
	if e.status(t, "p-void") != lockapi.StatusNotPresented || e.count(t, `SELECT count(*) FROM ledger_entry`) != 0 {
		t.Fatal("a line after NOT_PRESENTED changed the payout or booked it")
	}
	if n := len(e.logs.Events("reconciliation_exception")); n != 1 {
		t.Fatalf("%d reconciliation_exception log lines, want 1 (logged once, when recorded)", n)
	}
}
