package lockserver

import (
	"errors"
	"fmt"
	"time"
)

// The domain of lock-server, as the store speaks it. Times are lockdb's clock.

// Lease is one grant as it stands after an acquire or a renewal.
type Lease struct {
	Name       string
	Owner      string
	Token      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	// Holder is the SPIFFE ID of the workload that acquired the lease, the
	// grant's wid; "" when it was acquired without identities.
	Holder string
}

// LockState is a lock's row as GET /v1/locks/{name} shows it.
type LockState struct {
	Name      string
	Owner     string // empty unless Held
	Token     int64  // the last token issued
	Held      bool   // an owner is set and its lease has not expired by lockdb's clock
	ExpiresAt time.Time
}

// Grant is one row of a lock's grant history.
type Grant struct {
	Token      int64
	Owner      string
	AcquiredAt time.Time
	TTLMs      int64
	ReleasedAt *time.Time
	Holder     *string // the acquirer's SPIFFE ID; nil without identities
}

// The outcomes a store call can end in besides success. The handler maps each to
// exactly one problem code (handler.go, writeError).
var (
	// ErrLeaseLost: the presented grant is not the current one, belongs to another
	// owner, or (for a renewal) has expired.
	ErrLeaseLost = errors.New("lease lost")
	// ErrNotFound: the lock was never granted.
	ErrNotFound = errors.New("lock not found")
	// ErrNotLeaseHolder: the presented grant was acquired by another workload
	// than the caller (docs/contracts/workload-identity.md).
	ErrNotLeaseHolder = errors.New("not the lease holder")
	// ErrUnavailable: lockdb could not be reached, or did not answer in time.
	ErrUnavailable = errors.New("lockdb unavailable")
)

// HeldError says the lock is held by someone (perhaps the caller itself) whose
// lease has not expired. It matches ErrHeld.
type HeldError struct {
	Holder    string
	ExpiresAt time.Time
}

// ErrHeld is matched by every *HeldError.
var ErrHeld = errors.New("lock held")

func (e *HeldError) Error() string {
	return fmt.Sprintf("lock held by %s until %s", e.Holder, e.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }
