package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	"lock.dev/internal/stack"
)

// The reconciler (docs/contracts/reconciliation.md) runs beside the executors for
// the whole run, as it would in production, and closes the books: after the
// executors stop, the run waits for its final pass — one whose read of the rail's
// statement began past every attempt's settle window — so that every AMBIGUOUS
// payout is settled PAID, DECLINED or NOT_PRESENTED from the rail's own records
// before the ground truth is judged (invariant 7).

// reconcilerInterval is the pause between the demo reconciler's passes.
const reconcilerInterval = 500 * time.Millisecond

// SettleAfter is the RECONCILER_SETTLE_AFTER lockdemo gives its reconciler: as
// long as RAIL_PROXY_INTERRUPTED_AFTER, the longest rail-proxy holds an intent
// before its call has surely reached the rail or been given up (admission,
// connect, read, resolution, a margin). A call not in the rail-stub's books that
// long after its intent never will be: the stub books a call before anything
// else. Short, so the run settles everything within seconds; production's default
// is 5 minutes.
func (c Config) SettleAfter() time.Duration { return c.InterruptedAfter() }

// statementAcceptedOnly says the run's statement is a camt.053, which lists
// only what moved money (the ISO 20022 rail's statement route, or statement
// files): a declined call is on none, and the reconciler settles an AMBIGUOUS
// payout whose call was declined NOT_PRESENTED once its window has passed —
// right for the books, since no money moved (docs/contracts/iso20022.md).
func (c Config) statementAcceptedOnly() bool {
	return c.RailProtocol == stack.RailISO20022 || c.StatementSource == stack.StatementDir
}

// startReconciler starts the run's reconciler on the stack.
func (s *scenario) startReconciler(ctx context.Context) error {
	r, err := s.st.StartReconciler(ctx, map[string]string{
		"RECONCILER_INTERVAL":     reconcilerInterval.String(),
		"RECONCILER_SETTLE_AFTER": s.cfg.SettleAfter().String(),
	})
	if err != nil {
		return fmt.Errorf("start the reconciler: %w", err)
	}
	s.rec = r
	return nil
}

// finalPass waits for the reconciler's final pass and reports how long it took.
func (s *scenario) finalPass(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	s.t.progress.say("[fencing %s] waiting for the reconciler's final pass (settle window %s) …", onOff(s.fencing), s.cfg.SettleAfter())
	wctx, cancel := context.WithTimeout(ctx, s.cfg.SettleAfter()+30*time.Second)
	defer cancel()
	if _, err := s.st.FinalPass(wctx, s.rec, s.cfg.SettleAfter()); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// writeBooks is the report's word on the reconciliation under the table.
func writeBooks(w io.Writer, runs []*Result) {
	for _, r := range runs {
		rec := r.Report.Reconciliation
		if rec == nil {
			continue
		}
		settled := rec.SettledPaid + rec.SettledDeclined + rec.SettledNotPresented
		fmt.Fprintf(w, "Reconciliation, fencing %s: %d AMBIGUOUS payouts settled from the rail's statement\n"+
			"(%d PAID, %d DECLINED, %d NOT_PRESENTED), %d left, %d exceptions", onOff(r.Fencing), settled,
			rec.SettledPaid, rec.SettledDeclined, rec.SettledNotPresented, rec.AmbiguousLeft, rec.ExceptionTotal())
		if n := rec.Exceptions["PRESENTED_TWICE"]; n > 0 {
			fmt.Fprintf(w, " (%d double payments)", n)
		}
		if r.Report.Held(7) {
			fmt.Fprintln(w, ": the books close\n(booked in the ledger = accepted by the rail).")
		} else {
			fmt.Fprintln(w, ": the books do NOT close (invariant 7).")
		}
	}
}
