package railproxy

import "lock.dev/rail"

// railPayment is the body rail-stub's protocol posts (lock.dev/rail/stubjson),
// as the tests' own rails read it; reference = payoutId.
type railPayment struct {
	Reference   string `json:"reference"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	Beneficiary string `json:"beneficiary"`
}

// payment is p as the gate hands it to the adapter.
func (p railPayment) payment() rail.Payment {
	return rail.Payment{SubmissionID: 1, PayoutID: p.Reference, AccountID: p.AccountID, AmountMinor: p.AmountMinor,
		Currency: p.Currency, Beneficiary: p.Beneficiary}
}
