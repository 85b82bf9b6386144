// Package identity is who a caller is, on every hop of lock.dev
// (docs/contracts/workload-identity.md): each workload holds an X.509-SVID — a
// certificate whose single URI SAN is its SPIFFE ID, spiffe://{trust domain}/{name}
// — and every call between workloads is mutual TLS, verified against a trust
// bundle.
//
// The parts, each used by every service and client:
//
//   - Settings (settings.go): TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE and
//     UNSAFE_NO_AUTH, refused when empty unless the refusal is lifted;
//   - Source (source.go): the SVID and bundle read from those files and re-read
//     when they change, so certificates rotate without a restart; the server and
//     client TLS configurations built on it with go-spiffe's authorisers, which
//     ask the Source at every handshake;
//   - Listener and PeerID (peer.go): a TLS listener whose connections know their
//     peer's SPIFFE ID once, and the verified ID of a request's caller, for either
//     HTTP server the project runs;
//   - Guard (guard.go): roles per route, 403 FORBIDDEN for a caller without the
//     route's role, counted and logged, nothing written;
//   - WriteCerts (certs.go): a throwaway authority and SVIDs for demos, compose
//     and tests (lock-server certs).
//
// SAN parsing and chain verification are go-spiffe's (x509svid, x509bundle,
// spiffetls/tlsconfig), never this package's own.
package identity
