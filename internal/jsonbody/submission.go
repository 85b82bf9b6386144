package jsonbody

import "lock.dev/lockapi"

// ParseSubmissionRequest binds the five payout fields strictly: all required, no
// others, each within its bounds.
func ParseSubmissionRequest(b []byte) (lockapi.SubmissionRequest, []lockapi.FieldError) {
	var req lockapi.SubmissionRequest
	o, errs := ParseObject(b)
	if errs != nil {
		return req, errs
	}
	req.PayoutID, _ = o.String("payoutId", true, false, lockapi.ValidateIdentifier)
	req.AccountID, _ = o.String("accountId", true, false, lockapi.ValidateIdentifier)
	req.AmountMinor, _ = o.Int64("amountMinor", true, lockapi.MinAmountMinor, lockapi.MaxAmountMinor)
	req.Currency, _ = o.String("currency", true, false, lockapi.ValidateCurrency)
	req.Beneficiary, _ = o.String("beneficiary", true, false, lockapi.ValidateBeneficiary)
	return req, o.Finish()
}
