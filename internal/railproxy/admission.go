package railproxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"lock.dev/lockapi"
)

// admitter runs the four steps of C3 #ct3-railproxy for one submission, in this
// order, every time:
//
//  1. Fence first: the pinned upsert of rail_high_water, strict `<`.
//  2. Duplicate check: the intent insert, judged by rail_submission_attempt_uidx.
//  3. Intent before socket: that row is committed, outcome NULL, before any
//     connection to the rail is opened.
//  4. Forward exactly once, and resolve the row in a second transaction.
//
// Steps 1–3 are one transaction (Store.Admit); step 4 is railClient.Pay and then
// the resolving write. There is no retry of the rail call anywhere, for any
// outcome: a timeout means unknown, never failed, and a second call could be a
// second payment (C3 #ct3-ambiguity).
type admitter struct {
	store   *Store
	rail    *railClient
	metrics *metrics
	logger  *slog.Logger
	fencing bool

	active sync.WaitGroup // submissions being carried to their answers
}

// wait waits at most d for every submission in flight to finish; it reports
// whether they all did.
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
// committed intent whose rail call was cut short (C3: "the caller's cancellation
// never aborts a rail call or a resolution"). Every wait below has its own bound.
func (a *admitter) Submit(ctx context.Context, sub Submission) reply {
	start := time.Now()
	a.active.Add(1)
	defer a.active.Done()
	a.metrics.inflight.Inc()
	defer a.metrics.inflight.Dec()
	ctx = context.WithoutCancel(ctx)
	r := a.submit(ctx, sub, start)
	if r.metric != "" {
		a.metrics.submissions.WithLabelValues(r.metric).Inc()
		a.metrics.submissionSeconds.WithLabelValues(r.metric).Observe(time.Since(start).Seconds())
	}
	return r
}

func (a *admitter) submit(ctx context.Context, sub Submission, start time.Time) reply {
	// Steps 1–3, bounded as a whole (pool wait included) by AdmissionBound.
	actx, cancel := context.WithTimeout(ctx, AdmissionBound)
	adm, err := a.store.Admit(actx, sub, a.fencing)
	cancel()
	if err != nil {
		return a.intentNotCommitted(ctx, sub, err)
	}

	switch adm.Verdict {
	case Fenced:
		// The token is not strictly greater than the mark: an older holder, or a
		// replay of the same token. The rail is not called on this path — that
		// is the whole point of the gate.
		a.metrics.fencedOut.WithLabelValues("rail").Inc()
		a.logger.Warn("submission fenced out", "event", "fenced_out", "resource", "rail",
			"accountId", sub.AccountID, "payoutId", sub.PayoutID, "presentedToken", sub.Token,
			"highestToken", adm.HighestToken, "ownerId", sub.OwnerID, "idempotencyKey", sub.IdempotencyKey,
			"submissionId", adm.SubmissionID)
		return reply{status: http.StatusConflict, metric: metricFenced, problem: lockapi.NewProblem(http.StatusConflict,
			lockapi.CodeFencedOut, "the fencing token is not strictly greater than the account's high-water mark; a newer holder exists",
			map[string]any{"presentedToken": sub.Token, "highestToken": adm.HighestToken, "submissionId": adm.SubmissionID})}

	case Duplicate:
		// The payout already has a forwardable attempt; the unique index, not a
		// read, said so. The rail sees each payout at most once, ever.
		a.metrics.duplicates.Inc()
		m := map[string]any{"submissionId": adm.SubmissionID, "firstSubmissionId": nil, "firstSubmittedAt": nil,
			"firstOutcome": nil, "firstRailReference": nil}
		if f := adm.First; f != nil {
			m["firstSubmissionId"] = f.SubmissionID
			m["firstSubmittedAt"] = lockapi.UTC(f.SubmittedAt)
			m["firstOutcome"] = strOrNil(f.Outcome)
			m["firstRailReference"] = strOrNil(f.RailReference)
		}
		a.logger.Warn("duplicate rail submission attempted", "event", "duplicate_rail_submission_attempted",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "ownerId", sub.OwnerID,
			"submissionId", adm.SubmissionID, "firstSubmissionId", m["firstSubmissionId"],
			"firstSubmittedAt", m["firstSubmittedAt"], "firstOutcome", m["firstOutcome"])
		return reply{status: http.StatusConflict, metric: metricDuplicate, problem: lockapi.NewProblem(http.StatusConflict,
			lockapi.CodeDuplicateSubmission, "this payout already has a forwardable attempt; it is never presented to the rail twice", m)}
	}

	// Step 3 is done: the intent is committed (outcome NULL), so should this
	// process die from here on, the row is the evidence that a payment may have
	// been presented, and the janitor resolves it TIMEOUT — never resubmits it.

	// Step 4: forward exactly once. Only now is a connection to the rail opened.
	call := a.rail.Pay(ctx, railPayment{Reference: sub.PayoutID, AccountID: sub.AccountID,
		AmountMinor: sub.AmountMinor, Currency: sub.Currency, Beneficiary: sub.Beneficiary})
	a.metrics.callSeconds.Observe(call.Elapsed.Seconds())

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
	row, wrote, err := a.resolve(ctx, adm.SubmissionID, outcome, railRef, reason)
	switch {
	case err != nil:
		// The row stays unresolved; the janitor will resolve it TIMEOUT after
		// RAIL_PROXY_INTERRUPTED_AFTER. The caller still gets the rail's answer.
		a.logger.Error("resolving write failed; the row stays unresolved until the janitor resolves it TIMEOUT",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", adm.SubmissionID,
			"outcome", outcome, "railReference", strOrNil(railRef), "declineReason", strOrNil(reason), "error", err.Error())
	case !wrote:
		// Someone resolved the row first (the janitor, after a stall longer than
		// any bound). The row is the audit trail: answer what it says, so the
		// caller and the trail never disagree. The janitor already counted it.
		a.logger.Warn("submission was already resolved; answering what its row says",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", adm.SubmissionID,
			"railSaid", outcome, "railReference", strOrNil(railRef), "declineReason", strOrNil(reason),
			"rowSays", strOrNil(row.Outcome))
		r := a.answerFromRow(sub, row)
		r.metric = ""
		return r
	}

	elapsedMs := time.Since(start).Milliseconds()
	switch outcome {
	case lockapi.OutcomeTimeout:
		a.logger.Error("rail outcome ambiguous: do not resubmit, reconcile from the rail's records", "event", "rail_ambiguous",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "ownerId", sub.OwnerID,
			"submissionId", adm.SubmissionID, "elapsedMs", call.Elapsed.Milliseconds(), "cause", call.Cause,
			"error", call.Err.Error())
	case lockapi.OutcomeUnsent:
		a.logger.Warn("rail unavailable: no connection could be opened, nothing was presented", "event", "rail_unavailable",
			"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "stage", "dial",
			"error", call.Err.Error())
	}
	if wrote {
		a.logger.Info("submission resolved", "event", "submission_resolved", "payoutId", sub.PayoutID,
			"accountId", sub.AccountID, "submissionId", adm.SubmissionID, "outcome", outcome,
			"railReference", strOrNil(railRef), "elapsedMs", elapsedMs)
	}
	return a.answer(sub, adm.SubmissionID, outcome, railRef, reason)
}

// answer maps a resolved outcome to the reply C3 pins for it.
func (a *admitter) answer(sub Submission, id int64, outcome string, railRef, reason *string) reply {
	switch outcome {
	case lockapi.OutcomeAcked:
		return reply{status: http.StatusOK, metric: metricAcked, ok: &lockapi.SubmissionAccepted{
			SubmissionID: id, PayoutID: sub.PayoutID, AccountID: sub.AccountID, PresentedToken: sub.Token,
			Outcome: lockapi.OutcomeAcked, RailReference: deref(railRef)}}
	case lockapi.OutcomeRejected:
		return reply{status: http.StatusUnprocessableEntity, metric: metricRejected, problem: lockapi.NewProblem(
			http.StatusUnprocessableEntity, lockapi.CodeRailRejected, "the rail declined the payment; no money moved",
			map[string]any{"submissionId": id, "declineReason": strOrNil(reason)})}
	case lockapi.OutcomeUnsent:
		return reply{status: http.StatusServiceUnavailable, metric: metricUnavailable, problem: lockapi.NewProblem(
			http.StatusServiceUnavailable, lockapi.CodeRailUnavailable,
			"no connection to the rail could be opened; nothing was presented, the payout may be submitted again with a newer token",
			map[string]any{"stage": "dial", "submissionId": id})}
	default:
		return reply{status: http.StatusConflict, metric: metricAmbiguous, problem: lockapi.NewProblem(
			http.StatusConflict, lockapi.CodeRailAmbiguous,
			"the rail may have acted and the result is unknown: do not resubmit this payout, reconcile it from the rail's records",
			map[string]any{"submissionId": id})}
	}
}

func (a *admitter) answerFromRow(sub Submission, row Attempt) reply {
	return a.answer(sub, row.SubmissionID, deref(row.Outcome), row.RailReference, row.DeclineReason)
}

// resolve writes the outcome, retrying the write (it is idempotent: it only
// touches a row whose outcome is NULL) for at most ResolveBound. wrote is false
// when the row was found already resolved; row then says by whom to what.
func (a *admitter) resolve(ctx context.Context, id int64, outcome string, railRef, reason *string) (row Attempt, wrote bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, ResolveBound)
	defer cancel()
	backoff := 20 * time.Millisecond
	var last error // the last answer from paydb itself, not our own deadline
	for {
		ok, err := a.store.Resolve(ctx, id, outcome, railRef, reason)
		if err == nil {
			if ok {
				return Attempt{SubmissionID: id, Outcome: &outcome, RailReference: railRef, DeclineReason: reason}, true, nil
			}
			row, err = a.store.Attempt(ctx, id)
			if err == nil && row.Outcome != nil {
				return row, false, nil
			}
			if err == nil {
				err = errors.New("row still unresolved after a resolving write that changed nothing")
			}
		}
		if last == nil || ctx.Err() == nil {
			last = err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return Attempt{}, false, last
		case <-t.C:
		}
		backoff = min(2*backoff, 400*time.Millisecond)
	}
}

// intentNotCommitted answers an admission transaction that failed: 503
// RAIL_UNAVAILABLE, stage intent_commit. Nothing was presented — no socket to the
// rail is ever opened before the commit succeeds. If COMMIT was sent and its
// answer lost, the intent may exist after all; this process knows it opened no
// socket, so it resolves that row UNSENT (bounded retries) rather than leave a
// row nobody can explain to the janitor.
func (a *admitter) intentNotCommitted(ctx context.Context, sub Submission, err error) reply {
	members := map[string]any{"stage": "intent_commit"}
	var ce *CommitError
	if errors.As(err, &ce) && ce.Unsure && ce.SubmissionID != 0 {
		if ce.Intent {
			unsent := lockapi.OutcomeUnsent
			row, wrote, rerr := a.resolve(ctx, ce.SubmissionID, unsent, nil, nil)
			switch {
			case wrote:
				members["submissionId"] = ce.SubmissionID
				a.logger.Info("submission resolved", "event", "submission_resolved", "payoutId", sub.PayoutID,
					"accountId", sub.AccountID, "submissionId", ce.SubmissionID, "outcome", unsent,
					"railReference", nil, "elapsedMs", int64(0))
			case rerr == nil:
				members["submissionId"] = row.SubmissionID
			case errors.Is(rerr, ErrNoRow):
				// The commit did not happen: no row, nothing to resolve.
			default:
				a.logger.Error("intent commit unsure and the row could not be checked; the janitor will resolve it if it exists",
					"payoutId", sub.PayoutID, "accountId", sub.AccountID, "submissionId", ce.SubmissionID, "error", rerr.Error())
			}
		} else {
			cctx, cancel := context.WithTimeout(ctx, ResolveBound)
			if _, aerr := a.store.Attempt(cctx, ce.SubmissionID); aerr == nil {
				members["submissionId"] = ce.SubmissionID
			}
			cancel()
		}
	}
	a.logger.Warn("rail unavailable: the intent could not be committed, nothing was presented", "event", "rail_unavailable",
		"payoutId", sub.PayoutID, "accountId", sub.AccountID, "presentedToken", sub.Token, "stage", "intent_commit",
		"error", err.Error())
	return reply{status: http.StatusServiceUnavailable, metric: metricUnavailable, problem: lockapi.NewProblem(
		http.StatusServiceUnavailable, lockapi.CodeRailUnavailable,
		"paydb could not take the submission in time; nothing was presented to the rail", members)}
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
