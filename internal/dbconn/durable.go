package dbconn

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrCommitNotDurable says a COMMIT came back with PostgreSQL's warning that its
// wait for the synchronous standby was cancelled: the transaction is committed on
// the primary but may not be on the standby, so a failover can forget it. The
// caller must treat the transaction as NOT committed: hand out nothing it wrote,
// forward nothing it admitted, answer 503.
var ErrCommitNotDurable = errors.New("commit not durable: the wait for the synchronous standby was cancelled; committed on the primary only, a failover may forget it")

// The warnings of PostgreSQL 15's src/backend/replication/syncrep.c
// (SyncRepWaitForLSN), sent while COMMIT waits for the synchronous standby:
//
//   - a cancel request (pg_cancel_backend, a client's cancel): WARNING, SQLSTATE
//     01000 (no errcode: the default for a warning), "canceling wait for
//     synchronous replication due to user request"; the COMMIT then reports
//     success.
//   - a terminate request (pg_terminate_backend, a fast shutdown): WARNING,
//     SQLSTATE 57P01, "canceling the wait for synchronous replication and
//     terminating connection due to administrator command"; the connection then
//     closes without an answer to the COMMIT.
//
// Both carry the detail "The transaction has already committed locally, but might
// not have been replicated to the standby." (TestBeginCommitReportsCancelledSyncWait
// and TestBeginCommitReportsTerminatedSyncWait provoke them on a real primary and
// standby.)
const (
	syncRepCancelMessage    = "canceling wait for synchronous replication due to user request"
	syncRepTerminateMessage = "canceling the wait for synchronous replication and terminating connection due to administrator command"
	syncRepDetail           = "The transaction has already committed locally, but might not have been replicated to the standby."
)

// notDurableKey holds, in a connection's CustomData, the cancelled-wait warning
// received since the last COMMIT of Begin's transactions or ExecCommit began.
const notDurableKey = "lock.dev/dbconn.notDurable"

// onNotice is every pool connection's notice handler. It runs on the goroutine
// that is using the connection (pgconn calls it while reading replies), so the
// connection's CustomData needs no lock.
func onNotice(pc *pgconn.PgConn, n *pgconn.Notice) {
	if syncRepCancelled(n) {
		pc.CustomData()[notDurableKey] = n.Message
	}
}

// syncRepCancelled recognises the warnings above. Messages are translated when
// the server's lc_messages is not English, so the SQLSTATE decides, with the
// severity: a WARNING with 01000 or 57P01. Only a warning that arrives during a
// COMMIT is acted upon (the mark is cleared before COMMIT is sent), and a COMMIT of
// ours has no other source of such a warning; should one ever appear, the cost is
// a 503 for a transaction that was durable, never the reverse.
func syncRepCancelled(n *pgconn.Notice) bool {
	if n.Message == syncRepCancelMessage || n.Message == syncRepTerminateMessage || n.Detail == syncRepDetail {
		return true
	}
	return n.SeverityUnlocalized == "WARNING" && (n.Code == "01000" || n.Code == "57P01")
}

// RaiseSyncCommitSQL, run inside a transaction, makes its COMMIT wait for the
// synchronous standby and makes a cancelled wait visible, whatever the server's,
// database's, role's or connection URL's defaults:
//
//   - synchronous_commit = on: off and local would report a commit the standby
//     has not flushed; a stronger setting (remote_apply) is left as it is.
//   - client_min_messages = warning: the cancelled-wait warning that Commit,
//     ExecCommit and DurableBatch look for is sent to the client only when
//     client_min_messages is warning or more verbose; at error the COMMIT would
//     come back a clean success. A more verbose setting is left as it is.
//
// Both settings are transaction-local. It is one statement, so it can ride in
// the same batch or simple-protocol query as BEGIN (Begin does that) at no extra
// round trip. Its one row is of no interest.
const RaiseSyncCommitSQL = `SELECT CASE WHEN current_setting('synchronous_commit') NOT IN ('on', 'remote_apply')
            THEN set_config('synchronous_commit', 'on', true) END,
       CASE WHEN current_setting('client_min_messages') NOT IN ('debug5', 'debug4', 'debug3', 'debug2', 'debug1', 'log', 'info', 'notice', 'warning')
            THEN set_config('client_min_messages', 'warning', true) END`

// beginSQL is BEGIN and RaiseSyncCommitSQL in one simple-protocol query: one
// round trip.
const beginSQL = "BEGIN; " + RaiseSyncCommitSQL

// Begin starts a transaction on a connection of pool (the server's default
// isolation, READ COMMITTED) whose COMMIT waits for the synchronous standby:
// RaiseSyncCommitSQL is sent with BEGIN, in one round trip. Its Commit returns an
// error wrapping ErrCommitNotDurable when that wait was cancelled — also when the
// server reported the commit as a success, and whatever client_min_messages the
// role, the database or the URL sets. Commit and Rollback return the connection
// to the pool. Every transaction whose effects others rely on begins here (or
// sends RaiseSyncCommitSQL itself and ends with ExecCommit).
func Begin(ctx context.Context, pool *pgxpool.Pool) (pgx.Tx, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := c.Conn().BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL})
	if err != nil {
		c.Release()
		return nil, err
	}
	return &durableTx{Tx: tx, conn: c}, nil
}

// durableTx is a pgx.Tx on a pooled connection it holds until the transaction
// ends: the warning is read from the connection after COMMIT, before another
// request may borrow it (a *pgxpool.Tx releases it inside Commit).
type durableTx struct {
	pgx.Tx
	conn *pgxpool.Conn
}

func (t *durableTx) Commit(ctx context.Context) error {
	defer t.release()
	pc := t.Tx.Conn().PgConn()
	delete(pc.CustomData(), notDurableKey)
	return notDurable(pc, t.Tx.Commit(ctx))
}

func (t *durableTx) Rollback(ctx context.Context) error {
	defer t.release()
	return t.Tx.Rollback(ctx)
}

func (t *durableTx) release() {
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}

// ExecCommit sends COMMIT on conn, which is in a transaction it began itself (a
// raw BEGIN sent with conn.Exec or in a batch), and returns the command tag and
// error as conn.Exec would — "ROLLBACK" when the transaction had failed — except
// that a COMMIT that came back with the cancelled synchronous replication warning
// returns an error wrapping ErrCommitNotDurable (and the tag it got). conn must
// come from Open, and the transaction must have run RaiseSyncCommitSQL: without
// it a client_min_messages of error keeps the warning from ever arriving. For a
// *pgxpool.Conn pass c.Conn().
func ExecCommit(ctx context.Context, conn *pgx.Conn) (pgconn.CommandTag, error) {
	pc := conn.PgConn()
	delete(pc.CustomData(), notDurableKey)
	tag, err := conn.Exec(ctx, "COMMIT")
	return tag, notDurable(pc, err)
}

// notDurable adds ErrCommitNotDurable to err when the warning arrived.
func notDurable(pc *pgconn.PgConn, err error) error {
	msg, ok := pc.CustomData()[notDurableKey].(string)
	if !ok {
		return err
	}
	delete(pc.CustomData(), notDurableKey)
	if err != nil {
		return fmt.Errorf("%w (server: %q); and the commit failed: %w", ErrCommitNotDurable, msg, err)
	}
	return fmt.Errorf("%w (server: %q)", ErrCommitNotDurable, msg)
}

// DurableBatch runs, as one transaction pipelined in one round trip, BEGIN,
// RaiseSyncCommitSQL, the statements queue adds, and COMMIT: what an
// autocommit statement would do, except that a database or role default of
// synchronous_commit below on cannot weaken its commit, nor one of
// client_min_messages above warning hide from it, and a cancelled wait
// for the synchronous standby is reported (ErrCommitNotDurable, as ExecCommit
// does) instead of passing for success. read is given the statements' results,
// in order, and must read every one of them. A statement that fails rolls the
// transaction back; its error is returned.
func DurableBatch(ctx context.Context, pool *pgxpool.Pool, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(RaiseSyncCommitSQL)
	queue(b)
	b.Queue("COMMIT")
	pc := c.Conn().PgConn()
	delete(pc.CustomData(), notDurableKey)
	br := c.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = read(br)
	}
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = errors.New("transaction was rolled back")
	}
	return notDurable(pc, err)
}
