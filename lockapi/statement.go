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

// Statement is a page of the statement, in the rail's order. Next is the seq to
// pass as after for the next page when the page is full; nil when the page is the
// end for now.
type Statement struct {
	Lines []StatementLine `json:"lines"`
	Next  *int64          `json:"next"`
}
