// Package hatest holds the high-availability tests: the whole system under load
// on a three-member Patroni cluster (internal/patroni) in synchronous mode
// strict, through a member killed, a planned switchover and the like, judged by
// the invariant checker (internal/invariants) — the proof behind
// docs/operations/high-availability.md. It has no code besides its tests; the
// cluster is started once for the package and each test leaves it healthy for
// the next.
package hatest
