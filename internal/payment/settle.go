package payment

import (
	"errors"
	"math"
	"net/http"

	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// POST /v1/payouts/{id}/settle (docs/contracts/reconciliation.md): the reconciler settles an
// AMBIGUOUS payout from the rail's statement. Mounted only when
// PAYMENT_SETTLE_TOKEN is set; without it the route does not exist (404).
//
// The order is the contract's: the bearer token first (401 before anything of
// the request is looked at, so an unauthenticated caller learns nothing about
// payouts or body rules), then content type, size and body (415, 413, 400), then
// the payout (404; 409 PAYOUT_FINAL or PAYOUT_CONFLICT, or 200 for an identical
// repeat), then, with the books check on, the statement copy (409
// SETTLE_CONTRADICTS_STATEMENT, docs/contracts/books.md). Nothing is written
// unless every check passed.
func (h *handlers) settle(w http.ResponseWriter, r *http.Request) {
	if !lockapi.BearerMatches(r.Header, h.settleToken) {
		// The presented value is never logged: a near-miss would leak the secret.
		h.logger.Warn("settle refused: missing or wrong bearer token", "event", "settle_unauthorized",
			"remoteAddr", r.RemoteAddr, "authorizationPresent", r.Header.Get("Authorization") != "")
		w.Header().Set("WWW-Authenticate", `Bearer realm="payment-resource"`)
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeUnauthorized,
			"settling a payout needs Authorization: Bearer with the reconciler's token", nil))
		return
	}
	body, bf := jsonbody.ReadJSONBody(r)
	if bf != nil {
		lockapi.WriteInvalid(w, bf.Status, bf.Errors)
		return
	}
	id := r.PathValue("id")
	errs := checkPayoutID(id)
	u, berrs := parseSettleRequest(body)
	if errs = append(errs, berrs...); len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	ctx, cancel := h.dbContext(r)
	defer cancel()
	p, moved, err := h.store.Settle(ctx, id, u, h.caller(r))
	var final *FinalError
	var owned *SettleStatusError
	var contradicts *SettleContradictsError
	switch {
	case errors.As(err, &contradicts):
		var lineBeneficiary string
		if contradicts.LineBeneficiary != nil {
			lineBeneficiary = lockapi.MaskBeneficiary(*contradicts.LineBeneficiary)
		}
		h.logger.Warn("settle refused: the statement copy does not say so", "event", "settle_contradicts_statement",
			"payoutId", id, "outcome", u.Outcome, "statementSeq", u.StatementSeq, "railReference", u.RailReference,
			"lineSeq", contradicts.LineSeq, "lineBeneficiary", lineBeneficiary, "reason", contradicts.Reason)
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeSettleContradictsStatement,
			"settle of payout "+id+" as "+u.Outcome+" refused: "+contradicts.Reason, nil))
	case errors.As(err, &final):
		h.logger.Warn("settle refused: the payout is final", "event", "settle_refused", "payoutId", id,
			"outcome", u.Outcome, "statementSeq", u.StatementSeq, "payoutStatus", final.Status)
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodePayoutFinal,
			"payout "+id+" is "+final.Status+"; only an AMBIGUOUS payout is settled, once",
			map[string]any{"payoutStatus": final.Status}))
	case errors.As(err, &owned):
		h.logger.Warn("settle refused: an executor still owns the payout", "event", "settle_refused", "payoutId", id,
			"outcome", u.Outcome, "statementSeq", u.StatementSeq, "payoutStatus", owned.Status)
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodePayoutConflict,
			"payout "+id+" is "+owned.Status+": an executor still owns it; only an AMBIGUOUS payout is settled",
			map[string]any{"payoutStatus": owned.Status}))
	case err != nil:
		h.fail(w, r, err)
	case !moved:
		h.logger.Info("settle repeated: the payout was already settled so; nothing changed", "event", "settle_repeated",
			"payoutId", id, "outcome", u.Outcome, "statementSeq", u.StatementSeq)
		lockapi.WriteJSON(w, http.StatusOK, p)
	default:
		h.metrics.settled(p.Status)
		h.logger.Info("payout settled from the rail's statement", "event", "payout_settled", "payoutId", id,
			"accountId", p.AccountID, "outcome", p.Status, "statementSeq", u.StatementSeq,
			"railReference", p.RailReference, "fenceToken", p.FenceToken)
		lockapi.WriteJSON(w, http.StatusOK, p)
	}
}

// parseSettleRequest binds a settle's body: outcome required (PAID, DECLINED,
// NOT_PRESENTED); railReference, declineReason and statementSeq optional and
// nullable, each required or refused by the outcome. PAID needs railReference and
// statementSeq and takes no declineReason; DECLINED needs statementSeq and takes
// no railReference; NOT_PRESENTED takes none of the three (the statement has no
// line of the payout: that is the proof).
func parseSettleRequest(b []byte) (lockapi.SettleRequest, []lockapi.FieldError) {
	var u lockapi.SettleRequest
	o, errs := jsonbody.ParseObject(b)
	if errs != nil {
		return u, errs
	}
	outcome, outcomeOK := o.String("outcome", true, false, validateSettleOutcome)
	ref, refOK := o.String("railReference", false, true, validateRailReference)
	reason, reasonOK := o.String("declineReason", false, true, validateDeclineReason)
	seq, seqOK := o.OptionalInt64("statementSeq", 1, math.MaxInt64)
	errs = o.Finish()
	u.Outcome = outcome
	if refOK {
		u.RailReference = &ref
	}
	if reasonOK {
		u.DeclineReason = &reason
	}
	if seqOK {
		u.StatementSeq = &seq
	}
	if !outcomeOK {
		return u, errs
	}
	need := func(ok bool, field, why string) {
		if !ok && !hasFault(errs, field) {
			errs = append(errs, lockapi.FieldError{Field: field, Problem: why})
		}
	}
	refuse := func(present bool, field, why string) {
		if present {
			errs = append(errs, lockapi.FieldError{Field: field, Problem: why})
		}
	}
	switch outcome {
	case lockapi.StatusPaid:
		need(refOK, "railReference", "is required when outcome is PAID")
		need(seqOK, "statementSeq", "is required when outcome is PAID")
		refuse(reasonOK, "declineReason", "must be absent or null when outcome is PAID")
	case lockapi.StatusDeclined:
		need(seqOK, "statementSeq", "is required when outcome is DECLINED")
		refuse(refOK, "railReference", "must be absent or null when outcome is DECLINED")
	case lockapi.StatusNotPresented:
		refuse(seqOK, "statementSeq", "must be absent or null when outcome is NOT_PRESENTED")
		refuse(refOK, "railReference", "must be absent or null when outcome is NOT_PRESENTED")
		refuse(reasonOK, "declineReason", "must be absent or null when outcome is NOT_PRESENTED")
	}
	return u, errs
}

func validateSettleOutcome(s string) error {
	switch s {
	case lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusNotPresented:
		return nil
	}
	return fault("must be PAID, DECLINED or NOT_PRESENTED")
}
