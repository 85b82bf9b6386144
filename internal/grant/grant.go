// Package grant is lock.dev's own side of docs/contracts/signed-grants.md, built
// on the public fence kit (lock.dev/fence), which holds the grant's shape, key
// sets and the verifier: lock-server's keys and signer (keygen, the signing key
// file, Signer), and the gate both fence points — rail-proxy and
// payment-resource — run on each fenced request, with the project's metrics
// (grant_rejected_total, grant_without_wid_total), logs and key file reload.
//
// Files: kit.go (the kit's names the project's call sites use), keys.go (key
// files, keygen), sign.go (lock-server's side), gate.go (the HTTP check both
// fence points run, through fence.Verifier), reload.go (the key set file
// re-read on change).
package grant
