package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

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
	if s.cfg.StatementSource == stack.StatementDir {
		if err := s.filesCoverEveryCall(wctx); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// uncoveredAccountsSQL lists the accounts of $1 whose imported statement files
// do not cover the moment $2 yet.
const uncoveredAccountsSQL = `
SELECT a FROM unnest($1::text[]) a
 WHERE NOT EXISTS (SELECT 1 FROM statement_coverage v WHERE v.account_id = a AND v.covered_to > $2)
 ORDER BY a`

// filesCoverEveryCall waits, in dir mode, until the statement files imported
// cover every account the rail booked a call for past the last call, then for
// one more completed pass. The final pass settles every AMBIGUOUS payout, but
// only waits for the accounts that have one: an account whose payouts all
// resolved at their answer may still have its last accepted call in a file not
// written or not imported yet, and the run judges the copy whole. A file lists
// every call booked before its end, and its import covers its accounts to that
// end, so once every account is covered past the last call the copy holds all.
func (s *scenario) filesCoverEveryCall(ctx context.Context) error {
	calls, err := s.st.Stub.Calls(ctx)
	if err != nil || len(calls) == 0 {
		return err
	}
	seen := map[string]bool{}
	var accounts []string
	for _, c := range calls {
		if !seen[c.AccountID] {
			seen[c.AccountID] = true
			accounts = append(accounts, c.AccountID)
		}
	}
	last := calls[len(calls)-1].ReceivedAt
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		rows, err := s.st.Paydb.Query(ctx, uncoveredAccountsSQL, accounts, last)
		if err != nil {
			return fmt.Errorf("the statement files' coverage: %w", err)
		}
		waiting, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("the statement files' coverage: %w", err)
		}
		if len(waiting) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for statement files to cover %v past the last call: %w", waiting, ctx.Err())
		case <-tick.C:
		}
	}
	const completed = `reconciler_pass_total{result="completed"}`
	before, err := s.rec.Metric(ctx, completed)
	if err != nil {
		return err
	}
	for {
		n, err := s.rec.Metric(ctx, completed)
		if err != nil {
			return err
		}
		if n > before {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the reconciler's pass after the last statement file: %w", ctx.Err())
		case <-tick.C:
		}
	}
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
