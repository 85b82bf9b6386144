package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/testkit/faultproxy"
)

// PairOptions tune a primary and its standby.
type PairOptions struct {
	// Sync makes the standby synchronous: synchronous_standby_names names it and
	// synchronous_commit is on, so a commit returns only once the standby has
	// flushed its WAL. Otherwise the standby streams asynchronously and may lag.
	Sync bool
	// Durable, MaxConnections and Log as for Start, for both servers.
	Durable        bool
	MaxConnections int
	Log            *os.File
}

// standbyName is the standby's application_name, the name synchronous
// replication waits for.
const standbyName = "standby"

// Pair is a primary and a streaming standby made from it with pg_basebackup. The
// standby streams through a relay in this process, so that holding it back stops
// WAL at the primary's door: a stopped receiver alone would still find what the
// kernel had buffered for it once continued, and an asynchronous tail the primary
// never really shipped would survive its crash.
//
// A test (or lockdemo) connects through URL, which names both servers with
// target_session_attrs=read-write: clients find whichever is the primary. It can
// then kill the primary (KillPrimary), promote the standby (Promote), and make
// replication lag on purpose (HoldStandby, ReleaseStandby).
type Pair struct {
	opts    PairOptions
	primary *Cluster
	standby *Cluster // nil once promoted
	nodes   [2]*Cluster
	relay   *faultproxy.Proxy // the standby's replication connection to the primary

	mu   sync.Mutex
	held bool
}

// StartPair starts a primary, takes a base backup of it, and starts the standby
// on it. It returns when the standby streams (and, with Sync, is the primary's
// synchronous standby).
func StartPair(ctx context.Context, opts PairOptions) (p *Pair, err error) {
	primary, err := newCluster(opts.Log)
	if err != nil {
		return nil, err
	}
	p = &Pair{opts: opts, primary: primary}
	defer func() {
		if err != nil {
			_ = p.Stop()
		}
	}()
	if err := primary.initdb(ctx); err != nil {
		return nil, err
	}
	base := Options{Durable: opts.Durable, MaxConnections: opts.MaxConnections}
	settings := append(baseSettings(primary.dir, base),
		"wal_level=replica", "max_wal_senders=4", "max_replication_slots=4",
		// Replication itself must not be what the pair trades away for speed.
		"synchronous_commit=on")
	if opts.Sync {
		settings = append(settings, "synchronous_standby_names="+standbyName)
	}
	if err := primary.start(ctx, settings); err != nil {
		return nil, err
	}
	p.nodes[0] = primary

	standby, err := newCluster(opts.Log)
	if err != nil {
		return nil, err
	}
	p.standby, p.nodes[1] = standby, standby
	// The slot keeps the primary's WAL until the standby has it, however long the
	// standby is held back.
	if err := standby.run(ctx, "pg_basebackup", "-D", standby.data(), "-h", "127.0.0.1",
		"-p", fmt.Sprint(primary.port), "-U", "postgres", "-X", "stream", "-c", "fast", "--no-sync",
		"-C", "-S", standbyName); err != nil {
		return nil, err
	}
	signal := filepath.Join(standby.data(), "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return nil, fmt.Errorf("pgcluster: standby.signal: %w", err)
	}
	if err := standby.own(signal, 0o600); err != nil {
		return nil, err
	}
	if p.relay, err = faultproxy.New(fmt.Sprintf("127.0.0.1:%d", primary.port)); err != nil {
		return nil, err
	}
	// The standby has no synchronous_standby_names of its own: once promoted it
	// has no standby, and would otherwise wait for one forever.
	settings = append(baseSettings(standby.dir, base),
		"synchronous_commit=on",
		// A standby whose primary died retries the stream at this interval; a
		// promotion waits for the retry sleep to end (5 s by default).
		"wal_retrieve_retry_interval=100ms",
		fmt.Sprintf("primary_conninfo=host=127.0.0.1 port=%d user=postgres application_name=%s", p.relay.Port(), standbyName),
		"primary_slot_name="+standbyName)
	if err := standby.start(ctx, settings); err != nil {
		return nil, err
	}
	if err := p.waitStreaming(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// waitStreaming waits until the primary sees its standby streaming, and with Sync
// as its synchronous standby.
func (p *Pair) waitStreaming(ctx context.Context) error {
	want := "async"
	if p.opts.Sync {
		want = "sync"
	}
	return poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n int
		err := queryRow(ctx, p.primary.URL("postgres"),
			"SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2",
			[]any{standbyName, want}, &n)
		return n == 1, err
	})
}

// URL is the connection string of database db naming both servers, the original
// primary first, with target_session_attrs=read-write: a client connects to
// whichever accepts writes.
func (p *Pair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		p.nodes[0].port, p.nodes[1].port, db)
}

// Primary is the server that accepts writes now (the old standby once promoted).
func (p *Pair) Primary() *Cluster {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.primary
}

// Standby is the standby, or nil once it has been promoted.
func (p *Pair) Standby() *Cluster {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.standby
}

// CreateDatabase creates database name on the primary (the standby replays it).
func (p *Pair) CreateDatabase(ctx context.Context, name, template string) error {
	return p.Primary().CreateDatabase(ctx, name, template)
}

// HoldStandby makes the standby fall behind: the relay stops passing replication
// traffic either way, and every standby process (postmaster, startup, walreceiver,
// …) is stopped with SIGSTOP. With Sync, every commit on the primary now waits
// (wait_event SyncRep) until ReleaseStandby; without, commits go on and the
// standby lags.
func (p *Pair) HoldStandby() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.standby == nil {
		return errors.New("pgcluster: no standby to hold")
	}
	if p.held {
		return errors.New("pgcluster: standby already held")
	}
	p.relay.Hold()
	if err := p.standby.hold(); err != nil {
		p.relay.Forward()
		return err
	}
	p.held = true
	return nil
}

// ReleaseStandby lets the standby run and catch up again.
func (p *Pair) ReleaseStandby() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		return
	}
	p.standby.release()
	p.relay.Forward()
	p.held = false
}

// KillPrimary ends every process of the primary with SIGKILL (no shutdown, no
// checkpoint, no WAL sent after it) and waits for them. Replication traffic the
// relay was holding is dropped with it: it never left the primary.
func (p *Pair) KillPrimary() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.primary == nil {
		return errors.New("pgcluster: no primary to kill")
	}
	p.primary.kill()
	p.relay.Cut()
	return nil
}

// Promote promotes the standby with `pg_ctl promote` and returns once it accepts
// writes. The standby must not be held. Afterwards Primary is the promoted server
// and Standby is nil; it runs alone, with no standby of its own.
func (p *Pair) Promote(ctx context.Context) error {
	p.mu.Lock()
	standby, held := p.standby, p.held
	p.mu.Unlock()
	if standby == nil {
		return errors.New("pgcluster: no standby to promote")
	}
	if held {
		return errors.New("pgcluster: the standby is held; release it before promoting")
	}
	if err := standby.run(ctx, "pg_ctl", "promote", "-D", standby.data(), "-w", "-t", "60"); err != nil {
		return err
	}
	err := poll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
		var recovering bool
		var readOnly string
		if err := queryRow(ctx, standby.URL("postgres"), "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
			nil, &recovering, &readOnly); err != nil {
			return false, err
		}
		return !recovering && readOnly == "off", nil
	})
	if err != nil {
		return fmt.Errorf("pgcluster: promoted standby does not accept writes: %w", err)
	}
	p.mu.Lock()
	p.primary, p.standby = standby, nil
	p.mu.Unlock()
	return nil
}

// WaitReplayed waits until the standby has replayed everything the primary had
// flushed when it was called (so a read on the standby sees every commit made
// before).
func (p *Pair) WaitReplayed(ctx context.Context) error {
	p.mu.Lock()
	primary, standby := p.primary, p.standby
	p.mu.Unlock()
	if standby == nil {
		return errors.New("pgcluster: no standby")
	}
	var lsn string
	if err := queryRow(ctx, primary.URL("postgres"), "SELECT pg_current_wal_flush_lsn()::text", nil, &lsn); err != nil {
		return err
	}
	return poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		var done bool
		err := queryRow(ctx, standby.URL("postgres"), "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", []any{lsn}, &done)
		return done, err
	})
}

// WaitSyncRep waits until a backend of the primary waits for the synchronous
// standby (pg_stat_activity.wait_event SyncRep: a COMMIT held by HoldStandby) and
// returns its pid.
func (p *Pair) WaitSyncRep(ctx context.Context) (int, error) {
	var pid int
	err := poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		var pids []int
		err := queryRow(ctx, p.Primary().URL("postgres"),
			"SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE wait_event = 'SyncRep'", nil, &pids)
		if err != nil || len(pids) == 0 {
			return false, err
		}
		if len(pids) > 1 {
			return false, fmt.Errorf("pgcluster: %d backends wait for the standby, want one", len(pids))
		}
		pid = pids[0]
		return true, nil
	})
	if err != nil {
		return 0, fmt.Errorf("pgcluster: no backend waits for the synchronous standby: %w", err)
	}
	return pid, nil
}

// CancelBackend cancels what backend pid of the primary is doing
// (pg_cancel_backend), or ends its session (pg_terminate_backend) when terminate
// is set. For a COMMIT waiting for the synchronous standby, PostgreSQL then
// reports the commit with a WARNING instead of waiting.
func (p *Pair) CancelBackend(ctx context.Context, pid int, terminate bool) error {
	fn := "pg_cancel_backend"
	if terminate {
		fn = "pg_terminate_backend"
	}
	var ok bool
	if err := queryRow(ctx, p.Primary().URL("postgres"), "SELECT "+fn+"($1)", []any{pid}, &ok); err != nil {
		return fmt.Errorf("pgcluster: %s(%d): %w", fn, pid, err)
	}
	if !ok {
		return fmt.Errorf("pgcluster: %s(%d): no such backend", fn, pid)
	}
	return nil
}

// Stop stops both servers and removes their files.
func (p *Pair) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.relay != nil {
		p.relay.Close()
	}
	for _, c := range p.nodes {
		if c != nil {
			_ = c.Stop()
		}
	}
	if p.primary != nil && p.nodes[0] == nil { // failed before the primary ran
		p.primary.remove()
	}
	return nil
}

// queryRow runs one query on a fresh connection to url.
func queryRow(ctx context.Context, url, sql string, args []any, dest ...any) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(cctx, sql, args...).Scan(dest...)
}

// poll calls check until it reports done, ctx ends or bound passes.
func poll(ctx context.Context, bound time.Duration, check func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var last error
	for {
		done, err := check(ctx)
		if done && err == nil {
			return nil
		}
		if err != nil && ctx.Err() == nil { // not the bound itself cutting a check short
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
