package invariants

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
)

// Invariant 7, the books close (docs/lockdemo.md,
// docs/contracts/reconciliation.md): once the reconciler has read the statement
// past the settle window, no payout is AMBIGUOUS, the ledger equals what the rail
// accepted for our payouts, and every disagreement is a recorded exception. Judged
// from ground truth: the rail-stub's call log and the payouts, ledger and settle
// records in paydb. The reconciler's own copy of the statement is not trusted; it
// is compared with the call log.

// exceptionKinds are the kinds of docs/contracts/reconciliation.md, in its order,
// then those of docs/contracts/books.md.
var exceptionKinds = []string{"PRESENTED_TWICE", "AMOUNT_MISMATCH", "UNKNOWN_REFERENCE", "LINE_CONTRADICTS_PAYOUT", "PAID_WITHOUT_LINE",
	"BENEFICIARY_MISMATCH", "ATTEMPT_MISMATCH"}

var booksCheckDefs = []checkDef{
	{CheckAmbiguousLeft, 7, "AMBIGUOUS payouts after the final pass", true},
	{CheckLedgerVsAccepted, 7, "currencies whose ledger is not what the rail accepted", true},
	{CheckPaidAcceptedOnce, 7, "PAID payouts without exactly one accepted call", true},
	{CheckStatementCopy, 7, "statement lines copied wrong or not at all", true},
	{CheckExceptions, 7, "reconciliation exceptions (each needs a person)", true},
	{CheckUnrecorded, 7, "disagreements not recorded as exceptions", true},
}

// Reconciliation sums up what the reconciler did, from paydb's records: the
// payouts settled from the statement (payment-resource's settle records), the
// statement it copied, and the exceptions it recorded, by kind (every kind, zeros
// included).
type Reconciliation struct {
	SettledPaid         int            `json:"settledPaid"`
	SettledDeclined     int            `json:"settledDeclined"`
	SettledNotPresented int            `json:"settledNotPresented"`
	AmbiguousLeft       int            `json:"ambiguousLeft"`
	StatementLines      int            `json:"statementLines"`
	LastSeq             int64          `json:"lastSeq"`
	ReadAt              *time.Time     `json:"readAt"`
	Exceptions          map[string]int `json:"exceptions"`
}

// ExceptionTotal is the number of exceptions recorded, every kind.
func (r Reconciliation) ExceptionTotal() int {
	n := 0
	for _, c := range r.Exceptions {
		n += c
	}
	return n
}

// settledFromStatement reports whether a settle moved the payout out of AMBIGUOUS.
func (e *evaluation) settledFromStatement(id string) bool {
	_, ok := e.settlement[id]
	return ok
}

// settledAs reports whether a settle moved the payout to outcome.
func (e *evaluation) settledAs(id, outcome string) bool {
	s, ok := e.settlement[id]
	return ok && s.Outcome == outcome
}

// books judges invariant 7 and fills the report's reconciliation summary.
func (e *evaluation) books(r *Report) {
	if !e.opts.Reconciled {
		return
	}
	rec := &Reconciliation{Exceptions: map[string]int{}, StatementLines: len(e.h.StatementLines)}
	for _, k := range exceptionKinds {
		rec.Exceptions[k] = 0
	}
	for _, s := range e.h.Settlements {
		switch s.Outcome {
		case "PAID":
			rec.SettledPaid++
		case "DECLINED":
			rec.SettledDeclined++
		case "NOT_PRESENTED":
			rec.SettledNotPresented++
		}
	}
	if c := e.h.Cursor; c != nil {
		rec.LastSeq, rec.ReadAt = c.LastSeq, c.ReadAt
	}
	r.Reconciliation = rec

	for _, p := range e.payouts {
		if p.Status == "AMBIGUOUS" {
			rec.AmbiguousLeft++
			e.add(CheckAmbiguousLeft, Finding{AccountID: p.AccountID, PayoutID: p.PayoutID,
				Detail: "still AMBIGUOUS after the reconciler's final pass"})
		}
	}
	for _, m := range r.Money {
		if m.Booked != m.AcceptedForPayouts {
			e.add(CheckLedgerVsAccepted, Finding{Detail: fmt.Sprintf(
				"%s: the ledger books %d, the rail accepted %d for our payouts (a difference of %d)",
				m.Currency, m.Booked, m.AcceptedForPayouts, m.AcceptedForPayouts-m.Booked)})
		}
	}
	for _, p := range e.payouts {
		if p.Status != "PAID" {
			continue
		}
		var seqs []string
		for _, c := range e.byRef[p.PayoutID] {
			if c.Result == railstub.ResultAccepted {
				seqs = append(seqs, fmt.Sprint(c.Seq))
			}
		}
		if len(seqs) != 1 {
			e.add(CheckPaidAcceptedOnce, Finding{AccountID: p.AccountID, PayoutID: p.PayoutID,
				Detail: fmt.Sprintf("PAID, and the rail accepted it %d times (calls %s)", len(seqs), strings.Join(seqs, ", "))})
		}
	}
	e.statementCopy()
	for _, x := range e.h.Exceptions {
		rec.Exceptions[x.Kind]++
		e.add(CheckExceptions, Finding{PayoutID: x.PayoutID, Seq: x.Seq, Detail: x.Kind + ": " + x.Detail})
	}
	e.unrecorded()
}

// statementCopy compares the reconciler's copy with the rail's log: the final pass
// read the whole statement, so the cursor is at the log's last seq and every call
// is copied as it is (receivedAt to paydb's microsecond); the copy holds nothing
// else.
func (e *evaluation) statementCopy() {
	var last int64
	if n := len(e.calls); n > 0 {
		last = e.calls[n-1].Seq
	}
	if e.h.Cursor == nil {
		if last > 0 {
			e.add(CheckStatementCopy, Finding{Detail: fmt.Sprintf("no reconciler cursor: the statement (%d calls) was never read", len(e.calls))})
		}
		return
	}
	if e.opts.StatementAcceptedOnly {
		e.acceptedCopy()
		return
	}
	if e.h.Cursor.LastSeq != last {
		e.add(CheckStatementCopy, Finding{Seq: last, Detail: fmt.Sprintf(
			"the cursor is at seq %d, the rail's log ends at %d: the final pass did not read it all", e.h.Cursor.LastSeq, last)})
	}
	copied := make(map[int64]lockapi.StatementLine, len(e.h.StatementLines))
	for _, l := range e.h.StatementLines {
		copied[l.Seq] = l
	}
	for _, c := range e.calls {
		l, ok := copied[c.Seq]
		f := Finding{AccountID: c.AccountID, PayoutID: c.Reference, Seq: c.Seq}
		switch {
		case !ok:
			f.Detail = "the rail booked this call; the copy lacks it"
		case l.Reference != c.Reference || l.AccountID != c.AccountID || l.AmountMinor != c.AmountMinor ||
			l.Currency != c.Currency || l.Beneficiary != c.Beneficiary || l.Result != c.Result || text(l.RailReference) != c.RailReference ||
			text(l.DeclineReason) != c.Reason || l.ReceivedAt.Sub(c.ReceivedAt).Abs() > time.Microsecond:
			f.Detail = fmt.Sprintf("copied as %s %s %d %s %s %q, the rail booked %s %s %d %s %s %q",
				l.Reference, l.AccountID, l.AmountMinor, l.Currency, l.Result, text(l.RailReference),
				c.Reference, c.AccountID, c.AmountMinor, c.Currency, c.Result, c.RailReference)
		default:
			delete(copied, c.Seq)
			continue
		}
		delete(copied, c.Seq)
		e.add(CheckStatementCopy, f)
	}
	extra := make([]int64, 0, len(copied))
	for seq := range copied {
		extra = append(extra, seq)
	}
	slices.Sort(extra)
	for _, seq := range extra {
		l := copied[seq]
		e.add(CheckStatementCopy, Finding{AccountID: l.AccountID, PayoutID: l.Reference, Seq: seq,
			Detail: "the copy has a line the rail never booked"})
	}
}

// acceptedCopy is statementCopy for a statement of accepted calls only
// (Options.StatementAcceptedOnly): every accepted call is copied once, as it is,
// under its account and rail reference — the copy holding them all shows the
// final pass read the whole statement — and the copy holds nothing else.
func (e *evaluation) acceptedCopy() {
	type key struct{ account, ref string }
	copied := make(map[key][]lockapi.StatementLine, len(e.h.StatementLines))
	for _, l := range e.h.StatementLines {
		k := key{l.AccountID, text(l.RailReference)}
		copied[k] = append(copied[k], l)
	}
	for _, c := range e.calls {
		if c.Result != railstub.ResultAccepted {
			continue
		}
		k := key{c.AccountID, c.RailReference}
		ls := copied[k]
		delete(copied, k)
		f := Finding{AccountID: c.AccountID, PayoutID: c.Reference, Seq: c.Seq}
		switch {
		case len(ls) == 0:
			f.Detail = "the rail accepted this call; the copy lacks it"
		case len(ls) > 1:
			f.Detail = fmt.Sprintf("copied %d times (seqs %d, %d …)", len(ls), ls[0].Seq, ls[1].Seq)
		case ls[0].Reference != c.Reference || ls[0].AmountMinor != c.AmountMinor || ls[0].Currency != c.Currency ||
			!lockapi.SameBeneficiary(ls[0].Beneficiary, c.Beneficiary) || ls[0].Result != c.Result ||
			ls[0].ReceivedAt.Sub(c.ReceivedAt).Abs() > time.Microsecond:
			l := ls[0]
			f.Detail = fmt.Sprintf("copied as %s %s %d %s %s at %s, the rail booked %s %s %d %s %s at %s",
				l.Reference, l.AccountID, l.AmountMinor, l.Currency, l.Result, l.ReceivedAt.Format(time.RFC3339Nano),
				c.Reference, c.AccountID, c.AmountMinor, c.Currency, c.Result, c.ReceivedAt.Format(time.RFC3339Nano))
		default:
			continue
		}
		e.add(CheckStatementCopy, f)
	}
	extra := make([]lockapi.StatementLine, 0, len(copied))
	for _, ls := range copied {
		extra = append(extra, ls...)
	}
	slices.SortFunc(extra, func(a, b lockapi.StatementLine) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, l := range extra {
		e.add(CheckStatementCopy, Finding{AccountID: l.AccountID, PayoutID: l.Reference, Seq: l.Seq,
			Detail: "the copy has a line the rail never accepted"})
	}
}

// unrecorded derives from the rail's log the disagreements
// docs/contracts/reconciliation.md names per line and flags each one no exception
// records: a second accepted call of a payout (PRESENTED_TWICE), a call whose
// account, amount or currency is not its payout's (AMOUNT_MISMATCH), or, those
// equal, whose beneficiary is not (BENEFICIARY_MISMATCH, compared as IBANs are;
// docs/contracts/books.md), a call of no
// payout (UNKNOWN_REFERENCE), and a call its payout's final status denies
// (LINE_CONTRADICTS_PAYOUT). PAID_WITHOUT_LINE needs no derivation here: a PAID
// payout without exactly one accepted call already fails CheckPaidAcceptedOnce.
func (e *evaluation) unrecorded() {
	type key struct {
		kind, payout string
		seq          int64
	}
	recorded := map[key]bool{}
	for _, x := range e.h.Exceptions {
		recorded[key{x.Kind, x.PayoutID, x.Seq}] = true
	}
	// A statement of accepted calls only is numbered by its reader (statement
	// files in import order), not by the rail: the exception a call calls for
	// carries the seq of the line the call was copied as.
	type line struct{ account, ref string }
	copiedSeq := map[line]int64{}
	if e.opts.StatementAcceptedOnly {
		for _, l := range e.h.StatementLines {
			k := line{l.AccountID, text(l.RailReference)}
			if _, seen := copiedSeq[k]; !seen {
				copiedSeq[k] = l.Seq
			}
		}
	}
	expect := func(kind string, c railstub.Call, payout, detail string) {
		seq := c.Seq
		if s, ok := copiedSeq[line{c.AccountID, c.RailReference}]; ok {
			seq = s
		}
		if !recorded[key{kind, payout, seq}] {
			e.add(CheckUnrecorded, Finding{AccountID: c.AccountID, PayoutID: c.Reference, Seq: c.Seq,
				Detail: kind + " not recorded: " + detail})
		}
	}
	acceptedBefore := map[string]int64{}
	for _, c := range e.calls {
		if e.opts.StatementAcceptedOnly && c.Result != railstub.ResultAccepted {
			continue // on no statement: nothing for the reconciler to record
		}
		p, ours := e.payout[c.Reference]
		if !ours {
			expect("UNKNOWN_REFERENCE", c, "", fmt.Sprintf("%s call for %s, which is no payout", c.Result, c.Reference))
			continue
		}
		if c.AccountID != p.AccountID || c.AmountMinor != p.AmountMinor || c.Currency != p.Currency {
			expect("AMOUNT_MISMATCH", c, p.PayoutID, fmt.Sprintf("call %d %s %d on %s, payout %s %d on %s",
				c.Seq, c.Currency, c.AmountMinor, c.AccountID, p.Currency, p.AmountMinor, p.AccountID))
		} else if !lockapi.SameBeneficiary(c.Beneficiary, p.Beneficiary) {
			expect("BENEFICIARY_MISMATCH", c, p.PayoutID, fmt.Sprintf("call %d paid %s, payout's beneficiary %s",
				c.Seq, lockapi.MaskBeneficiary(c.Beneficiary), lockapi.MaskBeneficiary(p.Beneficiary)))
		}
		if c.Result == railstub.ResultAccepted {
			if first, seen := acceptedBefore[c.Reference]; seen {
				expect("PRESENTED_TWICE", c, p.PayoutID, fmt.Sprintf("accepted again after call %d", first))
			} else {
				acceptedBefore[c.Reference] = c.Seq
			}
		}
		accepted := c.Result == railstub.ResultAccepted
		if (accepted && (p.Status == "DECLINED" || p.Status == "NOT_PRESENTED")) ||
			(!accepted && (p.Status == "PAID" || p.Status == "NOT_PRESENTED")) {
			expect("LINE_CONTRADICTS_PAYOUT", c, p.PayoutID, fmt.Sprintf("%s call for a %s payout", c.Result, p.Status))
		}
	}
}
