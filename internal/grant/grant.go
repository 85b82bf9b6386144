// Package grant implements docs/contracts/signed-grants.md: a fencing token nobody can make
// up. lock-server signs each grant of a token — a JWT binding the token to its lock
// and to the owner it was granted to — with an Ed25519 key only it holds; both
// fence points, rail-proxy and payment-resource, verify the grant offline against a
// JWK Set before anything is written or forwarded.
//
// Without it a fencing token is only a number: anyone who can reach rail-proxy can
// present 9223372036854775807 for any account, the gate admits it (it is above the
// mark), the rail pays, and every honest holder of that account is fenced out for
// ever, because the mark never goes down.
//
// Files: grant.go (the grant's shape and the closed set of refusal reasons),
// keys.go (key files, JWK Sets, thumbprints, keygen), sign.go (lock-server's side),
// verify.go (the fence points' side, in the order of
// docs/contracts/signed-grants.md), cache.go (the bounded cache of verified
// grants), gate.go (the HTTP check both fence points run).
//
// The signature itself is go-jose's (github.com/go-jose/go-jose/v4): parsing the
// compact form, refusing every algorithm but EdDSA, verifying. What
// docs/contracts/signed-grants.md adds on top — the header's typ and kid, the
// claims' types, issuer, lock, token and owner — is checked here.
package grant

import (
	"fmt"
)

// The fixed values of a grant (docs/contracts/signed-grants.md).
const (
	// Issuer is the iss claim of every grant.
	Issuer = "lock-server"
	// Type is the typ header of every grant.
	Type = "lockgrant+jwt"
	// Algorithm is the only signature algorithm a grant may carry.
	Algorithm = "EdDSA"
)

// MaxGrantBytes bounds the grant a fence point reads. A real grant is about 300
// bytes; anything far larger is refused as malformed before any decoding, so a
// caller cannot make a fence point parse megabytes.
const MaxGrantBytes = 4096

// Claims are a grant's claims, decoded.
type Claims struct {
	Issuer   string // iss
	Lock     string // lock: the lock name, e.g. account:acct-7
	Token    int64  // tok: the fencing token (a decimal string on the wire)
	Subject  string // sub: the owner id the lease was granted to
	IssuedAt int64  // iat: seconds since the epoch, lockdb's clock at the grant
	// Workload is wid: the SPIFFE ID of the workload that acquired the lease, ""
	// when the grant carries none (lock-server serving without identities, or
	// one from before wid). A fence point serving mutual TLS compares it with
	// its caller's (docs/contracts/workload-identity.md).
	Workload string
}

// The closed set of reasons a fence point refuses a grant for (docs/contracts/signed-grants.md), in
// the order they are checked: the first that applies is the answer.
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
	// verified SPIFFE ID, or the caller has none, or (GRANT_WID_REQUIRED) the
	// grant carries no wid. Only a fence point serving mutual TLS checks it.
	ReasonWorkloadMismatch = "workload_mismatch"
)

// Reasons lists every reason in checking order: the label values of
// grant_rejected_total{reason}.
var Reasons = []string{
	ReasonMissing, ReasonMalformed, ReasonUnknownKey, ReasonBadSignature,
	ReasonWrongIssuer, ReasonLockMismatch, ReasonTokenMismatch, ReasonOwnerMismatch,
	ReasonWorkloadMismatch,
}

// Rejection is a refused grant: Reason is one of the closed set, Detail a short
// sentence for the problem answer. Neither ever quotes the grant.
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
	Lock  string // account:{accountId}
	Token int64  // X-Fencing-Token
	Owner string // X-Owner-Id
}
