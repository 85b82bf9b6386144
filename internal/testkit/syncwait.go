package testkit

import (
	"context"
	"testing"
	"time"

	"lock.dev/internal/pgcluster"
)

// SyncWaitTimeout bounds CancelSyncWait: the wait for a COMMIT to wait for the
// standby, and then for done to deliver.
const SyncWaitTimeout = time.Minute

// CancelSyncWait waits until one COMMIT on p's primary waits for the held
// synchronous standby, checks that the call done reports has not answered
// before or while it waits, cancels that backend's wait (pg_cancel_backend:
// PostgreSQL then reports the commit with its warning) or, with terminate, ends
// its session (pg_terminate_backend), and returns what done delivers. It fails
// t when no COMMIT waits or no answer comes within SyncWaitTimeout. Call it
// from the test's goroutine, with the standby held (p.HoldStandby).
func CancelSyncWait[T any](t testing.TB, p *pgcluster.Pair, terminate bool, done <-chan T) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), SyncWaitTimeout)
	defer cancel()
	type waiter struct {
		pid int
		err error
	}
	waiting := make(chan waiter, 1)
	go func() {
		pid, err := p.WaitSyncRep(ctx)
		waiting <- waiter{pid, err}
	}()
	var pid int
	select {
	case r := <-done:
		t.Fatalf("the call answered (%v) without waiting for the standby", r)
	case w := <-waiting:
		if w.err != nil {
			t.Fatal(w.err)
		}
		pid = w.pid
	}
	select {
	case r := <-done:
		t.Fatalf("the call answered (%v) while its COMMIT waited for the standby", r)
	default:
	}
	if err := p.CancelBackend(ctx, pid, terminate); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		t.Fatal("no answer after the wait was cancelled")
	}
	var zero T
	return zero
}

// WaitSyncRep waits until one backend of p's primary waits for the synchronous
// standby (wait_event SyncRep) and returns its pid; it fails t when none does
// within SyncWaitTimeout.
func WaitSyncRep(t testing.TB, p *pgcluster.Pair) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), SyncWaitTimeout)
	defer cancel()
	pid, err := p.WaitSyncRep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
