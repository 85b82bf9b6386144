package payment

import (
	"lock.dev/lockapi"
	"lock.dev/rail"
	"lock.dev/rail/iso20022"
)

// The rail profiles of PAYMENT_RAIL_PROFILE (docs/contracts/payments.md): which
// rail's limits a payout must fit at creation.
const (
	// ProfileStub takes every payout the API's own rules allow; rail-stub's
	// JSON (RAIL_PROTOCOL=stub) can present all of them.
	ProfileStub = "stub"
	// ProfileISO20022 also refuses a payout rail-proxy's ISO 20022 adapter
	// (RAIL_PROTOCOL=iso20022) could never present (docs/contracts/iso20022.md):
	// its payoutId becomes the pain.001's EndToEndId (Max35Text), its accountId
	// and beneficiary the debtor's and creditor's account (Max34Text), and its
	// amount a decimal in the currency's ISO 4217 minor unit. Refused at
	// creation, such a payout is never booked and stranded at the gate.
	ProfileISO20022 = "iso20022"
)

// validProfile reports whether p is a PAYMENT_RAIL_PROFILE value.
func validProfile(p string) bool { return p == ProfileStub || p == ProfileISO20022 }

// refuseForRail lists what makes req impossible for profile's rail to present,
// for each field the API's own rules did not already refuse (errs). The stub
// profile refuses nothing; the ISO 20022 profile refuses what rail-proxy's
// ISO 20022 adapter refuses, by the adapter's own rules, so that the two never
// drift apart.
func refuseForRail(profile string, req lockapi.SubmissionRequest, errs []lockapi.FieldError) []lockapi.FieldError {
	if profile != ProfileISO20022 {
		return nil
	}
	value := map[string]string{fieldPayoutID: req.PayoutID, "accountId": req.AccountID,
		"beneficiary": req.Beneficiary, "currency": req.Currency}
	var out []lockapi.FieldError
	for _, fe := range iso20022.New().Refuse(rail.Payment{PayoutID: req.PayoutID, AccountID: req.AccountID,
		AmountMinor: req.AmountMinor, Currency: req.Currency, Beneficiary: req.Beneficiary}) {
		if v, named := value[fe.Field]; hasFault(errs, fe.Field) || (named && v == "") {
			continue // the API's own rules already said what is wrong with it
		}
		fe.Problem += " (PAYMENT_RAIL_PROFILE=iso20022)"
		out = append(out, fe)
	}
	return out
}
