package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/lockapi"
)

// admitter runs the four steps of docs/contracts/rail-proxy.md ("The admission,
// in four steps") for one submission, in this order, every time:
//
//  1. Fence first: the account's mark in rail_high_water is read, compared and
//     advanced in one statement on paydb's primary, strict `<`. A token that
//     does not pass is answered FENCED_OUT (unless fencing is switched off)
//     and the rail is not called. Then, with the books check on
//     (RAIL_PROXY_BOOKS_CHECK, docs/contracts/books.md), the books: the payout
//     row must hold the submission CLAIMED by this token and owner, as
//     presented; one that does not is answered NOT_IN_BOOKS (an UNBOOKED row),
//     the mark is not moved and the rail is not called. So the order is fence,
//     books, duplicate, intent, forward.
//  2. Duplicate check: the intent insert, judged by rail_submission_attempt_uidx
//     (the index decides, never a prior read).
//  3. Intent before socket: that row is committed, outcome NULL, before any
//     connection to the rail is opened.
//  4. Forward exactly once (railClient.Pay, railclient.go), and resolve the row
//     in a second transaction (resolveOnce, below).
//
// Steps 1–3 are one transaction, started by admit (group.go). The fence is
// compared in exactly two places, which give the same verdicts
// (TestGroupAdmissionEqualsOneByOne, TestFenceRunsBeforeIntentInBothModes):
//
//   - One by one: admitSQL in store.go, the pinned upsert
//     `WHERE rail_high_water.highest_token < EXCLUDED.highest_token`, run by
//     Store.Admit and admitOn. With the books check on it is admitBooksSQL,
//     which compares the token with the mark row it locked
//     (`m.highest_token >= $2`: fenced) and then runs the same upsert for a
//     booked submission only. It serves RAIL_PROXY_MAX_GROUP=1, a group of
//     one, and every member a group left alone (admitAlone).
//   - In a group (RAIL_PROXY_MAX_GROUP > 1, the default): admit (group.go)
//     queues the submission; admitWorker → admitGroupGuarded (worker.go) →
//     admitGroupOn (groupstore.go) calls paydb's rail_admit_group_skip_locked_by,
//     defined in internal/paydb/migrations/00012_rail_admit_group_submitter.sql,
//     where the comparison is the line `v_passed[j] := v_marks[k] < p_token[i]`
//     (with the books check on, rail_admit_group_books_by, in the same file, the
//     same line).
//
// There is no retry of the rail call anywhere, for any outcome: a timeout means
// unknown, never failed, and a second call could be a second payment
// (docs/contracts/rail-proxy.md, "The rail call").
type admitter struct {
	store   *Store
	rail    *railClient
	metrics *metrics
	logger  *slog.Logger
	fencing bool
	// books is RAIL_PROXY_BOOKS_CHECK: a submission is admitted only when the
	// payout row holds it claimed by this token and owner, as booked
	// (docs/contracts/books.md). Off, the payout row is not read: the admission
	// is fence, duplicate, intent, forward.
	books bool
	// interruptAfter is this replica's RAIL_PROXY_INTERRUPTED_AFTER: every intent
	// it admits carries interrupt_at = submitted_at + interruptAfter, and a
	// resolving write it could not make is retried until shortly before then.
	interruptAfter time.Duration
	// groups queues admissions and resolving writes into groups
	// (RAIL_PROXY_MAX_GROUP, group.go); nil admits one by one.
	groups *groups

	// active counts submissions being carried to their answers and resolving
	// writes carried on in the background after the answer (a late writer is
	// added while its submission still holds its own count, so the drain's one
	// wait covers both).
	active sync.WaitGroup
	late   atomic.Int64 // resolving writes in the background right now

	// hooks are seams for tests (Config.hooks); nil in production.
	hooks *hooks
}

// lateMargin is how long before a row's interrupt_at the proxy stops trying to
// write the outcome it knows: "shortly before" (docs/contracts/rail-proxy.md,
// "Interrupted intents"), so that the janitor only ever takes over the rows of a
// proxy that is really gone, and a write still running when the janitor looks is
// one of its own bounded attempts, not an open-ended one.
const lateMargin = time.Second

// unsentAnswerBound bounds the UNSENT write a 503 intent_commit waits for. A
// COMMIT whose answer was lost usually means paydb is out of reach, so that
// write would only hold the caller for its whole 2 s bound; the caller's answer
// (nothing presented) does not depend on it. Not made in time, it goes on in the
// background, and the answer names no row.
const unsentAnswerBound = 250 * time.Millisecond

// unsentAnswerBound is unsentAnswerBound, or the tests' replacement for it.
func (a *admitter) unsentAnswerBound() time.Duration {
	if a.hooks != nil && a.hooks.unsentAnswerBound > 0 {
		return a.hooks.unsentAnswerBound
	}
	return unsentAnswerBound
}

// wait waits at most d for every submission in flight and every resolving write
// in the background to finish; it reports whether they all did.
func (a *admitter) wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		a.active.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// reply is what the handler writes: a success body or a problem, and the
// rail_submission_total outcome it counts as ("" when it is not counted).
type reply struct {
	status  int
	ok      *lockapi.SubmissionAccepted
	problem *lockapi.Problem
	metric  string
}

// Submit admits, forwards and resolves one submission. The caller's
// cancellation never reaches the work: once a submission is being admitted it
// is carried through to its answer, because abandoning it half-way would leave a
// committed intent whose rail call was cut short ("the caller's cancellation
// never aborts a rail call or a resolution", docs/contracts/rail-proxy.md).
// Every wait below has its own bound (TestCallerCancellationDoesNotAbortRailCall).
func (a *admitter) Submit(ctx context.Context, sub Submission) reply {
	start := time.Now()
	a.active.Add(1)
	defer a.active.Done()
	a.metrics.inflight.Inc()
	defer a.metrics.inflight.Dec()
	ctx = context.WithoutCancel(ctx)
	r := a.submit(ctx, sub, start)
	if r.metric != "" {
		a.count(r.metric, time.Since(start))
	}
	return r
}

// count counts one submission under the outcome its row records, with the time
// it took to answer. Each submission is counted once: when its answer and its
// row agree at the time of the answer, then; when the row is resolved in the
// background, by whoever resolves it (a late write here, or the janitor).
func (a *admitter) count(metric string, took time.Duration) {
	a.metrics.submissions.WithLabelValues(metric).Inc()
	a.metrics.submissionSeconds.WithLabelValues(metric).Observe(took.Seconds())
}

func (a *admitter) submit(ctx context.Context, sub Submission, start time.Time) reply {
	// Steps 1–3, bounded as a whole (pool wait included) by AdmissionBound.
	actx, cancel := context.WithTimeout(ctx, AdmissionBound)
	adm, err := a.admit(actx, sub)
	cancel()
	if err != nil {
		return a.intentNotCommitted(ctx, sub, err, start)
	}

	switch adm.Verdict {
	case Fenced:
		return a.fenced(sub, adm)
	case Unbooked:
		return a.unbooked(sub, adm)
	case Duplicate:
		return a.duplicate(sub, adm)
	}

	// Step 3 is done: the intent is committed (outcome NULL), so should this
	// process die from here on, the row is the evidence that a payment may have
	// been presented, and the janitor resolves it TIMEOUT — never resubmits it.

	// Step 4: forward exactly once. Only now is a connection to the rail opened.
	call := a.rail.Pay(ctx, sub.payment(adm.SubmissionID))
	a.metrics.callSeconds.Observe(call.Elapsed.Seconds())
	if call.StaleConn {
		a.metrics.reusedConnFailures.Inc()
	}

	var (
		outcome string
		railRef *string
		reason  *string
	)
	switch call.Result {
	case RailAccepted:
		outcome, railRef = lockapi.OutcomeAcked, &call.RailReference
	case RailDeclined:
		outcome, reason = lockapi.OutcomeRejected, call.DeclineReason
	case RailUnsent:
		outcome = lockapi.OutcomeUnsent
	default:
		outcome = lockapi.OutcomeTimeout
	}
	res := resolution{id: adm.SubmissionID, outcome: outcome, railRef: railRef, reason: reason}
	r := a.answer(sub, adm.SubmissionID, outcome, railRef, reason)
	row, wrote, err := a.resolveOnce(ctx, res, ResolveBound)
	switch {
	case err != nil:
		// paydb did not take the write. The outcome is known: left unresolved,
		// the row would be resolved TIMEOUT by the janitor once past its
		// interrupt_at, and the trail would say "unknown" about a payment this
		// process knows was made, declined or never presented. So the write goes
		// on in the background; the caller gets the rail's answer now, and the
		// submission is counted when its row says what happened.
		a.resolveLater(sub, res, start, r.metric, err)
		r.metric = ""
	case !wrote:
		// Someone resolved the row first (the janitor, after a stall longer than
		// any bound). The row is the audit trail: answer what it says, so the
		// caller and the trail never disagree. The janitor already counted it.
		return a.alreadyResolved(sub, adm.SubmissionID, res, row)
	}
	a.logResolved(sub, adm.SubmissionID, call, res, wrote, time.Since(start))
	return r
}

// alreadyResolved answers what a row resolved by someone else says.
func (a *admitter) alreadyResolved(sub Submission, id int64, res resolution, row Attempt) reply {
	a.logger.Warn("submission was already resolved; answering what its row says",
		"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", id,
		"railSaid", res.outcome, "railReference", strOrNil(res.railRef), "declineReason", strOrNil(res.reason),
		"rowSays", strOrNil(row.Outcome))
	r := a.answerFromRow(sub, row)
	r.metric = ""
	return r
}

// logResolved writes the log lines of a forwarded submission whose resolving
// write went through: rail_ambiguous or rail_unavailable when the call says so,
// and submission_resolved when this write resolved the row
// (docs/contracts/observability.md).
func (a *admitter) logResolved(sub Submission, id int64, call RailCall, res resolution, wrote bool, took time.Duration) {
	switch res.outcome {
	case lockapi.OutcomeTimeout:
		// A rail that says it has the payment and has not decided is doing what
		// most banks do at first: expected, so WARN; the statement settles it.
		// Every other cause is something that went wrong: ERROR.
		level, msg := slog.LevelError, "rail outcome ambiguous: do not resubmit, reconcile from the rail's records"
		if call.Cause == CausePending {
			level, msg = slog.LevelWarn, "rail has the payment and has not decided: do not resubmit, the rail's statement settles it"
		}
		a.logger.Log(context.Background(), level, msg, "event", "rail_ambiguous",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "ownerId", sub.OwnerID,
			"submissionId", id, "elapsedMs", call.Elapsed.Milliseconds(), "cause", call.Cause,
			"error", call.Err.Error())
	case lockapi.OutcomeUnsent:
		a.logger.Warn("rail unavailable: no connection could be opened, nothing was presented", "event", "rail_unavailable",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "stage", "dial",
			"error", call.Err.Error())
	}
	if wrote {
		// The one line every submission writes (docs/contracts/observability.md):
		// typed attributes, so that none of its values is boxed into an interface
		// on the way.
		ref := slog.Any("railReference", nil)
		if res.railRef != nil {
			ref = slog.String("railReference", *res.railRef)
		}
		a.logger.LogAttrs(context.Background(), slog.LevelInfo, "submission resolved",
			slog.String("event", "submission_resolved"), slog.String("payoutId", sub.PayoutID),
			slog.String("accountId", sub.AccountID), slog.Int64("submissionId", id), slog.String("outcome", res.outcome),
			ref, slog.Int64("elapsedMs", took.Milliseconds()))
	}
}

// The paths below are methods of their own, not parts of submit: a goroutine
// waits inside submit for the rail, up to RAIL_READ_TIMEOUT, and each log call's
// arguments are laid out in its caller's stack frame, held for that whole wait.
// Out of line they keep that frame, and the goroutine's stack, small
// (TestInflightSubmissionsKeepSmallStacks).

// fenced answers a submission whose token did not pass the fence.
func (a *admitter) fenced(sub Submission, adm Admission) reply {
	// The token is not strictly greater than the mark: an older holder, or a
	// replay of the same token. The rail is not called on this path — that
	// is the whole point of the gate.
	a.metrics.fencedOut.WithLabelValues("rail").Inc()
	a.logger.Warn("submission fenced out", "event", "fenced_out", "resource", "rail",
		"accountId", sub.AccountID, "payoutId", sub.PayoutID, "presentedToken", sub.Token,
		"highestToken", adm.HighestToken, "ownerId", sub.OwnerID, "idempotencyKey", sub.IdempotencyKey,
		"submissionId", adm.SubmissionID)
	return reply{status: http.StatusConflict, metric: metricFenced, problem: lockapi.NewProblemCode(
		lockapi.CodeFencedOut, "the fencing token is not strictly greater than the account's high-water mark; a newer holder exists",
		map[string]any{"presentedToken": sub.Token, "highestToken": adm.HighestToken, "submissionId": adm.SubmissionID})}
}

// unbooked answers a submission the books refused (docs/contracts/books.md):
// the payout row does not hold it claimed by this token and owner, as booked.
// Its UNBOOKED row is committed, the mark is unchanged, and the rail is not
// called. The beneficiary is personal data: the log carries it masked.
func (a *admitter) unbooked(sub Submission, adm Admission) reply {
	a.logger.Warn("submission not in the books: the payout is not held claimed by this token and owner as presented", "event", "unbooked_submission",
		"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "ownerId", sub.OwnerID,
		"mismatch", adm.Mismatch, "amountMinor", sub.AmountMinor, "currency", sub.Currency,
		"beneficiary", lockapi.MaskBeneficiary(sub.Beneficiary), "idempotencyKey", sub.IdempotencyKey,
		"submissionId", adm.SubmissionID)
	return reply{status: http.StatusConflict, metric: metricUnbooked, problem: lockapi.NewProblemCode(
		lockapi.CodeNotInBooks, "the books do not hold this payout claimed by this token and owner as presented ("+adm.Mismatch+"); nothing was presented to the rail",
		map[string]any{"submissionId": adm.SubmissionID, "presentedToken": sub.Token, "mismatch": adm.Mismatch})}
}

// duplicate answers a submission of a payout that has a forwardable attempt.
func (a *admitter) duplicate(sub Submission, adm Admission) reply {
	// The payout already has a forwardable attempt; the unique index, not a
	// read, said so. The rail sees each payout at most once, ever.
	a.metrics.duplicates.Inc()
	// The first attempt's account, amount, currency and beneficiary let the
	// executor adopt its outcome only when they are its payout's
	// (docs/contracts/books.md).
	m := map[string]any{"submissionId": adm.SubmissionID, "firstSubmissionId": nil, "firstSubmittedAt": nil,
		"firstOutcome": nil, "firstRailReference": nil, "firstAccountId": nil, "firstAmountMinor": nil,
		"firstCurrency": nil, "firstBeneficiary": nil}
	if f := adm.First; f != nil {
		m["firstSubmissionId"] = f.SubmissionID
		m["firstSubmittedAt"] = lockapi.UTC(f.SubmittedAt)
		m["firstOutcome"] = strOrNil(f.Outcome)
		m["firstRailReference"] = strOrNil(f.RailReference)
		m["firstAccountId"] = f.AccountID
		m["firstAmountMinor"] = f.AmountMinor
		m["firstCurrency"] = f.Currency
		m["firstBeneficiary"] = f.Beneficiary
	}
	a.logger.Warn("duplicate rail submission attempted", "event", "duplicate_rail_submission_attempted",
		"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "ownerId", sub.OwnerID,
		"submissionId", adm.SubmissionID, "firstSubmissionId", m["firstSubmissionId"],
		"firstSubmittedAt", m["firstSubmittedAt"], "firstOutcome", m["firstOutcome"])
	return reply{status: http.StatusConflict, metric: metricDuplicate, problem: lockapi.NewProblemCode(
		lockapi.CodeDuplicateSubmission, "this payout already has a forwardable attempt; it is never presented to the rail twice", m)}
}

// answer maps a resolved outcome to the reply docs/contracts/rail-proxy.md
// ("Answers") pins for it.
func (a *admitter) answer(sub Submission, id int64, outcome string, railRef, reason *string) reply {
	switch outcome {
	case lockapi.OutcomeAcked:
		return reply{status: http.StatusOK, metric: metricAcked, ok: &lockapi.SubmissionAccepted{
			SubmissionID: id, PayoutID: sub.PayoutID, AccountID: sub.AccountID, PresentedToken: sub.Token,
			Outcome: lockapi.OutcomeAcked, RailReference: deref(railRef)}}
	case lockapi.OutcomeRejected:
		return reply{status: http.StatusUnprocessableEntity, metric: metricRejected, problem: lockapi.NewProblemCode(
			lockapi.CodeRailRejected, "the rail declined the payment; no money moved",
			map[string]any{"submissionId": id, "declineReason": strOrNil(reason)})}
	case lockapi.OutcomeUnsent:
		return reply{status: http.StatusServiceUnavailable, metric: metricUnavailable, problem: lockapi.NewProblemCode(
			lockapi.CodeRailUnavailable,
			"no connection to the rail could be opened; nothing was presented, the payout may be submitted again with a newer token",
			map[string]any{"stage": "dial", "submissionId": id})}
	default:
		return reply{status: http.StatusConflict, metric: metricAmbiguous, problem: lockapi.NewProblemCode(
			lockapi.CodeRailAmbiguous,
			"the rail may have acted and the result is unknown: do not resubmit this payout, reconcile it from the rail's records",
			map[string]any{"submissionId": id})}
	}
}

func (a *admitter) answerFromRow(sub Submission, row Attempt) reply {
	return a.answer(sub, row.SubmissionID, deref(row.Outcome), row.RailReference, row.DeclineReason)
}

// resolution is a resolving write: what the row of submission id is to say.
type resolution struct {
	id      int64
	outcome string
	railRef *string
	reason  *string
	// unsureBackend is set for the UNSENT of an intent whose COMMIT answer was
	// lost: the backend that was sent it (CommitError.BackendPID).
	unsureBackend uint32
}

// resolveOnce makes one attempt at the resolving write (the conditional UPDATE
// of docs/contracts/database.md: it only touches an unresolved row, so any
// number of attempts is safe), bounded by bound. wrote is false when the row
// was found already resolved; row then says by whom to what. ErrNoRow: there is
// no such row.
func (a *admitter) resolveOnce(ctx context.Context, res resolution, bound time.Duration) (row Attempt, wrote bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	ok, err := a.resolve(ctx, res)
	if ok && errors.Is(err, dbconn.ErrCommitNotDurable) {
		// Written, on the primary only: writing it again changes nothing (the row
		// is resolved), so the outcome is taken as written and the log says what
		// a failover now could do — forget it, and the janitor on the new primary
		// would resolve the row TIMEOUT (the payout is then settled from the
		// rail's statement; nothing is presented again).
		a.logger.Warn("resolving write committed on the primary only: the wait for the synchronous standby was cancelled",
			"event", "resolution_not_durable", "submissionId", res.id, "outcome", res.outcome,
			"railReference", strOrNil(res.railRef), "error", err.Error())
		a.metrics.notDurable.Inc()
		err = nil
	}
	if err != nil {
		return Attempt{}, false, err
	}
	if ok {
		return Attempt{SubmissionID: res.id, Outcome: &res.outcome, RailReference: res.railRef, DeclineReason: res.reason}, true, nil
	}
	row, err = a.store.Attempt(ctx, res.id)
	if errors.Is(err, ErrNoRow) && a.hooks != nil && a.hooks.afterNoRow != nil {
		a.hooks.afterNoRow(res)
	}
	if err != nil {
		return Attempt{}, false, err
	}
	if row.Outcome == nil {
		return Attempt{}, false, errStillUnresolved
	}
	return row, false, nil
}

// errStillUnresolved: the resolving write changed nothing, yet the row read
// right after it is unresolved. The row's own COMMIT landed between the two —
// the late COMMIT of an intent whose answer was lost — so the write is to be
// made again, as for a row not found yet.
var errStillUnresolved = errors.New("row still unresolved after a resolving write that changed nothing")

// resolveLater carries on, in the background, a resolving write paydb did not
// take: it keeps trying until shortly before the row's interrupt_at — measured as
// start + RAIL_PROXY_INTERRUPTED_AFTER on this process's monotonic clock, start
// being taken before the admission began, so never later than paydb's own
// interrupt_at for the row — and then leaves the row to the janitor, as it would
// if this process were gone. metric is what the submission counts as once its
// row says so. The drain waits for these writes: a stopping proxy does not
// abandon an outcome it knows.
func (a *admitter) resolveLater(sub Submission, res resolution, start time.Time, metric string, cause error) {
	took := time.Since(start)
	deadline := start.Add(a.interruptAfter - lateMargin)
	a.active.Add(1)
	a.late.Add(1)
	a.logger.Warn("resolving write failed; retrying it in the background until shortly before the row's interrupt_at",
		"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", res.id, "outcome", res.outcome,
		"railReference", strOrNil(res.railRef), "declineReason", strOrNil(res.reason),
		"retryUntil", lockapi.UTC(deadline).Format(time.RFC3339Nano), "error", errText(cause))
	go func() {
		defer a.active.Done()
		defer a.late.Add(-1)
		ctx := context.Background()
		backoff := 50 * time.Millisecond
		var last error
		for attempt := 2; ; attempt++ {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			t := time.NewTimer(min(backoff, left))
			<-t.C
			backoff = min(2*backoff, time.Second)
			left = time.Until(deadline)
			if left <= 0 {
				break
			}
			row, wrote, err := a.resolveChecked(ctx, res, min(ResolveBound, left))
			switch {
			case wrote:
				a.metrics.lateResolutions.Inc()
				if metric != "" {
					a.count(metric, took)
				}
				a.logger.Info("submission resolved", "event", "submission_resolved", "payoutId", sub.PayoutID,
					"accountId", sub.AccountID, "submissionId", res.id, "outcome", res.outcome,
					"railReference", strOrNil(res.railRef), "elapsedMs", time.Since(start).Milliseconds(),
					"late", true, "attempts", attempt)
				return
			case err == nil && ownResolution(res, row):
				// The row says what this write says, and no janitor wrote it: an
				// earlier attempt of this very write committed after its deadline
				// had given up on its answer (a COMMIT waiting for the synchronous
				// standby is cancelled at the deadline and commits on the primary).
				// It is this write's resolution, counted and logged as such.
				a.lateLanded(sub, res, start, took, metric, attempt, min(ResolveBound, max(time.Until(deadline), unsentRetryFloor)))
				return
			case err == nil:
				// Resolved by someone else — the janitor, which counted it.
				a.logger.Error("the row was resolved by someone else before the outcome could be written; the audit trail and the caller's answer disagree",
					"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", res.id,
					"answered", res.outcome, "railReference", strOrNil(res.railRef), "rowSays", strOrNil(row.Outcome))
				return
			case errors.Is(err, ErrNoRow):
				// An intent whose COMMIT was unsure and did not happen: there is
				// nothing to resolve, and the answer (nothing presented) stands.
				if metric != "" {
					a.count(metric, took)
				}
				a.logger.Info("the intent whose commit was unsure does not exist; nothing to resolve",
					"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", res.id)
				return
			}
			last = err
		}
		a.logger.Error("resolving write still failing shortly before the row's interrupt_at; the row is left to the janitor, which will resolve it TIMEOUT",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", res.id, "outcome", res.outcome,
			"railReference", strOrNil(res.railRef), "declineReason", strOrNil(res.reason), "error", errText(last))
	}()
}

// ownResolution says whether row, found resolved by a resolving write that
// changed nothing, says exactly what res was to write and was not resolved by a
// janitor (which writes TIMEOUT only, and only past the row's interrupt_at).
func ownResolution(res resolution, row Attempt) bool {
	same := func(a, b *string) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
	return row.Outcome != nil && *row.Outcome == res.outcome && same(row.RailReference, res.railRef) &&
		same(row.DeclineReason, res.reason) && (res.outcome != lockapi.OutcomeTimeout || row.InTime)
}

// lateLanded counts and logs a resolving write of resolveLater's found to have
// committed after its deadline: a late resolution like any other
// (rail_resolution_late_total, the submission under metric, submission_resolved
// with late and committedAfterDeadline). Its COMMIT's answer was given up on, and
// with it any warning that the wait for the synchronous standby was cancelled —
// which is what our own deadline does to a COMMIT waiting for it — so whether it
// is durable is asked (Store.ConfirmDurable, within bound); not confirmed, it is
// resolution_not_durable, as a cancelled wait seen at once is.
func (a *admitter) lateLanded(sub Submission, res resolution, start time.Time, took time.Duration, metric string, attempt int, bound time.Duration) {
	a.metrics.lateResolutions.Inc()
	if metric != "" {
		a.count(metric, took)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	err := a.store.ConfirmDurable(ctx)
	cancel()
	if err != nil {
		a.metrics.notDurable.Inc()
		a.logger.Warn("resolving write committed after its deadline, on the primary, and not confirmed on the synchronous standby",
			"event", "resolution_not_durable", "submissionId", res.id, "outcome", res.outcome,
			"railReference", strOrNil(res.railRef), "late", true, "error", err.Error())
	}
	a.logger.Info("submission resolved", "event", "submission_resolved", "payoutId", sub.PayoutID,
		"accountId", sub.AccountID, "submissionId", res.id, "outcome", res.outcome,
		"railReference", strOrNil(res.railRef), "elapsedMs", time.Since(start).Milliseconds(),
		"late", true, "attempts", attempt, "committedAfterDeadline", true)
}

// resolveUnsure is resolveChecked for an intent whose row was not found after
// its COMMIT's answer was lost, within by: until the backend that was sent the
// COMMIT is past its transaction only that is asked, every unsurePoll (a row not
// found cannot be final before); then the write is tried. Still unknown at by,
// it answers errBackendBusy, for the caller to carry on in the background.
func (a *admitter) resolveUnsure(ctx context.Context, res resolution, by time.Time) (Attempt, bool, error) {
	wctx, cancel := context.WithDeadline(ctx, by)
	defer cancel()
	for {
		if over, err := a.store.TransactionOver(wctx, res.unsureBackend); err == nil && over {
			row, wrote, err := a.resolveChecked(ctx, res, max(time.Until(by), unsentRetryFloor))
			if !errors.Is(err, errBackendBusy) {
				return row, wrote, err
			}
		}
		t := time.NewTimer(unsurePoll)
		select {
		case <-t.C:
		case <-wctx.Done():
			t.Stop()
			return Attempt{}, false, errBackendBusy
		}
	}
}

// resolveChecked is one attempt at the resolving write res, for every path that
// resolves a row whose COMMIT's answer was lost (intentNotCommitted through
// resolveUnsure, and resolveLater): such a row counts as never written only when
// the backend that was sent the COMMIT was past it BEFORE the row was looked for.
// Asked the other way round, a COMMIT that lands between the lookup and the
// question passes for one that never happened: the row stays unresolved, the
// janitor makes it TIMEOUT, and a payout whose caller was told "nothing
// presented" is blocked as a duplicate. A row not found while the backend still
// held its transaction is errBackendBusy: ask again. Bounded by bound in all.
func (a *admitter) resolveChecked(ctx context.Context, res resolution, bound time.Duration) (Attempt, bool, error) {
	if res.unsureBackend == 0 {
		return a.resolveOnce(ctx, res, bound)
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	over, err := a.store.TransactionOver(ctx, res.unsureBackend)
	if err != nil {
		return Attempt{}, false, fmt.Errorf("asking whether paydb backend %d is past the lost COMMIT: %w", res.unsureBackend, err)
	}
	row, wrote, err := a.resolveOnce(ctx, res, bound)
	if errors.Is(err, ErrNoRow) && !over {
		return Attempt{}, false, errBackendBusy
	}
	return row, wrote, err
}

// errBackendBusy: the backend sent the lost COMMIT still holds its transaction.
var errBackendBusy = errors.New("the paydb backend sent the COMMIT still holds its transaction")

const (
	unsurePoll       = 5 * time.Millisecond
	unsentRetryFloor = 50 * time.Millisecond
)

// intentNotCommitted answers an admission transaction that failed: 503
// RAIL_UNAVAILABLE, stage intent_commit. Nothing was presented — no socket to the
// rail is ever opened before the commit succeeds. If COMMIT was sent and its
// answer lost, the intent may exist after all; this process knows it opened no
// socket, so it resolves that row UNSENT rather than leave a row nobody can
// explain to the janitor — once now, within unsentAnswerBound, and when paydb
// does not take it, in the background like any other known outcome (the caller
// does not wait for it).
func (a *admitter) intentNotCommitted(ctx context.Context, sub Submission, err error, start time.Time) reply {
	members := map[string]any{"stage": "intent_commit"}
	r := reply{status: http.StatusServiceUnavailable, metric: metricUnavailable}
	var ce *CommitError
	if errors.As(err, &ce) && ce.Unsure && ce.SubmissionID != 0 {
		if ce.Intent {
			res := resolution{id: ce.SubmissionID, outcome: lockapi.OutcomeUnsent, unsureBackend: ce.BackendPID}
			bound := time.Now().Add(a.unsentAnswerBound())
			row, wrote, rerr := a.resolveOnce(ctx, res, a.unsentAnswerBound())
			if errors.Is(rerr, ErrNoRow) || errors.Is(rerr, errStillUnresolved) {
				row, wrote, rerr = a.resolveUnsure(ctx, res, bound)
			}
			switch {
			case wrote:
				members["submissionId"] = ce.SubmissionID
				a.logger.Info("submission resolved", "event", "submission_resolved", "payoutId", sub.PayoutID,
					"accountId", sub.AccountID, "submissionId", ce.SubmissionID, "outcome", res.outcome,
					"railReference", nil, "elapsedMs", time.Since(start).Milliseconds())
			case rerr == nil:
				members["submissionId"] = row.SubmissionID
			case errors.Is(rerr, ErrNoRow):
				// The commit did not happen: no row, nothing to resolve.
			default:
				a.resolveLater(sub, res, start, r.metric, rerr)
				r.metric = ""
			}
		} else {
			// A FENCED, UNBOOKED or DUPLICATE row, resolved in the transaction itself: only
			// whether it exists is asked, within the same short bound.
			cctx, cancel := context.WithTimeout(ctx, a.unsentAnswerBound())
			if _, aerr := a.store.Attempt(cctx, ce.SubmissionID); aerr == nil {
				members["submissionId"] = ce.SubmissionID
			}
			cancel()
		}
	}
	a.logger.Warn("rail unavailable: the intent could not be committed, nothing was presented", "event", "rail_unavailable",
		"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "stage", "intent_commit",
		"error", err.Error())
	r.problem = lockapi.NewProblemCode(lockapi.CodeRailUnavailable,
		"paydb could not take the submission in time; nothing was presented to the rail", members)
	return r
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func strOrNil(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
