package reconcile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/serve"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

const goodToken = "reconciler-token-0123456789abcdef"

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// Settings: every variable (docs/contracts/reconciliation.md) with its default, env
// and equal flags (flag wins), --help lists them all, and a bad setting is a
// one-line usage error naming it — never quoting the token. serve needs the token;
// migrate does not.
func TestParseConfig(t *testing.T) {
	t.Parallel()
	cmd, cfg, err := reconcile.ParseConfig(nil, envOf(map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken}))
	if err != nil || cmd != "serve" || cfg.Addr != ":8086" || cfg.RailProxyURL != "http://127.0.0.1:8083" ||
		cfg.PaymentResourceURL != "http://127.0.0.1:8082" || cfg.Interval != 5*time.Second || cfg.SettleAfter != 5*time.Minute ||
		cfg.PaydbMaxConns != 20 || cfg.LogLevel != "info" || cfg.SettleToken != goodToken {
		t.Fatalf("defaults: %q %+v %v", cmd, cfg, err)
	}
	vars := map[string]string{"RECONCILER_ADDR": "127.0.0.1:9", "RAIL_PROXY_URL": "http://proxy:1", "PAYMENT_RESOURCE_URL": "https://pay:2",
		"PAYMENT_SETTLE_TOKEN": goodToken, "RECONCILER_INTERVAL": "1s", "RECONCILER_SETTLE_AFTER": "90s", "PAYDB_MAX_CONNS": "4",
		"PAYDB_URL": "postgres://u:pw@db/paydb", "LOG_LEVEL": "debug"}
	_, cfg, err = reconcile.ParseConfig([]string{"--reconciler-interval", "2s"}, envOf(vars))
	if err != nil || cfg.Addr != "127.0.0.1:9" || cfg.RailProxyURL != "http://proxy:1" || cfg.PaymentResourceURL != "https://pay:2" ||
		cfg.Interval != 2*time.Second || cfg.SettleAfter != 90*time.Second || cfg.PaydbMaxConns != 4 || cfg.PaydbURL != vars["PAYDB_URL"] {
		t.Fatalf("env and flags: %+v %v", cfg, err)
	}
	if cmd, _, err := reconcile.ParseConfig([]string{"migrate"}, envOf(nil)); err != nil || cmd != "migrate" {
		t.Fatalf("migrate without a token: %q %v, want no error", cmd, err)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		name string
	}{
		{nil, nil, "PAYMENT_SETTLE_TOKEN"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": "secret-short"}, "PAYMENT_SETTLE_TOKEN"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": "secret secret secret"}, "PAYMENT_SETTLE_TOKEN"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken, "RECONCILER_INTERVAL": "0s"}, "RECONCILER_INTERVAL"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken, "RECONCILER_SETTLE_AFTER": "-1m"}, "RECONCILER_SETTLE_AFTER"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken, "RECONCILER_SETTLE_AFTER": "soon"}, "RECONCILER_SETTLE_AFTER"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken, "RAIL_PROXY_URL": "proxy:8083"}, "RAIL_PROXY_URL"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken, "PAYMENT_RESOURCE_URL": "ftp://x"}, "PAYMENT_RESOURCE_URL"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken, "PAYDB_MAX_CONNS": "1"}, "PAYDB_MAX_CONNS"},
		{nil, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken, "LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{[]string{"frobnicate"}, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken}, "frobnicate"},
		{[]string{"--no-such"}, map[string]string{"PAYMENT_SETTLE_TOKEN": goodToken}, "no-such"},
	} {
		_, _, err := reconcile.ParseConfig(c.args, envOf(c.env))
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, c.name) || strings.Contains(ue.Msg, "secret") {
			t.Errorf("%v %v: %v, want a usage error naming %s (and never the token)", c.args, c.env, err, c.name)
			continue
		}
		var out bytes.Buffer
		if code := serve.ExitCode(err, &out); code != 2 || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("%v %v: exit %d %q, want 2 and one line", c.args, c.env, code, out.String())
		}
	}
	var usage bytes.Buffer
	if _, _, err := reconcile.ParseConfigTo([]string{"--help"}, envOf(nil), &usage); !errors.Is(err, serve.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, s := range []string{"RECONCILER_ADDR", ":8086", "PAYDB_URL", "PAYDB_MAX_CONNS", "RAIL_PROXY_URL", "http://127.0.0.1:8083",
		"PAYMENT_RESOURCE_URL", "http://127.0.0.1:8082", "PAYMENT_SETTLE_TOKEN", "RECONCILER_INTERVAL", "5s",
		"RECONCILER_SETTLE_AFTER", "5m0s", "LOG_LEVEL", "migrate"} {
		if !strings.Contains(usage.String(), s) {
			t.Errorf("--help lacks %q:\n%s", s, usage.String())
		}
	}
}

// serve refuses a paydb that is behind, naming `reconciler migrate`; migrate
// applies the whole paydb tree (twice is fine); serve then starts.
func TestMigrateAndRefuseBehindSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := reconcile.DefaultConfig()
	cfg.PaydbURL, cfg.SettleToken, cfg.LogOutput = pgtest.EmptyURL(t), goodToken, &logcapture.Buffer{}
	// About the schema and the database's durability, not identity
	// (docs/contracts/workload-identity.md).
	cfg.Identity.UnsafeNoAuth = true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	err = reconcile.Run(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "reconciler migrate") {
		t.Fatalf("serve on an empty paydb: %v, want a refusal naming `reconciler migrate`", err)
	}
	for range 2 {
		if err := reconcile.Migrate(ctx, cfg); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	pool := pgtest.Pool(t, cfg.PaydbURL)
	for _, table := range []string{"payout", "ledger_entry", "rail_submission", "rail_high_water", "rail_statement_line",
		"reconciliation_exception", "reconciler_cursor", "payout_settlement"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing after reconciler migrate", table)
		}
	}
	// The test cluster runs with fsync off: refused without UNSAFE_NON_DURABLE_DB
	// (docs/contracts/configuration.md), served with it.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	if err := reconcile.Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "fsync") {
		t.Fatalf("serve on a paydb with fsync off: %v, want a refusal naming fsync", err)
	}
	cfg.UnsafeNonDurableDB = true
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- reconcile.Run(sctx, cfg) }()
	url := "http://" + ln.Addr().String()
	testkit.WaitHTTP(t, nil, 15*time.Second, url+"/livez", 0)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
}

// /metrics has every series (docs/contracts/reconciliation.md) from start-up,
// zero-initialised over its closed sets; /readyz reports db and railProxy, and is
// 503 when rail-proxy is gone.
func TestMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	ctx := context.Background()
	rec, err := e.st.StartReconciler(ctx, map[string]string{"RECONCILER_INTERVAL": "1h"})
	if err != nil {
		t.Fatal(err)
	}
	series := []string{`reconciler_lines_imported_total`, `reconciler_statement_seq`, `reconciler_ambiguous_payouts`, `reconciler_overdue_intents`,
		`reconciler_pass_seconds_count`, `reconciler_pass_total{result="skipped"}`, `reconciler_pass_total{result="failed"}`}
	for _, to := range []string{"paid", "declined", "not_presented"} {
		series = append(series, `reconciler_settled_total{to="`+to+`"}`)
	}
	for _, k := range reconcile.Kinds {
		series = append(series, `reconciler_exception_total{kind="`+strings.ToLower(k)+`"}`)
	}
	// The books' two kinds by name, so that dropping one from Kinds fails here.
	series = append(series, `reconciler_exception_total{kind="beneficiary_mismatch"}`, `reconciler_exception_total{kind="attempt_mismatch"}`)
	for _, s := range series {
		v, err := rec.Metric(ctx, s)
		if err != nil {
			t.Errorf("%v", err)
		} else if s != `reconciler_pass_seconds_count` && v != 0 {
			t.Errorf("%s = %v, want 0", s, v)
		}
	}
	code, body := readyz(t, rec.Client, rec.URL)
	if code != http.StatusOK || body.Components["db"].Status != "UP" || body.Components["railProxy"].Status != "UP" {
		t.Fatalf("readyz: %d %+v", code, body)
	}

	// A reconciler whose rail-proxy does not answer is not ready.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := e.scheme() + dead.Addr().String()
	_ = dead.Close()
	cfg := e.cfg
	cfg.RailProxyURL, cfg.Interval = deadURL, time.Hour
	cfg.UnsafeNonDurableDB = true // the throwaway test cluster runs with fsync off
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- reconcile.Run(rctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	url := e.scheme() + ln.Addr().String()
	ops := e.st.HTTPClient(identity.NameOps, identity.NameReconciler)
	testkit.WaitHTTP(t, ops, 15*time.Second, url+"/livez", 0)
	code, body = readyz(t, ops, url)
	if code != http.StatusServiceUnavailable || body.Components["railProxy"].Status != "DOWN" || body.Components["db"].Status != "UP" {
		t.Fatalf("readyz without rail-proxy: %d %+v, want 503 with railProxy DOWN", code, body)
	}
}

func readyz(t testing.TB, client *http.Client, url string) (int, serve.Readiness) {
	t.Helper()
	resp, err := client.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r serve.Readiness
	_ = json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode, r
}

// A settle payment-resource refuses for want of the right token stops the pass
// (every other settle would be refused too): the pass fails, saying why, and the
// payout stays AMBIGUOUS; with the right token the next pass settles it.
func TestWrongTokenFailsThePassAndMovesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	e.chaos(t, 0, 0, 1)
	if got := e.drive(t, e.st.ProxyURL, payoutReq("p-1", "acct-1", 10)); got != lockapi.StatusAmbiguous {
		t.Fatalf("p-1 posted %s", got)
	}
	cfg := e.cfg
	cfg.SettleToken = "not-the-token-0123456789"
	_, err := reconcile.Pass(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "PAYMENT_SETTLE_TOKEN") {
		t.Fatalf("pass with a wrong token: %v, want a failure naming PAYMENT_SETTLE_TOKEN", err)
	}
	if e.status(t, "p-1") != lockapi.StatusAmbiguous {
		t.Fatal("a refused settle moved the payout")
	}
	if strings.Contains(e.logs.String(), cfg.SettleToken) || strings.Contains(e.logs.String(), e.cfg.SettleToken) {
		t.Fatal("a token appears in the reconciler's log")
	}
	if rep := e.pass(t); rep.Settled["p-1"] != lockapi.StatusPaid {
		t.Fatalf("pass with the right token settled %v", rep.Settled)
	}
}
