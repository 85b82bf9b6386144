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
//
// A payout left for a person (awaitsPerson) is passed over without a call while
// its claim is the one it was found with; it does not use up the pass's
// reconcileLimit, and the listing reads that many more rows so that it does not
// crowd out the payouts the pass can settle.
func (e *executor) reconcilePass(ctx context.Context) {
	before := time.Now().Add(-e.cfg.LeaseTTL)
	limit := min(scanLimit, reconcileLimit+e.holds())
	lctx, cancel := context.WithTimeout(ctx, e.cfg.requestTimeout())
	stale, err := e.payouts.List(lctx, lockapi.StatusClaimed, "", &before, limit)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			e.fails.failed("reconcile_scan_failed", "looking for stale CLAIMED payouts failed", err)
		}
		return
	}
	e.fails.recovered("reconcile_scan_failed")
	if len(stale) < limit {
		// The listing is whole: a payout held that is no longer in it with the
		// same claim was settled or re-claimed meanwhile.
		e.forgetHolds(stale, before)
	}
	worked, waiting := 0, 0
	for _, p := range stale {
		if ctx.Err() != nil {
			return
		}
		if e.awaitsPerson(p) {
			waiting++
			continue
		}
		if worked == reconcileLimit {
			break
		}
		worked++
		if !e.take(p.AccountID) {
			continue // a worker of this process holds the account; next pass
		}
		e.reconcileOne(ctx, p)
		e.free(p.AccountID)
	}
	e.log.Debug("reconcile pass done", "event", "reconcile_pass", "stale", len(stale), "worked", worked, "awaitingPerson", waiting)
}

// reconcileOne settles one stale CLAIMED payout under a new lease: re-claim it with
// the new token, then adopt the outcome the proxy recorded for its forwardable
// attempt; with no forwardable attempt on record the rail never saw the payout, so
// it is submitted (the new token passes the fence) and the answer mapped as in a
// cycle. An attempt still unresolved is left alone: nothing resubmits it.
//
// Before any of that, the audit trail is read once without a lease: when it
// shows that the payout waits for a person (needsPerson), the payout is neither
// re-claimed nor submitted — a re-claim would move the claim a person is to
// judge, and a submission would only be refused again (docs/contracts/books.md).
func (e *executor) reconcileOne(ctx context.Context, stale lockapi.Payout) {
	subs, err := e.trail(ctx, stale.PayoutID)
	if err != nil {
		e.log.Warn("reconcile: reading the audit trail failed; left CLAIMED", "event", "trail_failed",
			"payoutId", stale.PayoutID, "error", err.Error())
		return
	}
	if e.leaveForPerson(stale, subs) {
		return
	}
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
	// Read again under the claim: an attempt of the previous claimant may have
	// been admitted after the first read.
	subs, err = e.trail(ctx, p.PayoutID)
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
	if d := presentedBy(row).differs(p); len(d) > 0 {
		e.notAdopted(p, token, "audit trail", &row.SubmissionID, presentedBy(row), d)
		e.m.count(resultMismatch)
		e.hold(p.PayoutID, token, true)
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

// Why a stale payout waits for a person (docs/contracts/books.md).
const (
	personUnbooked = "unbooked" // its holder's own attempt was refused by the books
	personMismatch = "mismatch" // its forwardable attempt presented other fields
)

// needsPerson says whether the audit trail subs shows that the CLAIMED payout p
// waits for a person, and why:
//
//   - its forwardable attempt presented another account, amount, currency or
//     beneficiary than p's: whatever the rail did, it is not p's outcome to adopt
//     (mismatch);
//   - an attempt presented with p's current claim — its fence token and owner —
//     and with other fields than p's is on record UNBOOKED: the books refused
//     p's holder for p's own fields (a refusal for another claim's token or
//     owner cannot carry p's current claim), and the reconciler lists it as an
//     ATTEMPT_MISMATCH exception (unbooked). An UNBOOKED attempt of the current
//     claim with p's own fields was refused before that claim was made; it was
//     never presented to the rail, so p is re-claimed and presented as any
//     stale payout is.
//
// It returns the row that shows it.
func needsPerson(p lockapi.Payout, subs []lockapi.Submission) (string, *lockapi.Submission) {
	if row := forwardable(subs); row != nil && len(presentedBy(row).differs(p)) > 0 {
		return personMismatch, row
	}
	if p.ClaimedBy == nil {
		return "", nil
	}
	for i := range subs {
		s := &subs[i]
		if s.Outcome != nil && *s.Outcome == lockapi.OutcomeUnbooked &&
			s.PresentedToken == p.FenceToken && s.OwnerID == *p.ClaimedBy &&
			len(presentedBy(s).differs(p)) > 0 {
			return personUnbooked, s
		}
	}
	return "", nil
}

// leaveForPerson leaves the stale payout p CLAIMED, untouched, when its audit
// trail says a person must decide (needsPerson); it reports whether it did. The
// first time this process finds p so at its current claim, and no cycle of this
// process has reported it already, it is reported as a cycle would have:
// unbooked_own_payout or duplicate_mismatch at ERROR, counted unbooked or
// mismatch. Later passes skip p without a call until its claim changes.
func (e *executor) leaveForPerson(p lockapi.Payout, subs []lockapi.Submission) bool {
	why, row := needsPerson(p, subs)
	if why == "" {
		return false
	}
	reported := e.hold(p.PayoutID, p.FenceToken, true)
	e.log.Info("reconcile: the payout waits for a person; not re-claimed, nothing submitted", "event", "reconcile_left_for_person",
		"payoutId", p.PayoutID, "accountId", p.AccountID, "token", p.FenceToken, "claimant", deref(p.ClaimedBy),
		"why", why, "submissionId", row.SubmissionID)
	if reported {
		return true
	}
	f := presentedBy(row)
	switch why {
	case personMismatch:
		e.notAdopted(p, p.FenceToken, "audit trail", &row.SubmissionID, f, f.differs(p))
		e.m.count(resultMismatch)
	default:
		e.log.Error("rail-proxy's books refused this payout as its holder presented it: the payout stays CLAIMED for a person",
			"event", "unbooked_own_payout", "payoutId", p.PayoutID, "accountId", p.AccountID, "token", p.FenceToken,
			"ownerId", row.OwnerID, "submissionId", row.SubmissionID, "differs", f.differs(p),
			"beneficiary", lockapi.MaskBeneficiary(p.Beneficiary), "presentedBeneficiary", maskPresent(f.beneficiary))
		e.m.count(resultUnbooked)
	}
	return true
}

// personHold is a payout this process found waiting for a person, at the fence
// token of the claim it then had.
type personHold struct {
	token   int64
	checked bool      // the reconcile pass confirmed it from the audit trail
	noted   time.Time // when it was found
}

// hold notes that payout id, claimed with token, waits for a person; checked
// says the audit trail confirmed it. It reports whether this process had
// already noted the payout at that token (and so reported it).
func (e *executor) hold(id string, token int64, checked bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	h, ok := e.person[id]
	known := ok && h.token == token
	if !known {
		h = personHold{token: token, noted: time.Now()}
	}
	h.checked = h.checked || checked
	e.person[id] = h
	return known
}

// awaitsPerson reports whether the stale payout p is one the audit trail showed
// waiting for a person at its current claim.
func (e *executor) awaitsPerson(p lockapi.Payout) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	h, ok := e.person[p.PayoutID]
	return ok && h.checked && h.token == p.FenceToken
}

func (e *executor) holds() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.person)
}

// forgetHolds drops the holds a whole listing of stale payouts no longer
// bears out: a payout gone from it, or listed with another claim. A hold a
// cycle noted after before is kept: its payout is not stale yet.
func (e *executor) forgetHolds(stale []lockapi.Payout, before time.Time) {
	listed := make(map[string]int64, len(stale))
	for _, p := range stale {
		listed[p.PayoutID] = p.FenceToken
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, h := range e.person {
		if t, ok := listed[id]; ok && t == h.token {
			continue
		}
		if !h.checked && h.noted.After(before) {
			continue
		}
		delete(e.person, id)
	}
}
