package stack

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"time"

	"lock.dev/internal/identity"

	"lock.dev/internal/reconcile"
	"lock.dev/internal/testkit"
)

// Reconciler is a reconciler running in this process against the stack.
type Reconciler struct {
	URL    string       // metrics and health (https with identities: call with Client)
	Client *http.Client // the ops workload's client towards the reconciler
	p      *inProcess
	// dir: its statement comes from files (RECONCILER_STATEMENT_SOURCE=dir),
	// and its settle window is judged per account against the coverage.
	dir bool
}

// StartReconciler runs a reconciler (docs/contracts/reconciliation.md) in-process
// on a free port, configured like the other services through its variables
// (docs/contracts/configuration.md, reconciliation.md): paydb, rail-proxy and
// payment-resource of the stack, the stack's settle token and the reconciler's
// own identity (the workload "reconciler"), then
// Options.Env["reconciler"], then env. It returns once the reconciler is ready;
// Close stops it, before the other services. Several may run at once.
func (s *Stack) StartReconciler(ctx context.Context, env map[string]string) (*Reconciler, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("stack: reconciler listen: %w", err)
	}
	e := s.env("reconciler", s.withUnsafe("paydb", map[string]string{
		"PAYDB_URL":            s.PaydbURL,
		"RAIL_PROXY_URL":       s.ProxyURL,
		"PAYMENT_RESOURCE_URL": s.PaymentURL,
		"PAYMENT_SETTLE_TOKEN": s.SettleToken,
		"RECONCILER_ADDR":      ln.Addr().String(),
	}))
	maps.Copy(e, env)
	p, err := runInProcess("reconciler", ln, e, s.opts.Log, func(ctx context.Context, ln net.Listener, getenv func(string) string, log io.Writer) error {
		_, cfg, err := reconcile.ParseConfig(nil, getenv)
		if err != nil {
			return err
		}
		cfg.Listener, cfg.LogOutput = ln, log
		return reconcile.Run(ctx, cfg)
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.reconcilers = append(s.reconcilers, p)
	s.mu.Unlock()
	r := &Reconciler{URL: s.scheme() + ln.Addr().String(), Client: s.HTTPClient(identity.NameOps, identity.NameReconciler), p: p,
		dir: e["RECONCILER_STATEMENT_SOURCE"] == reconcile.SourceDir}
	if err := waitReady(ctx, r.URL, r.Client); err != nil {
		return nil, fmt.Errorf("stack: reconciler: %w", err)
	}
	return r, nil
}

// Metric reads one series of the reconciler's /metrics, as exposed (name with its
// labels, e.g. `reconciler_settled_total{to="paid"}`).
func (r *Reconciler) Metric(ctx context.Context, series string) (float64, error) {
	return testkit.ReadMetricWith(ctx, r.Client, r.URL, series)
}

// completedPasses is reconciler_pass_total{result="completed"}.
func (r *Reconciler) completedPasses(ctx context.Context) (float64, error) {
	return r.Metric(ctx, `reconciler_pass_total{result="completed"}`)
}

// lastDeadlineSQL is the latest moment a settle window starts from, as the
// reconciler's rules read it (docs/contracts/reconciliation.md): every attempt's
// submitted_at, and the updated_at of an AMBIGUOUS or PAID payout without a
// forwardable attempt (a PAID payout settled from the statement has its ACCEPTED
// line by construction, so its window never matters). Before any attempt: paydb's
// now().
const lastDeadlineSQL = `
SELECT coalesce(greatest(
         (SELECT max(submitted_at) FROM rail_submission),
         (SELECT max(p.updated_at) FROM payout p
           WHERE p.status IN ('AMBIGUOUS','PAID')
             AND NOT EXISTS (SELECT 1 FROM rail_submission s WHERE s.payout_id = p.payout_id
                              AND (s.outcome IS NULL OR s.outcome IN ('ACKED','REJECTED','TIMEOUT'))))),
       now())`

// FinalPass waits for the final pass: a pass of r that completed and whose whole
// read of the statement began after every settle window had passed. Call it once
// nothing reaches rail-proxy any more (executors stopped), with r the only
// reconciler: once the cursor's read_at — the start of a complete read, on
// paydb's clock — is later than the last window's start plus settleAfter, the
// next pass of r to complete has settled everything that can be settled and
// recorded every exception due. It returns that read_at.
//
// With a reconciler whose statement comes from files the window is judged per
// account, against what the files imported cover (statement_coverage): it waits
// until every AMBIGUOUS payout without a statement line has its account covered
// past its own window, so the rail-stub must keep writing
// statements of those accounts.
func (s *Stack) FinalPass(ctx context.Context, r *Reconciler, settleAfter time.Duration) (time.Time, error) {
	if r.dir {
		return s.finalPassPerAccount(ctx, r, settleAfter)
	}
	var last time.Time
	if err := s.Paydb.QueryRow(ctx, lastDeadlineSQL).Scan(&last); err != nil {
		return time.Time{}, fmt.Errorf("stack: the last settle window: %w", err)
	}
	threshold := last.Add(settleAfter)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	wait := func() error {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: waiting for the reconciler's final pass: %w", ctx.Err())
		case <-tick.C:
			return nil
		}
	}
	var readAt *time.Time
	for {
		if err := s.Paydb.QueryRow(ctx, `SELECT (SELECT read_at FROM reconciler_cursor)`).Scan(&readAt); err != nil {
			return time.Time{}, fmt.Errorf("stack: read the reconciler's cursor: %w", err)
		}
		if readAt != nil && readAt.After(threshold) {
			break
		}
		if err := wait(); err != nil {
			return time.Time{}, err
		}
	}
	// Passes run one after another: the next pass to complete is the one that
	// stored this read_at, or a later one.
	if err := r.nextCompletedPass(ctx, wait); err != nil {
		return time.Time{}, err
	}
	return *readAt, nil
}

// nextCompletedPass waits until a pass of r completes after the call.
func (r *Reconciler) nextCompletedPass(ctx context.Context, wait func() error) error {
	before, err := r.completedPasses(ctx)
	if err != nil {
		return err
	}
	for {
		n, err := r.completedPasses(ctx)
		if err != nil {
			return err
		}
		if n > before {
			return nil
		}
		if err := wait(); err != nil {
			return err
		}
	}
}

// uncoveredSQL lists the accounts of the AMBIGUOUS payouts without a statement
// line whose settle window the account's coverage has not passed yet, as the
// reconciler's rules read it in dir mode (docs/contracts/reconciliation.md): the
// window starts at the payout's last forwardable attempt's submitted_at (with
// none, its updated_at); $1 is the window in microseconds.
const uncoveredSQL = `
SELECT p.account_id, max(coalesce(a.submitted_at, p.updated_at)) + $1 * interval '1 microsecond', min(v.covered_to)
  FROM payout p
  LEFT JOIN statement_coverage v ON v.account_id = p.account_id
  LEFT JOIN LATERAL (SELECT max(s.submitted_at) AS submitted_at FROM rail_submission s
                      WHERE s.payout_id = p.payout_id
                        AND (s.outcome IS NULL OR s.outcome IN ('ACKED','REJECTED','TIMEOUT'))) a ON true
 WHERE p.status = 'AMBIGUOUS'
   AND NOT EXISTS (SELECT 1 FROM rail_statement_line l WHERE l.reference = p.payout_id)
 GROUP BY p.account_id
HAVING NOT coalesce(min(v.covered_to) > max(coalesce(a.submitted_at, p.updated_at)) + $1 * interval '1 microsecond', false)
 ORDER BY p.account_id`

// finalPassPerAccount is FinalPass for a reconciler in dir mode: once every
// AMBIGUOUS payout without a line has its account's coverage past its window,
// the next pass of r to complete settles it. It returns paydb's now() at that
// moment.
func (s *Stack) finalPassPerAccount(ctx context.Context, r *Reconciler, settleAfter time.Duration) (time.Time, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var waiting string
	wait := func() error {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: waiting for the reconciler's final pass (accounts not covered yet: %s): %w", waiting, ctx.Err())
		case <-tick.C:
			return nil
		}
	}
	failed := func(err error) error {
		if ctx.Err() != nil { // say what it was waiting for
			return fmt.Errorf("stack: waiting for the reconciler's final pass (accounts not covered yet: %s): %w", waiting, ctx.Err())
		}
		return fmt.Errorf("stack: the accounts' coverage: %w", err)
	}
	var at time.Time
	for {
		rows, err := s.Paydb.Query(ctx, uncoveredSQL, settleAfter.Microseconds())
		if err != nil {
			return time.Time{}, failed(err)
		}
		var uncovered []string
		for rows.Next() {
			var account string
			var due time.Time
			var covered *time.Time
			if err := rows.Scan(&account, &due, &covered); err != nil {
				rows.Close()
				return time.Time{}, failed(err)
			}
			uncovered = append(uncovered, fmt.Sprintf("%s due %s covered to %v", account, due.Format(time.RFC3339Nano), covered))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return time.Time{}, failed(err)
		}
		if len(uncovered) == 0 {
			if err := s.Paydb.QueryRow(ctx, `SELECT now()`).Scan(&at); err != nil {
				return time.Time{}, fmt.Errorf("stack: paydb's clock: %w", err)
			}
			break
		}
		waiting = strings.Join(uncovered, "; ")
		if err := wait(); err != nil {
			return time.Time{}, err
		}
	}
	if err := r.nextCompletedPass(ctx, wait); err != nil {
		return time.Time{}, err
	}
	return at, nil
}
