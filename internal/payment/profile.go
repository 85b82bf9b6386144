package payment

import (
	"fmt"
	"unicode/utf8"

	"lock.dev/internal/iso4217"
	"lock.dev/lockapi"
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

// The ISO 20022 text limits, in characters.
const (
	iso20022Max35 = 35 // Max35Text: EndToEndId
	iso20022Max34 = 34 // Max34Text: Othr/Id of an account
)

// validProfile reports whether p is a PAYMENT_RAIL_PROFILE value.
func validProfile(p string) bool { return p == ProfileStub || p == ProfileISO20022 }

// refuseForRail lists what makes req impossible for profile's rail to present,
// for each field the API's own rules did not already refuse (errs). The stub
// profile refuses nothing.
func refuseForRail(profile string, req lockapi.SubmissionRequest, errs []lockapi.FieldError) []lockapi.FieldError {
	if profile != ProfileISO20022 {
		return nil
	}
	var out []lockapi.FieldError
	tooLong := func(field, value string, max int, what string) {
		if hasFault(errs, field) || value == "" {
			return
		}
		if n := utf8.RuneCountInString(value); n > max {
			out = append(out, lockapi.FieldError{Field: field, Problem: fmt.Sprintf(
				"must be at most %d characters for the ISO 20022 rail (PAYMENT_RAIL_PROFILE=iso20022: it becomes the %s), got %d", max, what, n)})
		}
	}
	tooLong(fieldPayoutID, req.PayoutID, iso20022Max35, "pain.001 EndToEndId, Max35Text")
	tooLong("accountId", req.AccountID, iso20022Max34, "debtor's account, Max34Text")
	tooLong("beneficiary", req.Beneficiary, iso20022Max34, "creditor's account, Max34Text")
	if !hasFault(errs, "currency") && req.Currency != "" {
		if _, ok := iso4217.Exponent(req.Currency); !ok {
			out = append(out, lockapi.FieldError{Field: "currency", Problem: "has no ISO 4217 minor unit: the ISO 20022 rail " +
				"(PAYMENT_RAIL_PROFILE=iso20022) cannot express an amount in it"})
		}
	}
	return out
}
