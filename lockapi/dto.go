package lockapi

import (
	"math"
	"time"
)

// Timestamps on the wire are RFC 3339 with nanoseconds in UTC; time.Time's JSON form
// is RFC 3339 with nanoseconds, so a value only needs to be in UTC.
func UTC(t time.Time) time.Time { return t.UTC() }

// UTCPtr is UTC for an optional time.
func UTCPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// Outcomes of a rail_submission row (docs/contracts/database.md).
const (
	OutcomeFenced    = "FENCED"
	OutcomeDuplicate = "DUPLICATE"
	OutcomeAcked     = "ACKED"
	OutcomeRejected  = "REJECTED"
	OutcomeTimeout   = "TIMEOUT"
	OutcomeUnsent    = "UNSENT"
	// OutcomeUnbooked: the books do not hold the submission as presented
	// (docs/contracts/books.md); resolved at once, never forwardable.
	OutcomeUnbooked = "UNBOOKED"
)

// Payout statuses (docs/contracts/database.md).
const (
	StatusPending   = "PENDING"
	StatusClaimed   = "CLAIMED"
	StatusPaid      = "PAID"
	StatusDeclined  = "DECLINED"
	StatusAmbiguous = "AMBIGUOUS"
	// StatusNotPresented: the rail's statement proves the rail never received the
	// payout; no money moved; final. Only the reconciler's settle sets it
	// (docs/contracts/reconciliation.md).
	StatusNotPresented = "NOT_PRESENTED"
)

// SubmissionRequest is the body of POST /v1/rail/submissions and, with the fencing
// headers, of a payout's creation at payment-resource (same five fields).
type SubmissionRequest struct {
	PayoutID    string `json:"payoutId"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	Beneficiary string `json:"beneficiary"`
}

// SubmissionAccepted is rail-proxy's 200 answer.
type SubmissionAccepted struct {
	SubmissionID   int64  `json:"submissionId"`
	PayoutID       string `json:"payoutId"`
	AccountID      string `json:"accountId"`
	PresentedToken int64  `json:"presentedToken"`
	Outcome        string `json:"outcome"`
	RailReference  string `json:"railReference"`
}

// Submission is one rail_submission row as the audit-trail endpoint shows it.
type Submission struct {
	SubmissionID   int64      `json:"submissionId"`
	PayoutID       string     `json:"payoutId"`
	AccountID      string     `json:"accountId"`
	AmountMinor    int64      `json:"amountMinor"`
	Currency       string     `json:"currency"`
	Beneficiary    string     `json:"beneficiary"`
	PresentedToken int64      `json:"presentedToken"`
	OwnerID        string     `json:"ownerId"`
	Outcome        *string    `json:"outcome"`
	RailReference  *string    `json:"railReference"`
	DeclineReason  *string    `json:"declineReason"`
	SubmittedAt    time.Time  `json:"submittedAt"`
	ResolvedAt     *time.Time `json:"resolvedAt"`
	// SubmitterIdentity is the verified SPIFFE ID of the workload that presented
	// the attempt (docs/contracts/workload-identity.md); nil when the proxy ran
	// without identities or the row predates the column.
	SubmitterIdentity *string `json:"submitterIdentity"`
}

// SubmissionList is one page of the answer of GET /v1/rail/submissions?payoutId=,
// oldest first. Next is the submissionId to pass as after= for the next page; nil
// (JSON null) when there is no more.
type SubmissionList struct {
	Submissions []Submission `json:"submissions"`
	Next        *int64       `json:"next"`
}

// Payout is payment-resource's payout shape.
type Payout struct {
	PayoutID      string    `json:"payoutId"`
	AccountID     string    `json:"accountId"`
	AmountMinor   int64     `json:"amountMinor"`
	Currency      string    `json:"currency"`
	Beneficiary   string    `json:"beneficiary"`
	Status        string    `json:"status"`
	FenceToken    int64     `json:"fenceToken"`
	ClaimedBy     *string   `json:"claimedBy"`
	RailReference *string   `json:"railReference"`
	DeclineReason *string   `json:"declineReason"`
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
}

// PayoutList is the answer of GET /v1/payouts.
type PayoutList struct {
	Payouts []Payout `json:"payouts"`
}

// PostRequest is the body of POST /v1/payouts/{id}/post.
type PostRequest struct {
	Outcome       string  `json:"outcome"`
	RailReference *string `json:"railReference,omitempty"`
	DeclineReason *string `json:"declineReason,omitempty"`
}

// LeaseRequest is the body of acquire and renew.
type LeaseRequest struct {
	TTLMs int64 `json:"ttlMs"`
}

// Lease is lock-server's answer to acquire and renew.
type Lease struct {
	LockName   string    `json:"lockName"`
	OwnerID    string    `json:"ownerId"`
	Token      int64     `json:"token"`
	AcquiredAt time.Time `json:"acquiredAt"`
	ExpiresAt  time.Time `json:"expiresAt"`
	TTLMs      int64     `json:"ttlMs"`
	// Grant is lock-server's signed grant of Token to OwnerID for LockName
	// (docs/contracts/signed-grants.md); absent when lock-server signs nothing.
	Grant string `json:"grant,omitempty"`
}

// LockState is the answer of GET /v1/locks/{name}.
type LockState struct {
	LockName  string     `json:"lockName"`
	OwnerID   *string    `json:"ownerId"`
	Token     int64      `json:"token"`
	Held      bool       `json:"held"`
	ExpiresAt *time.Time `json:"expiresAt"`
	// No grant: a lock's state is read by workloads other than its holder, and
	// a grant is answered only to the holder, by acquire and renew
	// (docs/contracts/workload-identity.md).
}

// Grant is one element of a lock's grant history.
type Grant struct {
	Token      int64      `json:"token"`
	OwnerID    string     `json:"ownerId"`
	AcquiredAt time.Time  `json:"acquiredAt"`
	TTLMs      int64      `json:"ttlMs"`
	ReleasedAt *time.Time `json:"releasedAt"`
	// HolderIdentity is the SPIFFE ID of the workload that acquired the lease
	// (docs/contracts/workload-identity.md); null when it was acquired without
	// identities.
	HolderIdentity *string `json:"holderIdentity"`
}

// GrantList is the answer of GET /v1/locks/{name}/grants.
type GrantList struct {
	Grants []Grant `json:"grants"`
}

// AccountLockName is the lock an account's tokens come from (docs/contracts/lock-service.md).
func AccountLockName(accountID string) string { return "account:" + accountID }

// MaxInt64 is the largest token.
const MaxInt64 = math.MaxInt64
