// Package stubjson is the adapter for rail-stub's own JSON protocol
// (docs/contracts/rail-stub.md), the rail rail-proxy speaks with
// RAIL_PROTOCOL=stub, its default:
//
//   - a payment is POST /rail/v1/payments with the JSON body reference (the
//     payoutId), accountId, amountMinor, currency and beneficiary;
//   - 200 {"status":"ACCEPTED","railReference":…} accepts it, 422
//     {"status":"DECLINED","reason":…} declines it (the reason may be absent);
//     anything else is not understood;
//   - the health probe is GET /rail/v1/health;
//   - the statement is GET /rail/v1/calls?after=&limit=, every call the rail was
//     presented, accepted and declined alike.
//
// rail-stub takes whatever the books take, so the adapter refuses no payment.
package stubjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"lock.dev/lockapi"
	"lock.dev/rail"
)

// The adapter's name and rail-stub's routes.
const (
	Protocol      = "stub"
	PaymentsPath  = "/rail/v1/payments"
	HealthPath    = "/rail/v1/health"
	CallsPath     = "/rail/v1/calls"
	contentJSON   = "application/json"
	statusAccept  = "ACCEPTED"
	statusDecline = "DECLINED"
)

// New is the adapter for rail-stub's JSON protocol. It keeps no state.
func New() rail.Adapter { return adapter{} }

type adapter struct{}

// payment is the body of POST /rail/v1/payments, members in this order.
type payment struct {
	Reference   string `json:"reference"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	Beneficiary string `json:"beneficiary"`
}

// reply covers both the accept and the decline body. Reason is a pointer so
// that an absent or null reason and an empty one read alike: no reason given.
type reply struct {
	Status        string  `json:"status"`
	RailReference string  `json:"railReference"`
	Reason        *string `json:"reason"`
}

func (adapter) Protocol() string { return Protocol }

// Refuse refuses nothing: rail-stub takes every payment the books can hold.
func (adapter) Refuse(rail.Payment) []lockapi.FieldError { return nil }

// PaymentRequest is the one POST presenting p; its reference is the payoutId.
func (adapter) PaymentRequest(p rail.Payment) (rail.Request, error) {
	body, err := json.Marshal(payment{Reference: p.PayoutID, AccountID: p.AccountID, AmountMinor: p.AmountMinor,
		Currency: p.Currency, Beneficiary: p.Beneficiary})
	if err != nil {
		return rail.Request{}, fmt.Errorf("encoding rail payment: %w", err)
	}
	return rail.Request{Method: http.MethodPost, Path: PaymentsPath, ContentType: contentJSON, Accept: contentJSON, Body: body}, nil
}

// ReadAnswer reads 200 ACCEPTED with a reference as an accept and 422 DECLINED
// as a decline; a reference or reason that is not storable text
// (lockapi.StorableTextProblem) makes either no well-formed answer. rail-stub's
// answer does not name the payment: the connection it came on does.
func (adapter) ReadAnswer(_ rail.Payment, r rail.Reply) rail.Answer {
	var rep reply
	if err := json.Unmarshal(r.Body, &rep); err != nil {
		return notUnderstood("reply is not JSON")
	}
	switch {
	case r.Status == http.StatusOK && rep.Status == statusAccept && rep.RailReference != "":
		if p := lockapi.StorableTextProblem(rep.RailReference, lockapi.MaxRailReferenceLen); p != "" {
			return notUnderstood("railReference " + p)
		}
		return rail.Answer{Verdict: rail.Accepted, RailReference: rep.RailReference}
	case r.Status == http.StatusUnprocessableEntity && rep.Status == statusDecline:
		var reason string
		if rep.Reason != nil {
			if p := lockapi.StorableTextProblem(*rep.Reason, lockapi.MaxDeclineReasonLen); p != "" {
				return notUnderstood("reason " + p)
			}
			reason = *rep.Reason
		}
		return rail.Answer{Verdict: rail.Declined, DeclineReason: reason}
	case r.Status == http.StatusOK:
		return notUnderstood("not a well-formed accept")
	case r.Status == http.StatusUnprocessableEntity:
		return notUnderstood("not a well-formed decline")
	default:
		return notUnderstood("unexpected status")
	}
}

func notUnderstood(why string) rail.Answer { return rail.Answer{Verdict: rail.NotUnderstood, Why: why} }

// HealthRequest is GET /rail/v1/health.
func (adapter) HealthRequest() rail.Request {
	return rail.Request{Method: http.MethodGet, Path: HealthPath}
}

// StatementRequest is GET /rail/v1/calls?after=&limit=.
func (adapter) StatementRequest(after int64, limit int) rail.Request {
	return rail.Request{Method: http.MethodGet, Accept: contentJSON,
		Path: CallsPath + "?after=" + strconv.FormatInt(after, 10) + "&limit=" + strconv.Itoa(limit)}
}

// ReadStatement reads a 200 page of calls, each as its statement line
// (lockapi.RailCall.Line): the page whole, or an error when the reply is not a
// page of calls or a call lacks its result, reference, account, currency or
// beneficiary.
func (adapter) ReadStatement(r rail.Reply, _ int64, _ int) ([]lockapi.StatementLine, error) {
	if r.Status != http.StatusOK {
		return nil, fmt.Errorf("the rail answered %d", r.Status)
	}
	var page struct {
		Calls []lockapi.RailCall `json:"calls"`
	}
	if err := json.Unmarshal(r.Body, &page); err != nil || page.Calls == nil {
		return nil, errors.New("the rail's reply is not a page of calls")
	}
	lines := make([]lockapi.StatementLine, 0, len(page.Calls))
	for _, c := range page.Calls {
		switch {
		case c.Result != lockapi.ResultAccepted && c.Result != lockapi.ResultDeclined:
			return nil, fmt.Errorf("call %d has result %q, neither ACCEPTED nor DECLINED", c.Seq, c.Result)
		case c.Reference == "" || c.AccountID == "" || c.Currency == "" || c.Beneficiary == "":
			return nil, fmt.Errorf("call %d lacks its reference, account, currency or beneficiary", c.Seq)
		}
		lines = append(lines, c.Line())
	}
	return lines, nil
}
