package dbconn

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// followPrimary makes every connection of the pool go to a server that accepts
// writes, and has the pool drop every connection it holds once one of them shows
// that their server is gone or no longer the primary.
//
// Writable, per connection: pgconn runs ValidateConnect on each host of a
// multi-host URL in turn until one passes, which is target_session_attrs=read-write
// — set here whatever the URL says, because a service that writes never wants a
// standby, and a check made only at start-up would not hold after a failover
// (pgxpool reconnects at any time, and a demoted server's address may come back
// as a standby).
//
// Dropped together: after a failover every connection the pool holds leads to the
// dead (or demoted) server. pgxpool discards a connection when it breaks in use,
// and pings one that sat idle for more than a second before lending it, but a
// busy pool would still lend each dead connection once, failing one request per
// connection. So the first request that meets a dead server resets the pool; the
// connections made afterwards find the new primary.
func followPrimary(cfg *pgxpool.Config) *resetter {
	cfg.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	r := &resetter{}
	cfg.ConnConfig.Tracer = r
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		c.PgConn().CustomData()[generationKey] = r.generation.Load()
		if prev != nil {
			return prev(ctx, c)
		}
		return nil
	}
	return r
}

const generationKey = "lock.dev/dbconn.generation"

// resetter is the pool's tracer: it watches every statement's outcome for a
// sign that the server has gone.
type resetter struct {
	pool       atomic.Pointer[pgxpool.Pool]
	generation atomic.Int64 // bumped by each reset; connections remember theirs
}

// connState travels in a statement's (or batch's) context: whether its
// connection was open when the statement began. A statement on a connection an
// earlier failure had closed fails with "conn closed", which says nothing new
// about the server. In a batch it is updated after each query.
type connState struct{ open bool }

type connStateKey struct{}

func (r *resetter) start(ctx context.Context, c *pgx.Conn) context.Context {
	return context.WithValue(ctx, connStateKey{}, &connState{open: !c.IsClosed()})
}

func (r *resetter) TraceQueryStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return r.start(ctx, c)
}

func (r *resetter) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	r.check(ctx, c, d.Err)
}

func (r *resetter) TraceBatchStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return r.start(ctx, c)
}

func (r *resetter) TraceBatchQuery(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.check(ctx, c, d.Err)
}

func (r *resetter) TraceBatchEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchEndData) {
	r.check(ctx, c, d.Err)
}

// check resets the pool when err says the connection's server is gone: the
// error says so (ServerGone), or the statement broke its open connection for a
// reason other than the caller's deadline (pgconn reports a simple-protocol
// statement sent to a dead server as "conn closed"). Once per generation:
// connections made before the last reset are stale already, and each is dropped
// when it fails, without resetting the fresh ones again.
func (r *resetter) check(ctx context.Context, c *pgx.Conn, err error) {
	st, _ := ctx.Value(connStateKey{}).(*connState)
	wasOpen := st != nil && st.open
	if st != nil {
		st.open = !c.IsClosed() // what the next query of a batch starts from
	}
	if err == nil || ownDeadline(err) {
		return
	}
	if !ServerGone(err) && !(wasOpen && c.IsClosed()) {
		return
	}
	gen, _ := c.PgConn().CustomData()[generationKey].(int64)
	if !r.generation.CompareAndSwap(gen, gen+1) {
		return
	}
	if p := r.pool.Load(); p != nil {
		p.Reset()
	}
}

// ownDeadline: the caller's context ended, or a read or write timed out — a
// failure of this call's patience, which says nothing about the server.
func ownDeadline(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// ServerGone reports whether err means the server behind a connection is gone or
// no longer the primary — so every other connection to it is as dead — rather
// than a failure of this one statement: the connection broke (reset, closed,
// EOF), the server is shutting down or restarting (57P01, 57P02, 57P03), or it
// refused a write because it is read-only now (25006). A timeout or a cancelled
// context says nothing about the server and is not counted.
func ServerGone(err error) bool {
	if ownDeadline(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", "25006":
			return true
		}
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, net.ErrClosed)
}
