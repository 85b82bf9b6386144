package pgcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/pgcluster"
	"lock.dev/internal/testkit"
)

func startPair(t *testing.T, sync bool) *pgcluster.Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p, err := pgcluster.StartPair(ctx, pgcluster.PairOptions{Sync: sync, MaxConnections: 50})
	if err != nil {
		t.Fatalf("start pair: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, conn *pgx.Conn, v string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t WHERE v = $1", v).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", v, err)
	}
	return n
}

// A row committed on the primary is on the standby, which refuses writes; the
// pair's URL reaches the primary.
func TestPairReplicates(t *testing.T) {
	p := startPair(t, true)
	ctx := context.Background()
	primary := connect(t, p.URL("postgres"))
	exec(t, primary, "CREATE TABLE t (v text)")
	exec(t, primary, "INSERT INTO t VALUES ('one')")
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	standby := connect(t, p.Standby().URL("postgres"))
	if n := count(t, standby, "one"); n != 1 {
		t.Fatalf("standby has %d rows 'one', want 1", n)
	}
	_, err := standby.Exec(ctx, "INSERT INTO t VALUES ('two')")
	if err == nil {
		t.Fatal("the standby took a write")
	}
	var inRecovery bool
	if err := primary.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
		t.Fatalf("the pair's URL reached a server in recovery (%v, %v)", inRecovery, err)
	}
}

// With a synchronous standby held back, a commit waits for it (wait_event
// SyncRep) and completes once it is released.
func TestSyncCommitWaitsWhileStandbyHeld(t *testing.T) {
	p := startPair(t, true)
	primary := connect(t, p.URL("postgres"))
	exec(t, primary, "CREATE TABLE t (v text)")
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := primary.Exec(context.Background(), "INSERT INTO t VALUES ('waits')")
		done <- err
	}()
	testkit.WaitSyncRep(t, p)
	select {
	case err := <-done:
		t.Fatalf("the commit returned (%v) while its backend waited for the held standby", err)
	default:
	}
	p.ReleaseStandby()
	if err := <-done; err != nil {
		t.Fatalf("commit after release: %v", err)
	}
	if err := p.WaitReplayed(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(t, connect(t, p.Standby().URL("postgres")), "waits"); n != 1 {
		t.Fatalf("standby has %d rows after release, want 1", n)
	}
}

// kill -9 of the primary, then promotion: the pair's URL finds the new primary,
// which has every synchronously committed row and takes writes.
func TestPromoteAfterKill(t *testing.T) {
	p := startPair(t, true)
	ctx := context.Background()
	primary := connect(t, p.URL("postgres"))
	exec(t, primary, "CREATE TABLE t (v text)")
	exec(t, primary, "INSERT INTO t VALUES ('before')")
	old := p.Primary()
	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if _, err := primary.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection to the killed primary still answers")
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Primary() == old || p.Standby() != nil {
		t.Fatal("roles did not move to the promoted standby")
	}
	next := connect(t, p.URL("postgres"))
	if n := count(t, next, "before"); n != 1 {
		t.Fatalf("new primary has %d rows 'before', want 1", n)
	}
	exec(t, next, "INSERT INTO t VALUES ('after')")
}

// Asynchronous replication loses the tail: a commit made while the standby was
// held back, then the primary killed, is not on the promoted standby.
func TestAsyncLosesTailWhenHeld(t *testing.T) {
	p := startPair(t, false)
	ctx := context.Background()
	primary := connect(t, p.URL("postgres"))
	exec(t, primary, "CREATE TABLE t (v text)")
	exec(t, primary, "INSERT INTO t VALUES ('replicated')")
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	exec(t, primary, "INSERT INTO t VALUES ('tail')") // returns at once: nobody waits for the standby
	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	p.ReleaseStandby()
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	next := connect(t, p.URL("postgres"))
	if n := count(t, next, "replicated"); n != 1 {
		t.Fatalf("new primary has %d rows 'replicated', want 1", n)
	}
	if n := count(t, next, "tail"); n != 0 {
		t.Fatalf("new primary has the tail the standby never received (%d rows)", n)
	}
}
