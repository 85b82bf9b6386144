package lockapi

import "time"

// Statement results (docs/contracts/reconciliation.md).
const (
	ResultAccepted = "ACCEPTED"
	ResultDeclined = "DECLINED"
)

// StatementLine is one line of the rail's statement, as rail-proxy serves it on
// GET /v1/rail/statement (docs/contracts/reconciliation.md).
type StatementLine struct {
	Seq           int64     `json:"seq"`
	ReceivedAt    time.Time `json:"receivedAt"`
	Reference     string    `json:"reference"` // = payoutId when the rail was called by us
	AccountID     string    `json:"accountId"`
	AmountMinor   int64     `json:"amountMinor"`
	Currency      string    `json:"currency"`
	Result        string    `json:"result"` // ACCEPTED or DECLINED
	RailReference *string   `json:"railReference"`
	DeclineReason *string   `json:"declineReason"`
}

// RailCall is one call of rail-stub's books as GET /rail/v1/calls answers it and
// its call-log file holds it, members in the order docs/contracts/rail-stub.md lists
// them: rail-stub writes it and rail-proxy reads it to serve the statement.
// RailReference is null for a declined call, Reason (the decline reason) null for an
// accepted one.
type RailCall struct {
	Seq           int64     `json:"seq"`
	ReceivedAt    time.Time `json:"receivedAt"`
	Reference     string    `json:"reference"`
	AccountID     string    `json:"accountId"`
	AmountMinor   int64     `json:"amountMinor"`
	Currency      string    `json:"currency"`
	Beneficiary   string    `json:"beneficiary"`
	Result        string    `json:"result"`
	RailReference *string   `json:"railReference"`
	Reason        *string   `json:"reason"`
	LatencyMs     int       `json:"latencyMs"`
	Dropped       bool      `json:"dropped"`
}

// Line is c as a statement line, field for field: reason becomes declineReason,
// receivedAt is given in UTC, and beneficiary, latencyMs and dropped are not
// statement fields (docs/contracts/reconciliation.md).
func (c RailCall) Line() StatementLine {
	return StatementLine{
		Seq: c.Seq, ReceivedAt: c.ReceivedAt.UTC(), Reference: c.Reference, AccountID: c.AccountID,
		AmountMinor: c.AmountMinor, Currency: c.Currency, Result: c.Result,
		RailReference: c.RailReference, DeclineReason: c.Reason,
	}
}

// Statement is a page of the statement, in the rail's order. Next is the seq to
// pass as after for the next page when the page is full; nil when the page is the
// end for now.
type Statement struct {
	Lines []StatementLine `json:"lines"`
	Next  *int64          `json:"next"`
}
