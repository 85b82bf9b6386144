package invariants

import (
	"fmt"
	"slices"
	"strings"

	"lock.dev/lockapi"
)

// Invariant 8, only the books move money (docs/contracts/books.md, "The
// invariant"): every rail_submission row that may have moved money (ACKED or
// TIMEOUT) matches a payout that was CLAIMED by the row's token and owner — in
// payout_history, so a payout re-claimed since still shows the claim — with the
// row's account, amount, currency and beneficiary; every posted outcome is the one
// the audit trail recorded; every settled outcome is the one the statement copy
// shows. Payout fields never change after creation, so the payout row stands for
// the payout at every claim. Judged only with Options.BooksBound: the history
// must hold payout_history.

var booksBoundCheckDefs = []checkDef{
	{CheckAdmittedWithoutClaim, 8, "ACKED/TIMEOUT rows no claim by their token and owner backs", true},
	{CheckAdmittedNotAsBooked, 8, "ACKED/TIMEOUT rows not as their payout is booked", true},
	{CheckPaidPostNotRecorded, 8, "payouts posted PAID without their ACKED row", true},
	{CheckPostNotRecorded, 8, "payouts posted DECLINED or AMBIGUOUS the audit trail does not bear out", true},
	{CheckPaidSettleWithoutLine, 8, "payouts settled PAID without a matching ACCEPTED line", true},
	{CheckSettleContradicted, 8, "payouts settled DECLINED or NOT_PRESENTED the statement contradicts", true},
}

// booksBound judges invariant 8.
func (e *evaluation) booksBound() {
	if !e.opts.BooksBound {
		return
	}
	type claim struct {
		payout, owner string
		token         int64
	}
	claims := map[claim]bool{}
	claimsOf := map[string][]string{}
	// recorded: payouts with at least one move in payout_history. payment-resource
	// records every payout's creation, so a payout in the books with none was
	// created before the history existed (a paydb migrated in place): whom it was
	// claimed by cannot be judged, and its rows are judged only as booked.
	recorded := map[string]bool{}
	for _, m := range e.h.Moves {
		recorded[m.PayoutID] = true
		if m.Status == "CLAIMED" {
			claims[claim{m.PayoutID, m.OwnerID, m.FenceToken}] = true
			claimsOf[m.PayoutID] = append(claimsOf[m.PayoutID], fmt.Sprintf("token %d by %s", m.FenceToken, m.OwnerID))
		}
	}
	for _, s := range e.subs {
		if s.Outcome != "ACKED" && s.Outcome != "TIMEOUT" {
			continue
		}
		f := Finding{AccountID: s.AccountID, PayoutID: s.PayoutID, SubmissionID: s.SubmissionID}
		p, ok := e.payout[s.PayoutID]
		if !ok {
			f.Detail = fmt.Sprintf("%s with token %d of %s: no payout %s is in the books", s.Outcome, s.PresentedToken, s.OwnerID, s.PayoutID)
			e.add(CheckAdmittedWithoutClaim, f)
			continue
		}
		if recorded[s.PayoutID] && !claims[claim{s.PayoutID, s.OwnerID, s.PresentedToken}] {
			held := "never claimed"
			if cs := claimsOf[s.PayoutID]; len(cs) > 0 {
				held = "claimed only with " + strings.Join(cs, ", ")
			}
			f.Detail = fmt.Sprintf("%s with token %d of %s: the payout was %s", s.Outcome, s.PresentedToken, s.OwnerID, held)
			e.add(CheckAdmittedWithoutClaim, f)
		}
		if !asBooked(s, p) {
			f.Detail = fmt.Sprintf("%s presented %s %d %s to %s; the books hold %s %d %s to %s", s.Outcome,
				s.AccountID, s.AmountMinor, s.Currency, lockapi.MaskBeneficiary(s.Beneficiary),
				p.AccountID, p.AmountMinor, p.Currency, lockapi.MaskBeneficiary(p.Beneficiary))
			e.add(CheckAdmittedNotAsBooked, f)
		}
	}
	lines := map[string][]lockapi.StatementLine{}
	for _, l := range e.h.StatementLines {
		lines[l.Reference] = append(lines[l.Reference], l)
	}
	for _, p := range e.payouts {
		f := Finding{AccountID: p.AccountID, PayoutID: p.PayoutID}
		settled, bySettle := e.settlement[p.PayoutID]
		posted := p.Status
		if bySettle {
			posted = "AMBIGUOUS" // a settle moves only an AMBIGUOUS payout
		}
		if id, detail := e.postRecorded(p, posted); detail != "" {
			f.Detail = detail
			e.add(id, f)
		}
		if !bySettle {
			continue
		}
		if id, detail := settleShown(p, settled, lines[p.PayoutID]); detail != "" {
			f.Detail = detail
			e.add(id, f)
		}
	}
}

// asBooked: the row presented exactly the payout's account, amount, currency and
// beneficiary (the gate compares them as stored).
func asBooked(s Submission, p Payout) bool {
	return s.AccountID == p.AccountID && s.AmountMinor == p.AmountMinor && s.Currency == p.Currency && s.Beneficiary == p.Beneficiary
}

// postRecorded checks a posted outcome against the payout's forwardable rows, as
// payment-resource does with its books check on: PAID ↔ ACKED with the same rail
// reference, DECLINED ↔ REJECTED with the same reason, AMBIGUOUS ↔ TIMEOUT or a
// forwardable row not as booked. It names the failing check and why, or nothing.
func (e *evaluation) postRecorded(p Payout, posted string) (CheckID, string) {
	rows := e.fwd[p.PayoutID]
	has := func(ok func(Submission) bool) bool { return slices.ContainsFunc(rows, ok) }
	switch posted {
	case "PAID":
		if !has(func(s Submission) bool { return s.Outcome == "ACKED" && s.RailReference == p.RailReference }) {
			return CheckPaidPostNotRecorded, fmt.Sprintf("posted PAID with rail reference %q; the audit trail records %s",
				p.RailReference, recorded(rows))
		}
	case "DECLINED":
		if !has(func(s Submission) bool { return s.Outcome == "REJECTED" && s.DeclineReason == p.DeclineReason }) {
			return CheckPostNotRecorded, fmt.Sprintf("posted DECLINED (%q); the audit trail records %s", p.DeclineReason, recorded(rows))
		}
	case "AMBIGUOUS":
		if !has(func(s Submission) bool { return s.Outcome == "TIMEOUT" || !asBooked(s, p) }) {
			return CheckPostNotRecorded, "posted AMBIGUOUS; the audit trail records " + recorded(rows)
		}
	}
	return "", ""
}

// recorded says what a payout's forwardable rows record.
func recorded(rows []Submission) string {
	if len(rows) == 0 {
		return "no forwardable attempt"
	}
	var out []string
	for _, s := range rows {
		w := fmt.Sprintf("submission %d %s", s.SubmissionID, outcomeName(s.Outcome))
		switch {
		case s.RailReference != "":
			w += fmt.Sprintf(" %q", s.RailReference)
		case s.DeclineReason != "":
			w += fmt.Sprintf(" (%q)", s.DeclineReason)
		}
		out = append(out, w)
	}
	return strings.Join(out, ", ")
}

// settleShown checks a settled outcome against the statement copy's lines of
// the payout, as payment-resource does with its books check on: PAID needs an
// ACCEPTED line with the payout's account, amount, currency, rail reference and
// (when the line carries one) beneficiary, compared as IBANs are; DECLINED a
// DECLINED line and no ACCEPTED one; NOT_PRESENTED no line at all.
func settleShown(p Payout, s Settlement, lines []lockapi.StatementLine) (CheckID, string) {
	var accepted, declined []lockapi.StatementLine
	for _, l := range lines {
		if l.Result == "ACCEPTED" {
			accepted = append(accepted, l)
		} else {
			declined = append(declined, l)
		}
	}
	switch s.Outcome {
	case "PAID":
		if !slices.ContainsFunc(accepted, func(l lockapi.StatementLine) bool {
			return l.AccountID == p.AccountID && l.AmountMinor == p.AmountMinor && l.Currency == p.Currency &&
				text(l.RailReference) == p.RailReference &&
				(l.Beneficiary == "" || lockapi.SameBeneficiary(l.Beneficiary, p.Beneficiary))
		}) {
			return CheckPaidSettleWithoutLine, fmt.Sprintf("settled PAID with rail reference %q; the statement copy has %s",
				p.RailReference, shown(lines))
		}
	case "DECLINED":
		if len(declined) == 0 || len(accepted) > 0 {
			return CheckSettleContradicted, "settled DECLINED; the statement copy has " + shown(lines)
		}
	case "NOT_PRESENTED":
		if len(lines) > 0 {
			return CheckSettleContradicted, "settled NOT_PRESENTED; the statement copy has " + shown(lines)
		}
	}
	return "", ""
}

// shown says what a payout's statement lines show.
func shown(lines []lockapi.StatementLine) string {
	if len(lines) == 0 {
		return "no line of it"
	}
	var out []string
	for _, l := range lines {
		w := fmt.Sprintf("line %d %s %s %d %s", l.Seq, l.Result, l.AccountID, l.AmountMinor, l.Currency)
		if l.Beneficiary != "" {
			w += " to " + lockapi.MaskBeneficiary(l.Beneficiary)
		}
		if r := text(l.RailReference); r != "" {
			w += fmt.Sprintf(" %q", r)
		}
		out = append(out, w)
	}
	return strings.Join(out, ", ")
}
