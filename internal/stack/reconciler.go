package stack

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
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
	r := &Reconciler{URL: s.scheme() + ln.Addr().String(), Client: s.HTTPClient(identity.NameOps, identity.NameReconciler), p: p}
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
func (s *Stack) FinalPass(ctx context.Context, r *Reconciler, settleAfter time.Duration) (time.Time, error) {
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
	before, err := r.completedPasses(ctx)
	if err != nil {
		return time.Time{}, err
	}
	for {
		n, err := r.completedPasses(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if n > before {
			return *readAt, nil
		}
		if err := wait(); err != nil {
			return time.Time{}, err
		}
	}
}
