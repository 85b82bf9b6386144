// Package fence lets a service fence out stale holders of a lock.dev lease: it
// verifies the signed grant a worker presents with its fencing token, so the
// service can trust that token and refuse any write whose token is older than
// the newest it has seen (docs/contracts/signed-grants.md).
//
// A lease is only a liveness hint: its holder may be paused past its expiry
// while another worker takes the lock. What keeps the two from both writing is
// the fencing token lock-server hands out with each lease — strictly greater at
// each new grant — compared by the resource itself. The token must be one
// lock-server really granted, or anyone could present the largest token there is
// and fence every honest holder out for ever; the grant is that proof: a JWT
// lock-server signs with an Ed25519 key, binding the token to its lock, to the
// owner it was granted to, and (with workload identity) to the workload that
// acquired it.
//
// The kit has three parts:
//
//   - a [KeySet] (lock-server's published JWK Set, [ParseKeySet] or
//     [ReadKeySet]) and a [Verifier] that checks a grant against what a request
//     presents — token, owner, lock name — and answers a [*Rejection] whose
//     Reason is one of the contract's closed list;
//   - [Middleware], which reads X-Fencing-Token, X-Owner-Id and X-Fencing-Grant,
//     verifies, compares the grant's workload with the caller's SPIFFE ID over
//     mutual TLS, answers refusals as application/problem+json, and hands the
//     verified [Claims] to the handler through the request's context
//     ([FromContext]);
//   - package lock.dev/fence/fencepg, the comparison itself for a team's own
//     PostgreSQL rows: a per-resource high-water mark advanced or refused in one
//     statement, inside the transaction that writes.
//
// Verification is offline — no call to lock-server per request — and a grant
// verified once is remembered (bounded), so a lease's many requests pay for one
// signature check. docs/adopting.md walks through a worker, a resource and the
// example module in examples/adopt.
package fence
