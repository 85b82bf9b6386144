package patroni

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// WaitLeader waits until a member other than not ("" for any) leads and
// commits a write (on a synchronous cluster: acknowledged by its standby).
func (c *Cluster) WaitLeader(ctx context.Context, not string) (Member, error) {
	var (
		last    Member
		lastErr error
	)
	err := poll(ctx, 200*time.Millisecond, func(ctx context.Context) bool {
		l, err := c.Leader(ctx)
		if err != nil {
			lastErr = err
			return false
		}
		if l.Name == not {
			lastErr = fmt.Errorf("%s still leads", not)
			return false
		}
		if err := c.writeProbe(ctx, l.Name); err != nil {
			lastErr = err
			return false
		}
		last = l
		return true
	})
	if err != nil {
		return Member{}, fmt.Errorf("patroni: no leader other than %q accepting writes: %w (last: %v)", not, err, lastErr)
	}
	return last, nil
}

// writeProbe commits a transaction with a transaction id on member, bounded:
// its commit waits for a synchronous standby. A cancelled wait is a failure
// (the context's error), never a success.
func (c *Cluster) writeProbe(ctx context.Context, member string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url, err := c.MemberURL(member, "postgres")
	if err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	// A commit whose wait for the standby was cancelled answers success with a
	// WARNING: that is no acknowledged write.
	var warned atomic.Bool
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Severity == "WARNING" {
			warned.Store(true)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		return err
	}
	if inRecovery {
		return fmt.Errorf("%s is in recovery", member)
	}
	// A transaction that writes WAL before its commit record: only such a commit
	// waits for the synchronous standby (an xid alone, txid_current(), commits
	// without waiting), so its success proves a standby acknowledged it.
	if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, 'lock.dev/patroni', 'write probe')"); err != nil {
		return err
	}
	if warned.Load() {
		return errors.New("commit not acknowledged")
	}
	return nil
}

// WaitHealthy waits until every member runs, one leads and commits a write,
// and (on a synchronous cluster) one is its synchronous standby, and every
// other member streams from the leader.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var lastErr error
	err := poll(ctx, 250*time.Millisecond, func(ctx context.Context) bool {
		lastErr = c.healthy(ctx)
		return lastErr == nil
	})
	if err != nil {
		return fmt.Errorf("patroni: cluster not healthy: %w (last: %v)", err, lastErr)
	}
	return nil
}

func (c *Cluster) healthy(ctx context.Context) error {
	ms, err := c.Members(ctx)
	if err != nil {
		return err
	}
	if len(ms) != len(c.nodes) {
		return fmt.Errorf("%d of %d members: %v", len(ms), len(c.nodes), ms)
	}
	for _, m := range ms {
		if m.State != "running" && m.State != "streaming" {
			return fmt.Errorf("member %s is %s", m.Name, m.State)
		}
	}
	l, ok := byRole(ms, "leader")
	if !ok {
		return fmt.Errorf("no leader: %v", ms)
	}
	if _, ok := byRole(ms, "sync_standby"); !ok && !c.opts.Async {
		return fmt.Errorf("no synchronous standby: %v", ms)
	}
	if err := c.writeProbe(ctx, l.Name); err != nil {
		return err
	}
	url, err := c.MemberURL(l.Name, "postgres")
	if err != nil {
		return err
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var streaming int
	if err := conn.QueryRow(qctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&streaming); err != nil {
		return err
	}
	if streaming != len(c.nodes)-1 {
		return fmt.Errorf("%d of %d standbys stream from %s", streaming, len(c.nodes)-1, l.Name)
	}
	return nil
}
