package payment

import (
	"fmt"
	"time"

	"lock.dev/lockapi"
)

// The books check (docs/contracts/books.md): with PAYMENT_BOOKS_CHECK on, a post
// is made only as the audit trail recorded the payout's attempt at the rail, and
// a settle only as the statement copy says. Both verdicts are pure functions of
// what the store read in the transaction that makes the move, so nothing else can
// slip between the check and the write.

// RecordedUnresolved is the recorded member of OUTCOME_NOT_RECORDED while the
// payout's forwardable attempt has no outcome yet: the rail call is in flight, or
// its proxy died before resolving it (the janitor resolves it).
const RecordedUnresolved = "UNRESOLVED"

// attempt is a payout's forwardable rail_submission row (the one
// rail_submission_attempt_uidx holds), as the post check reads it.
type attempt struct {
	Found         bool
	SubmissionID  int64
	Outcome       *string // nil while unresolved
	RailReference *string
	DeclineReason *string
	AccountID     string
	AmountMinor   int64
	Currency      string
	Beneficiary   string
}

// recorded is the OUTCOME_NOT_RECORDED member: the row's outcome, UNRESOLVED
// while it has none, nil when there is no forwardable row.
func (a attempt) recorded() *string {
	switch {
	case !a.Found:
		return nil
	case a.Outcome == nil:
		u := RecordedUnresolved
		return &u
	}
	o := *a.Outcome
	return &o
}

// mismatch names the first of the payout's account, amount, currency and
// beneficiary that the attempt did not present as booked, in the books' one
// order (lockapi.BooksMismatchOrder), or "" when it presented all four. The
// audit row and the payout are both this system's records of one payout, so
// they compare exactly, as the gate compares them.
func (a attempt) mismatch(p lockapi.Payout) string {
	switch {
	case a.AccountID != p.AccountID:
		return lockapi.MismatchAccount
	case a.AmountMinor != p.AmountMinor:
		return lockapi.MismatchAmount
	case a.Currency != p.Currency:
		return lockapi.MismatchCurrency
	case a.Beneficiary != p.Beneficiary:
		return lockapi.MismatchBeneficiary
	}
	return ""
}

// OutcomeNotRecordedError refuses a post the audit trail does not bear out: 409
// OUTCOME_NOT_RECORDED, nothing written.
type OutcomeNotRecordedError struct {
	Posted   string  // the outcome the post claimed
	Recorded *string // the member: see attempt.recorded
	// SubmissionID is the forwardable row's id; 0 when there is none.
	SubmissionID int64
	// Mismatch is the first field the attempt presented otherwise than the
	// payout (attempt.mismatch), "" when it presented all as booked.
	Mismatch string
	// PresentedBeneficiary is the attempt's beneficiary, for a log that masks it.
	PresentedBeneficiary string
	Reason               string // for the problem's detail and the log
}

func (e *OutcomeNotRecordedError) Error() string { return "outcome not recorded: " + e.Reason }

// postVerdict checks a post against its payout's forwardable attempt and returns
// the update to make. The rule, per outcome posted:
//
//   - PAID: the attempt was ACKED with this railReference, presenting the
//     payout's account, amount, currency and beneficiary;
//   - DECLINED: the attempt was REJECTED, presenting them; a declineReason or
//     railReference the post gives must be the row's, and an omitted
//     declineReason is taken from the row, so the books carry the rail's words;
//   - AMBIGUOUS: the attempt was TIMEOUT, or it presented anything otherwise than
//     the payout (whatever its outcome, resolved or not): something was
//     presented under this payout's id, and a person decides. Words the post
//     gives must be the row's.
//
// A post with no forwardable attempt is refused whatever it claims: nothing
// was presented, so the rail can have said nothing.
func postVerdict(p lockapi.Payout, a attempt, u postUpdate) (postUpdate, error) {
	refuse := func(format string, args ...any) (postUpdate, error) {
		e := &OutcomeNotRecordedError{Posted: u.Outcome, Recorded: a.recorded(), Reason: fmt.Sprintf(format, args...)}
		if a.Found {
			e.SubmissionID, e.Mismatch, e.PresentedBeneficiary = a.SubmissionID, a.mismatch(p), a.Beneficiary
		}
		return u, e
	}
	if !a.Found {
		return refuse("payout %s has no forwardable attempt at the rail: the rail answered nothing to post", p.PayoutID)
	}
	mismatch := a.mismatch(p)
	outcome := deref(a.Outcome)
	wordsAreTheRows := func() (postUpdate, error) {
		if u.RailReference != nil && !eqPtr(u.RailReference, a.RailReference) {
			return refuse("the railReference posted is not the one the attempt (submission %d) recorded", a.SubmissionID)
		}
		if u.DeclineReason != nil && !eqPtr(u.DeclineReason, a.DeclineReason) {
			return refuse("the declineReason posted is not the one the attempt (submission %d) recorded", a.SubmissionID)
		}
		return u, nil
	}
	if u.Outcome == lockapi.StatusAmbiguous {
		if mismatch == "" && outcome != "TIMEOUT" {
			return refuse("%s", answeredOtherwise(a, "TIMEOUT"))
		}
		return wordsAreTheRows()
	}
	if mismatch != "" {
		return refuse("the attempt (submission %d) presented another %s than the payout's: only AMBIGUOUS may be posted, and a person decides",
			a.SubmissionID, mismatch)
	}
	switch u.Outcome {
	case lockapi.StatusPaid:
		if outcome != "ACKED" {
			return refuse("%s", answeredOtherwise(a, "ACKED"))
		}
		if !eqPtr(u.RailReference, a.RailReference) {
			return refuse("the railReference posted is not the one the rail acknowledged (submission %d)", a.SubmissionID)
		}
		return u, nil
	case lockapi.StatusDeclined:
		if outcome != "REJECTED" {
			return refuse("%s", answeredOtherwise(a, "REJECTED"))
		}
		if u.DeclineReason == nil {
			u.DeclineReason = a.DeclineReason
		}
		return wordsAreTheRows()
	}
	return refuse("outcome %s is not one a post records", u.Outcome)
}

// answeredOtherwise says why an attempt's outcome is not the one a post needs.
func answeredOtherwise(a attempt, want string) string {
	if a.Outcome == nil {
		return fmt.Sprintf("the attempt (submission %d) is not resolved yet; the post needs it %s", a.SubmissionID, want)
	}
	return fmt.Sprintf("the attempt (submission %d) was recorded %s; the post needs it %s", a.SubmissionID, *a.Outcome, want)
}

// statementLine is a line of the statement copy (rail_statement_line) as the
// settle check reads it.
type statementLine struct {
	Seq           int64
	Result        string // ACCEPTED or DECLINED
	AccountID     string
	AmountMinor   int64
	Currency      string
	Beneficiary   *string // nil: copied before the statement carried beneficiaries
	RailReference *string
	DeclineReason *string
}

// matches reports whether the line is the payout as booked: its account, amount
// and currency, and its beneficiary compared as IBANs are
// (lockapi.SameBeneficiary) — unless the line has none, being older than the
// column.
func (l statementLine) matches(p lockapi.Payout) bool {
	return l.AccountID == p.AccountID && l.AmountMinor == p.AmountMinor && l.Currency == p.Currency &&
		(l.Beneficiary == nil || lockapi.SameBeneficiary(*l.Beneficiary, p.Beneficiary))
}

// statementEvidence is what the statement copy says of one payout.
type statementEvidence struct {
	Lines []statementLine // the lines with its reference, in seq order
	// ReadAt is reconciler_cursor.read_at: when the last complete read of the
	// statement started (nil: never).
	ReadAt *time.Time
	// WindowPassed: ReadAt is later than the payout's forwardable attempt's
	// submitted_at (with none, its updated_at) plus PAYMENT_SETTLE_AFTER.
	WindowPassed bool
	// Unstorable: a line of this payout could not be copied (an UNSTORABLE_LINE
	// exception names it): the statement has a line the copy does not show.
	Unstorable bool
}

// SettleContradictsError refuses a settle the statement copy does not bear out:
// 409 SETTLE_CONTRADICTS_STATEMENT, nothing written.
type SettleContradictsError struct {
	Outcome string
	// LineSeq is the seq of the line the refusal names, if one.
	LineSeq *int64
	// LineBeneficiary is that line's beneficiary, for a log that masks it.
	LineBeneficiary *string
	Reason          string // for the problem's detail and the log
}

func (e *SettleContradictsError) Error() string {
	return "settle contradicts the statement: " + e.Reason
}

// settleVerdict checks a settle against the statement copy:
//
//   - PAID: an ACCEPTED line matches the payout (statementLine.matches); the
//     settle names the first such line (lowest seq): its railReference and its
//     seq. A second ACCEPTED line is the reconciler's PRESENTED_TWICE exception,
//     never a reason to refuse;
//   - DECLINED: no ACCEPTED line at all (money moved under this reference), and
//     the settle names a DECLINED line of it: its seq and its declineReason;
//   - NOT_PRESENTED: no line of this reference, not even one the copy could not
//     store, and the statement read past the attempt plus PAYMENT_SETTLE_AFTER.
//
// The seq and the words are checked as well as the outcome so that
// payout_settlement, the audit of which line closed the payout, names a line
// that says so.
func settleVerdict(p lockapi.Payout, ev statementEvidence, u lockapi.SettleRequest) error {
	refuse := func(l *statementLine, format string, args ...any) error {
		e := &SettleContradictsError{Outcome: u.Outcome, Reason: fmt.Sprintf(format, args...)}
		if l != nil {
			seq := l.Seq
			e.LineSeq, e.LineBeneficiary = &seq, l.Beneficiary
		}
		return e
	}
	switch u.Outcome {
	case lockapi.StatusPaid:
		var first *statementLine
		for i := range ev.Lines {
			if l := &ev.Lines[i]; l.Result == lockapi.ResultAccepted && l.matches(p) {
				first = l
				break
			}
		}
		switch {
		case first == nil:
			return refuse(firstOf(ev.Lines, lockapi.ResultAccepted),
				"no ACCEPTED line of payout %s carries its account, amount, currency and beneficiary", p.PayoutID)
		case first.RailReference == nil || !eqPtr(u.RailReference, first.RailReference):
			return refuse(first, "the railReference is not the one of the first matching ACCEPTED line (seq %d)", first.Seq)
		case !eqPtr(u.StatementSeq, &first.Seq):
			return refuse(first, "statementSeq is not the first matching ACCEPTED line's (seq %d)", first.Seq)
		}
		return nil
	case lockapi.StatusDeclined:
		if l := firstOf(ev.Lines, lockapi.ResultAccepted); l != nil {
			return refuse(l, "the statement has an ACCEPTED line of payout %s (seq %d): the rail took the money", p.PayoutID, l.Seq)
		}
		if firstOf(ev.Lines, lockapi.ResultDeclined) == nil {
			return refuse(nil, "the statement has no DECLINED line of payout %s", p.PayoutID)
		}
		for i := range ev.Lines {
			if l := &ev.Lines[i]; l.Result == lockapi.ResultDeclined && eqPtr(u.StatementSeq, &l.Seq) {
				if !eqPtr(u.DeclineReason, l.DeclineReason) {
					return refuse(l, "the declineReason is not the one of the DECLINED line (seq %d)", l.Seq)
				}
				return nil
			}
		}
		return refuse(nil, "statementSeq names no DECLINED line of payout %s", p.PayoutID)
	case lockapi.StatusNotPresented:
		switch {
		case len(ev.Lines) > 0:
			return refuse(&ev.Lines[0], "the statement has a line of payout %s (seq %d, %s)", p.PayoutID, ev.Lines[0].Seq, ev.Lines[0].Result)
		case ev.Unstorable:
			return refuse(nil, "the statement has a line of payout %s that could not be copied (UNSTORABLE_LINE)", p.PayoutID)
		case ev.ReadAt == nil:
			return refuse(nil, "the statement has not been read in full yet")
		case !ev.WindowPassed:
			return refuse(nil, "the statement was last read in full at %s, not yet PAYMENT_SETTLE_AFTER past payout %s's attempt",
				ev.ReadAt.UTC().Format(time.RFC3339Nano), p.PayoutID)
		}
		return nil
	}
	return refuse(nil, "outcome %s is not one a settle records", u.Outcome)
}

// firstOf is the first line with result, or nil.
func firstOf(lines []statementLine, result string) *statementLine {
	for i := range lines {
		if lines[i].Result == result {
			return &lines[i]
		}
	}
	return nil
}
