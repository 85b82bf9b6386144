package service

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/serve"
)

// Database is the database a service serves: where it is, how to check it at
// start-up, and the migration tree that brings its schema up to date.
type Database struct {
	Tree     dbconn.Tree // the embedded migrations; Tree.Database names it ("paydb") in messages
	URL      string      // the connection URL; empty means the libpq PG* environment
	MaxConns int         // the pool's size
	// MinConns and ConnsBound bound MaxConns (Spec.Check); MinConns 0 means 1.
	MinConns, ConnsBound int

	// UnsafeNonDurable is UNSAFE_NON_DURABLE_DB: serve a database whose fsync is
	// off (logged at ERROR) instead of refusing it.
	UnsafeNonDurable bool
	// MigrateCommand is the command a refusal of a schema that is behind names,
	// e.g. "rail-proxy migrate".
	MigrateCommand string
	// CheckTimeout bounds each start-up check: the schema's version (with Check),
	// then the server's durability.
	CheckTimeout time.Duration
	// Check, when set, runs before the schema check, under the same bound: a
	// service's own refusal of a server it must not serve (a standby).
	Check func(ctx context.Context, pool *pgxpool.Pool) error
	// BackendPID: the service finds a COMMIT whose answer was lost by its
	// backend's pid, so a pooler in front of the server is refused
	// (dbconn.Preconditions).
	BackendPID bool
	// Roles are the runtime logins migrate grants the tree's privileges to,
	// by setting (PAYDB_ROLE_RAIL_PROXY, …, LOCKDB_ROLE_LOCK_SERVER); an empty
	// one gets no grant step (docs/contracts/workload-identity.md, least privilege).
	Roles Roles
}

// Roles maps a role setting to the login it names (read after parsing: the
// settings write through the pointers).
type Roles map[string]*string

// Login is the login env names; "" when unset.
func (r Roles) Login(env string) string {
	if p := r[env]; p != nil {
		return *p
	}
	return ""
}

// RoleSettings are the role settings of each tree, by database.
// PAYDB_ROLE_OPERATOR is the operators' login for `reconciler exceptions`, not
// a service's: it reads the exceptions' context and records decisions.
var RoleSettings = map[string][]string{
	"paydb":  {"PAYDB_ROLE_RAIL_PROXY", "PAYDB_ROLE_PAYMENT", "PAYDB_ROLE_RECONCILER", "PAYDB_ROLE_OPERATOR"},
	"lockdb": {"LOCKDB_ROLE_LOCK_SERVER"},
}

// BindRoles binds the role settings of database ("paydb", "lockdb") into r.
func BindRoles(s *serve.Settings, database string, r *Roles) {
	*r = Roles{}
	for _, env := range RoleSettings[database] {
		p := new(string)
		s.String(p, env, "", "migrate: the login granted this tree's privileges for its service (created by the operator); empty: no grant step")
		(*r)[env] = p
	}
}

// name is the database's name in messages: "paydb", "lockdb".
func (d Database) name() string { return d.Tree.Database }

// check refuses, naming the setting (PAYDB_URL, PAYDB_MAX_CONNS, …), a URL that
// does not parse and a pool size out of bounds. The URL is never quoted: it may
// carry a password.
func (d Database) check() error {
	env := strings.ToUpper(d.name())
	if err := dbconn.CheckURL(d.URL); err != nil {
		return serve.Invalid(env+"_URL", "cannot be parsed as a PostgreSQL connection string")
	}
	if lo := max(d.MinConns, 1); d.MaxConns < lo || d.MaxConns > d.ConnsBound {
		return serve.Invalid(env+"_MAX_CONNS", "must be between %d and %d, got %d", lo, d.ConnsBound, d.MaxConns)
	}
	return nil
}

// libpqHostVars are the variables from which libpq (and pgx) take a server when
// the URL names none. Without any of them an empty URL means the local socket
// directory, which is rarely what was meant.
var libpqHostVars = []string{"PGHOST", "PGHOSTADDR", "PGSERVICE"}

// checkDBURLSet refuses, at start and before migrate (exit 2, one line), a
// database URL left empty when the libpq environment names no server either:
// an unset PAYDB_URL is a forgotten setting, and the socket error pgx would
// give for it ("dial unix /var/run/postgresql/.s.PGSQL.5432") names neither
// the setting nor the fix. The check is not in Check, which --help and the
// settings' own tests run without any database in mind.
func (spec Spec) checkDBURLSet() error {
	if spec.DB == nil || spec.DB.URL != "" {
		return nil
	}
	getenv := spec.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	for _, v := range libpqHostVars {
		if getenv(v) != "" {
			return nil
		}
	}
	name := spec.DB.name()
	env := strings.ToUpper(name) + "_URL"
	return &serve.UsageError{Msg: fmt.Sprintf("%s: %s is not set: set %s (e.g. postgres://USER@HOST:5432/%s), or PGHOST for libpq's environment",
		spec.Name, env, env, name)}
}

// open opens the pool; it does not wait for the server.
func (d Database) open(ctx context.Context, maxConns int) (*pgxpool.Pool, error) {
	pool, err := dbconn.Open(ctx, d.URL, int32(maxConns))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.name(), err)
	}
	return pool, nil
}

// OpenDB opens the service's database (Spec.DB) and checks it, in this order, before the
// service serves it: the service's own Check and the schema (a schema behind the
// binary is refused naming MigrateCommand, wrapping dbconn.ErrSchemaBehind), the
// server's durability (dbconn.RequireDurable), then the replication preconditions
// (dbconn.CheckPreconditions, watched until Close). Readiness gets a "db"
// component, a ping of the pool. Close closes the pool.
func (s *Service) OpenDB(ctx context.Context) (*pgxpool.Pool, error) {
	d := *s.spec.DB
	pool, err := d.open(ctx, d.MaxConns)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, pool.Close)
	if err := s.checkSchema(ctx, d, pool); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, d.CheckTimeout)
	err = dbconn.RequireDurable(cctx, pool, d.name(), d.UnsafeNonDurable, s.Logger, s.Registry)
	cancel()
	if err != nil {
		return nil, err
	}
	stopWatch, err := dbconn.CheckPreconditions(ctx, pool, dbconn.Preconditions{Database: d.name(), BackendPID: d.BackendPID}, s.Logger, s.Registry)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, stopWatch)
	s.Health.Add("db", pool.Ping)
	return pool, nil
}

// checkSchema runs d.Check and the schema check under one CheckTimeout.
func (s *Service) checkSchema(ctx context.Context, d Database, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, d.CheckTimeout)
	defer cancel()
	if d.Check != nil {
		if err := d.Check(ctx, pool); err != nil {
			return err
		}
	}
	return d.Tree.RequireCurrent(ctx, pool, d.MigrateCommand)
}

// migrateConns is the pool of a migrate run: goose holds its advisory lock on
// one connection and migrates on another.
const migrateConns = 2

// Migrate is a service's migrate command: it validates spec, applies the
// embedded migrations of its database (Spec.DB), logs the version reached (event
// migrated) and returns. Concurrent and repeated runs are safe: goose holds an
// advisory lock while it works. Then it grants each runtime login a role
// setting names (Database.Roles) its privileges (roles.go).
func Migrate(ctx context.Context, spec Spec) error {
	d := *spec.DB
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := spec.checkDBURLSet(); err != nil {
		return err
	}
	logger, err := NewLogger(spec.LogOutput, spec.Name, spec.LogLevel)
	if err != nil {
		return err
	}
	pool, err := d.open(ctx, migrateConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	v, err := d.Tree.Migrate(ctx, pool, logger)
	if err != nil {
		return err
	}
	// the grant step follows every run, so it holds whether or not a migration
	// was pending (roles.go)
	granted, err := d.grant(ctx, pool)
	if err != nil {
		return err
	}
	logger.Info(d.name()+" migrated", "event", "migrated", "version", v, "granted", strings.Join(granted, ","))
	return nil
}
