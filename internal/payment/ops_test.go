package payment_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// Every series (docs/contracts/observability.md) of payment-resource exists from
// start-up at 0, for each value of its closed label set, on /metrics and
// /actuator/prometheus alike.
func TestMetricsZeroInitialised(t *testing.T) {
	t.Parallel()
	e := start(t, booksUnchecked) // about the metrics' labels; its payouts never went to the rail
	series := []string{`lock_fenced_out_total{resource="payout"}`}
	for _, to := range []string{"claimed", "paid", "declined", "ambiguous", "not_presented"} {
		series = append(series, fmt.Sprintf(`payout_transition_total{to=%q}`, to))
	}
	for _, o := range []string{"paid", "declined", "not_presented"} {
		series = append(series, fmt.Sprintf(`payout_settle_total{outcome=%q}`, o))
	}
	for _, s := range series {
		if v := e.metric(t, s); v != 0 {
			t.Errorf("%s = %v at start-up, want 0", s, v)
		}
	}
	_, a := e.raw(t, http.MethodGet, "/actuator/prometheus", nil, "")
	for _, s := range series {
		if !bytes.Contains(a, []byte(s+" 0")) {
			t.Errorf("/actuator/prometheus lacks %s 0", s)
		}
	}
	// Counting: one claim, one post of each outcome.
	ctx := context.Background()
	for i, req := range []lockapi.PostRequest{
		{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")},
		{Outcome: lockapi.StatusDeclined, DeclineReason: ptr("closed account")},
		{Outcome: lockapi.StatusAmbiguous},
	} {
		id := fmt.Sprintf("p-%d", i)
		e.create(t, id, "acct-1", 10)
		e.claim(t, id, 1, "exec-a")
		if _, err := e.client.Post(ctx, id, 1, "exec-a", req); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]float64{"claimed": 3, "paid": 1, "declined": 1, "ambiguous": 1}
	for to, n := range want {
		if v := e.metric(t, fmt.Sprintf(`payout_transition_total{to=%q}`, to)); v != n {
			t.Errorf("payout_transition_total{to=%s} = %v, want %v", to, v, n)
		}
	}
	_, m := e.raw(t, http.MethodGet, "/metrics", nil, "")
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, "payout_transition_total{") || strings.HasPrefix(line, "lock_fenced_out_total{") {
			if strings.Contains(line, "p-") || strings.Contains(line, "acct") || strings.Contains(line, "exec") {
				t.Errorf("identifier in a label: %s", line)
			}
		}
	}
}

// Readiness follows paydb: UP with a db component, DOWN (503) while paydb
// refuses connections, UP again once it accepts them. Liveness stays UP
// throughout; API calls answer 503 UNAVAILABLE meanwhile.
func TestReadinessFollowsPaydb(t *testing.T) {
	t.Parallel()
	e := start(t)
	e.create(t, "p-1", "acct-1", 10)
	code, body := e.readyz(t)
	db, _ := body["components"].(map[string]any)["db"].(map[string]any)
	if code != http.StatusOK || body["status"] != "UP" || db["status"] != "UP" {
		t.Fatalf("readyz = %d %v", code, body)
	}

	restore := refusePaydb(t, e)
	ctx := context.Background()
	if code, _ := e.raw(t, http.MethodGet, "/livez", nil, ""); code != http.StatusOK {
		t.Errorf("livez = %d while paydb is away, want 200", code)
	}
	_, err := e.client.Get(ctx, "p-1")
	asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)

	restore()
	if _, err := e.client.Get(ctx, "p-1"); err != nil {
		t.Fatalf("GET once paydb is back: %v", err)
	}
}

// refusePaydb makes paydb refuse the service's connections (and ends those it
// has) and waits for readiness to say DOWN; the function it returns lets paydb
// take connections again and waits for UP.
func refusePaydb(t *testing.T, e *env) (restore func()) {
	t.Helper()
	u, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	admin := pgtest.Pool(t, u.String())
	ctx := context.Background()
	ident := `"` + strings.ReplaceAll(dbName, `"`, `""`) + `"`
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident+" ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", dbName); err != nil {
		t.Fatal(err)
	}
	waitReady(t, e, http.StatusServiceUnavailable, "DOWN")
	return func() {
		t.Helper()
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident+" ALLOW_CONNECTIONS true"); err != nil {
			t.Fatal(err)
		}
		waitReady(t, e, http.StatusOK, "UP")
	}
}

func waitReady(t *testing.T, e *env, wantCode int, wantDB string) {
	t.Helper()
	testkit.EventuallyState(t, 20*time.Second, fmt.Sprintf("readyz %d with db %s", wantCode, wantDB), func() (bool, string) {
		code, body := e.readyz(t)
		comps, _ := body["components"].(map[string]any)
		db, _ := comps["db"].(map[string]any)
		return code == wantCode && db["status"] == wantDB, fmt.Sprintf("readyz = %d %v", code, body)
	})
}

// A request that cannot get its paydb work done within its bound answers 503
// UNAVAILABLE and writes nothing: here the payout's row is locked by another
// transaction and the pool has one connection, so of several claims at once one
// waits on the row lock and the rest wait for the connection; all are bounded.
// The same claim succeeds once paydb is free.
func TestUnavailableWhenPaydbTooSlow(t *testing.T) {
	t.Parallel()
	e := start(t, func(c *payment.Config) {
		c.PaydbMaxConns = 1
		c.DBTimeout = 300 * time.Millisecond
	})
	ctx := context.Background()
	e.create(t, "p-1", "acct-1", 10)

	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM payout WHERE payout_id = 'p-1' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = e.client.Claim(ctx, "p-1", int64(i+1), "exec-a") })
	}
	wg.Wait()
	for _, err := range errs {
		asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	}
	if n := len(e.logs.events(t, "paydb_unavailable")); n != len(errs) {
		t.Errorf("%d paydb_unavailable log lines, want %d", n, len(errs))
	}
	// The server stopped waiting too: no backend is left queued on the row lock
	// for a client that has gone.
	testkit.Eventually(t, 10*time.Second, "no backend left waiting on the row lock after the requests answered 503", func() bool {
		return e.queryInt(t, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'") == 0
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := e.client.Get(ctx, "p-1"); err != nil || p.Status != lockapi.StatusPending || p.FenceToken != 0 {
		t.Fatalf("after the lock: %+v, %v; want PENDING, fenceToken 0 (the timed-out claims wrote nothing)", p, err)
	}
	if p := e.claim(t, "p-1", 1, "exec-a"); p.FenceToken != 1 {
		t.Fatalf("claim once paydb is free: %+v", p)
	}
}

// serve refuses an empty or a behind schema, naming the migrate command;
// several migrate runs at once all succeed and apply paydb's whole tree; serve
// then starts.
func TestMigrateAndRefuseBehindSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.EmptyURL(t)
	cfg := payment.DefaultConfig()
	cfg.PaydbURL = dbURL
	cfg.UnsafeNonDurableDB = true    // the test cluster runs with fsync off
	cfg.Identity.UnsafeNoAuth = true // about the schema, not identity (docs/contracts/workload-identity.md)
	cfg.LogOutput = &syncBuffer{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg.Listener = ln
	err = payment.Run(ctx, cfg)
	if !errors.Is(err, dbconn.ErrSchemaBehind) || !strings.Contains(err.Error(), "payment-resource migrate") {
		t.Fatalf("Run on an empty paydb = %v, want ErrSchemaBehind naming `payment-resource migrate`", err)
	}
	if serve.ExitCode(err, &bytes.Buffer{}) != 1 {
		t.Errorf("exit code for a behind schema is not 1")
	}

	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			c := cfg
			c.Listener = nil
			errs[i] = payment.Migrate(ctx, c)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate %d: %v", i, err)
		}
	}
	if err := payment.Migrate(ctx, cfg); err != nil {
		t.Fatalf("repeated migrate: %v", err)
	}
	e := startOn(t, dbURL)
	for _, table := range []string{"payout", "ledger_entry", "rail_high_water", "rail_submission"} {
		if n := e.queryInt(t, "SELECT count(*) FROM pg_tables WHERE tablename = $1", table); n != 1 {
			t.Errorf("table %s missing after migrate", table)
		}
	}
	e.create(t, "p-1", "acct-1", 10)

	// One migration behind: refused again.
	behind := pgtest.PaydbURL(t)
	pool := pgtest.Pool(t, behind)
	if _, err := pool.Exec(ctx, "DELETE FROM goose_paydb_version WHERE version_id = (SELECT max(version_id) FROM goose_paydb_version)"); err != nil {
		t.Fatal(err)
	}
	cfg.PaydbURL = behind
	if err := payment.Run(ctx, cfg); !errors.Is(err, dbconn.ErrSchemaBehind) || !strings.Contains(err.Error(), "payment-resource migrate") {
		t.Fatalf("Run one migration behind = %v, want a refusal naming `payment-resource migrate`", err)
	}
}

// Settings: the defaults (docs/contracts/configuration.md), environment, flags
// winning over it, out-of-bounds values refused naming the variable, unknown
// subcommands refused, --help listing every setting.
func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cmd, cfg, err := payment.ParseConfig(nil, env(nil))
	if err != nil || cmd != "serve" || cfg.Addr != ":8082" || cfg.LogLevel != "info" || cfg.PaydbMaxConns != 20 || cfg.PaydbURL != "" ||
		cfg.UnsafeNonDurableDB || !cfg.BooksCheck || cfg.SettleAfter != 5*time.Minute || cfg.RailProfile != payment.ProfileStub {
		t.Fatalf("defaults: %q %+v %v", cmd, cfg, err)
	}
	vars := map[string]string{"PAYMENT_RESOURCE_ADDR": "127.0.0.1:9000", "LOG_LEVEL": "debug",
		"PAYDB_URL": "postgres://u:secret@db.example:5432/paydb", "PAYDB_MAX_CONNS": "7", "UNSAFE_NON_DURABLE_DB": "true",
		"PAYMENT_BOOKS_CHECK": "false", "PAYMENT_SETTLE_AFTER": "90s", "PAYMENT_RAIL_PROFILE": "iso20022"}
	cmd, cfg, err = payment.ParseConfig([]string{"migrate", "--paydb-max-conns", "9", "--payment-settle-after", "2m"}, env(vars))
	if err != nil || cmd != "migrate" || cfg.Addr != "127.0.0.1:9000" || cfg.LogLevel != "debug" ||
		cfg.PaydbMaxConns != 9 || cfg.PaydbURL != vars["PAYDB_URL"] || !cfg.UnsafeNonDurableDB ||
		cfg.BooksCheck || cfg.SettleAfter != 2*time.Minute || cfg.RailProfile != payment.ProfileISO20022 {
		t.Fatalf("env and flags: %q %+v %v", cmd, cfg, err)
	}
	if _, cfg, err = payment.ParseConfig([]string{"--unsafe-non-durable-db=false"}, env(vars)); err != nil || cfg.UnsafeNonDurableDB {
		t.Fatalf("--unsafe-non-durable-db=false over the environment's true: %v %v", cfg.UnsafeNonDurableDB, err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		name string
	}{
		{nil, map[string]string{"PAYDB_MAX_CONNS": "0"}, "PAYDB_MAX_CONNS"},
		{nil, map[string]string{"PAYDB_MAX_CONNS": "many"}, "PAYDB_MAX_CONNS"},
		{[]string{"--paydb-max-conns=-1"}, nil, "PAYDB_MAX_CONNS"},
		{nil, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{nil, map[string]string{"PAYMENT_RESOURCE_ADDR": "8082"}, "PAYMENT_RESOURCE_ADDR"},
		{nil, map[string]string{"PAYDB_URL": "postgres://u:secret@db:notaport/x"}, "PAYDB_URL"},
		{[]string{"frobnicate"}, nil, "frobnicate"},
		{[]string{"--no-such-flag"}, nil, "no-such-flag"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": "secret-but-short"[:10]}, "PAYMENT_SETTLE_TOKEN"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": "secret with spaces in it"}, "PAYMENT_SETTLE_TOKEN"},
		{nil, map[string]string{"PAYMENT_SETTLE_AFTER": "0s"}, "PAYMENT_SETTLE_AFTER"},
		{nil, map[string]string{"PAYMENT_SETTLE_AFTER": "-1m"}, "PAYMENT_SETTLE_AFTER"},
		{nil, map[string]string{"PAYMENT_SETTLE_AFTER": "soon"}, "PAYMENT_SETTLE_AFTER"},
		{nil, map[string]string{"PAYMENT_BOOKS_CHECK": "maybe"}, "PAYMENT_BOOKS_CHECK"},
		{nil, map[string]string{"PAYMENT_RAIL_PROFILE": "swift"}, "PAYMENT_RAIL_PROFILE"},
		{nil, map[string]string{"PAYMENT_RAIL_PROFILE": "ISO20022"}, "PAYMENT_RAIL_PROFILE"},
	} {
		_, _, err := payment.ParseConfig(tc.args, env(tc.env))
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, tc.name) || strings.Contains(ue.Msg, "secret") {
			t.Errorf("%v %v: err = %v, want a usage error naming %s (and no password)", tc.args, tc.env, err, tc.name)
		}
		var out bytes.Buffer
		if code := serve.ExitCode(err, &out); code != 2 || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("%v %v: exit %d with %q, want 2 and one line", tc.args, tc.env, code, out.String())
		}
	}
	var usage bytes.Buffer
	_, _, err = payment.ParseConfigTo([]string{"--help"}, env(nil), &usage)
	if !errors.Is(err, serve.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, s := range []string{"PAYMENT_RESOURCE_ADDR", ":8082", "LOG_LEVEL", "PAYDB_URL", "PAYDB_MAX_CONNS", "20", "UNSAFE_NON_DURABLE_DB", "migrate", "PAYMENT_SETTLE_TOKEN",
		"PAYMENT_BOOKS_CHECK", "PAYMENT_SETTLE_AFTER", "5m0s", "PAYMENT_RAIL_PROFILE", "iso20022"} {
		if !strings.Contains(usage.String(), s) {
			t.Errorf("usage lacks %q:\n%s", s, usage.String())
		}
	}
}
