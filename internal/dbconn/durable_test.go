package dbconn_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/testkit"
)

var (
	shared     *pgcluster.Pair
	sharedErr  error
	sharedOnce sync.Once
	sharedMu   sync.Mutex // tests that hold the shared standby run one at a time
	dbSeq      int
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		_ = shared.Stop()
	}
	os.Exit(code)
}

// sharedPair is a primary with a synchronous standby for the tests that neither
// kill nor promote; each gets its own database on it and the pair to itself.
func sharedPair(t *testing.T) (*pgcluster.Pair, string) {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		shared, sharedErr = pgcluster.StartPair(ctx, pgcluster.PairOptions{Sync: true, MaxConnections: 100})
	})
	if sharedErr != nil {
		t.Fatalf("start a primary and standby: %v", sharedErr)
	}
	sharedMu.Lock()
	t.Cleanup(func() {
		shared.ReleaseStandby()
		sharedMu.Unlock()
	})
	dbSeq++
	name := fmt.Sprintf("d%d", dbSeq)
	if err := shared.CreateDatabase(context.Background(), name, ""); err != nil {
		t.Fatal(err)
	}
	if err := shared.WaitReplayed(context.Background()); err != nil {
		t.Fatal(err)
	}
	return shared, name
}

func open(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := dbconn.Open(context.Background(), url, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// commitResult is what a COMMIT sent on another goroutine came back with.
type commitResult struct {
	tag string
	err error
}

// A cancelled wait for the synchronous standby: PostgreSQL reports the COMMIT as
// a success with a WARNING; a transaction begun with dbconn.Begin reports
// ErrCommitNotDurable instead. The row is on the primary all the same (committed
// locally), which is exactly why it must not be trusted: the standby does not
// have it.
func TestBeginCommitReportsCancelledSyncWait(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	mustExec(t, pool, "CREATE TABLE t (v text)")
	ctx := context.Background()
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	tx, err := dbconn.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ('cancelled')"); err != nil {
		t.Fatal(err)
	}
	done := make(chan commitResult, 1)
	go func() { done <- commitResult{err: tx.Commit(ctx)} }()
	r := testkit.CancelSyncWait(t, p, false, done)
	if !errors.Is(r.err, dbconn.ErrCommitNotDurable) {
		t.Fatalf("Commit after a cancelled sync wait = %v, want ErrCommitNotDurable", r.err)
	}
	if !strings.Contains(r.err.Error(), "canceling wait for synchronous replication due to user request") {
		t.Errorf("error does not quote the server's warning: %v", r.err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the primary has %d rows (%v): the commit was local, as PostgreSQL says", n, err)
	}
	// The pool still works, and a commit without a cancelled wait is clean.
	p.ReleaseStandby()
	tx, err = dbconn.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ('clean')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("a commit the standby confirmed: %v", err)
	}
}

// A terminated backend (pg_terminate_backend, a fast shutdown) sends the other
// warning and closes the connection: the error says both.
func TestBeginCommitReportsTerminatedSyncWait(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	mustExec(t, pool, "CREATE TABLE t (v text)")
	ctx := context.Background()
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	tx, err := dbconn.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ('terminated')"); err != nil {
		t.Fatal(err)
	}
	done := make(chan commitResult, 1)
	go func() { done <- commitResult{err: tx.Commit(ctx)} }()
	r := testkit.CancelSyncWait(t, p, true, done)
	if !errors.Is(r.err, dbconn.ErrCommitNotDurable) {
		t.Fatalf("Commit after a terminated sync wait = %v, want ErrCommitNotDurable", r.err)
	}
	if !strings.Contains(r.err.Error(), "canceling the wait for synchronous replication and terminating connection due to administrator command") {
		t.Errorf("error does not quote the server's warning: %v", r.err)
	}
}

// rail-proxy's shape: BEGIN and the statement in one batch on a pooled
// connection, then a raw COMMIT through ExecCommit.
func TestExecCommitReportsCancelledSyncWait(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	mustExec(t, pool, "CREATE TABLE t (v text)")
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(dbconn.RaiseSyncCommitSQL)
	b.Queue("INSERT INTO t VALUES ($1)", "raw")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan commitResult, 1)
	go func() {
		tag, err := dbconn.ExecCommit(ctx, conn.Conn())
		done <- commitResult{tag: tag.String(), err: err}
	}()
	r := testkit.CancelSyncWait(t, p, false, done)
	if !errors.Is(r.err, dbconn.ErrCommitNotDurable) || r.tag != "COMMIT" {
		t.Fatalf("ExecCommit after a cancelled sync wait = %q, %v; want COMMIT and ErrCommitNotDurable", r.tag, r.err)
	}
	// The next commit on the same connection is not tainted by the last one.
	p.ReleaseStandby()
	if _, err := conn.Exec(ctx, "BEGIN; INSERT INTO t VALUES ('next')"); err != nil {
		t.Fatal(err)
	}
	if tag, err := dbconn.ExecCommit(ctx, conn.Conn()); err != nil || tag.String() != "COMMIT" {
		t.Fatalf("next ExecCommit = %q, %v", tag, err)
	}
	// A failed transaction's COMMIT is answered ROLLBACK, as conn.Exec says it.
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if tag, err := dbconn.ExecCommit(ctx, conn.Conn()); err != nil || tag.String() != "ROLLBACK" {
		t.Fatalf("COMMIT of a failed transaction = %q, %v; want ROLLBACK", tag, err)
	}
}

// Begin raises synchronous_commit to on inside the transaction: with the
// database's default lowered to off (or local) a plain transaction's COMMIT does
// not wait for the held standby, Begin's does. A stronger default (remote_apply)
// is left as it is.
func TestBeginRaisesSynchronousCommit(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	mustExec(t, pool, "CREATE TABLE t (v text)")
	ctx := context.Background()
	for _, def := range []string{"off", "local", "remote_write", "on", "remote_apply"} {
		mustExec(t, pool, fmt.Sprintf("ALTER DATABASE %s SET synchronous_commit = %s", db, def))
		pool.Reset() // the default applies to new sessions
		want := "on"
		if def == "remote_apply" {
			want = def
		}
		tx, err := dbconn.Begin(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		var got, session string
		if err := tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&session); err != nil {
			t.Fatal(err)
		}
		if got != want || session != def {
			t.Errorf("default %s: synchronous_commit in Begin's transaction = %s (want %s), after it = %s (want %s)", def, got, want, session, def)
		}
	}

	mustExec(t, pool, fmt.Sprintf("ALTER DATABASE %s SET synchronous_commit = off", db))
	pool.Reset()
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	// A plain transaction commits without the standby: the weakened default at work.
	plain, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Exec(ctx, "INSERT INTO t VALUES ('plain')"); err != nil {
		t.Fatal(err)
	}
	if err := plain.Commit(ctx); err != nil {
		t.Fatalf("plain commit with synchronous_commit=off: %v", err)
	}
	// Begin's waits for the standby.
	tx, err := dbconn.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ('durable')"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tx.Commit(ctx) }()
	testkit.WaitSyncRep(t, p)
	select {
	case err := <-done:
		t.Fatalf("Begin's commit came back (%v) while the standby was held", err)
	default:
	}
	p.ReleaseStandby()
	if err := <-done; err != nil {
		t.Fatalf("commit after the standby was released: %v", err)
	}
}

// PostgreSQL disarms statement_timeout before it commits: a COMMIT waiting for
// the held standby outlives a transaction-local statement_timeout (payment-
// resource sets one on every transaction) many times over, still waiting. Were it
// not so, the timeout would cancel the wait and the COMMIT would report success
// with only a warning.
func TestStatementTimeoutDoesNotCancelTheSyncWait(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	mustExec(t, pool, "CREATE TABLE t (v text)")
	ctx := context.Background()
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	tx, err := dbconn.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', '100', true)"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ('waits')"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tx.Commit(ctx) }()
	pid := testkit.WaitSyncRep(t, p)
	// Wait, by the server's clock, until the COMMIT has waited ten times its
	// statement_timeout; it never gets there if the timeout cancelled it.
	testkit.Eventually(t, 30*time.Second, "the COMMIT to have waited for the standby ten times its statement_timeout", func() bool {
		var long bool
		err := pool.QueryRow(ctx, `SELECT coalesce(wait_event = 'SyncRep' AND clock_timestamp() - query_start > interval '1 second', false)
			FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&long)
		if err != nil {
			t.Fatalf("backend %d: %v", pid, err)
		}
		if long {
			return true
		}
		select {
		case err := <-done:
			t.Fatalf("COMMIT came back (%v) before it had waited ten times its statement_timeout", err)
		default:
		}
		return false
	})
	p.ReleaseStandby()
	if err := <-done; err != nil {
		t.Fatalf("COMMIT after the standby was released: %v", err)
	}
}

// quietCases are the ways an operator can set client_min_messages = error for
// the services' connections: on their role, on their database, in their URL.
// Each gives the setup to run as the superuser and the URL to connect with; the
// connections log in as role, so that ALTER ROLE touches nothing else.
func quietCases(p *pgcluster.Pair, db, role string) []struct{ name, setup, url string } {
	url := strings.Replace(p.URL(db), "postgres://postgres@", "postgres://"+role+"@", 1)
	return []struct{ name, setup, url string }{
		{"role", "ALTER ROLE " + role + " SET client_min_messages = error", url},
		{"database", "ALTER DATABASE " + db + " SET client_min_messages = error", url},
		{"URL", "", url + "&options=-c%20client_min_messages%3Derror"},
	}
}

// PostgreSQL sends the cancelled-wait warning only when client_min_messages is
// warning or more verbose; at error a cancelled wait's COMMIT is a clean
// success. Every durable transaction raises client_min_messages itself, so
// whatever the role, the database or the URL sets, Begin's Commit, ExecCommit
// after RaiseSyncCommitSQL and DurableBatch still report ErrCommitNotDurable.
func TestCancelledSyncWaitSeenWhateverClientMinMessages(t *testing.T) {
	p, db := sharedPair(t)
	admin := open(t, p.URL(db))
	role := "quiet_" + db
	mustExec(t, admin, "CREATE TABLE t (v text)")
	mustExec(t, admin, "CREATE ROLE "+role+" LOGIN")
	mustExec(t, admin, "GRANT SELECT, INSERT ON t TO "+role)
	ctx := context.Background()
	shapes := []struct {
		name   string
		commit func(*pgxpool.Pool, string) error
	}{
		{"Begin", func(pool *pgxpool.Pool, v string) error {
			tx, err := dbconn.Begin(ctx, pool)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ($1)", v); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}},
		{"ExecCommit", func(pool *pgxpool.Pool, v string) error {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			b := &pgx.Batch{}
			b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
			b.Queue(dbconn.RaiseSyncCommitSQL)
			b.Queue("INSERT INTO t VALUES ($1)", v)
			if err := conn.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			_, err = dbconn.ExecCommit(ctx, conn.Conn())
			return err
		}},
		{"DurableBatch", func(pool *pgxpool.Pool, v string) error {
			return dbconn.DurableBatch(ctx, pool, func(b *pgx.Batch) { b.Queue("INSERT INTO t VALUES ($1)", v) },
				func(br pgx.BatchResults) error { _, err := br.Exec(); return err })
		}},
	}
	for _, c := range quietCases(p, db, role) {
		if c.setup != "" {
			mustExec(t, admin, c.setup)
		}
		pool := open(t, c.url)
		var level string
		if err := pool.QueryRow(ctx, "SELECT current_setting('client_min_messages')").Scan(&level); err != nil || level != "error" {
			t.Fatalf("%s: client_min_messages of a session = %q (%v); the case does not set error", c.name, level, err)
		}
		for _, s := range shapes {
			if err := p.HoldStandby(); err != nil {
				t.Fatal(err)
			}
			done := make(chan commitResult, 1)
			go func() { done <- commitResult{err: s.commit(pool, c.name+"-"+s.name)} }()
			r := testkit.CancelSyncWait(t, p, false, done)
			p.ReleaseStandby()
			if !errors.Is(r.err, dbconn.ErrCommitNotDurable) {
				t.Errorf("client_min_messages = error on the %s: %s after a cancelled sync wait = %v; want ErrCommitNotDurable", c.name, s.name, r.err)
			}
		}
		pool.Close()
		mustExec(t, admin, "ALTER ROLE "+role+" RESET client_min_messages")
		mustExec(t, admin, "ALTER DATABASE "+db+" RESET client_min_messages")
	}
}

// The raise of client_min_messages is transaction-local and only ever makes it
// more verbose: error becomes warning inside Begin's transaction, a more verbose
// default is kept, and the session's own value is back after the transaction.
func TestBeginRaisesClientMinMessages(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	ctx := context.Background()
	for _, def := range []string{"error", "warning", "notice", "info", "log", "debug1", "debug5"} {
		mustExec(t, pool, fmt.Sprintf("ALTER DATABASE %s SET client_min_messages = %s", db, def))
		pool.Reset() // the default applies to new sessions
		want := def
		if def == "error" {
			want = "warning"
		}
		tx, err := dbconn.Begin(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		var got, session string
		if err := tx.QueryRow(ctx, "SELECT current_setting('client_min_messages')").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "SELECT current_setting('client_min_messages')").Scan(&session); err != nil {
			t.Fatal(err)
		}
		if got != want || session != def {
			t.Errorf("default %s: client_min_messages in Begin's transaction = %s (want %s), after it = %s (want %s)", def, got, want, session, def)
		}
	}
}
