package payment

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// handlers binds requests, asks the store, and answers. Validation (415, 413,
// 400) always comes before any lookup (404, 409), so a malformed request writes
// nothing whatever state its payout is in.
type handlers struct {
	store     *store
	metrics   *metrics
	logger    *slog.Logger
	dbTimeout time.Duration

	settleToken string      // PAYMENT_SETTLE_TOKEN; empty: the settle route is not mounted
	railProfile string      // PAYMENT_RAIL_PROFILE: the rail's limits a created payout must fit (profile.go)
	grants      *grant.Gate // claims and posts must prove their token, when it verifies
	// caller is the verified workload of a request (identity.Guard.Caller), ""
	// without identities: recorded as the actor of each move it makes.
	caller func(*http.Request) string
}

// dbContext bounds a request's paydb work, the wait for a connection included.
// It is detached from the caller: once a request reaches paydb, its transaction
// commits or rolls back on this bound, not on the client hanging up mid-way.
func (h *handlers) dbContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), h.dbTimeout)
}

// POST /v1/payouts
func (h *handlers) create(w http.ResponseWriter, r *http.Request) {
	body, bf := jsonbody.ReadJSONBody(r)
	if bf != nil {
		lockapi.WriteInvalid(w, bf.Status, bf.Errors)
		return
	}
	req, errs := jsonbody.ParseSubmissionRequest(body)
	errs = append(errs, refuseForRail(h.railProfile, req, errs)...)
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	ctx, cancel := h.dbContext(r)
	defer cancel()
	p, created, err := h.store.Create(ctx, req, h.caller(r))
	var conflict *ConflictError
	switch {
	case errors.As(err, &conflict):
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodePayoutConflict,
			"payout "+req.PayoutID+" already exists with a different "+joinFields(conflict.Fields),
			map[string]any{"payoutId": req.PayoutID, "conflictingFields": conflict.Fields}))
	case err != nil:
		h.fail(w, r, err)
	case created:
		h.logger.Info("payout created", "event", "payout_created", "payoutId", p.PayoutID, "accountId", p.AccountID,
			"amountMinor", p.AmountMinor, "currency", p.Currency, "beneficiary", lockapi.MaskBeneficiary(p.Beneficiary))
		w.Header().Set("Location", "/v1/payouts/"+p.PayoutID)
		lockapi.WriteJSON(w, http.StatusCreated, p)
	default:
		lockapi.WriteJSON(w, http.StatusOK, p)
	}
}

// GET /v1/payouts/{id}
func (h *handlers) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if errs := checkPayoutID(id); errs != nil {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	ctx, cancel := h.dbContext(r)
	defer cancel()
	p, err := h.store.Get(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	lockapi.WriteJSON(w, http.StatusOK, p)
}

// GET /v1/payouts?status=&accountId=&updatedBefore=&limit=
func (h *handlers) list(w http.ResponseWriter, r *http.Request) {
	f, errs := parseListQuery(r.URL.Query())
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	ctx, cancel := h.dbContext(r)
	defer cancel()
	ps, err := h.store.List(ctx, f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	lockapi.WriteJSON(w, http.StatusOK, lockapi.PayoutList{Payouts: ps})
}

// POST /v1/payouts/{id}/claim — fence point (a). No body: neither the body nor
// its Content-Type is looked at.
func (h *handlers) claim(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	errs := checkPayoutID(id)
	f, herrs := lockapi.ParseFencingHeaders(r.Header, true, true, false)
	if errs = append(errs, herrs...); len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	ctx, cancel := h.dbContext(r)
	defer cancel()
	if !h.checkGrant(ctx, w, r, id, f) {
		return
	}
	p, err := h.store.Claim(ctx, id, f.Token, f.OwnerID, h.caller(r))
	if err != nil {
		h.refuse(w, r, "claim", id, f, err)
		return
	}
	h.metrics.transitioned(lockapi.StatusClaimed)
	h.logger.Info("payout claimed", "event", "payout_claimed", "payoutId", id, "accountId", p.AccountID,
		"token", f.Token, "ownerId", f.OwnerID)
	lockapi.WriteJSON(w, http.StatusOK, p)
}

// POST /v1/payouts/{id}/post — the claimant records the rail's outcome.
func (h *handlers) post(w http.ResponseWriter, r *http.Request) {
	body, bf := jsonbody.ReadJSONBody(r)
	if bf != nil {
		lockapi.WriteInvalid(w, bf.Status, bf.Errors)
		return
	}
	id := r.PathValue("id")
	errs := checkPayoutID(id)
	f, herrs := lockapi.ParseFencingHeaders(r.Header, true, true, false)
	u, berrs := parsePostRequest(body)
	if errs = append(append(errs, herrs...), berrs...); len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	ctx, cancel := h.dbContext(r)
	defer cancel()
	if !h.checkGrant(ctx, w, r, id, f) {
		return
	}
	p, err := h.store.Post(ctx, id, f.Token, f.OwnerID, h.caller(r), u)
	if err != nil {
		h.refuse(w, r, "post", id, f, err)
		return
	}
	h.metrics.transitioned(p.Status)
	h.logger.Info("payout posted", "event", "payout_posted", "payoutId", id, "accountId", p.AccountID,
		"payoutStatus", p.Status, "token", f.Token, "ownerId", f.OwnerID, "railReference", p.RailReference)
	lockapi.WriteJSON(w, http.StatusOK, p)
}

// refuse answers a claim or post the store refused: 404, 409 PAYOUT_FINAL,
// 409 FENCED_OUT (logged and counted), 409 OUTCOME_NOT_RECORDED (logged), or a
// failure.
func (h *handlers) refuse(w http.ResponseWriter, r *http.Request, call, id string, f lockapi.Fencing, err error) {
	var final *FinalError
	var fenced *FencedError
	var unrecorded *OutcomeNotRecordedError
	switch {
	case errors.As(err, &unrecorded):
		h.logger.Warn("payout post refused: the audit trail did not record this outcome", "event", "outcome_not_recorded",
			"payoutId", id, "posted", unrecorded.Posted, "recorded", unrecorded.Recorded, "submissionId", unrecorded.SubmissionID,
			"mismatch", unrecorded.Mismatch, "presentedBeneficiary", maskedOrEmpty(unrecorded.PresentedBeneficiary),
			"token", f.Token, "ownerId", f.OwnerID, "reason", unrecorded.Reason)
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeOutcomeNotRecorded,
			"post of payout "+id+" refused: "+unrecorded.Reason,
			map[string]any{"recorded": unrecorded.Recorded}))
	case errors.As(err, &final):
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodePayoutFinal,
			"payout "+id+" is "+final.Status+"; a final payout never changes",
			// docs/contracts/payments.md names this member "status", which RFC 9457
			// and the conventions of docs/contracts/README.md reserve for the HTTP
			// status; the payout's status goes in payoutStatus.
			map[string]any{"payoutStatus": final.Status}))
	case errors.As(err, &fenced):
		h.metrics.fenced()
		h.logger.Warn("payout "+call+" fenced out", "event", "fenced_out", "resource", "payout", "call", call,
			"payoutId", id, "presentedToken", fenced.Presented, "fenceToken", fenced.FenceToken,
			"ownerId", f.OwnerID, "claimedBy", fenced.ClaimedBy, "payoutStatus", fenced.Status)
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeFencedOut,
			call+" of payout "+id+" refused: "+fenced.Reason,
			map[string]any{"presentedToken": fenced.Presented, "fenceToken": fenced.FenceToken}))
	default:
		h.fail(w, r, err)
	}
}

// fail answers 404, 503 UNAVAILABLE or 500 INTERNAL. Only the last two are logged.
func (h *handlers) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeNotFound,
			"no payout "+r.PathValue("id"), nil))
	case errors.Is(err, ErrUnavailable):
		h.logger.Warn("paydb unavailable", "event", "paydb_unavailable", "method", r.Method, "route", r.Pattern, "error", err.Error())
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeUnavailable,
			"paydb could not be reached in time; for a post, read the payout to learn whether it was recorded", nil))
	default:
		h.logger.Error("request failed", "event", "internal_error", "method", r.Method, "route", r.Pattern, "error", err.Error())
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal,
			"internal error", nil))
	}
}

// maskedOrEmpty masks a beneficiary for a log line (lockapi.MaskBeneficiary);
// an absent one stays empty.
func maskedOrEmpty(b string) string {
	if b == "" {
		return ""
	}
	return lockapi.MaskBeneficiary(b)
}

func joinFields(fs []string) string {
	s := ""
	for i, f := range fs {
		switch {
		case i == 0:
		case i == len(fs)-1:
			s += " and "
		default:
			s += ", "
		}
		s += f
	}
	return s
}
