package railproxy

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"sort"

	"lock.dev/internal/grant"
	"lock.dev/internal/identity"
	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
	"lock.dev/rail"
)

// ParseSubmission binds a submission strictly: the three fencing headers, then
// the five body members (docs/contracts/README.md). Every fault is returned, the
// headers' first: when both are wrong, the headers answer, and the 400 still
// lists every fault found. Content type (415) and size (413) come before this, in
// jsonbody.ReadJSONBody.
func ParseSubmission(h http.Header, body []byte) (Submission, []lockapi.FieldError) {
	f, errs := lockapi.ParseFencingHeaders(h, true, true, true)
	req, berrs := jsonbody.ParseSubmissionRequest(body)
	errs = append(errs, berrs...)
	if len(errs) > 0 {
		return Submission{}, errs
	}
	return Submission{
		PayoutID:       req.PayoutID,
		AccountID:      req.AccountID,
		Token:          f.Token,
		OwnerID:        f.OwnerID,
		IdempotencyKey: f.IdempotencyKey,
		AmountMinor:    req.AmountMinor,
		Currency:       req.Currency,
		Beneficiary:    req.Beneficiary,
	}, nil
}

// BindSubmission applies the rules of docs/contracts/rail-proxy.md in their order:
// content type (415), size (413), then headers and body (400). status is 0 when the
// request is well-formed.
func BindSubmission(r *http.Request) (sub Submission, status int, errs []lockapi.FieldError) {
	body, fault := jsonbody.ReadJSONBody(r)
	if fault != nil {
		return Submission{}, fault.Status, fault.Errors
	}
	sub, errs = ParseSubmission(r.Header, body)
	if len(errs) > 0 {
		return Submission{}, http.StatusBadRequest, errs
	}
	return sub, 0, nil
}

// payment is s as the rail is asked to pay it, under the admitted attempt's
// submission id (0 before the admission).
func (s Submission) payment(submissionID int64) rail.Payment {
	return rail.Payment{SubmissionID: submissionID, PayoutID: s.PayoutID, AccountID: s.AccountID,
		AmountMinor: s.AmountMinor, Currency: s.Currency, Beneficiary: s.Beneficiary}
}

// handleSubmit is POST /v1/rail/submissions. A malformed request writes nothing and
// calls nothing: validation is complete before the admission begins — the
// rail's language included: a payment the adapter could never present (a field
// too long for its message, a currency it cannot express) is 400
// INVALID_REQUEST naming the fields, before any row, whether the submission
// would then be admitted alone or in a group. So is the
// grant check (docs/contracts/signed-grants.md): a token lock-server did not grant
// for this account to this owner never reaches the gate's decision — no row, no
// mark moved, no rail. Every row the submission writes names the verified
// caller (guard.Caller: its SPIFFE ID, "" without identities) as its submitter.
func handleSubmit(a *admitter, gate *grant.Gate, guard *identity.Guard) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sub, status, errs := BindSubmission(r)
		if status != 0 {
			lockapi.WriteInvalid(w, status, errs)
			return
		}
		if errs := a.rail.adapter.Refuse(sub.payment(0)); len(errs) > 0 {
			lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
			return
		}
		sub.SubmitterIdentity = guard.Caller(r)
		if !gate.Check(w, r, grant.Fenced{AccountID: sub.AccountID, PayoutID: sub.PayoutID, Token: sub.Token, OwnerID: sub.OwnerID}) {
			return
		}
		rep := a.Submit(r.Context(), sub)
		if rep.ok != nil {
			lockapi.WriteJSON(w, rep.status, rep.ok)
			return
		}
		lockapi.WriteProblem(w, rep.problem)
	}
}

// handleList is GET /v1/rail/submissions?payoutId=[&after=]: one page of a
// payout's audit trail, oldest first, at most MaxListPage rows, with next naming
// where the following page starts. Executors read it to learn the outcome of an
// attempt they lost track of.
func handleList(store *Store, logger *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, errs := parseListQuery(r.URL.RawQuery)
		if len(errs) > 0 {
			lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), AdmissionBound)
		defer cancel()
		subs, next, err := store.List(ctx, q.payoutID, q.after, MaxListPage)
		if err != nil {
			logger.Warn("audit read failed", "payoutId", q.payoutID, "error", err.Error())
			lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeUnavailable,
				"paydb could not be read in time", nil))
			return
		}
		lockapi.WriteJSON(w, http.StatusOK, lockapi.SubmissionList{Submissions: subs, Next: next})
	}
}

type listQuery struct {
	payoutID string
	after    int64 // 0: from the first row
}

// parseListQuery binds the audit-trail query strictly: payoutId exactly once,
// after at most once and a submissionId (a positive decimal integer without sign
// or leading zero), nothing else.
func parseListQuery(raw string) (listQuery, []lockapi.FieldError) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return listQuery{}, []lockapi.FieldError{{Field: "query", Problem: "is not a well-formed query string"}}
	}
	var errs, unknown []lockapi.FieldError
	names := make([]string, 0, len(q))
	for k := range q {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if k != "payoutId" && k != "after" {
			unknown = append(unknown, lockapi.FieldError{Field: k, Problem: "is not a known parameter"})
		}
	}
	var lq listQuery
	switch vs := q["payoutId"]; {
	case len(vs) == 0:
		errs = append(errs, lockapi.FieldError{Field: "payoutId", Problem: "is required"})
	case len(vs) > 1:
		errs = append(errs, lockapi.FieldError{Field: "payoutId", Problem: "must appear exactly once"})
	default:
		if err := lockapi.ValidateIdentifier(vs[0]); err != nil {
			errs = append(errs, lockapi.FieldError{Field: "payoutId", Problem: lockapi.ProblemText(err)})
		}
		lq.payoutID = vs[0]
	}
	switch vs := q["after"]; {
	case len(vs) > 1:
		errs = append(errs, lockapi.FieldError{Field: "after", Problem: "must appear at most once"})
	case len(vs) == 1:
		// A submissionId has the form of a token: the same strict parser.
		v, err := lockapi.ParseToken(vs[0])
		if err != nil {
			errs = append(errs, lockapi.FieldError{Field: "after", Problem: lockapi.ProblemText(err)})
		}
		lq.after = v
	}
	errs = append(errs, unknown...)
	if len(errs) > 0 {
		return listQuery{}, errs
	}
	return lq, nil
}
