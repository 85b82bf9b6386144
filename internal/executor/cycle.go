package executor

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// postAttempts bounds how often a post that got no answer is tried. A repeated post
// is harmless: the same token and outcome, or PAYOUT_FINAL once the first landed.
const postAttempts = 3

// cycle is one cycle of docs/contracts/executor.md for one account: one lease, at most one
// payout. It reports whether it claimed a payout.
//
//  1. acquire account:A → token T (held by someone else → skip A)
//  2. claim the oldest PENDING payout P of A with T (fence point (a); refused → skip)
//  3. submit P to rail-proxy with T, once
//  4. post what the proxy said
//  5. release
func (e *executor) cycle(ctx context.Context, accountID string) bool {
	lease, ok := e.acquire(ctx, accountID)
	if !ok {
		return false
	}
	defer e.release(lease)

	if e.stopped(ctx, lease, "claim") {
		return false
	}
	// The payout is chosen under the lease: the scan that led here may be stale.
	lctx, cancel := context.WithTimeout(ctx, e.cfg.requestTimeout())
	pending, err := e.payouts.List(lctx, lockapi.StatusPending, accountID, nil, 1)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("looking for the account's oldest PENDING payout failed", "event", "scan_failed",
				"accountId", accountID, "error", err.Error())
		}
		return false
	}
	if len(pending) == 0 {
		return false
	}
	p, ok := e.claim(ctx, lease, pending[0].PayoutID)
	if !ok {
		return false
	}
	e.submitAndSettle(ctx, lease, p)
	return true
}

// acquire takes the account's lease. Held by another owner → skipped.
func (e *executor) acquire(ctx context.Context, accountID string) (*lockclient.Lease, bool) {
	actx, cancel := context.WithTimeout(ctx, e.cfg.requestTimeout())
	defer cancel()
	lease, err := e.locks.Acquire(actx, lockapi.AccountLockName(accountID), e.cfg.OwnerID, e.cfg.LeaseTTL)
	switch {
	case err == nil:
		e.log.Debug("lease acquired", "accountId", accountID, "token", lease.Token())
		return lease, true
	case errors.Is(err, lockclient.ErrHeld):
		e.m.count(resultSkipped)
		e.log.Debug("account held by another owner; skipped", "accountId", accountID)
	case ctx.Err() == nil:
		e.log.Warn("acquiring the account lease failed", "event", "acquire_failed",
			"accountId", accountID, "error", err.Error())
	}
	return nil, false
}

// release gives the lease back. It runs after the cycle whatever happened, also
// while stopping, so it has a context of its own.
func (e *executor) release(lease *lockclient.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.requestTimeout())
	defer cancel()
	err := lease.Release(ctx)
	switch {
	case err == nil:
	case errors.Is(err, lockclient.ErrLeaseLost):
		// A newer holder took the account: nothing to give back.
		e.log.Info("lease was already lost at release", "event", "lease_lost",
			"lockName", lease.Name(), "token", lease.Token(), "step", "release")
	default:
		// The lease expires on its own after its TTL.
		e.log.Warn("releasing the lease failed", "event", "release_failed",
			"lockName", lease.Name(), "token", lease.Token(), "error", err.Error())
	}
}

// stopped is the lease check before a step: a stopping executor or a lost lease
// ends the cycle here. Safety does not depend on it (the fences decide); it spares
// work a newer holder would have fenced anyway.
func (e *executor) stopped(ctx context.Context, lease *lockclient.Lease, step string) bool {
	if ctx.Err() != nil {
		e.log.Info("stopping: cycle abandoned before "+step, "event", "cycle_abandoned",
			"lockName", lease.Name(), "token", lease.Token(), "step", step)
		return true
	}
	if lease.Context().Err() != nil {
		e.log.Warn("lease lost: cycle stopped before "+step, "event", "lease_lost",
			"lockName", lease.Name(), "token", lease.Token(), "step", step, "error", errText(lease.Err()))
		return true
	}
	return false
}

// claim claims payout id with the lease's token (fence point (a)). A refusal
// (FENCED_OUT, PAYOUT_FINAL, or a payout gone) is a skip.
func (e *executor) claim(ctx context.Context, lease *lockclient.Lease, id string) (lockapi.Payout, bool) {
	cctx, cancel := context.WithTimeout(ctx, e.cfg.requestTimeout())
	defer cancel()
	p, err := e.payouts.ClaimWithGrant(cctx, id, lease.Token(), lease.Grant(), e.cfg.OwnerID)
	if err == nil {
		e.log.Debug("payout claimed", "payoutId", id, "accountId", p.AccountID, "token", lease.Token())
		return p, true
	}
	var pr *lockapi.Problem
	if errors.As(err, &pr) && (pr.Code == lockapi.CodeFencedOut || pr.Code == lockapi.CodePayoutFinal || pr.Code == lockapi.CodeNotFound) {
		e.m.count(resultSkipped)
		e.log.Info("claim refused; skipped", "event", "claim_refused", "payoutId", id,
			"token", lease.Token(), "code", pr.Code, "detail", pr.Detail)
		return lockapi.Payout{}, false
	}
	if ctx.Err() == nil {
		// GRANT_REJECTED among them (workload_mismatch too: the grant names
		// another workload than the one this TLS connection proves): an answer,
		// not a failure to reach the server, so the cycle ends here and the
		// reason is logged for the operator.
		e.log.Warn("claim failed", "event", "claim_failed", "payoutId", id, "token", lease.Token(),
			"reason", grantReason(err), "error", err.Error())
	}
	return lockapi.Payout{}, false
}

// submitAndSettle is steps 3 and 4: submit the claimed payout once and post what
// the proxy said.
func (e *executor) submitAndSettle(ctx context.Context, lease *lockclient.Lease, p lockapi.Payout) {
	token, grant := lease.Token(), lease.Grant()
	// The last lease check before the submission.
	if e.stopped(ctx, lease, "submit") {
		return
	}
	if e.drawPause() && !e.pause(ctx, lease, p) {
		return
	}
	// No lease check between the pause and the submission: a process frozen after
	// its last check submits exactly like this, and the proxy's fence, not this
	// process's belief, decides. The submission runs under its own bound, not the
	// lease's context and not the stop signal: once sent it is never abandoned
	// half-way, or we would not learn what happened to money that may have moved.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.ProxyTimeout)
	start := time.Now()
	req := lockapi.SubmissionRequest{
		PayoutID:    p.PayoutID,
		AccountID:   p.AccountID,
		AmountMinor: p.AmountMinor,
		Currency:    p.Currency,
		Beneficiary: p.Beneficiary,
	}
	ans := e.proxy.submitWithGrant(sctx, req, token, grant, e.cfg.OwnerID)
	if ans.kind == answerNone && ans.staleConn {
		// A kept-alive connection rail-proxy had closed (idle, or shutting down)
		// failed before a byte of answer. Most likely the proxy never read the
		// request; but even if it did, sending it again with the same token is
		// safe: an equal token is fenced, so at most one of the two copies is ever
		// admitted, and a FENCED_OUT answer to this second copy is read through
		// the audit trail, which says what became of the first (verdict). Without
		// the resend the payout would wait a lease TTL for the reconcile pass.
		e.m.resent.Inc()
		e.log.Info("submission failed on a reused connection before any answer; sending it again, same token, on a fresh connection",
			"event", "submission_resent", "payoutId", p.PayoutID, "accountId", p.AccountID, "token", token,
			"error", errText(ans.err))
		ans = e.proxy.resubmitWithGrant(sctx, req, token, grant, e.cfg.OwnerID)
	}
	cancel()

	v := e.verdict(ctx, p, token, ans)
	e.m.count(v.result)
	e.logVerdict(p, token, ans, v, time.Since(start))
	if v.result == resultUnbooked || v.result == resultMismatch {
		// Reported once, here: this process's reconcile pass leaves the payout
		// to a person without reporting it again (reconcile.go).
		e.hold(p.PayoutID, token, false)
	}
	if v.post == nil {
		return
	}
	if e.stopped(context.WithoutCancel(ctx), lease, "post") {
		// The outcome is on record at the proxy; the reconcile pass adopts it.
		return
	}
	e.post(ctx, p, token, grant, *v.post)
}

// pause is the stale-writer maker (docs/contracts/executor.md): the lease is frozen — no
// renewal, no local deadline — as if the whole process stopped after its last lease
// check. It reports false when the executor was told to stop during the pause:
// nothing has been sent, and the payout stays CLAIMED for the reconcile pass.
func (e *executor) pause(ctx context.Context, lease *lockclient.Lease, p lockapi.Payout) bool {
	e.log.Warn("pausing between claim and submit", "event", "executor_pause", "payoutId", p.PayoutID,
		"accountId", p.AccountID, "token", lease.Token(), "pause", e.cfg.Pause.String(), "hook", e.cfg.PauseHook != nil)
	e.pauser.Freeze(lease)
	if e.cfg.PauseHook != nil {
		e.cfg.PauseHook(ctx, p.PayoutID)
	} else {
		sleep(ctx, e.cfg.Pause)
	}
	e.pauser.Thaw(lease)
	e.m.pauses.Inc()
	if ctx.Err() != nil {
		e.log.Info("stopping: cycle abandoned after a pause, nothing submitted", "event", "cycle_abandoned",
			"payoutId", p.PayoutID, "token", lease.Token(), "step", "submit")
		return false
	}
	return true
}

// verdict is what the executor makes of one submission's answer.
type verdict struct {
	result string               // executor_payout_total label
	post   *lockapi.PostRequest // nil: post nothing, the payout stays CLAIMED
	why    string
}

func paid(ref string) *lockapi.PostRequest {
	return &lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: &ref}
}

func declined(reason *string) *lockapi.PostRequest {
	return &lockapi.PostRequest{Outcome: lockapi.StatusDeclined, DeclineReason: reason}
}

func ambiguous() *lockapi.PostRequest {
	return &lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}
}

// verdict maps the proxy's answer to what is posted (step 4 of docs/contracts/executor.md).
func (e *executor) verdict(ctx context.Context, p lockapi.Payout, token int64, a submitAnswer) verdict {
	return storableOnly(e.answerVerdict(ctx, p, token, a))
}

// storableOnly turns a verdict whose post would carry a rail reference or
// decline reason that is not storable text (lockapi.ValidateRailReference,
// lockapi.ValidateDeclineReason) into AMBIGUOUS, as rail-proxy does with such
// an answer: an accept or decline whose words cannot be recorded as given is no
// well-formed one (docs/contracts/executor.md). Only an older rail-proxy, or an
// audit row written by one, can carry such words; payment-resource would refuse
// them and leave the payout CLAIMED.
func storableOnly(v verdict) verdict {
	if v.post == nil {
		return v
	}
	field, err := "railReference", error(nil)
	if r := v.post.RailReference; r != nil {
		err = lockapi.ValidateRailReference(*r)
	}
	if r := v.post.DeclineReason; err == nil && r != nil {
		field, err = "declineReason", lockapi.ValidateDeclineReason(*r)
	}
	if err == nil {
		return v
	}
	return verdict{resultAmbiguous, ambiguous(), "the " + field + " to post is not storable text (" + err.Error() +
		"): no well-formed " + strings.ToLower(v.post.Outcome) + ", taken as ambiguous; settled from the rail's statement"}
}

// answerVerdict is verdict before the storable-text check.
func (e *executor) answerVerdict(ctx context.Context, p lockapi.Payout, token int64, a submitAnswer) verdict {
	switch a.kind {
	case answerAccepted:
		return verdict{resultPaid, paid(a.railReference), "the rail accepted"}
	case answerRejected:
		return verdict{resultDeclined, declined(a.declineReason), "the rail declined; no money moved"}
	case answerAmbiguous:
		// Unknown, never "failed": marked AMBIGUOUS and never submitted again.
		return verdict{resultAmbiguous, ambiguous(), "the rail may have acted; settled outside the system"}
	case answerFenced:
		if a.resent {
			// Our first copy may have reached the proxy and moved the mark to our
			// own token; only the audit trail can tell the two apart.
			return e.adoptRecorded(ctx, p, token)
		}
		return verdict{resultFenced, nil, "fenced out: a newer holder owns the account"}
	case answerUnavailable:
		return verdict{resultUnavailable, nil, "nothing was presented to the rail (stage " + a.stage + ")"}
	case answerInvalid:
		// Our request was refused before admission: nothing was presented. A bug
		// here or there, not the rail's doing; left CLAIMED and logged loudly.
		e.log.Error("rail-proxy refused the submission as invalid", "event", "submission_invalid",
			"payoutId", p.PayoutID, "token", token, "reason", grantReason(a.err), "error", errText(a.err))
		return verdict{resultUnavailable, nil, "refused as invalid; nothing was presented"}
	case answerDuplicate:
		return e.adoptDuplicate(ctx, p, token, a)
	case answerUnbooked:
		if lockapi.LeaseMismatch(a.mismatch) {
			// Another claim owns the payout (re-claimed with a newer token, or
			// no longer CLAIMED): as FENCED_OUT. The books judge after the fence,
			// so a resend's NOT_IN_BOOKS is never our own first copy's doing.
			return verdict{resultFenced, nil, "not in the books (" + a.mismatch + "): another claim owns the payout"}
		}
		// Our own payout's fields, as payment-resource gave them at the claim,
		// are not what the books hold (or the books hold no such payout). Nothing
		// was presented; nothing is posted, and a person decides.
		e.log.Error("rail-proxy's books refused this payout as presented: nothing posted, the payout stays CLAIMED for a person",
			"event", "unbooked_own_payout", "payoutId", p.PayoutID, "accountId", p.AccountID, "token", token,
			"mismatch", a.mismatch, "beneficiary", lockapi.MaskBeneficiary(p.Beneficiary), "submissionId", derefInt(a.submissionID))
		return verdict{resultUnbooked, nil, "not in the books (" + a.mismatch + "): the payout's own fields were refused; left CLAIMED for a person"}
	default:
		return e.adoptRecorded(ctx, p, token)
	}
}

// adoptDuplicate takes over the outcome of the payout's first forwardable
// attempt — only when that attempt presented the payout's own account, amount,
// currency and beneficiary: an outcome of something else is not this payout's.
// An answer that does not say what the first attempt presented (an older
// rail-proxy) is taken as a mismatch: nothing is adopted on trust.
func (e *executor) adoptDuplicate(ctx context.Context, p lockapi.Payout, token int64, a submitAnswer) verdict {
	if d := a.first.differs(p); len(d) > 0 {
		return e.notAdopted(p, token, "duplicate answer", a.firstSubmissionID, a.first, d)
	}
	if a.firstOutcome == nil {
		return verdict{resultDuplicate, nil, "duplicate; the first attempt is still unresolved"}
	}
	switch *a.firstOutcome {
	case lockapi.OutcomeAcked:
		if a.firstRailReference != nil && *a.firstRailReference != "" {
			return verdict{resultDuplicate, paid(*a.firstRailReference), "duplicate; the first attempt was accepted"}
		}
		// PAID needs the reference; the audit trail has it.
		row := e.forwardableRow(ctx, p.PayoutID)
		if row != nil {
			if d := presentedBy(row).differs(p); len(d) > 0 {
				return e.notAdopted(p, token, "audit trail", &row.SubmissionID, presentedBy(row), d)
			}
		}
		if row != nil && row.RailReference != nil && row.Outcome != nil && *row.Outcome == lockapi.OutcomeAcked {
			return verdict{resultDuplicate, paid(*row.RailReference), "duplicate; the first attempt was accepted"}
		}
		return verdict{resultDuplicate, nil, "duplicate; the first attempt was accepted but its reference is unknown"}
	case lockapi.OutcomeRejected:
		// The answer does not carry the reason; the audit trail does. DECLINED is
		// final, so a reason not read now could never be added: when the trail
		// cannot be read, post nothing and let the reconcile pass adopt the row.
		row := e.forwardableRow(ctx, p.PayoutID)
		if row == nil {
			return verdict{resultDuplicate, nil, "duplicate; the first attempt was declined, its reason could not be read (the reconcile pass adopts it)"}
		}
		if d := presentedBy(row).differs(p); len(d) > 0 {
			return e.notAdopted(p, token, "audit trail", &row.SubmissionID, presentedBy(row), d)
		}
		return verdict{resultDuplicate, declined(row.DeclineReason), "duplicate; the first attempt was declined"}
	case lockapi.OutcomeTimeout:
		return verdict{resultDuplicate, ambiguous(), "duplicate; the first attempt is ambiguous"}
	default:
		return verdict{resultDuplicate, nil, "duplicate; the first attempt's outcome " + *a.firstOutcome + " is not one to adopt"}
	}
}

// adoptRecorded is the no-answer path: whether anything was admitted is unknown
// until the audit trail says. Its forwardable row, if any, is the payout's one
// attempt the rail may have seen; its outcome is adopted. Nothing on record means
// nothing was presented, and the payout stays CLAIMED for the reconcile pass.
func (e *executor) adoptRecorded(ctx context.Context, p lockapi.Payout, token int64) verdict {
	subs, err := e.trail(ctx, p.PayoutID)
	if err != nil {
		return verdict{resultUnavailable, nil, "no answer, and the audit trail could not be read: " + err.Error()}
	}
	if row := forwardable(subs); row != nil {
		if d := presentedBy(row).differs(p); len(d) > 0 {
			return e.notAdopted(p, token, "audit trail", &row.SubmissionID, presentedBy(row), d)
		}
		if v := adoptRow(row); v.post != nil {
			return v
		}
		return verdict{resultUnavailable, nil, "no answer; the attempt on record is still unresolved"}
	}
	for _, s := range subs {
		if s.PresentedToken == token && s.Outcome != nil && *s.Outcome == lockapi.OutcomeFenced {
			return verdict{resultFenced, nil, "no answer, but our attempt is on record as fenced out"}
		}
	}
	return verdict{resultUnavailable, nil, "no answer, and nothing forwardable is on record"}
}

// notAdopted is the verdict on a first or recorded attempt that presented
// other fields than payout p's (source says where they were read): whatever
// became of it is not p's outcome. Nothing is posted; the payout stays CLAIMED
// for a person, who finds the attempt in the audit trail (docs/contracts/books.md).
// Beneficiaries are logged masked.
func (e *executor) notAdopted(p lockapi.Payout, token int64, source string, submissionID *int64, f presented, differs []string) verdict {
	e.log.Error("an attempt presented this payout with other fields than the books': its outcome is not adopted, the payout stays CLAIMED for a person",
		"event", "duplicate_mismatch", "payoutId", p.PayoutID, "accountId", p.AccountID, "token", token,
		"source", source, "submissionId", derefInt(submissionID), "differs", differs,
		"presentedAccountId", deref(f.accountID), "presentedAmountMinor", derefInt(f.amountMinor),
		"presentedCurrency", deref(f.currency), "presentedBeneficiary", maskPresent(f.beneficiary),
		"amountMinor", p.AmountMinor, "currency", p.Currency, "beneficiary", lockapi.MaskBeneficiary(p.Beneficiary))
	return verdict{resultMismatch, nil, "the " + source + " shows an attempt that presented other fields (" +
		strings.Join(differs, ", ") + "): not adopted; left CLAIMED for a person"}
}

// maskPresent masks a reported beneficiary; "" when none was reported.
func maskPresent(b *string) string {
	if b == nil {
		return ""
	}
	return lockapi.MaskBeneficiary(*b)
}

// adoptRow maps a forwardable row's outcome to a post; an unresolved row posts
// nothing. Words on record that are not storable text post AMBIGUOUS
// (storableOnly).
func adoptRow(row *lockapi.Submission) verdict {
	return storableOnly(adoptRowOutcome(row))
}

func adoptRowOutcome(row *lockapi.Submission) verdict {
	if row.Outcome == nil {
		return verdict{resultUnavailable, nil, "the attempt on record is still unresolved"}
	}
	switch *row.Outcome {
	case lockapi.OutcomeAcked:
		if row.RailReference != nil && *row.RailReference != "" {
			return verdict{resultPaid, paid(*row.RailReference), "on record as accepted"}
		}
	case lockapi.OutcomeRejected:
		return verdict{resultDeclined, declined(row.DeclineReason), "on record as declined"}
	case lockapi.OutcomeTimeout:
		return verdict{resultAmbiguous, ambiguous(), "on record as ambiguous"}
	}
	return verdict{resultUnavailable, nil, "the attempt on record has outcome " + *row.Outcome}
}

// trail reads the payout's audit trail under its own bound; it runs after a
// submission, so a stopping executor still finishes it.
func (e *executor) trail(ctx context.Context, payoutID string) ([]lockapi.Submission, error) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.requestTimeout())
	defer cancel()
	return e.proxy.submissions(tctx, payoutID)
}

// forwardableRow is the payout's forwardable row, or nil (also when the trail
// cannot be read: callers only use it to fill in detail).
func (e *executor) forwardableRow(ctx context.Context, payoutID string) *lockapi.Submission {
	subs, err := e.trail(ctx, payoutID)
	if err != nil {
		e.log.Warn("reading the audit trail failed", "event", "trail_failed", "payoutId", payoutID, "error", err.Error())
		return nil
	}
	return forwardable(subs)
}

func (e *executor) logVerdict(p lockapi.Payout, token int64, a submitAnswer, v verdict, elapsed time.Duration) {
	attrs := []any{"event", "submission_answered", "payoutId", p.PayoutID, "accountId", p.AccountID,
		"token", token, "answer", a.kind.String(), "status", a.status, "result", v.result,
		"post", postOutcome(v.post), "why", v.why, "elapsedMs", elapsed.Milliseconds()}
	if a.submissionID != nil {
		attrs = append(attrs, "submissionId", *a.submissionID)
	}
	if a.highestToken != nil {
		attrs = append(attrs, "highestToken", *a.highestToken)
	}
	if a.mismatch != "" {
		attrs = append(attrs, "mismatch", a.mismatch)
	}
	if a.err != nil {
		attrs = append(attrs, "error", a.err.Error())
	}
	switch v.result {
	case resultPaid, resultDeclined, resultDuplicate:
		e.log.Info("submission answered", attrs...)
	case resultAmbiguous:
		e.log.Error("submission ambiguous: do not resubmit, reconcile with the rail", attrs...)
	default:
		e.log.Warn("submission not settled", attrs...)
	}
}

func postOutcome(r *lockapi.PostRequest) string {
	if r == nil {
		return "none"
	}
	return r.Outcome
}

// post records the outcome at payment-resource. It finishes also while stopping.
// A refusal (FENCED_OUT: someone re-claimed the payout; PAYOUT_FINAL: it is
// settled) is an answer and is logged, never retried; only a call that got no
// answer is tried again, a bounded number of times.
func (e *executor) post(ctx context.Context, p lockapi.Payout, token int64, grant string, req lockapi.PostRequest) bool {
	base := context.WithoutCancel(ctx)
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(base, e.cfg.requestTimeout())
		_, err := e.payouts.PostWithGrant(pctx, p.PayoutID, token, grant, e.cfg.OwnerID, req)
		cancel()
		if err == nil {
			e.log.Info("payout posted", "event", "payout_posted", "payoutId", p.PayoutID, "accountId", p.AccountID,
				"token", token, "outcome", req.Outcome, "railReference", deref(req.RailReference))
			return true
		}
		var pr *lockapi.Problem
		if errors.As(err, &pr) && pr.Status < 500 {
			if attempt > 1 && landedEarlier(pr, req) {
				// An earlier attempt of this very post got no answer, yet landed:
				// the payout is final in exactly the state we posted.
				e.log.Info("payout posted", "event", "payout_posted", "payoutId", p.PayoutID, "accountId", p.AccountID,
					"token", token, "outcome", req.Outcome, "railReference", deref(req.RailReference),
					"attempts", attempt, "confirmedBy", lockapi.CodePayoutFinal)
				return true
			}
			if pr.Code == lockapi.CodeOutcomeNotRecorded {
				e.postNotRecorded(p, token, req, pr)
				return false
			}
			e.log.Warn("post refused", "event", "post_refused", "payoutId", p.PayoutID, "token", token,
				"outcome", req.Outcome, "code", pr.Code, "reason", grantReason(pr), "detail", pr.Detail)
			return false
		}
		if attempt == postAttempts {
			e.log.Error("post failed; the payout stays CLAIMED and the reconcile pass will adopt the outcome",
				"event", "post_failed", "payoutId", p.PayoutID, "token", token, "outcome", req.Outcome,
				"attempts", attempt, "error", err.Error())
			return false
		}
		sleep(base, time.Duration(attempt)*100*time.Millisecond)
	}
}

// postNotRecorded logs payment-resource's refusal of a post the audit trail
// does not record (OUTCOME_NOT_RECORDED, docs/contracts/books.md). It is an
// answer, so it is not tried again: nothing was written, the payout stays
// CLAIMED, and the reconcile pass adopts what the trail records once it is
// resolved. "UNRESOLVED" is expected while the rail call or rail-proxy's
// janitor has yet to resolve the row (WARN); anything else means this
// executor's reading of the answer and the trail disagree (ERROR).
func (e *executor) postNotRecorded(p lockapi.Payout, token int64, req lockapi.PostRequest, pr *lockapi.Problem) {
	var recorded *string
	if _, err := pr.Member("recorded", &recorded); err != nil {
		recorded = nil
	}
	rec := "null"
	if recorded != nil {
		rec = *recorded
	}
	level := slog.LevelError
	if rec == payment.RecordedUnresolved {
		level = slog.LevelWarn
	}
	e.log.Log(context.Background(), level, "post refused: the audit trail does not record this outcome; left CLAIMED for the reconcile pass",
		"event", "post_not_recorded", "payoutId", p.PayoutID, "accountId", p.AccountID, "token", token,
		"outcome", req.Outcome, "railReference", deref(req.RailReference), "recorded", rec, "detail", pr.Detail)
}

// landedEarlier reports whether a refusal of a repeated post is the first
// attempt's success seen again: PAYOUT_FINAL carrying, as payoutStatus, the very
// outcome posted.
func landedEarlier(pr *lockapi.Problem, req lockapi.PostRequest) bool {
	if pr.Code != lockapi.CodePayoutFinal {
		return false
	}
	var status string
	ok, err := pr.Member("payoutStatus", &status)
	return ok && err == nil && status == req.Outcome
}

// grantReason is the reason member of a GRANT_REJECTED refusal
// (docs/contracts/signed-grants.md: owner_mismatch, workload_mismatch, …), or ""
// for any other error.
func grantReason(err error) string {
	var pr *lockapi.Problem
	if !errors.As(err, &pr) || pr.Code != lockapi.CodeGrantRejected {
		return ""
	}
	var reason string
	if ok, rerr := pr.Member("reason", &reason); !ok || rerr != nil {
		return ""
	}
	return reason
}

func derefInt(n *int64) int64 {
	if n == nil {
		return 0
	}
	return *n
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
