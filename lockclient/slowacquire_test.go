package lockclient_test

import (
	"context"
	"testing"
	"time"

	"lock.dev/internal/leasepause"
	"lock.dev/lockclient"
)

// An acquire whose answer comes back after the lease's safe time (as across a
// database failover, when lock-server answers late) yields a lease that has
// already passed its deadline: its timer fires at once and ends it while
// Acquire is still attaching it to the client's pauser. The lease is expired,
// the pauser no longer reaches it, and under -race nothing races.
func TestAcquireAnsweredPastTheDeadline(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	pz := leasepause.New[*lockclient.Lease]()
	c := newClient(t, w.URL, lockclient.WithPauser(pz))
	const ttl = 300 * time.Millisecond
	w.net.setSlow(modeSlow, 2*ttl) // the answer comes back after the whole TTL
	l, err := c.Acquire(context.Background(), "account:late", "exec-1", ttl)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 5*time.Second)
	if !isExpired(l.Err()) {
		t.Errorf("Err = %v, want ErrExpired", l.Err())
	}
	if pz.Freeze(l) {
		t.Error("the pauser still reaches a lease that ended")
	}
}
