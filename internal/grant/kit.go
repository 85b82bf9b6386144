package grant

import "lock.dev/fence"

// The grant's shape and its verification are the kit's (lock.dev/fence); these
// names let lock-server, the fence points and their tests say grant.KeySet or
// grant.ReasonMissing for what they share with it.
type (
	// KeySet is fence.KeySet.
	KeySet = fence.KeySet
	// Claims is fence.Claims.
	Claims = fence.Claims
	// Presented is fence.Presented.
	Presented = fence.Presented
	// Rejection is fence.Rejection.
	Rejection = fence.Rejection
)

// The fixed values of a grant and the closed set of refusal reasons (fence's).
const (
	Issuer    = fence.Issuer
	Type      = fence.Type
	Algorithm = fence.Algorithm

	ReasonMissing          = fence.ReasonMissing
	ReasonMalformed        = fence.ReasonMalformed
	ReasonUnknownKey       = fence.ReasonUnknownKey
	ReasonBadSignature     = fence.ReasonBadSignature
	ReasonWrongIssuer      = fence.ReasonWrongIssuer
	ReasonLockMismatch     = fence.ReasonLockMismatch
	ReasonTokenMismatch    = fence.ReasonTokenMismatch
	ReasonOwnerMismatch    = fence.ReasonOwnerMismatch
	ReasonWorkloadMismatch = fence.ReasonWorkloadMismatch
)

// Reasons lists every reason in checking order: the label values of
// grant_rejected_total{reason}.
var Reasons = fence.Reasons()

// ReadKeySet is fence.ReadKeySet.
func ReadKeySet(path string) (set *KeySet, ignored int, err error) { return fence.ReadKeySet(path) }

// ParseKeySet is fence.ParseKeySet.
func ParseKeySet(b []byte) (set *KeySet, ignored int, err error) { return fence.ParseKeySet(b) }

// Verifier is fence.Verifier as the project's tests call it: VerifyClaims is
// its Verify.
type Verifier struct{ *fence.Verifier }

// NewVerifier is fence.NewVerifier.
func NewVerifier(keys *KeySet, cacheSize int) (*Verifier, error) {
	v, err := fence.NewVerifier(keys, cacheSize)
	if err != nil {
		return nil, err
	}
	return &Verifier{v}, nil
}

// VerifyClaims is fence.Verifier.Verify.
func (v *Verifier) VerifyClaims(g string, p Presented) (Claims, error) { return v.Verify(g, p) }
