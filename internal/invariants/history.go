// Package invariants judges a finished run of the system against the invariants
// of docs/contracts/README.md (1–6; 7, the books close, when a reconciler made its final pass; 8,
// only the books move money, when paydb records the payouts' history), from
// ground truth only: what the rail-stub was presented, and what paydb
// and lockdb hold. It never asks a service what it believes happened; the
// reconciler's copy of the statement is checked against the rail-stub's log, never
// used in its place.
//
// Load reads a History; Evaluate, a pure function, turns it into a Report, which
// renders as a text table or JSON. Tests build histories by hand.
package invariants

import (
	"time"

	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
)

// History is the ground truth of one run.
type History struct {
	Calls       []railstub.Call  // the rail-stub's call log; Evaluate orders it by seq
	Submissions []Submission     // rail_submission; Evaluate orders it by submission_id
	HighWater   map[string]int64 // rail_high_water: account_id → highest_token
	Payouts     []Payout         // payout
	Ledger      []LedgerEntry    // ledger_entry
	Grants      []Grant          // lock_grant, every lock
	// Issued is every token lock-server answered an acquire with, as recorded in
	// front of it (the tokens clients were given); judged only with
	// Options.IssuedRecorded. lock_grant alone cannot show a grant a failover
	// forgot: only what was handed out can.
	Issued []IssuedToken

	// The reconciler's records (docs/contracts/reconciliation.md), judged against
	// Calls: its copy of the statement, its exceptions and its cursor (nil when no
	// reconciler ever ran), and payment-resource's record of each settle.
	StatementLines []lockapi.StatementLine // rail_statement_line; RailReference and DeclineReason nil when NULL
	Exceptions     []Exception             // reconciliation_exception
	Cursor         *Cursor                 // reconciler_cursor
	Settlements    []Settlement            // payout_settlement

	// Moves is payment-resource's record of every move it made on a payout
	// (payout_history, docs/contracts/books.md): the claim history invariant 8
	// is judged against (only with Options.BooksBound).
	Moves []Move
}

// Submission is one rail_submission row. Outcome is empty while the row is
// unresolved (NULL in the table).
type Submission struct {
	SubmissionID   int64      `json:"submissionId"`
	PayoutID       string     `json:"payoutId"`
	AccountID      string     `json:"accountId"`
	PresentedToken int64      `json:"presentedToken"`
	OwnerID        string     `json:"ownerId"`
	IdempotencyKey string     `json:"idempotencyKey"`
	AmountMinor    int64      `json:"amountMinor"`
	Currency       string     `json:"currency"`
	Beneficiary    string     `json:"-"`
	Outcome        string     `json:"outcome"`
	RailReference  string     `json:"railReference,omitempty"`
	DeclineReason  string     `json:"declineReason,omitempty"`
	SubmittedAt    time.Time  `json:"submittedAt"`
	ResolvedAt     *time.Time `json:"resolvedAt"`
}

// Unresolved is the Outcome of a row whose outcome is NULL.
const Unresolved = ""

// Admitted reports whether the attempt passed the fence and became an intent
// (docs/contracts/database.md: outcome NULL, ACKED, REJECTED, TIMEOUT or UNSENT).
func (s Submission) Admitted() bool {
	switch s.Outcome {
	case Unresolved, "ACKED", "REJECTED", "TIMEOUT", "UNSENT":
		return true
	}
	return false
}

// PassedFence reports whether the token passed the fence: admitted, or a
// DUPLICATE (whose token still advanced the mark).
func (s Submission) PassedFence() bool { return s.Admitted() || s.Outcome == "DUPLICATE" }

// Forwardable reports whether rail_submission_attempt_uidx covers the row
// (outcome NULL, ACKED, REJECTED or TIMEOUT): the payout's one attempt at the rail.
func (s Submission) Forwardable() bool {
	switch s.Outcome {
	case Unresolved, "ACKED", "REJECTED", "TIMEOUT":
		return true
	}
	return false
}

// Payout is one payout row.
type Payout struct {
	PayoutID      string    `json:"payoutId"`
	AccountID     string    `json:"accountId"`
	AmountMinor   int64     `json:"amountMinor"`
	Currency      string    `json:"currency"`
	Beneficiary   string    `json:"-"`
	Status        string    `json:"status"`
	FenceToken    int64     `json:"fenceToken"`
	ClaimedBy     string    `json:"claimedBy,omitempty"`
	RailReference string    `json:"railReference,omitempty"`
	DeclineReason string    `json:"declineReason,omitempty"`
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
}

// Final reports whether no executor can move the payout any more (AMBIGUOUS only
// a reconciler's settle moves).
func (p Payout) Final() bool {
	return p.Status == "PAID" || p.Status == "DECLINED" || p.Status == "AMBIGUOUS" || p.Status == "NOT_PRESENTED"
}

// LedgerEntry is one ledger_entry row; AmountMinor is negative (a debit).
type LedgerEntry struct {
	EntryID     int64     `json:"entryId"`
	PayoutID    string    `json:"payoutId"`
	AccountID   string    `json:"accountId"`
	AmountMinor int64     `json:"amountMinor"`
	Currency    string    `json:"currency"`
	PostedToken int64     `json:"postedToken"`
	CreatedAt   time.Time `json:"createdAt"`
}

// Grant is one lock_grant row.
type Grant struct {
	LockName   string     `json:"lockName"`
	Token      int64      `json:"token"`
	OwnerID    string     `json:"ownerId"`
	AcquiredAt time.Time  `json:"acquiredAt"`
	TTLMs      int64      `json:"ttlMs"`
	ExpiresAt  time.Time  `json:"expiresAt"`
	ReleasedAt *time.Time `json:"releasedAt"`
}

// IssuedToken is one token lock-server answered an acquire with (200), seen on
// the wire: Seq is its place in the order answered, At when.
type IssuedToken struct {
	LockName string    `json:"lockName"`
	Token    int64     `json:"token"`
	OwnerID  string    `json:"ownerId"`
	Seq      int64     `json:"seq"`
	At       time.Time `json:"at"`
}

// Exception is one reconciliation_exception row; PayoutID empty and Seq 0 when NULL.
type Exception struct {
	ExceptionID int64  `json:"exceptionId"`
	Kind        string `json:"kind"`
	PayoutID    string `json:"payoutId,omitempty"`
	Seq         int64  `json:"seq,omitempty"`
	Detail      string `json:"detail"`
}

// Cursor is the reconciler_cursor row.
type Cursor struct {
	LastSeq int64      `json:"lastSeq"`
	ReadAt  *time.Time `json:"readAt"`
}

// Settlement is one payout_settlement row: how a settle moved an AMBIGUOUS payout.
type Settlement struct {
	PayoutID      string `json:"payoutId"`
	Outcome       string `json:"outcome"`
	RailReference string `json:"railReference,omitempty"`
	StatementSeq  int64  `json:"statementSeq,omitempty"`
}

// Move is one payout_history row: a move payment-resource made on a payout, in
// the transaction that made it. OwnerID is the X-Owner-Id of a claim or a post,
// empty for a creation or a settle (NULL in the table); RailReference and
// DeclineReason empty when NULL.
type Move struct {
	HistoryID     int64     `json:"historyId"`
	PayoutID      string    `json:"payoutId"`
	Status        string    `json:"status"`
	FenceToken    int64     `json:"fenceToken"`
	OwnerID       string    `json:"ownerId,omitempty"`
	Actor         string    `json:"actor,omitempty"`
	RailReference string    `json:"railReference,omitempty"`
	DeclineReason string    `json:"declineReason,omitempty"`
	RecordedAt    time.Time `json:"recordedAt"`
}
