package invariants

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// CheckID names one check of the report; the JSON form carries it.
type CheckID string

// The checks, grouped by the invariant they test (docs/lockdemo.md, "The
// invariants and their checks"; 0: the
// cross-module checks: the books, and the run's own setting).
const (
	// Invariant 1: no stale admission.
	CheckStaleAdmission         CheckID = "stale_admission"
	CheckRailOvertake           CheckID = "rail_overtake"           // reported, not failed
	CheckSupersededPresentation CheckID = "superseded_presentation" // reported, not failed
	// Invariant 2: at most one forwardable attempt per payout.
	CheckDoublePresentation CheckID = "double_presentation"
	CheckExtraForwardable   CheckID = "extra_forwardable_rows"
	// Invariant 3: intent before socket.
	CheckCallWithoutIntent CheckID = "call_without_intent"
	// Invariant 4: complete audit.
	CheckAttemptRows CheckID = "attempt_without_one_row"
	// Invariant 5: ambiguity is never retried.
	CheckAmbiguousWithoutTimeout CheckID = "ambiguous_without_timeout"
	CheckAmbiguityRetried        CheckID = "ambiguity_retried"
	CheckTimeoutNotAmbiguous     CheckID = "timeout_not_ambiguous" // reported, not failed
	// Invariant 6: the mark survives everything.
	CheckMark CheckID = "mark"
	// Invariant 6 for lockdb's tokens, judged from the tokens handed out (only
	// with Options.IssuedRecorded).
	CheckTokenIssuedTwice  CheckID = "token_issued_twice"
	CheckTokenWithoutGrant CheckID = "token_without_grant"
	// Cross-module: the books, and the fencing switch.
	CheckLedger            CheckID = "paid_ledger"
	CheckPayoutVsRail      CheckID = "payout_vs_rail"
	CheckBooks             CheckID = "books_balance"
	CheckUnsettled         CheckID = "unsettled"          // fails only with Options.RequireSettled
	CheckAmbiguousAccepted CheckID = "ambiguous_accepted" // reported, not failed
	CheckFencingSwitch     CheckID = "fenced_with_fencing_off"
	// Invariant 7: the books close (only for a run whose reconciler made its final
	// pass: Options.Reconciled).
	CheckAmbiguousLeft    CheckID = "ambiguous_after_final_pass"
	CheckLedgerVsAccepted CheckID = "ledger_vs_rail_accepted"
	CheckPaidAcceptedOnce CheckID = "paid_without_one_accepted_call"
	CheckStatementCopy    CheckID = "statement_copy"
	CheckExceptions       CheckID = "reconciliation_exceptions"
	CheckUnrecorded       CheckID = "unrecorded_disagreements"
	// Invariant 8: only the books move money (only for a run whose paydb records
	// the payouts' history: Options.BooksBound).
	CheckAdmittedWithoutClaim  CheckID = "admitted_without_claim"
	CheckAdmittedNotAsBooked   CheckID = "admitted_not_as_booked"
	CheckPaidPostNotRecorded   CheckID = "paid_post_not_recorded"
	CheckPostNotRecorded       CheckID = "post_not_recorded"
	CheckPaidSettleWithoutLine CheckID = "paid_settle_without_line"
	CheckSettleContradicted    CheckID = "settle_contradicts_statement"
)

// Report is what Evaluate makes of a History. Its JSON form is lockdemo's --json.
type Report struct {
	FencingEnabled bool             `json:"fencingEnabled"`
	Payouts        PayoutCounts     `json:"payouts"`
	RailCalls      CallCounts       `json:"railCalls"`
	Submissions    SubmissionCounts `json:"submissions"`
	Money          []Money          `json:"money"` // one per currency, by code
	// MoneyAtRisk is what the stale admissions put in front of the rail
	// (risk.go): zero when invariant 1 held.
	MoneyAtRisk MoneyAtRisk `json:"moneyAtRisk"`
	// Reconciliation is what the reconciler settled and recorded
	// (docs/contracts/reconciliation.md); nil when the run had no reconciler.
	Reconciliation *Reconciliation `json:"reconciliation,omitempty"`

	Invariants []Verdict `json:"invariants"` // 1–6 (7 when reconciled, 8 when books bound), then 0 (cross-checks)
	Checks     []Check   `json:"checks"`

	// Violations are the findings of failing checks; Notes those of checks that
	// are reported, not failed. Both in check order, then ground-truth order.
	Violations []Finding `json:"violations"`
	Notes      []Finding `json:"notes"`
}

// PayoutCounts counts payouts by final state.
type PayoutCounts struct {
	Total     int `json:"total"`
	Pending   int `json:"pending"`
	Claimed   int `json:"claimed"`
	Paid      int `json:"paid"`
	Declined  int `json:"declined"`
	Ambiguous int `json:"ambiguous"`
	// NotPresented: settled from the statement, which proves the rail never got them.
	NotPresented int `json:"notPresented"`
}

// CallCounts counts what the rail was presented. Dropped calls are accepted
// payments whose reply the stub withheld (money moved; the caller cannot know).
type CallCounts struct {
	Total      int `json:"total"`
	Accepted   int `json:"accepted"`
	Dropped    int `json:"dropped"`
	Declined   int `json:"declined"`
	References int `json:"references"` // distinct payout ids presented
}

// SubmissionCounts counts rail_submission rows by outcome. Admitted is the word of
// docs/contracts/database.md: NULL, ACKED, REJECTED, TIMEOUT or UNSENT.
type SubmissionCounts struct {
	Total      int `json:"total"`
	Admitted   int `json:"admitted"`
	Fenced     int `json:"fenced"`
	Unbooked   int `json:"unbooked"` // refused by the books (docs/contracts/books.md)
	Duplicate  int `json:"duplicate"`
	Acked      int `json:"acked"`
	Rejected   int `json:"rejected"`
	Timeout    int `json:"timeout"`
	Unsent     int `json:"unsent"`
	Unresolved int `json:"unresolved"`
}

// Money sums one currency in minor units. RailAccepted is every accepted call,
// and splits exactly into AcceptedPaid (the first accepted call of a PAID payout),
// AcceptedAmbiguous (the first accepted call of an AMBIGUOUS payout: money moved,
// not booked, to be reconciled from the rail's records), AcceptedOther (the first
// accepted call of any other or unknown payout) and DoublePaid (every accepted call
// after a reference's first). The books balance when Booked — the sum of the
// ledger's debits, negated — equals AcceptedPaid.
type Money struct {
	Currency          string `json:"currency"`
	RailAccepted      int64  `json:"railAccepted"`
	AcceptedPaid      int64  `json:"acceptedPaid"`
	AcceptedAmbiguous int64  `json:"acceptedAmbiguous"`
	AcceptedOther     int64  `json:"acceptedOther"`
	DoublePaid        int64  `json:"doublePaid"`
	Booked            int64  `json:"booked"`
	// AcceptedForPayouts is every accepted call whose reference is a payout, a
	// double payment's every call included: what the books must equal once they
	// close (invariant 7).
	AcceptedForPayouts int64 `json:"acceptedForPayouts"`
}

// Verdict is one invariant's result.
type Verdict struct {
	Invariant  int    `json:"invariant"`
	Name       string `json:"name"`
	Held       bool   `json:"held"`
	Violations int    `json:"violations"`
}

// Check is one line of the report: how many items it found and whether they are
// violations (Fails) or reported for information.
type Check struct {
	ID        CheckID `json:"id"`
	Invariant int     `json:"invariant"`
	Title     string  `json:"title"`
	Count     int     `json:"count"`
	Fails     bool    `json:"fails"`
}

// Finding is one item a check found, with the ground-truth keys that locate it.
type Finding struct {
	Check        CheckID `json:"check"`
	Invariant    int     `json:"invariant"`
	AccountID    string  `json:"accountId,omitempty"`
	PayoutID     string  `json:"payoutId,omitempty"`
	Seq          int64   `json:"seq,omitempty"`          // rail-stub call
	SubmissionID int64   `json:"submissionId,omitempty"` // rail_submission row
	Detail       string  `json:"detail"`
}

// OK reports whether every invariant held.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// Count is the number of items check id found (0 for a check the run did not make).
func (r Report) Count(id CheckID) int {
	for _, c := range r.Checks {
		if c.ID == id {
			return c.Count
		}
	}
	return 0
}

// Held reports whether invariant n (1–8, or 0 for the cross-checks) held; an
// invariant the run did not judge counts as held.
func (r Report) Held(n int) bool {
	for _, v := range r.Invariants {
		if v.Invariant == n {
			return v.Held
		}
	}
	return true
}

// HeldCell is invariant n's cell in a report table: held or BROKEN.
func (r Report) HeldCell(n int) string {
	if r.Held(n) {
		return "held"
	}
	return "BROKEN"
}

// CheckCell is check id's cell in a report table: its count, "FAIL n" when it
// is a failing check that found something, "-" when the run did not make it.
func (r Report) CheckCell(id CheckID) string {
	for _, c := range r.Checks {
		if c.ID != id {
			continue
		}
		if c.Fails && c.Count > 0 {
			return "FAIL " + strconv.Itoa(c.Count)
		}
		return strconv.Itoa(c.Count)
	}
	return "-"
}

// InvariantLabel is invariant n's row label: its number and name (the
// cross-checks, n = 0, have no number).
func InvariantLabel(n int) string {
	if n == 0 {
		return invariantName(n)
	}
	return fmt.Sprintf("%d %s", n, invariantName(n))
}

// Broken lists the invariants that did not hold, in order.
func (r Report) Broken() []int {
	var out []int
	for _, v := range r.Invariants {
		if !v.Held {
			out = append(out, v.Invariant)
		}
	}
	return out
}

func invariantName(n int) string {
	switch n {
	case 1:
		return "No stale admission"
	case 2:
		return "At most one forwardable attempt per payout"
	case 3:
		return "Intent before socket"
	case 4:
		return "Complete audit"
	case 5:
		return "Ambiguity is never retried"
	case 6:
		return "The mark survives everything"
	case 7:
		return "The books close"
	case 8:
		return "Only the books move money"
	default:
		return "Cross-checks: books and settings"
	}
}

type checkDef struct {
	id        CheckID
	invariant int
	title     string
	fails     bool
}

// checkDefs lists the checks in report order. The fencing-switch check exists only
// for a run with fencing off; unsettled payouts fail only when the run promised to
// settle them all.
func checkDefs(opts Options) []checkDef {
	defs := []checkDef{
		{CheckStaleAdmission, 1, "stale admissions", true},
		{CheckRailOvertake, 1, "rail overtakes (reported)", false},
		{CheckSupersededPresentation, 1, "presentations by superseded holders (reported)", false},
		{CheckDoublePresentation, 2, "double payments (a reference presented twice or more)", true},
		{CheckExtraForwardable, 2, "payouts with more than one forwardable row", true},
		{CheckCallWithoutIntent, 3, "rail calls without an intent row", true},
		{CheckAttemptRows, 4, "attempts without exactly one row", true},
		{CheckAmbiguousWithoutTimeout, 5, "AMBIGUOUS payouts without a TIMEOUT row", true},
		{CheckAmbiguityRetried, 5, "ambiguous attempts retried", true},
		{CheckTimeoutNotAmbiguous, 5, "TIMEOUT rows of payouts not AMBIGUOUS (reported)", false},
		{CheckMark, 6, "accounts whose mark is wrong", true},
		{CheckLedger, 0, "ledger entries wrong (PAID needs exactly one)", true},
		{CheckPayoutVsRail, 0, "payout states the rail contradicts", true},
		{CheckBooks, 0, "currencies whose books do not balance", true},
		{CheckUnsettled, 0, "payouts not settled", opts.RequireSettled},
		{CheckAmbiguousAccepted, 0, "AMBIGUOUS payouts the rail accepted (reported)", false},
	}
	if opts.IssuedRecorded {
		// After the mark's own check, under invariant 6.
		i := slices.IndexFunc(defs, func(d checkDef) bool { return d.id == CheckMark }) + 1
		defs = append(defs[:i], append([]checkDef{
			{CheckTokenIssuedTwice, 6, "lock tokens handed out twice", true},
			{CheckTokenWithoutGrant, 6, "lock tokens handed out that lock_grant lacks", true},
		}, defs[i:]...)...)
	}
	if !opts.FencingEnabled {
		defs = append(defs, checkDef{CheckFencingSwitch, 0, "FENCED rows with fencing off", true})
	}
	if opts.Reconciled {
		defs = append(defs, booksCheckDefs...)
	}
	if opts.BooksBound {
		defs = append(defs, booksBoundCheckDefs...) // booksbound.go
	}
	return defs
}

// ViolationsText lists the violations one a line, with where each was found:
// what a failing test shows of the checker's verdict.
func (r Report) ViolationsText() string {
	var b strings.Builder
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  %s [%s %s seq %d submission %d]: %s\n", v.Check, v.AccountID, v.PayoutID, v.Seq, v.SubmissionID, v.Detail)
	}
	return b.String()
}

// NotHeld are those of invariants ns that were broken or not judged at all:
// what a test that requires them all to hold reports.
func (r Report) NotHeld(ns ...int) []int {
	var out []int
	for _, n := range ns {
		if !r.Held(n) || !slices.ContainsFunc(r.Invariants, func(v Verdict) bool { return v.Invariant == n }) {
			out = append(out, n)
		}
	}
	return out
}
