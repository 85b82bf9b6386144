// Package pgtest gives each test its own migrated database on a real PostgreSQL:
// one throwaway cluster per test binary (or the server TEST_DATABASE_URL names),
// a migrated template per tree, and a fresh clone of it per test.
//
// A package that uses it runs its tests through Main so the cluster is stopped:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// No PostgreSQL to be had fails the test with what to install; it never skips.
package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/lockdb"
	"lock.dev/internal/paydb"
	"lock.dev/internal/pgcluster"
)

// server is the PostgreSQL this test binary works against.
type server struct {
	cluster *pgcluster.Cluster // nil when TEST_DATABASE_URL is used
	base    *url.URL
	prefix  string // database name prefix, unique per test binary

	mu        sync.Mutex // CREATE DATABASE … TEMPLATE wants the template to itself
	templates map[string]string
}

var (
	srvOnce sync.Once
	srv     *server
	srvErr  error
	seq     atomic.Int64
)

// Main runs m and stops the throwaway cluster, if one was started.
func Main(m *testing.M) int {
	code := m.Run()
	if srv != nil && srv.cluster != nil {
		_ = srv.cluster.Stop()
	}
	return code
}

func get(t testing.TB) *server {
	t.Helper()
	srvOnce.Do(func() {
		s := &server{templates: map[string]string{}, prefix: fmt.Sprintf("t%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)}
		if raw := os.Getenv("TEST_DATABASE_URL"); raw != "" {
			u, err := url.Parse(raw)
			if err != nil {
				srvErr = fmt.Errorf("TEST_DATABASE_URL cannot be parsed")
				return
			}
			s.base = u
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := pgcluster.Start(ctx, pgcluster.Options{})
			if err != nil {
				srvErr = fmt.Errorf("starting a throwaway PostgreSQL for the tests: %w", err)
				return
			}
			s.cluster = c
			s.base, _ = url.Parse(c.URL("postgres"))
		}
		srv = s
	})
	if srvErr != nil {
		t.Fatalf("pgtest: %v", srvErr)
	}
	return srv
}

func (s *server) url(db string) string {
	u := *s.base
	u.Path = "/" + db
	return u.String()
}

func (s *server) create(ctx context.Context, name, template string) error {
	conn, err := pgx.Connect(ctx, s.url(strings.TrimPrefix(s.base.Path, "/")))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	_, err = conn.Exec(ctx, sql)
	return err
}

// template returns the name of a database migrated with tree, creating it once.
func (s *server) template(ctx context.Context, tree dbconn.Tree) (string, error) {
	if name, ok := s.templates[tree.Database]; ok {
		return name, nil
	}
	name := s.prefix + "_tmpl_" + tree.Database
	if err := s.create(ctx, name, ""); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, s.url(name))
	if err != nil {
		return "", err
	}
	_, err = tree.Migrate(ctx, pool, nil)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	s.templates[tree.Database] = name
	return name, nil
}

// fresh creates a new database, migrated with tree when tree.FS is set.
func (s *server) fresh(t testing.TB, tree *dbconn.Tree) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	tmpl := ""
	kind := "empty"
	if tree != nil {
		var err error
		if tmpl, err = s.template(ctx, *tree); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		kind = tree.Database
	}
	name := fmt.Sprintf("%s_%s_%d", s.prefix, kind, seq.Add(1))
	if err := s.create(ctx, name, tmpl); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return s.url(name)
}

// PaydbURL returns the URL of a fresh, migrated paydb for this test.
func PaydbURL(t testing.TB) string {
	tree := paydb.Tree()
	return get(t).fresh(t, &tree)
}

// LockdbURL returns the URL of a fresh, migrated lockdb for this test.
func LockdbURL(t testing.TB) string {
	tree := lockdb.Tree()
	return get(t).fresh(t, &tree)
}

// EmptyURL returns the URL of a fresh database with no schema (to test migrate
// and the refusal to serve a schema that is behind).
func EmptyURL(t testing.TB) string {
	return get(t).fresh(t, nil)
}

// Pool opens a pool on url that is closed when the test ends.
func Pool(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Pair starts a primary and a streaming standby for this test (opts as for
// pgcluster.StartPair: Sync for a synchronous standby), creates and migrates the databases "paydb" and "lockdb" on it, waits until the standby
// has them, and stops it when the test ends. Connect through p.URL("paydb") or
// p.URL("lockdb"): both servers, target_session_attrs=read-write. The pair runs
// with fsync off, like every throwaway cluster: services on it need
// UNSAFE_NON_DURABLE_DB. It needs the local server binaries; TEST_DATABASE_URL
// cannot stand in for a replicated pair.
func Pair(t testing.TB, opts pgcluster.PairOptions) *pgcluster.Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 100
	}
	p, err := pgcluster.StartPair(ctx, opts)
	if err != nil {
		t.Fatalf("pgtest: start a primary and standby: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	for _, tree := range []dbconn.Tree{paydb.Tree(), lockdb.Tree()} {
		if err := p.CreateDatabase(ctx, tree.Database, ""); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		pool, err := pgxpool.New(ctx, p.URL(tree.Database))
		if err != nil {
			t.Fatalf("pgtest: pool: %v", err)
		}
		_, err = tree.Migrate(ctx, pool, nil)
		pool.Close()
		if err != nil {
			t.Fatalf("pgtest: migrate %s: %v", tree.Database, err)
		}
	}
	if err := p.WaitReplayed(ctx); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return p
}

// QuietPlaces are where an operator can set client_min_messages = error for a
// service's sessions, for tests that show a durable commit's cancelled wait is
// seen all the same: nowhere (the server's default), on the role the pair's URL
// logs in as, on the database, in the URL's options.
var QuietPlaces = []string{"default", "role", "database", "URL"}

// Quiet sets client_min_messages = error for database db of p at place (one of
// QuietPlaces), after clearing what an earlier call set, and returns the URL to
// connect with. Sessions opened afterwards get the setting; start the service
// after calling it.
func Quiet(t testing.TB, p *pgcluster.Pair, db, place string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL(db))
	if err != nil {
		t.Fatalf("pgtest: quiet: %v", err)
	}
	defer conn.Close(ctx)
	dbID := pgx.Identifier{db}.Sanitize()
	stmts := []string{"ALTER ROLE CURRENT_USER RESET client_min_messages", "ALTER DATABASE " + dbID + " RESET client_min_messages"}
	u := p.URL(db)
	switch place {
	case "default":
	case "role":
		stmts = append(stmts, "ALTER ROLE CURRENT_USER SET client_min_messages = error")
	case "database":
		stmts = append(stmts, "ALTER DATABASE "+dbID+" SET client_min_messages = error")
	case "URL":
		u += "&options=-c%20client_min_messages%3Derror"
	default:
		t.Fatalf("pgtest: quiet: no place %q", place)
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("pgtest: %s: %v", s, err)
		}
	}
	if place != "default" {
		// The place set really does quieten a new session.
		var level string
		check, err := pgx.Connect(ctx, u)
		if err == nil {
			err = check.QueryRow(ctx, "SELECT current_setting('client_min_messages')").Scan(&level)
			check.Close(ctx)
		}
		if err != nil || level != "error" {
			t.Fatalf("pgtest: quiet at the %s: a new session's client_min_messages = %q (%v), want error", place, level, err)
		}
	}
	return u
}
