package reconcile

import (
	"fmt"
	"strconv"

	"lock.dev/lockapi"
)

// maxLineTextLen bounds a statement line's reference, account, currency and
// beneficiary, in characters: room for any rail's reference (ours are payout ids
// of at most 64), any account (an IBAN is at most 34) and any beneficiary (ours
// are at most 128; ISO 20022 names one in a Max140Text).
const maxLineTextLen = lockapi.MaxDeclineReasonLen

// unstorable names the first text field of a statement line that is not text
// paydb can store and show as it is, and why (lockapi.StorableTextProblem); ""
// when every field is. Such a line is not copied: it is recorded as an
// UNSTORABLE_LINE exception (docs/contracts/reconciliation.md).
func unstorable(l lockapi.StatementLine) (field, problem string) {
	check := func(name, s string, max int) bool {
		if p := lockapi.StorableTextProblem(s, max); p != "" {
			field, problem = name, p
			return true
		}
		return false
	}
	switch {
	case check("reference", l.Reference, maxLineTextLen),
		check("accountId", l.AccountID, maxLineTextLen),
		check("currency", l.Currency, maxLineTextLen),
		check("beneficiary", l.Beneficiary, maxLineTextLen),
		l.RailReference != nil && check("railReference", *l.RailReference, lockapi.MaxRailReferenceLen),
		l.DeclineReason != nil && check("declineReason", *l.DeclineReason, lockapi.MaxDeclineReasonLen):
	}
	return field, problem
}

// unstorableException is the exception recording a line that was not copied.
// Its detail quotes the line's text escaped to printable ASCII (and shortened), so
// the exception itself is storable, the beneficiary masked as a log line carries
// it (the detail is logged); payoutID is the line's reference when that is
// storable text, to be matched against payout in SQL.
func unstorableException(l lockapi.StatementLine, field, problem string) (payoutID *string, e exception) {
	if f, _ := unstorable(lockapi.StatementLine{Reference: l.Reference}); f == "" {
		ref := l.Reference
		payoutID = &ref
	}
	seq := l.Seq
	show := func(s *string) string {
		if s == nil {
			return "null"
		}
		v, more := *s, ""
		if len(v) > 100 {
			v, more = v[:100], "…"
		}
		return strconv.QuoteToASCII(v) + more
	}
	masked := lockapi.MaskBeneficiary(l.Beneficiary)
	return payoutID, exception{Kind: KindUnstorableLine, Seq: &seq, Detail: fmt.Sprintf(
		"%s line at seq %d (%d %s on %s to beneficiary %s for reference %s, rail reference %s, decline reason %s) not copied: its %s %s",
		l.Result, l.Seq, l.AmountMinor, show(&l.Currency), show(&l.AccountID), show(&masked), show(&l.Reference),
		show(l.RailReference), show(l.DeclineReason), field, problem)}
}
