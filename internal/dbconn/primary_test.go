package dbconn_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/testkit"
)

func backendPid(t *testing.T, c *pgxpool.Conn) int {
	t.Helper()
	var pid int
	if err := c.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// Every connection goes to a server that accepts writes, whatever the URL says:
// a URL naming the standby first still reaches the primary, and a URL naming only
// the standby gets no connection at all (rail-proxy's "refuse a standby", held per
// connection).
func TestOpenConnectsOnlyToThePrimary(t *testing.T) {
	p, db := sharedPair(t)
	ctx := context.Background()
	standby, primary := p.Standby().Port(), p.Primary().Port()
	for _, url := range []string{
		fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable", standby, primary, db),
		fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=any", standby, primary, db),
	} {
		pool := open(t, url)
		var inRecovery bool
		if err := pool.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
			t.Errorf("%s: pool reached a server in recovery (%v, %v)", url, inRecovery, err)
		}
	}
	pool := open(t, p.Standby().URL(db))
	err := pool.Ping(ctx)
	if err == nil {
		t.Fatal("a pool on the standby alone got a connection")
	}
	if !strings.Contains(err.Error(), "read only") {
		t.Errorf("refusal does not say why: %v", err)
	}
}

// After kill -9 of the primary and a promotion, the same pool serves again
// without being reopened; the connections it made before are dropped as a whole
// once one of them shows the server gone, so none of them is lent again.
func TestPoolFollowsPromotion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := pgcluster.StartPair(ctx, pgcluster.PairOptions{Sync: true, MaxConnections: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	pool := open(t, p.URL("postgres"))
	mustExec(t, pool, "CREATE TABLE t (v text)")
	mustExec(t, pool, "INSERT INTO t VALUES ('before')")

	// Four connections in the pool, idle.
	var conns []*pgxpool.Conn
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	// Until the standby is promoted, nothing accepts writes: every call fails.
	if _, err := pool.Exec(ctx, "INSERT INTO t VALUES ('during')"); err == nil {
		t.Fatal("a write succeeded with the primary dead and the standby not promoted")
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// The first failure reset the pool: every call now lands on the new primary.
	for i := range 8 {
		if _, err := pool.Exec(ctx, "INSERT INTO t VALUES ($1)", fmt.Sprint("after-", i)); err != nil {
			t.Fatalf("write %d after the promotion: %v", i, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM t WHERE v = 'before'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the synchronously committed row: %d (%v)", n, err)
	}
}

// One connection that finds its server gone makes the pool drop the others: the
// next connections lent are new ones, not the idle ones made before.
func TestServerGoneResetsThePool(t *testing.T) {
	p, db := sharedPair(t)
	ctx := context.Background()
	pool := open(t, p.URL(db))
	old := map[int]bool{}
	var conns []*pgxpool.Conn
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old[backendPid(t, c)] = true
		conns = append(conns, c)
	}
	victim := conns[0]
	for _, c := range conns[1:] {
		c.Release()
	}
	// The server ends the victim's session (57P01, as in a shutdown); its next
	// statement learns of it.
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", backendPid(t, victim)).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate: %v %v", ok, err)
	}
	testkit.Eventually(t, 10*time.Second, "the terminated session to stop answering", func() bool {
		_, err := victim.Exec(ctx, "SELECT 1")
		if err != nil && !dbconn.ServerGone(err) {
			t.Fatalf("the terminated session's error %v is not taken for a server gone", err)
		}
		return err != nil
	})
	victim.Release()
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		if pid := backendPid(t, c); old[pid] {
			t.Errorf("the pool lent connection %d, made before the reset", pid)
		}
	}
}

func TestServerGone(t *testing.T) {
	gone := []error{
		io.EOF,
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		&net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE},
		&pgconn.PgError{Code: "57P01"}, // admin shutdown
		&pgconn.PgError{Code: "57P02"}, // crash shutdown
		&pgconn.PgError{Code: "57P03"}, // cannot connect now
		&pgconn.PgError{Code: "25006"}, // read-only transaction: not the primary any more
	}
	for _, err := range gone {
		if !dbconn.ServerGone(err) {
			t.Errorf("ServerGone(%v) = false", err)
		}
	}
	notGone := []error{
		context.DeadlineExceeded,
		context.Canceled,
		&pgconn.PgError{Code: "57014"}, // query cancelled
		&pgconn.PgError{Code: "23505"},
		&pgconn.PgError{Code: "40001"},
		errors.New("something else"),
	}
	for _, err := range notGone {
		if dbconn.ServerGone(err) {
			t.Errorf("ServerGone(%v) = true", err)
		}
	}
}

// A statement that runs out of its caller's time closes its connection, and the
// next statement on it fails with "conn closed": neither says anything about the
// server, and the pool keeps its other connections.
func TestOwnDeadlineKeepsThePool(t *testing.T) {
	p, db := sharedPair(t)
	ctx := context.Background()
	pool := open(t, p.URL(db))
	old := map[int]bool{}
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old[backendPid(t, c)] = true
		conns = append(conns, c)
	}
	slow, batched := conns[0], conns[1]
	conns[2].Release()
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := slow.Exec(sctx, "SELECT pg_sleep(30)")
	cancel()
	if err == nil || !slow.Conn().IsClosed() {
		t.Fatalf("a statement past its deadline: %v, closed %v", err, slow.Conn().IsClosed())
	}
	if _, err := slow.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a closed connection ran a statement")
	}
	slow.Release()
	// The same in a batch: the queries after the one that ran out of time fail
	// on the connection it closed.
	b := &pgx.Batch{}
	b.Queue("SELECT pg_sleep(30)")
	b.Queue("SELECT 1")
	b.Queue("SELECT 2")
	sctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	br := batched.SendBatch(sctx, b)
	for range 3 {
		if _, err := br.Exec(); err == nil {
			t.Fatal("a batch query past its deadline succeeded")
		}
	}
	_ = br.Close()
	cancel()
	batched.Release()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if pid := backendPid(t, c); !old[pid] {
		t.Errorf("the pool made a new connection (%d): its idle one was dropped", pid)
	}
}
