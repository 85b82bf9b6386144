package reconcile

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"lock.dev/lockapi"
)

// An operator's decision on a reconciliation exception
// (docs/operations/reconciliation-exceptions.md): one of a closed set, recorded
// once beside the exception, with who decided and why. A decision is a record,
// never a move: it settles or unsettles no payout, books nothing and changes no
// exception (docs/contracts/reconciliation.md, "An exception never settles or
// unsettles anything"). Whatever the decision says was done — a ledger
// correction, a recall — was done elsewhere, by the finance team's own means.
const (
	// DecisionAcceptedAsIs: investigated, and the books and the rail stand as
	// they are; nothing to correct (a payment another system made on the
	// account, a statement file re-sent with the same bookings).
	DecisionAcceptedAsIs = "accepted-as-is"
	// DecisionCorrectedInLedger: the books were corrected by a posting in the
	// general ledger, outside lock.dev, so that they agree with the rail.
	DecisionCorrectedInLedger = "corrected-in-ledger"
	// DecisionRefunded: the money paid in error came back — recalled through the
	// rail or returned by the payee.
	DecisionRefunded = "refunded"
	// DecisionWrittenOff: the money paid in error will not come back; the loss
	// is booked as such.
	DecisionWrittenOff = "written-off"
)

// Decisions are the decisions an operator may record, in the order the help
// lists them. It is the CHECK of reconciliation_decision.decision (migration
// 00014), which TestDecisionsAreTheTablesCheck compares.
func Decisions() []string {
	return []string{DecisionAcceptedAsIs, DecisionCorrectedInLedger, DecisionRefunded, DecisionWrittenOff}
}

// Bounds of a decision's text, as the table's CHECKs have them.
const (
	MaxDecidedBy = 200
	MaxNote      = 4000
)

// Resolution is what an operator asks to record on an exception.
type Resolution struct {
	Decision  string // one of Decisions()
	DecidedBy string // who decided: the operator's name or identity
	Note      string // why: what was found, what was done
}

// ErrNoSuchException: no exception has the id asked for.
var ErrNoSuchException = errors.New("no such exception")

// ErrInvalidResolution: the resolution itself is refused (a field missing or
// out of bounds, a decision outside the set); nothing was written.
var ErrInvalidResolution = errors.New("invalid resolution")

// DecidedError is the refusal of a second decision on an exception: it carries
// the decision that stands. Nothing was written.
type DecidedError struct {
	ExceptionID int64
	Decision    Decision
}

func (e *DecidedError) Error() string {
	d := e.Decision
	return fmt.Sprintf("exception %d was already decided: %s by %s at %s (login %s); an exception is decided once, and nothing was written",
		e.ExceptionID, d.Decision, d.DecidedBy, d.DecidedAt.UTC().Format(time.RFC3339), d.DecidedLogin)
}

// Check returns the resolution with its text trimmed, or an error wrapping
// ErrInvalidResolution that names the field. It is checked before paydb is
// asked anything, so a refused resolution writes nothing.
func (r Resolution) Check() (Resolution, error) {
	r.Decision = strings.TrimSpace(r.Decision)
	r.DecidedBy = strings.TrimSpace(r.DecidedBy)
	r.Note = strings.TrimSpace(r.Note)
	switch {
	case r.Decision == "":
		return r, fmt.Errorf("%w: --decision is required: one of %s", ErrInvalidResolution, strings.Join(Decisions(), ", "))
	case !slices.Contains(Decisions(), r.Decision):
		return r, fmt.Errorf("%w: --decision %q is not one of %s", ErrInvalidResolution, r.Decision, strings.Join(Decisions(), ", "))
	case r.DecidedBy == "":
		return r, fmt.Errorf("%w: --by is required: the operator who decided (a name or identity)", ErrInvalidResolution)
	case r.Note == "":
		return r, fmt.Errorf("%w: --note is required: why — what was found, what was done", ErrInvalidResolution)
	}
	if err := checkText("--by", r.DecidedBy, MaxDecidedBy, false); err != nil {
		return r, err
	}
	if err := checkText("--note", r.Note, MaxNote, true); err != nil {
		return r, err
	}
	return r, nil
}

// checkText refuses text paydb would store but a reader could not see as it
// is: bytes that are not UTF-8, control characters (a note may keep its line
// breaks and tabs), and text over limit characters.
func checkText(flag, s string, limit int, lines bool) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not UTF-8 text", ErrInvalidResolution, flag)
	}
	if n := utf8.RuneCountInString(s); n > limit {
		return fmt.Errorf("%w: %s has %d characters, at most %d", ErrInvalidResolution, flag, n, limit)
	}
	for _, r := range s {
		if (r == '\n' || r == '\t') && lines {
			continue
		}
		if unicode.IsControl(r) || r == utf8.RuneError {
			return fmt.Errorf("%w: %s holds the control character %U", ErrInvalidResolution, flag, r)
		}
	}
	return nil
}

// Exception is one reconciliation_exception row, with its decision when one
// was recorded.
type Exception struct {
	ExceptionID int64     `json:"exceptionId"`
	Kind        string    `json:"kind"`
	PayoutID    *string   `json:"payoutId"`
	Seq         *int64    `json:"seq"`
	FileID      *int64    `json:"fileId"`
	Detail      string    `json:"detail"`
	CreatedAt   time.Time `json:"createdAt"`
	Decision    *Decision `json:"decision"` // nil while the exception is open
}

// Open reports whether no decision was recorded on the exception.
func (e Exception) Open() bool { return e.Decision == nil }

// Decision is one reconciliation_decision row: what was decided, by whom
// (DecidedBy, as the operator gave it; DecidedLogin, the paydb login that wrote
// it), why, and when (DecidedAt, paydb's clock).
type Decision struct {
	Decision     string    `json:"decision"`
	DecidedBy    string    `json:"decidedBy"`
	Note         string    `json:"note"`
	DecidedLogin string    `json:"decidedLogin"`
	DecidedAt    time.Time `json:"decidedAt"`
}

// ListOptions select the exceptions List returns.
type ListOptions struct {
	All   bool   // decided ones too; else only the open ones
	Kind  string // only this kind; "" for every kind
	Limit int    // at most this many, by exception id (≥ 1)
}

// ExceptionContext is an exception with what an operator needs to decide it:
// its payout as it is now, the payout's history, its settlement, its attempts at
// the gate, the statement lines that name it (or the exception's own line), and
// the statement file versions it names. A beneficiary is shown in full: this is
// the operator's view of paydb, not a log.
type ExceptionContext struct {
	Exception
	Payout      *ContextPayout      `json:"payout"`
	History     []ContextMove       `json:"history"`
	Settlement  *ContextSettlement  `json:"settlement"`
	Lines       []ContextLine       `json:"statementLines"`
	Submissions []ContextSubmission `json:"submissions"`
	Files       []ContextFile       `json:"statementFiles"`
}

// ContextPayout is the payout row, in payment-resource's own payout shape.
type ContextPayout = lockapi.Payout

// ContextMove is one payout_history row.
type ContextMove struct {
	HistoryID     int64     `json:"historyId"`
	Status        string    `json:"status"`
	FenceToken    int64     `json:"fenceToken"`
	OwnerID       *string   `json:"ownerId"`
	Actor         *string   `json:"actor"`
	RailReference *string   `json:"railReference"`
	DeclineReason *string   `json:"declineReason"`
	RecordedAt    time.Time `json:"recordedAt"`
}

// ContextSettlement is the payout_settlement row.
type ContextSettlement struct {
	Outcome       string    `json:"outcome"`
	RailReference *string   `json:"railReference"`
	DeclineReason *string   `json:"declineReason"`
	StatementSeq  *int64    `json:"statementSeq"`
	SettledAt     time.Time `json:"settledAt"`
}

// ContextLine is one rail_statement_line row.
type ContextLine struct {
	Seq           int64     `json:"seq"`
	ReceivedAt    time.Time `json:"receivedAt"`
	Reference     string    `json:"reference"`
	AccountID     string    `json:"accountId"`
	AmountMinor   int64     `json:"amountMinor"`
	Currency      string    `json:"currency"`
	Beneficiary   *string   `json:"beneficiary"`
	Result        string    `json:"result"`
	RailReference *string   `json:"railReference"`
	DeclineReason *string   `json:"declineReason"`
	ImportedAt    time.Time `json:"importedAt"`
}

// ContextSubmission is one rail_submission row: an attempt at the gate.
type ContextSubmission struct {
	SubmissionID      int64      `json:"submissionId"`
	AccountID         string     `json:"accountId"`
	PresentedToken    int64      `json:"presentedToken"`
	OwnerID           string     `json:"ownerId"`
	SubmitterIdentity *string    `json:"submitterIdentity"`
	AmountMinor       int64      `json:"amountMinor"`
	Currency          string     `json:"currency"`
	Beneficiary       string     `json:"beneficiary"`
	Outcome           *string    `json:"outcome"`
	RailReference     *string    `json:"railReference"`
	DeclineReason     *string    `json:"declineReason"`
	SubmittedAt       time.Time  `json:"submittedAt"`
	ResolvedAt        *time.Time `json:"resolvedAt"`
}

// ContextFile is one statement_file row.
type ContextFile struct {
	FileID     int64     `json:"fileId"`
	Name       string    `json:"name"`
	SHA256     string    `json:"sha256"`
	Result     string    `json:"result"`
	Entries    *int      `json:"entries"`
	ImportedAt time.Time `json:"importedAt"`
}
