package executor

import (
	"context"
	"time"

	"lock.dev/lockapi"
)

// reconciler runs the reconcile pass at start-up and then every reconcile interval.
func (e *executor) reconciler(ctx context.Context) {
	for {
		e.reconcilePass(ctx)
		if !sleep(ctx, e.cfg.reconcileInterval()) {
			return
		}
	}
}

// reconcilePass settles payouts left CLAIMED for longer than a lease TTL: their
// claimant died, lost its lease, or could not learn or post the outcome. "Longer
// than a lease TTL" is judged by this process's clock against updatedAt; it only
// decides when to look, never who may act — the account's lease and the fences do.
func (e *executor) reconcilePass(ctx context.Context) {
	before := time.Now().Add(-e.cfg.LeaseTTL)
	lctx, cancel := context.WithTimeout(ctx, e.cfg.requestTimeout())
	stale, err := e.payouts.List(lctx, lockapi.StatusClaimed, "", &before, reconcileLimit)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("looking for stale CLAIMED payouts failed", "event", "reconcile_scan_failed", "error", err.Error())
		}
		return
	}
	for _, p := range stale {
		if ctx.Err() != nil {
			return
		}
		if !e.take(p.AccountID) {
			continue // a worker of this process holds the account; next pass
		}
		e.reconcileOne(ctx, p)
		e.free(p.AccountID)
	}
}

// reconcileOne settles one stale CLAIMED payout under a new lease: re-claim it with
// the new token, then adopt the outcome the proxy recorded for its forwardable
// attempt; with no forwardable attempt on record the rail never saw the payout, so
// it is submitted (the new token passes the fence) and the answer mapped as in a
// cycle. An attempt still unresolved is left alone: nothing resubmits it.
func (e *executor) reconcileOne(ctx context.Context, stale lockapi.Payout) {
	lease, ok := e.acquire(ctx, stale.AccountID)
	if !ok {
		return
	}
	defer e.release(lease)
	if e.stopped(ctx, lease, "claim") {
		return
	}
	p, ok := e.claim(ctx, lease, stale.PayoutID)
	if !ok {
		return
	}
	token := lease.Token()
	e.log.Info("reconciling a stale claim", "event", "reconcile_claimed", "payoutId", p.PayoutID,
		"accountId", p.AccountID, "token", token, "previousToken", stale.FenceToken, "previousClaimant", deref(stale.ClaimedBy))
	if e.stopped(ctx, lease, "read audit trail") {
		return
	}
	subs, err := e.trail(ctx, p.PayoutID)
	if err != nil {
		// Unknown is not "nothing": without the trail nothing is submitted.
		e.log.Warn("reconcile: reading the audit trail failed; left CLAIMED", "event", "trail_failed",
			"payoutId", p.PayoutID, "token", token, "error", err.Error())
		return
	}
	row := forwardable(subs)
	if row == nil {
		e.submitAndSettle(ctx, lease, p)
		return
	}
	v := adoptRow(row)
	if v.post == nil {
		e.log.Info("reconcile: the attempt on record is unresolved; left CLAIMED", "event", "reconcile_unresolved",
			"payoutId", p.PayoutID, "token", token, "submissionId", row.SubmissionID, "why", v.why)
		return
	}
	e.log.Info("reconcile: adopting the recorded outcome", "event", "reconcile_adopted", "payoutId", p.PayoutID,
		"accountId", p.AccountID, "token", token, "submissionId", row.SubmissionID, "presentedToken", row.PresentedToken,
		"result", v.result, "post", v.post.Outcome)
	if e.stopped(context.WithoutCancel(ctx), lease, "post") {
		return
	}
	// The pass counts what it settles: a post that did not land settles nothing,
	// and the next pass would count the same payout again.
	if e.post(ctx, p, token, lease.Grant(), *v.post) {
		e.m.count(v.result)
	}
}
