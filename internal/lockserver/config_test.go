package lockserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfigDefaultsEnvAndFlags(t *testing.T) {
	t.Parallel()
	cmd, cfg, err := parseConfig(nil, env(nil), &bytes.Buffer{})
	if err != nil || cmd != CmdServe {
		t.Fatalf("no arguments: %q %v", cmd, err)
	}
	want := Config{Addr: ":8081", LogLevel: "info", LockdbMaxConns: 20, MinTTL: time.Second, MaxTTL: 5 * time.Minute}
	if cfg.Addr != want.Addr || cfg.LogLevel != want.LogLevel || cfg.LockdbURL != "" || cfg.LockdbMaxConns != want.LockdbMaxConns ||
		cfg.MinTTL != want.MinTTL || cfg.MaxTTL != want.MaxTTL || cfg.UnsafeNonDurableDB {
		t.Errorf("defaults %+v, want %+v", cfg, want)
	}

	e := env(map[string]string{"LOCK_SERVER_ADDR": ":9000", "LOG_LEVEL": "debug", "LOCKDB_URL": "postgres://x@h/db",
		"LOCKDB_MAX_CONNS": "5", "LOCK_MIN_TTL": "250ms", "LOCK_MAX_TTL": "1m", "UNSAFE_NON_DURABLE_DB": "true"})
	cmd, cfg, err = parseConfig([]string{"migrate", "--lock-max-ttl=2m", "--lock-server-addr", ":9001"}, e, &bytes.Buffer{})
	if err != nil || cmd != CmdMigrate {
		t.Fatalf("migrate: %q %v", cmd, err)
	}
	if cfg.Addr != ":9001" || cfg.LogLevel != "debug" || cfg.LockdbURL != "postgres://x@h/db" || cfg.LockdbMaxConns != 5 ||
		cfg.MinTTL != 250*time.Millisecond || cfg.MaxTTL != 2*time.Minute || !cfg.UnsafeNonDurableDB {
		t.Errorf("env and flags (flag wins): %+v", cfg)
	}
	if _, cfg, err = parseConfig([]string{"--unsafe-non-durable-db=false"}, e, &bytes.Buffer{}); err != nil || cfg.UnsafeNonDurableDB {
		t.Errorf("--unsafe-non-durable-db=false over the environment's true: %v %v", cfg.UnsafeNonDurableDB, err)
	}
}

func TestParseConfigRejects(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string // the variable the one line must name
	}{
		{[]string{"serve", "--lock-min-ttl=0s"}, nil, "LOCK_MIN_TTL"},
		{nil, map[string]string{"LOCK_MIN_TTL": "1500us"}, "LOCK_MIN_TTL"},
		{nil, map[string]string{"LOCK_MIN_TTL": "10s", "LOCK_MAX_TTL": "5s"}, "LOCK_MAX_TTL"},
		{nil, map[string]string{"LOCK_MAX_TTL": "1000h"}, "LOCK_MAX_TTL"},
		{nil, map[string]string{"LOCK_MAX_TTL": "soon"}, "LOCK_MAX_TTL"},
		{nil, map[string]string{"LOCKDB_MAX_CONNS": "0"}, "LOCKDB_MAX_CONNS"},
		{nil, map[string]string{"LOCKDB_MAX_CONNS": "many"}, "LOCKDB_MAX_CONNS"},
		{nil, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{nil, map[string]string{"LOCKDB_URL": "postgres://u:secret@h:notaport/db"}, "LOCKDB_URL"},
		{[]string{"--lock-server-addr="}, nil, "LOCK_SERVER_ADDR"},
		{[]string{"bogus"}, nil, "bogus"},
		{[]string{"serve", "extra"}, nil, "extra"},
		{[]string{"--no-such-flag"}, nil, "no-such-flag"},
	} {
		_, _, err := parseConfig(c.args, env(c.env), &bytes.Buffer{})
		var ue *serve.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%v %v: err %v, want a usage error (exit 2)", c.args, c.env, err)
			continue
		}
		if !strings.Contains(ue.Msg, c.want) || strings.Contains(ue.Msg, "\n") || strings.Contains(ue.Msg, "secret") {
			t.Errorf("%v %v: %q must be one line naming %s, without the URL", c.args, c.env, ue.Msg, c.want)
		}
		var stderr bytes.Buffer
		if code := serve.ExitCode(err, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", c.args, code)
		}
	}
}

func TestHelpListsEverySetting(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, _, err := parseConfig([]string{"--help"}, env(nil), &out)
	if !errors.Is(err, serve.ErrHelp) || serve.ExitCode(err, &bytes.Buffer{}) != 0 {
		t.Fatalf("--help: %v", err)
	}
	for _, s := range []string{"LOCK_SERVER_ADDR", ":8081", "LOG_LEVEL", "info", "LOCKDB_URL", "LOCKDB_MAX_CONNS", "20",
		"LOCK_MIN_TTL", "1s", "LOCK_MAX_TTL", "5m0s", "UNSAFE_NON_DURABLE_DB", "migrate"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("usage lacks %q:\n%s", s, out.String())
		}
	}
}

// serve refuses a lockdb whose schema is behind, naming the migrate command;
// migrate (concurrently, repeatedly) brings it up; then serve starts. No log
// line carries the database URL or its password.
func TestServeRefusesSchemaBehindUntilMigrated(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "pw-never-logged") // the test cluster trusts local users
	logs := &syncBuffer{}
	cfg := testConfig(u.String())
	cfg.LogOutput = logs
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	err = Run(context.Background(), cfg)
	if !errors.Is(err, dbconn.ErrSchemaBehind) || !strings.Contains(err.Error(), "lock-server migrate") {
		t.Fatalf("Run on an empty lockdb: %v, want ErrSchemaBehind naming `lock-server migrate`", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Errorf("a refusing Run left its listener open")
	}

	cfg.Listener = nil
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Migrate(context.Background(), cfg)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	if err := Migrate(context.Background(), cfg); err != nil {
		t.Fatalf("repeated migrate: %v", err)
	}
	cfg.LogOutput = nil // startServer collects it
	s := startServer(t, cfg)
	mustAcquire(t, s.URL, "after-migrate", "o", 1000)
	s.stop()

	for _, out := range []string{logs.String(), s.logs.String()} {
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Errorf("log line is not JSON: %q", line)
				continue
			}
			if m["service"] != "lock-server" || m["time"] == nil || m["level"] == nil || m["msg"] == nil {
				t.Errorf("log line lacks time/level/msg/service=lock-server: %q", line)
			}
		}
		if strings.Contains(out, "pw-never-logged") || strings.Contains(out, u.Host+u.Path) {
			t.Errorf("logs carry the database URL:\n%s", out)
		}
	}
	if !strings.Contains(s.logs.String(), `"event":"lock_granted"`) {
		t.Errorf("no lock_granted log line:\n%s", s.logs.String())
	}
}
