// Package dbconn opens the services' PostgreSQL pools and applies or checks an
// embedded goose migration tree. paydb and lockdb each own a tree; this package
// holds the mechanics they share — and what keeps a commit durable across a
// failover: pools that reach only the primary and follow it (primary.go),
// transactions whose COMMIT waits for the synchronous standby and reports a wait
// that was cancelled (durable.go), and the start-up refusal of a database whose
// fsync is off (durability.go).
package dbconn

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// ErrSchemaBehind says the database has migrations still to apply.
var ErrSchemaBehind = errors.New("database schema is behind")

// ErrURLUnparsable is what a database URL that cannot be parsed gives. pgx's own
// parse error may quote the URL, password included: it is never passed on.
var ErrURLUnparsable = errors.New("database URL cannot be parsed")

// CheckURL reports whether url (the libpq PG* environment when empty) parses as a
// connection string, without quoting it: configuration validation calls it so that
// a bad URL is a configuration error (exit 2, docs/contracts/configuration.md), not
// a start-up failure.
func CheckURL(url string) error {
	if _, err := pgxpool.ParseConfig(url); err != nil {
		return ErrURLUnparsable
	}
	return nil
}

// Open builds a pool for url (libpq PG* environment when empty) with maxConns
// connections. It does not wait for the server: readiness reports that.
//
// url may name several hosts (host1:port1,host2:port2); every connection the
// pool makes goes to a server that accepts writes, whatever the URL's
// target_session_attrs says (primary.go), so the pool follows the primary across
// a failover. Every connection also watches for the cancelled synchronous
// replication warning that Commit and ExecCommit report (durable.go).
func Open(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, ErrURLUnparsable
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.ConnConfig.OnNotice = onNotice
	r := followPrimary(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	r.pool.Store(pool)
	return pool, nil
}

// Tree is one embedded migration tree and the goose version table it keeps.
type Tree struct {
	FS       fs.FS  // the .sql files at its root
	Table    string // goose version table
	LockID   int64  // advisory lock that serialises concurrent migrate runs
	Database string // name for messages: "paydb", "lockdb"
	// Grants is the tree's grants file (its grants.sql): the privileges of each
	// runtime login, by role setting, that migrate applies after the migrations
	// (service.Database.Roles). Empty: the tree has none.
	Grants string
}

func (t Tree) provider(pool *pgxpool.Pool, logger *slog.Logger) (*goose.Provider, func() error, error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(t.LockID))
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	opts := []goose.ProviderOption{goose.WithTableName(t.Table), goose.WithSessionLocker(locker)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, t.FS, opts...)
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("%s migrations: %w", t.Database, err)
	}
	return p, db.Close, nil
}

// Migrate applies every pending migration. Concurrent and repeated runs are safe:
// goose holds a session advisory lock while it works.
func (t Tree) Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int64, error) {
	p, closeDB, err := t.provider(pool, logger)
	if err != nil {
		return 0, err
	}
	defer closeDB()
	if _, err := p.Up(ctx); err != nil {
		return 0, fmt.Errorf("%s migrate: %w", t.Database, err)
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s version: %w", t.Database, err)
	}
	return v, nil
}

// RequireCurrent is the start-up check of a service that serves the database: nil
// when the schema is current; ErrSchemaBehind (wrapped) with the command that
// brings it up to date; or why the version could not be read.
func (t Tree) RequireCurrent(ctx context.Context, pool *pgxpool.Pool, migrateCommand string) error {
	err := t.Check(ctx, pool)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrSchemaBehind):
		return fmt.Errorf("%w; run `%s` first", err, migrateCommand)
	default:
		return fmt.Errorf("%s: cannot verify the schema: %w", t.Database, err)
	}
}

// Check returns ErrSchemaBehind (wrapped, with both versions) when the database
// lacks migrations this binary embeds.
func (t Tree) Check(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Table).Scan(&exists); err != nil {
		return fmt.Errorf("%s: reading schema version: %w", t.Database, err)
	}
	if !exists {
		return fmt.Errorf("%w: %s has no migrations applied", ErrSchemaBehind, t.Database)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, t.FS, goose.WithTableName(t.Table))
	if err != nil {
		return fmt.Errorf("%s migrations: %w", t.Database, err)
	}
	current, target, err := p.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("%s: reading schema version: %w", t.Database, err)
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("%s: reading schema version: %w", t.Database, err)
	}
	if pending || current < target {
		return fmt.Errorf("%w: %s is at version %d, this binary needs %d", ErrSchemaBehind, t.Database, current, target)
	}
	return nil
}
