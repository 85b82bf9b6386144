package service

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/paydb"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// dbSpec is a service over paydb at url, with a listener handed in and its log
// captured.
func dbSpec(t *testing.T, url string, log *logcapture.Buffer) (Spec, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	spec := Spec{Name: "demo-svc", Identity: noAuth, LogLevel: "info", LogOutput: log, Listener: ln, Validate: func() error { return nil },
		DB: &Database{Tree: paydb.Tree(), URL: url, MaxConns: 4, ConnsBound: 10, MigrateCommand: "demo-svc migrate",
			CheckTimeout: 10 * time.Second, UnsafeNonDurable: true}} // the test cluster runs with fsync off
	return spec, ln
}

// closed reports whether ln was closed: with a deadline already past, Accept on
// an open listener times out, on a closed one it fails with net.ErrClosed.
func closed(ln net.Listener) bool {
	_ = ln.(*net.TCPListener).SetDeadline(time.Now())
	_, err := ln.Accept()
	return errors.Is(err, net.ErrClosed)
}

func TestOpenDBRefusesASchemaBehindNamingMigrate(t *testing.T) {
	spec, ln := dbSpec(t, pgtest.EmptyURL(t), &logcapture.Buffer{})
	err := Run(spec, func(sv *Service) error {
		_, err := sv.OpenDB(context.Background())
		return err
	})
	if !errors.Is(err, dbconn.ErrSchemaBehind) || !strings.Contains(err.Error(), "run `demo-svc migrate` first") {
		t.Fatalf("OpenDB on an empty paydb: %v, want ErrSchemaBehind naming `demo-svc migrate`", err)
	}
	if !closed(ln) {
		t.Error("the listener handed in is still open after a failed start-up")
	}
}

func TestOpenDBRunsTheServicesCheckFirst(t *testing.T) {
	spec, _ := dbSpec(t, pgtest.EmptyURL(t), &logcapture.Buffer{})
	standby := errors.New("paydb is a read replica")
	var checked bool
	spec.DB.Check = func(ctx context.Context, pool *pgxpool.Pool) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the service's check runs without the start-up bound")
		}
		checked = pool.Ping(ctx) == nil
		return standby
	}
	err := Run(spec, func(sv *Service) error {
		_, err := sv.OpenDB(context.Background())
		return err
	})
	if !errors.Is(err, standby) || !checked {
		t.Fatalf("OpenDB = %v (check ran on a live pool: %v), want the check's refusal before the schema's", err, checked)
	}
}

func TestOpenDBRefusesANonDurableDatabaseAfterTheSchema(t *testing.T) {
	spec, _ := dbSpec(t, pgtest.PaydbURL(t), &logcapture.Buffer{})
	spec.DB.UnsafeNonDurable = false
	err := Run(spec, func(sv *Service) error {
		_, err := sv.OpenDB(context.Background())
		return err
	})
	if !errors.Is(err, dbconn.ErrNonDurable) || !strings.Contains(err.Error(), dbconn.UnsafeSetting) {
		t.Fatalf("OpenDB on a current paydb with fsync off: %v, want ErrNonDurable naming %s", err, dbconn.UnsafeSetting)
	}
}

func TestMigrateThenServe(t *testing.T) {
	url := pgtest.EmptyURL(t)
	var log logcapture.Buffer
	spec, ln := dbSpec(t, url, &log)
	for range 2 { // a second run finds nothing to do
		if err := Migrate(context.Background(), spec); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	migrated := log.Events("migrated")
	if len(migrated) != 2 || migrated[0]["msg"] != "paydb migrated" || migrated[0]["service"] != "demo-svc" || migrated[1]["version"] != migrated[0]["version"] {
		t.Fatalf("migrated events %v, want two, the same version", migrated)
	}
	if v, _ := migrated[0]["version"].(float64); v < 1 {
		t.Fatalf("migrated to version %v", migrated[0]["version"])
	}

	ctx := context.Background()
	err := Run(spec, func(sv *Service) error {
		pool, err := sv.OpenDB(ctx)
		if err != nil {
			return err
		}
		if err := pool.Ping(ctx); err != nil {
			return err
		}
		up, comps := sv.Health.Ready(ctx)
		if !up || comps["db"].Status != "UP" {
			t.Errorf("readiness %v %v, want UP with a db component UP", up, comps)
		}
		families, err := sv.Registry.Gather()
		if err != nil {
			return err
		}
		names := map[string]bool{}
		for _, f := range families {
			names[f.GetName()] = true
		}
		for _, n := range []string{"db_synchronous_standbys", dbconn.UnsafeGauge, "go_goroutines"} {
			if !names[n] {
				t.Errorf("the registry lacks %s once the database is open", n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Run over a migrated paydb: %v", err)
	}
	if closed(ln) {
		t.Error("a run that succeeded closed a listener it never served")
	}
	if len(log.Events("unsafe_non_durable_db")) != 1 {
		t.Errorf("serving a database with fsync off was not logged:\n%s", log.String())
	}
}

// An empty database URL with no server in the libpq environment either is a
// forgotten setting: Start and Migrate refuse it before any connection, in one
// line saying what to set (exit 2), where pgx would fail on the local socket
// directory naming neither. With PGHOST set the libpq environment is meant, and
// the refusal does not apply.
func TestEmptyDBURLRefusedNamingTheSetting(t *testing.T) {
	t.Parallel()
	envOf := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, run := range []struct {
		name string
		call func(Spec) error
	}{
		{"start", func(spec Spec) error { return Run(spec, func(*Service) error { return nil }) }},
		{"migrate", func(spec Spec) error { return Migrate(context.Background(), spec) }},
	} {
		spec, ln := dbSpec(t, "", &logcapture.Buffer{})
		spec.Getenv = envOf(map[string]string{"PGUSER": "someone"})
		err := run.call(spec)
		var ue *serve.UsageError
		if !errors.As(err, &ue) || serve.ExitCode(err, io.Discard) != 2 {
			t.Fatalf("%s with PAYDB_URL unset: %v, want a usage error (exit 2)", run.name, err)
		}
		if want := "PAYDB_URL is not set: set PAYDB_URL (e.g. postgres://"; !strings.Contains(ue.Msg, want) || strings.Contains(ue.Msg, "\n") {
			t.Errorf("%s: %q, want one line saying %q", run.name, ue.Msg, want)
		}
		if run.name == "start" && !closed(ln) {
			t.Error("the listener handed in is still open after the refusal")
		}
	}
	spec, _ := dbSpec(t, "", &logcapture.Buffer{})
	spec.Getenv = envOf(map[string]string{"PGHOST": "db.example"})
	if err := spec.checkDBURLSet(); err != nil {
		t.Errorf("with PGHOST set: %v, want the libpq environment taken", err)
	}
	spec.DB = nil
	spec.Getenv = envOf(nil)
	if err := spec.checkDBURLSet(); err != nil {
		t.Errorf("a service without a database: %v", err)
	}
}
