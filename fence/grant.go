package fence

import "fmt"

// The fixed values of a grant (docs/contracts/signed-grants.md).
const (
	// Issuer is the iss claim of every grant.
	Issuer = "lock-server"
	// Type is the typ header of every grant.
	Type = "lockgrant+jwt"
	// Algorithm is the only signature algorithm a grant may carry.
	Algorithm = "EdDSA"
)

// MaxGrantBytes bounds the grant a verifier reads. A real grant is about 300
// bytes; anything far larger is refused as malformed before any decoding, so a
// caller cannot make a resource parse megabytes.
const MaxGrantBytes = 4096

// Challenge is the WWW-Authenticate header of every refusal (401 GRANT_REJECTED).
const Challenge = `LockGrant realm="lock.dev"`

// Claims are a verified grant's claims.
type Claims struct {
	Issuer   string // iss
	Lock     string // lock: the lock name, e.g. account:acct-7
	Token    int64  // tok: the fencing token (a decimal string on the wire)
	Subject  string // sub: the owner id the lease was granted to
	IssuedAt int64  // iat: seconds since the epoch, lock-server's database clock at the grant
	// Workload is wid: the SPIFFE ID of the workload that acquired the lease, ""
	// when the grant carries none (lock-server serving without identities). A
	// resource serving mutual TLS compares it with its caller's
	// (docs/contracts/workload-identity.md).
	Workload string
}

// The closed set of reasons a grant is refused for (docs/contracts/signed-grants.md),
// in the order they are checked: the first that applies is the answer.
const (
	ReasonMissing       = "missing"        // no X-Fencing-Grant, or an empty one
	ReasonMalformed     = "malformed"      // not a well-formed grant
	ReasonUnknownKey    = "unknown_key"    // kid names no key of the verifier's set
	ReasonBadSignature  = "bad_signature"  // the signature does not verify with that key
	ReasonWrongIssuer   = "wrong_issuer"   // iss is not lock-server
	ReasonLockMismatch  = "lock_mismatch"  // the grant is for another lock
	ReasonTokenMismatch = "token_mismatch" // tok differs from X-Fencing-Token
	ReasonOwnerMismatch = "owner_mismatch" // sub differs from X-Owner-Id
	// ReasonWorkloadMismatch: wid names another workload than the caller's
	// verified SPIFFE ID, or the caller has none, or the grant carries no wid
	// where one is required. Only a resource serving mutual TLS checks it
	// (docs/contracts/workload-identity.md).
	ReasonWorkloadMismatch = "workload_mismatch"
)

// Reasons lists every reason in checking order: what a caller counting
// refusals by reason initialises its series with.
func Reasons() []string {
	return []string{
		ReasonMissing, ReasonMalformed, ReasonUnknownKey, ReasonBadSignature,
		ReasonWrongIssuer, ReasonLockMismatch, ReasonTokenMismatch, ReasonOwnerMismatch,
		ReasonWorkloadMismatch,
	}
}

// Rejection is a refused grant: Reason is one of the closed set, Detail a short
// sentence for the problem answer. Neither ever quotes the grant, so both may be
// logged and answered. A caller finds it with errors.As.
type Rejection struct {
	Reason string
	Detail string
}

func (r *Rejection) Error() string { return "grant rejected (" + r.Reason + "): " + r.Detail }

func reject(reason, format string, args ...any) *Rejection {
	return &Rejection{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Presented is what a request presents besides its grant: the grant must be of
// Lock, for Token, to Owner.
type Presented struct {
	Lock  string // the lock whose token this is, e.g. account:acct-7
	Token int64  // X-Fencing-Token
	Owner string // X-Owner-Id
}
