package dbconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/serve"
)

// SyncStandbysGauge is the gauge of every service with a database: how many
// synchronous standbys the primary's synchronous_standby_names requires a commit
// to wait for. NotSynchronousEvent is the WARN logged when it is 0, and
// SynchronousEvent the INFO logged when it is not (at start-up, and when a
// re-read finds a new value). Project additions beyond the pinned tables
// (docs/contracts/observability.md).
const (
	SyncStandbysGauge   = "db_synchronous_standbys"
	NotSynchronousEvent = "replication_not_synchronous"
	SynchronousEvent    = "replication_synchronous"
)

// ReplicationInterval is how often a service re-reads synchronous_standby_names:
// a failover to a standby whose own setting differs (an unconfigured one has none)
// or an operator's reload changes it without restarting the services.
const ReplicationInterval = 30 * time.Second

// preconditionTimeout bounds each read of the check, at start-up and after.
const preconditionTimeout = 5 * time.Second

// ErrTransactionPooling says the service's database connections go through a
// pooler that hands one client connection different server sessions (PgBouncer
// in transaction or statement mode), which the services do not support.
var ErrTransactionPooling = errors.New("database connections go through a transaction-pooling proxy")

// ErrBackendKeyRewritten says a connection's BackendKeyData pid is not the pid of
// the server session behind it (a proxy such as PgBouncer in front of PostgreSQL,
// in any pool mode): a service that looks its backend up by that pid cannot run
// there.
var ErrBackendKeyRewritten = errors.New("database connections do not report their server session's pid")

// Preconditions says what CheckPreconditions checks for one service.
type Preconditions struct {
	// Database names the database in messages and logs: "paydb", "lockdb".
	Database string
	// BackendPID: the service looks a connection's server session up in
	// pg_stat_activity by the pid the connection announced at start-up
	// (rail-proxy resolving a COMMIT whose answer was lost), so that pid must be
	// the server session's own.
	BackendPID bool
	// Interval between re-reads of synchronous_standby_names; 0 is
	// ReplicationInterval.
	Interval time.Duration
}

// CheckPreconditions is the start-up check, shared by every service with a
// database, of what the durability rule relies on and nothing else enforces
// (docs/operations/high-availability.md):
//
//   - Connection pooling. A pooler that gives one client connection several
//     server sessions (PgBouncer's transaction and statement modes) breaks the
//     session state the services keep on a connection — rail-proxy's check that
//     the backend which was sent a COMMIT is past it, the reconciler's pass lock,
//     migrate's lock. Detected as well as a client can (ProbePooling), and refused:
//     an error wrapping ErrTransactionPooling (or ErrBackendKeyRewritten when
//     p.BackendPID), which the service returns, so it exits non-zero.
//   - Synchronous replication. How many synchronous standbys the primary requires
//     is shown on the gauge SyncStandbysGauge, registered in reg from start-up;
//     none is logged at WARN (NotSynchronousEvent): a failover may then lose
//     commits the service acknowledged. That can be legitimate (one server on
//     durable storage, managed PostgreSQL that replicates its storage), so it is
//     reported, never refused. Only synchronous_standby_names counts: every
//     transaction the services rely on raises synchronous_commit itself
//     (RaiseSyncCommitSQL), so the server's default for it does not matter.
//
// The setting is re-read every p.Interval until ctx ends or stop is called (a
// failover can change it), each read bounded; a change is logged once, and a
// failed read is logged once until a read succeeds again, keeping the last value.
// stop waits for the re-reading to end; call it before the pool is closed.
func CheckPreconditions(ctx context.Context, pool *pgxpool.Pool, p Preconditions, logger *slog.Logger, reg prometheus.Registerer) (stop func(), err error) {
	gauge, err := newSyncStandbysGauge(reg)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, preconditionTimeout)
	defer cancel()
	probe, err := ProbePooling(cctx, pool)
	if err != nil {
		return nil, fmt.Errorf("%s: checking how connections reach the server (a PgBouncer in statement pooling mode fails this way; only session pooling is supported): %w", p.Database, err)
	}
	if err := probe.Verdict(p.BackendPID); err != nil {
		return nil, fmt.Errorf("%s: %w", p.Database, err)
	}

	w := &replicationWatch{pool: pool, database: p.Database, logger: logger, gauge: gauge}
	if err := w.read(cctx); err != nil {
		return nil, err
	}
	interval := p.Interval
	if interval <= 0 {
		interval = ReplicationInterval
	}
	wctx, cancelWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.run(wctx, interval) })
	return func() {
		cancelWatch()
		wg.Wait()
	}, nil
}

// RegisterPreconditionMetrics registers the gauge CheckPreconditions registers,
// for a registry built the way a service builds its own but without a database
// (each service's MetricsRegistry, which the alert and dashboard checks read).
func RegisterPreconditionMetrics(reg prometheus.Registerer) error {
	_, err := newSyncStandbysGauge(reg)
	return err
}

func newSyncStandbysGauge(reg prometheus.Registerer) (prometheus.Gauge, error) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: SyncStandbysGauge,
		Help: "Synchronous standbys the database's primary requires each commit to wait for (synchronous_standby_names); 0: a failover may lose acknowledged commits.",
	})
	if err := reg.Register(gauge); err != nil {
		return nil, fmt.Errorf("register %s: %w", SyncStandbysGauge, err)
	}
	return gauge, nil
}

// replicationWatch keeps SyncStandbysGauge current and logs its changes. Only
// its own goroutine uses it after the start-up read.
type replicationWatch struct {
	pool     *pgxpool.Pool
	database string
	logger   *slog.Logger
	gauge    prometheus.Gauge

	known   bool   // a read has succeeded
	setting string // the value last read
	failing bool   // the last read failed, and that was logged
}

func (w *replicationWatch) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, preconditionTimeout)
		err := w.read(rctx)
		cancel()
		switch {
		case err == nil:
			w.failing = false
		case ctx.Err() != nil:
			return
		case !w.failing:
			w.failing = true
			w.logger.Warn("cannot re-read synchronous_standby_names; "+SyncStandbysGauge+" keeps its last value until a read succeeds",
				"event", "replication_check_failed", "database", w.database, "error", serve.Redact(err.Error()))
		}
	}
}

// read reads synchronous_standby_names from the server the pool reaches (the
// primary), sets the gauge and logs when the value is new.
func (w *replicationWatch) read(ctx context.Context) error {
	var setting string
	if err := w.pool.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&setting); err != nil {
		return fmt.Errorf("%s: reading synchronous_standby_names: %w", w.database, err)
	}
	if w.known && setting == w.setting {
		return nil
	}
	n, err := ParseSyncStandbyNames(setting)
	if err != nil {
		return fmt.Errorf("%s: %w", w.database, err)
	}
	w.known, w.setting = true, setting
	w.gauge.Set(float64(n))
	if n == 0 {
		w.logger.Warn(w.database+"'s primary requires no synchronous standby (synchronous_standby_names is empty): a failover to a standby may lose commits this service has acknowledged — granted tokens, admitted intents, raised marks. "+
			"Legitimate only on a single server with durable storage or on managed PostgreSQL that replicates its storage synchronously (then silence the LockdevReplicationNotSynchronous alert); "+
			"otherwise name a synchronous standby in synchronous_standby_names (docs/operations/high-availability.md)",
			"event", NotSynchronousEvent, "database", w.database, "synchronousStandbys", 0)
		return nil
	}
	w.logger.Info(w.database+"'s primary makes every commit wait for synchronous standbys",
		"event", SynchronousEvent, "database", w.database, "synchronousStandbys", n, "synchronousStandbyNames", setting)
	return nil
}

// ErrSyncStandbyNames says a synchronous_standby_names value does not follow
// PostgreSQL's grammar. A server never reports such a value (it refuses to take
// one), so this means the grammar has grown beyond what ParseSyncStandbyNames
// knows.
var ErrSyncStandbyNames = errors.New("synchronous_standby_names cannot be parsed")

// ParseSyncStandbyNames returns how many synchronous standbys a
// synchronous_standby_names value makes each commit wait for, per PostgreSQL 15's
// grammar (src/backend/replication/syncrep_gram.y and syncrep_scanner.l):
//
//	''                          → 0: no synchronous replication
//	s1, s2, …                   → 1 (the same as FIRST 1 (s1, s2, …))
//	n (s1, …), FIRST n (s1, …)  → n, by priority
//	ANY n (s1, …)               → n, quorum
//
// A name is an identifier, a number, "*" (any standby) or a double-quoted name
// ("" inside stands for one "); ANY and FIRST are keywords in any case. n must be
// at least 1. The count may exceed the names listed ("*" matches any number of
// standbys): it is what the primary requires, not what is connected.
func ParseSyncStandbyNames(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	toks, err := syncRepTokens(s)
	if err != nil {
		return 0, err
	}
	bad := func(why string) (int, error) {
		return 0, fmt.Errorf("%w: %q: %s", ErrSyncStandbyNames, s, why)
	}
	// standby_list: name (',' name)*, consuming toks[i:j] exactly.
	list := func(ts []syncRepToken) bool {
		if len(ts) == 0 || len(ts)%2 == 0 {
			return false
		}
		for k, t := range ts {
			if k%2 == 0 && t.kind != tokName && t.kind != tokNum {
				return false
			}
			if k%2 == 1 && t.kind != ',' {
				return false
			}
		}
		return true
	}
	if len(toks) == 0 {
		return bad("no standby named")
	}
	method := 0 // tokens before NUM: 0, or 1 for ANY / FIRST
	if toks[0].kind == tokAny || toks[0].kind == tokFirst {
		method = 1
	}
	// n ( list ) with an optional method keyword.
	if len(toks) >= method+4 && toks[method].kind == tokNum && toks[method+1].kind == '(' && toks[len(toks)-1].kind == ')' {
		if !list(toks[method+2 : len(toks)-1]) {
			return bad("the list in parentheses is not names separated by commas")
		}
		n, err := strconv.Atoi(toks[method].text)
		if err != nil {
			return bad("the number of standbys is out of range")
		}
		if n <= 0 {
			return bad("the number of synchronous standbys must be greater than zero")
		}
		return n, nil
	}
	if method == 0 && list(toks) {
		return 1, nil
	}
	return bad("syntax error")
}

type syncRepTokenKind int

const (
	tokName syncRepTokenKind = iota + 256
	tokNum
	tokAny
	tokFirst
	// ',' '(' ')' are their own characters
)

type syncRepToken struct {
	kind syncRepTokenKind
	text string
}

// syncRepTokens splits s as syncrep_scanner.l does: whitespace separates; an
// identifier starts with a letter, '_' or a byte ≥ 0x80 and goes on with those,
// digits and '$'; the longest match wins, and an identifier spelled any or first
// (any case) is the keyword; digits are a number; "*" is a name; a double-quoted
// name runs to the next lone ".
func syncRepTokens(s string) ([]syncRepToken, error) {
	identStart := func(c byte) bool {
		return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_' || c >= 0x80
	}
	identCont := func(c byte) bool { return identStart(c) || c >= '0' && c <= '9' || c == '$' }
	var toks []syncRepToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == ',' || c == '(' || c == ')':
			toks = append(toks, syncRepToken{kind: syncRepTokenKind(c)})
			i++
		case c == '*':
			toks = append(toks, syncRepToken{kind: tokName, text: "*"})
			i++
		case c >= '0' && c <= '9':
			j := i
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			toks = append(toks, syncRepToken{kind: tokNum, text: s[i:j]})
			i = j
		case identStart(c):
			j := i
			for j < len(s) && identCont(s[j]) {
				j++
			}
			word := s[i:j]
			kind := tokName
			switch strings.ToLower(word) {
			case "any":
				kind = tokAny
			case "first":
				kind = tokFirst
			}
			toks = append(toks, syncRepToken{kind: kind, text: word})
			i = j
		case c == '"':
			var name strings.Builder
			j := i + 1
			for {
				if j >= len(s) {
					return nil, fmt.Errorf("%w: %q: unterminated quoted identifier", ErrSyncStandbyNames, s)
				}
				if s[j] == '"' {
					if j+1 < len(s) && s[j+1] == '"' {
						name.WriteByte('"')
						j += 2
						continue
					}
					break
				}
				name.WriteByte(s[j])
				j++
			}
			toks = append(toks, syncRepToken{kind: tokName, text: name.String()})
			i = j + 1
		default:
			return nil, fmt.Errorf("%w: %q: unexpected character %q", ErrSyncStandbyNames, s, c)
		}
	}
	return toks, nil
}

// PoolingProbe is what ProbePooling saw: the pid a connection announced when it
// connected (its BackendKeyData), and pg_backend_pid() read on it in two
// transactions, with another connection running a transaction in between.
type PoolingProbe struct {
	AnnouncedPID uint32 // BackendKeyData of the first connection
	First        uint32 // pg_backend_pid() on the first connection
	Other        uint32 // pg_backend_pid() inside an open transaction on a second connection
	Again        uint32 // pg_backend_pid() on the first connection again, while that transaction is open
}

// ProbePooling opens two connections the way the pool does (same URL, same
// primary-only rule; outside the pool, so its size does not matter) and reads
// pg_backend_pid() on the first, then inside a transaction it opens on the
// second, then on the first again while that transaction is still open.
//
// Connected to PostgreSQL itself, or through a pooler in session mode, each
// client connection is one server session for its whole life: First and Again
// are equal, Other differs. A pooler in transaction mode lends a server session
// only for a transaction: idle between its statements, the first connection holds
// none, so the second one's transaction is given the one it just used (PgBouncer
// reuses the most recently released first), and the first connection's next
// statement gets another. Statement mode refuses the transaction block (an
// error). The probe uses the simple protocol, which every mode carries.
func ProbePooling(ctx context.Context, pool *pgxpool.Pool) (PoolingProbe, error) {
	var p PoolingProbe
	cfg := pool.Config().ConnConfig.Copy()
	c1, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return p, fmt.Errorf("connect: %w", err)
	}
	defer c1.Close(context.WithoutCancel(ctx))
	c2, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return p, fmt.Errorf("connect: %w", err)
	}
	defer c2.Close(context.WithoutCancel(ctx))

	p.AnnouncedPID = c1.PgConn().PID()
	pid := func(c *pgx.Conn, dst *uint32) error {
		var v int64
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&v); err != nil {
			return fmt.Errorf("SELECT pg_backend_pid(): %w", err)
		}
		*dst = uint32(v)
		return nil
	}
	if err := pid(c1, &p.First); err != nil {
		return p, err
	}
	if _, err := c2.Exec(ctx, "BEGIN", pgx.QueryExecModeSimpleProtocol); err != nil {
		return p, fmt.Errorf("BEGIN: %w", err)
	}
	if err := pid(c2, &p.Other); err != nil {
		return p, err
	}
	if err := pid(c1, &p.Again); err != nil {
		return p, err
	}
	if _, err := c2.Exec(ctx, "ROLLBACK", pgx.QueryExecModeSimpleProtocol); err != nil {
		return p, fmt.Errorf("ROLLBACK: %w", err)
	}
	return p, nil
}

// Verdict refuses what no direct or session-pooled connection can show: one
// client connection served by two server sessions, or two client connections open
// at once sharing one (ErrTransactionPooling). With backendPID it also refuses a
// connection whose announced pid is not its server session's
// (ErrBackendKeyRewritten), as any proxy in front of PostgreSQL shows.
func (p PoolingProbe) Verdict(backendPID bool) error {
	if p.First != p.Again || p.First == p.Other {
		return fmt.Errorf("%w: one connection was served by server sessions %d and %d, and a second connection's transaction by %d; "+
			"PgBouncer in transaction or statement mode breaks the session state the durability rule relies on (a COMMIT's backend, advisory locks). "+
			"Use session pooling, or connect to PostgreSQL directly (docs/operations/high-availability.md)",
			ErrTransactionPooling, p.First, p.Again, p.Other)
	}
	if backendPID && p.AnnouncedPID != p.First {
		return fmt.Errorf("%w: the connection announced pid %d but its server session is %d, so a proxy (PgBouncer, in any pool mode) stands in front of PostgreSQL; "+
			"this service finds a COMMIT whose answer was lost by its backend's pid and cannot run through it. Connect to PostgreSQL directly (docs/operations/high-availability.md)",
			ErrBackendKeyRewritten, p.AnnouncedPID, p.First)
	}
	return nil
}
