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
	Seq         int64     `json:"seq"`
	ReceivedAt  time.Time `json:"receivedAt"`
	Reference   string    `json:"reference"` // = payoutId when the rail was called by us
	AccountID   string    `json:"accountId"`
	AmountMinor int64     `json:"amountMinor"`
	Currency    string    `json:"currency"`
	// Beneficiary is the beneficiary the rail was presented, exactly as the rail
	// gives it: part of what was paid, compared with the payout's as
	// SameBeneficiary does (docs/contracts/reconciliation.md).
	Beneficiary   string  `json:"beneficiary"`
	Result        string  `json:"result"` // ACCEPTED or DECLINED
	RailReference *string `json:"railReference"`
	DeclineReason *string `json:"declineReason"`
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
// receivedAt is given in UTC, and latencyMs and dropped are not statement fields
// (docs/contracts/reconciliation.md). The beneficiary is one: what the rail was
// presented includes whom it paid.
func (c RailCall) Line() StatementLine {
	return StatementLine{
		Seq: c.Seq, ReceivedAt: c.ReceivedAt.UTC(), Reference: c.Reference, AccountID: c.AccountID,
		AmountMinor: c.AmountMinor, Currency: c.Currency, Beneficiary: c.Beneficiary, Result: c.Result,
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

// Beneficiaries compare as IBANs do (docs/contracts/reconciliation.md): an IBAN
// is written in groups of four for people to read ("NL91 ABNA 0417 1643 00") and
// its letters are case-insensitive, so two beneficiaries are the same when they
// are equal once every space (U+0020) is removed and every ASCII letter is upper
// case. Nothing else is folded: a beneficiary that is not an IBAN compares
// exactly, but for those two, and no character outside ASCII is case-folded, so
// the comparison never depends on a locale or on PostgreSQL's collation, and the
// Go and SQL forms below give the same answer for every text.

// BeneficiaryKey is s in the form beneficiaries are compared in: spaces removed,
// ASCII letters upper case.
func BeneficiaryKey(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ':
		case c >= 'a' && c <= 'z':
			b = append(b, c-'a'+'A')
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// SameBeneficiary reports whether a and b name the same beneficiary, compared as
// IBANs are (BeneficiaryKey).
func SameBeneficiary(a, b string) bool { return BeneficiaryKey(a) == BeneficiaryKey(b) }

// BeneficiaryKeySQL is BeneficiaryKey in PostgreSQL, over the text expression
// expr: translate maps a–z to A–Z position by position, whatever the database's
// collation, and drops the space, which is last in the first list and so has no
// counterpart in the second.
func BeneficiaryKeySQL(expr string) string {
	return "translate(" + expr + ", 'abcdefghijklmnopqrstuvwxyz ', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ')"
}
