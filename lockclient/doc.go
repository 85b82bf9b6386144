// Package lockclient lets a worker take a lease on a named lock from
// lock-server and act under it safely: it acquires the lease, keeps it alive,
// tells the worker through a context the moment it can no longer vouch for it,
// and puts the lease's fencing token on every write, so that the resource —
// not the lease — decides whether the write is still allowed
// (docs/contracts/lock-service.md).
//
// A worker does four things:
//
//	c, err := lockclient.New("https://lock-server:8081", lockclient.WithTLSConfig(cfg))
//	lease, err := c.Lock(ctx, lockapi.AccountLockName("acct-7"), owner, 15*time.Second)
//	defer lease.Release(context.WithoutCancel(ctx))
//	req, _ := http.NewRequestWithContext(lease.Context(), "POST", resourceURL, body)
//	lease.SetHeaders(req) // X-Fencing-Token, X-Owner-Id, X-Fencing-Grant
//
// Lock waits until the lease is held (backing off between attempts; ctx bounds
// the wait); Acquire tries once and returns ErrHeld when someone else holds it,
// leaving the decision to the caller. Work is done under lease.Context(), which
// is cancelled when the lease is lost, its local deadline passes, or it is
// released.
//
// A lease is a liveness hint, never a guarantee: the holder may be paused past
// its expiry. Safety comes from the fencing token, strictly greater for every
// grant of the lock, which every resource compares with the highest it has
// seen (lock.dev/fence is the kit for a resource's side). The client's part is
// to never believe in a lease longer than the server could: its local deadline
// is measured from before the request that granted or renewed the lease was
// sent, minus a drift margin, so it always falls before lockdb's expiry (as long
// as the two clocks run at rates within that margin of each other).
//
// lock-server is called over mutual TLS between workload identities
// (docs/contracts/workload-identity.md): WithTLSConfig takes the configuration
// that presents the worker's X.509-SVID and accepts only lock-server's SPIFFE
// ID; lock.dev/workload builds it from the SVID files and re-reads them when
// they rotate.
//
// The package depends only on the standard library and lock.dev/lockapi (and
// internal/leasepause, itself standard library only): importing it brings in
// no third-party code. A test reads the import graph to keep it so.
package lockclient
