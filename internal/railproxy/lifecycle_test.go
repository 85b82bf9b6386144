package railproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// childEnv makes the test binary a rail-proxy process (configured by the usual
// environment variables) instead of running tests: the kill test needs a proxy
// it can SIGKILL.
const childEnv = "RAILPROXY_TEST_CHILD"

func runChild() int {
	_, cfg, err := ParseConfig(nil, os.Getenv)
	if err != nil {
		return serve.ExitCode(err, os.Stderr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr().String())
	cfg.Listener = ln
	cfg.LogOutput = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return serve.ExitCode(Run(ctx, cfg), os.Stderr)
}

// A proxy killed between its intent commit and its
// resolution leaves a NULL row; after RAIL_PROXY_INTERRUPTED_AFTER the janitor
// of another proxy resolves it TIMEOUT (rail_ambiguous, cause interrupted,
// counted ambiguous), and nothing resubmits it: the rail saw it once.
func TestKilledProxyLeavesIntentForJanitor(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)

	// The child's own bound goes into its intent's interrupt_at: short timeouts
	// and the shortest RAIL_PROXY_INTERRUPTED_AFTER they allow.
	child := testConfig(dbURL, hold.URL)
	child.RailConnectTimeout = 100 * time.Millisecond
	child.RailReadTimeout = 100 * time.Millisecond
	child.InterruptedAfter = child.InFlightBound() + InterruptMargin
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// The child is given a made-up payout: the books check is off, as in testConfig.
	// About surviving a kill, not identity (docs/contracts/workload-identity.md).
	cmd.Env = append(os.Environ(), childEnv+"=1", "UNSAFE_NO_AUTH=true", "UNSAFE_NON_DURABLE_DB=true", "PAYDB_URL="+dbURL, "RAIL_BASE_URL="+hold.URL, "LOG_LEVEL=error",
		"RAIL_CONNECT_TIMEOUT=100ms", "RAIL_READ_TIMEOUT=100ms", "RAIL_PROXY_INTERRUPTED_AFTER="+child.InterruptedAfter.String(),
		"RAIL_PROXY_BOOKS_CHECK=false")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child did not report its address: %v; stderr: %s", err, stderr.String())
	}
	childURL := "http://" + strings.TrimSpace(addr)
	waitLive(t, childURL)

	go func() {
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set(lockapi.HeaderFencingToken, "9")
		h.Set(lockapi.HeaderOwnerID, "w")
		h.Set(lockapi.HeaderIdempotencyKey, "k")
		_, _ = tryPost(context.Background(), childURL, h, newPayout("p-killed", "acct-k").body())
	}()
	hold.waitCalls(t, 1) // the intent is committed and the rail holds the call
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	hold.release()
	if rs := rowsOf(t, db, "p-killed"); len(rs) != 1 || rs[0].Outcome != nil || rs[0].ResolvedAt != nil {
		t.Fatalf("after the kill: %+v", rs)
	}

	// A surviving proxy with default settings: it judges the row by the
	// interrupt_at the dead one gave it, not by its own 60 s.
	rail := startStub(t, 0)
	cfg := testConfig(dbURL, rail.URL)
	cfg.JanitorInterval = 100 * time.Millisecond
	p := startProxy(t, cfg)
	// The sweep logs a row after its statement commits, so the log is waited for
	// too: the row alone can be seen resolved a moment before its event is written.
	eventually(t, 20*time.Second, "the janitor to resolve the interrupted intent and log it", func() bool {
		rs := rowsOf(t, db, "p-killed")
		return len(rs) == 1 && rs[0].Outcome != nil && len(p.Logs.events("rail_ambiguous")) > 0
	})
	rs := rowsOf(t, db, "p-killed")
	if outcomeOf(rs[0]) != "TIMEOUT" || rs[0].ResolvedAt == nil {
		t.Fatalf("resolved to %+v", rs[0])
	}
	if age := rs[0].ResolvedAt.Sub(rs[0].SubmittedAt); age < child.InterruptedAfter {
		t.Fatalf("resolved after %s, before the dead proxy's RAIL_PROXY_INTERRUPTED_AFTER %s", age, child.InterruptedAfter)
	}
	ev := p.Logs.events("rail_ambiguous")
	if len(ev) != 1 || ev[0]["cause"] != CauseInterrupted || ev[0]["payoutId"] != "p-killed" || ev[0]["level"] != "ERROR" {
		t.Fatalf("rail_ambiguous: %v", ev)
	}
	if v := metric(t, p, `rail_submission_total{outcome="ambiguous"}`); v != 1 {
		t.Fatalf("ambiguous = %v", v)
	}
	// Nothing resubmits it, and a later submission is a DUPLICATE of the TIMEOUT row.
	if a := submit(t, p.URL, 10, newPayout("p-killed", "acct-k")); a.code() != lockapi.CodeDuplicateSubmission || a.str("firstOutcome") != "TIMEOUT" {
		t.Fatalf("resubmission: %+v", a)
	}
	if n := hold.count("p-killed"); n != 1 {
		t.Fatalf("the held rail received p-killed %d times", n)
	}
	if n := rail.callsFor(t, "p-killed"); n != 0 {
		t.Fatalf("the surviving proxy's rail received p-killed %d times", n)
	}
}

// With fencing off a lower token is admitted and
// forwarded (the mark still only moves up), the start-up log says
// fencing_disabled at ERROR, and the gauge is 0.
func TestFencingDisabledAdmitsLowerToken(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, rail.URL)
	cfg.FencingEnabled = false
	p := startProxy(t, cfg)
	if ev := p.Logs.events("fencing_disabled"); len(ev) != 1 || ev[0]["level"] != "ERROR" || ev[0]["service"] != "rail-proxy" {
		t.Fatalf("fencing_disabled: %v", ev)
	}
	if v := metric(t, p, "rail_proxy_fencing_enabled"); v != 0 {
		t.Fatalf("rail_proxy_fencing_enabled = %v", v)
	}
	if a := submit(t, p.URL, 42, newPayout("p-f1", "acct-f")); a.Status != http.StatusOK {
		t.Fatalf("42: %+v", a)
	}
	if a := submit(t, p.URL, 41, newPayout("p-f2", "acct-f")); a.Status != http.StatusOK {
		t.Fatalf("41 with fencing off: %+v", a)
	}
	if n := rail.callsFor(t, "p-f2"); n != 1 {
		t.Fatalf("rail calls for the stale token: %d", n)
	}
	if got := mark(t, db, "acct-f"); got != 42 {
		t.Fatalf("mark = %d, want 42 (never lowered)", got)
	}
	// With fencing on (default), the gauge is 1 and the same token is refused.
	p2 := startProxy(t, testConfig(dbURL, rail.URL))
	if v := metric(t, p2, "rail_proxy_fencing_enabled"); v != 1 {
		t.Fatalf("rail_proxy_fencing_enabled = %v", v)
	}
	if len(p2.Logs.events("fencing_disabled")) != 0 {
		t.Fatal("fencing_disabled logged with fencing on")
	}
	if a := submit(t, p2.URL, 40, newPayout("p-f3", "acct-f")); a.code() != lockapi.CodeFencedOut {
		t.Fatalf("40 with fencing on: %+v", a)
	}
}

// serve refuses a schema that is behind, naming the migrate command; migrate
// (run concurrently) brings it up, after which serve starts.
func TestSchemaBehindRefusedUntilMigrated(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.EmptyURL(t)
	cfg := testConfig(dbURL, rail.URL)
	cfg.LogOutput = io.Discard
	_, err := tryStartProxy(cfg)
	if err == nil || !errors.Is(err, ErrSchemaBehind) || !strings.Contains(err.Error(), "rail-proxy migrate") {
		t.Fatalf("serve on an empty database: %v", err)
	}
	errc := make(chan error, 3)
	for range 3 {
		go func() { errc <- Migrate(context.Background(), cfg) }()
	}
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	p := startProxy(t, testConfig(dbURL, rail.URL))
	if a := submit(t, p.URL, 1, newPayout("p-m", "acct-m")); a.Status != http.StatusOK {
		t.Fatalf("after migrate: %+v", a)
	}
}

// serve refuses a server that says it is in recovery. A real standby is out of
// reach of the test harness, so the database's search_path puts a schema whose
// pg_is_in_recovery() answers true ahead of pg_catalog — the proxy asks the
// question unqualified, exactly as against a standby.
func TestReadReplicaRefused(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	var dbName string
	if err := db.QueryRow(context.Background(), "SELECT current_database()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE SCHEMA standby",
		"CREATE FUNCTION standby.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS 'SELECT true'",
		fmt.Sprintf(`ALTER DATABASE %q SET search_path = standby, pg_catalog, public`, dbName),
	} {
		if _, err := db.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg := testConfig(dbURL, "http://127.0.0.1:1")
	_, err := tryStartProxy(cfg)
	if err == nil || !strings.Contains(err.Error(), "read replica") {
		t.Fatalf("serve against a server in recovery: %v", err)
	}
}

// On cancellation the proxy drains: a submission in flight is carried to its
// answer and its row resolved, readiness goes DOWN, and Run returns nil.
func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, hold.URL))
	done := make(chan answer, 1)
	go func() { done <- trySubmit(p.URL, 3, newPayout("p-drain", "acct-drain")) }()
	hold.waitCalls(t, 1)
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop() }()
	eventually(t, 5*time.Second, "readiness DOWN while draining", func() bool {
		resp, err := http.Get(p.URL + "/readyz")
		if err != nil {
			return true // no longer accepting: also out of service
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	hold.release()
	if a := <-done; a.Status != http.StatusOK {
		t.Fatalf("in-flight submission: %+v", a)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rs := rowsOf(t, db, "p-drain"); len(rs) != 1 || outcomeOf(rs[0]) != "ACKED" {
		t.Fatalf("rows: %+v", rs)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	cmd, cfg, err := ParseConfigTo(nil, env(nil), io.Discard)
	if err != nil || cmd != "serve" {
		t.Fatalf("defaults: %s %v", cmd, err)
	}
	want := DefaultConfig()
	if cfg.Addr != ":8083" || cfg.PaydbMaxConns != 20 || cfg.RailBaseURL != "http://127.0.0.1:8084" ||
		cfg.RailConnectTimeout != time.Second || cfg.RailReadTimeout != 2*time.Second || !cfg.FencingEnabled ||
		cfg.InterruptedAfter != 60*time.Second || cfg.LogLevel != "info" || cfg.Addr != want.Addr ||
		cfg.RailIdleConnTimeout != 4*time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
	cmd, cfg, err = ParseConfigTo([]string{"migrate", "--rail-read-timeout=3s"},
		env(map[string]string{"RAIL_READ_TIMEOUT": "1s", "RAIL_PROXY_FENCING_ENABLED": "false", "PAYDB_MAX_CONNS": "7"}), io.Discard)
	if err != nil || cmd != "migrate" || cfg.RailReadTimeout != 3*time.Second || cfg.FencingEnabled || cfg.PaydbMaxConns != 7 {
		t.Fatalf("flag over env: %s %+v %v", cmd, cfg, err)
	}
	var usage bytes.Buffer
	if _, _, err := ParseConfigTo([]string{"--help"}, env(nil), &usage); !errors.Is(err, serve.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, v := range []string{"RAIL_PROXY_ADDR", "PAYDB_URL", "PAYDB_MAX_CONNS", "RAIL_BASE_URL", "RAIL_CONNECT_TIMEOUT",
		"RAIL_READ_TIMEOUT", "RAIL_PROXY_FENCING_ENABLED", "RAIL_PROXY_INTERRUPTED_AFTER", "RAIL_IDLE_CONN_TIMEOUT", "LOG_LEVEL", "1m0s", "4s"} {
		if !strings.Contains(usage.String(), v) {
			t.Errorf("usage lacks %s", v)
		}
	}
	bad := []struct {
		args []string
		env  map[string]string
		name string
	}{
		{[]string{"frobnicate"}, nil, "unknown command"},
		{nil, map[string]string{"RAIL_PROXY_INTERRUPTED_AFTER": "7s"}, "RAIL_PROXY_INTERRUPTED_AFTER"},
		{nil, map[string]string{"RAIL_PROXY_INTERRUPTED_AFTER": "8s"}, "RAIL_PROXY_INTERRUPTED_AFTER"},
		{nil, map[string]string{"RAIL_IDLE_CONN_TIMEOUT": "-1s"}, "RAIL_IDLE_CONN_TIMEOUT"},
		{nil, map[string]string{"RAIL_IDLE_CONN_TIMEOUT": "later"}, "RAIL_IDLE_CONN_TIMEOUT"},
		{nil, map[string]string{"PAYDB_URL": "postgres://u:pw@[::1"}, "PAYDB_URL"},
		{nil, map[string]string{"PAYDB_URL": "host=x port=notaport"}, "PAYDB_URL"},
		{nil, map[string]string{"RAIL_PROXY_INTERRUPTED_AFTER": "61s", "RAIL_READ_TIMEOUT": "57s"}, "RAIL_PROXY_INTERRUPTED_AFTER"},
		{nil, map[string]string{"RAIL_CONNECT_TIMEOUT": "0s"}, "RAIL_CONNECT_TIMEOUT"},
		{nil, map[string]string{"RAIL_READ_TIMEOUT": "-1s"}, "RAIL_READ_TIMEOUT"},
		{nil, map[string]string{"RAIL_READ_TIMEOUT": "soon"}, "RAIL_READ_TIMEOUT"},
		{nil, map[string]string{"PAYDB_MAX_CONNS": "0"}, "PAYDB_MAX_CONNS"},
		{nil, map[string]string{"RAIL_BASE_URL": "ftp://x"}, "RAIL_BASE_URL"},
		{nil, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{nil, map[string]string{"RAIL_PROXY_FENCING_ENABLED": "maybe"}, "RAIL_PROXY_FENCING_ENABLED"},
	}
	for _, b := range bad {
		_, _, err := ParseConfigTo(b.args, env(b.env), io.Discard)
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, b.name) || strings.Contains(ue.Msg, "\n") {
			t.Errorf("%v %v: %v, want a one-line usage error naming %s", b.args, b.env, err, b.name)
		}
		if code := serve.ExitCode(err, io.Discard); code != 2 {
			t.Errorf("%v %v: exit %d, want 2", b.args, b.env, code)
		}
	}
	// The exact boundary (docs/contracts/rail-proxy.md "Interrupted intents"): at least 2 s above
	// admission + connect + read + resolution.
	c := DefaultConfig()
	for _, d := range []time.Duration{0, time.Nanosecond, time.Second, InterruptMargin - time.Nanosecond} {
		c.InterruptedAfter = c.InFlightBound() + d
		if err := c.Validate(); err == nil {
			t.Errorf("RAIL_PROXY_INTERRUPTED_AFTER %s above the in-flight bound was accepted; the margin is %s", d, InterruptMargin)
		}
	}
	c.InterruptedAfter = c.InFlightBound() + InterruptMargin
	if err := c.Validate(); err != nil {
		t.Fatalf("exactly the margin above the bound: %v", err)
	}
	c.RailIdleConnTimeout = 0
	if err := c.Validate(); err != nil {
		t.Fatalf("RAIL_IDLE_CONN_TIMEOUT 0 (no reuse): %v", err)
	}
}

// rail-proxy never depends on lockclient, lockserver or
// payment, read from the real import graph.
func TestImportGraph(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-json", "lock.dev/internal/railproxy", "lock.dev/cmd/rail-proxy").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	seen := map[string]bool{}
	for dec.More() {
		var p struct{ ImportPath string }
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		seen[p.ImportPath] = true
	}
	if !seen["lock.dev/lockapi"] || !seen["lock.dev/internal/railproxy"] {
		t.Fatalf("the import graph looks wrong: %d packages", len(seen))
	}
	for _, forbidden := range []string{"lock.dev/lockclient", "lock.dev/internal/lockserver", "lock.dev/internal/payment"} {
		if seen[forbidden] {
			t.Errorf("rail-proxy depends on %s", forbidden)
		}
	}
}

// The janitor also sweeps at start-up, before the first interval: an intent left
// by a proxy that died long ago is resolved TIMEOUT as soon as a proxy starts. A
// young unresolved row is left alone.
func TestJanitorSweepsAtStartup(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	for _, q := range []string{
		`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary, submitted_at)
		 VALUES ('p-old', 'acct-old', 3, 'w', 'k', 1, 'EUR', 'b', clock_timestamp() - interval '1 hour')`,
		`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary)
		 VALUES ('p-young', 'acct-old', 4, 'w', 'k', 1, 'EUR', 'b')`,
	} {
		if _, err := db.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(dbURL, rail.URL)
	cfg.JanitorInterval = DefaultJanitorInterval
	p := startProxy(t, cfg)
	// Run returns from start-up only after the first sweep, so no waiting here.
	if rs := rowsOf(t, db, "p-old"); len(rs) != 1 || outcomeOf(rs[0]) != "TIMEOUT" || rs[0].ResolvedAt == nil {
		t.Fatalf("old intent after start-up: %+v", rs)
	}
	if rs := rowsOf(t, db, "p-young"); len(rs) != 1 || rs[0].Outcome != nil {
		t.Fatalf("young intent after start-up: %+v", rs)
	}
	ev := p.Logs.events("rail_ambiguous")
	if len(ev) != 1 || ev[0]["payoutId"] != "p-old" || ev[0]["cause"] != CauseInterrupted {
		t.Fatalf("rail_ambiguous: %v", ev)
	}
	for _, f := range []string{"payoutId", "accountId", "presentedToken", "ownerId", "submissionId", "elapsedMs", "cause"} {
		if _, ok := ev[0][f]; !ok {
			t.Errorf("rail_ambiguous lacks %s", f)
		}
	}
	if n := len(rail.calls(t)); n != 0 {
		t.Fatalf("rail calls: %d", n)
	}
}

// The janitor's cadence is min(10 s, RAIL_PROXY_INTERRUPTED_AFTER/4); the test
// hook only ever shortens it.
func TestJanitorInterval(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		after, hook, want time.Duration
	}{
		{60 * time.Second, 0, 10 * time.Second},
		{40 * time.Second, 0, 10 * time.Second},
		{20 * time.Second, 0, 5 * time.Second},
		{6800 * time.Millisecond, 0, 1700 * time.Millisecond},
		{6800 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		{6800 * time.Millisecond, 5 * time.Second, 1700 * time.Millisecond},
		{60 * time.Second, time.Minute, 10 * time.Second},
	} {
		cfg := DefaultConfig()
		// Timeouts short enough that every bound above is one Validate accepts.
		cfg.RailConnectTimeout, cfg.RailReadTimeout = 100*time.Millisecond, 500*time.Millisecond
		cfg.InterruptedAfter, cfg.JanitorInterval = c.after, c.hook
		if err := cfg.Validate(); err != nil {
			t.Fatalf("InterruptedAfter %s, hook %s: %v", c.after, c.hook, err)
		}
		if got := cfg.janitorInterval(); got != c.want {
			t.Errorf("InterruptedAfter %s, hook %s: interval %s, want %s", c.after, c.hook, got, c.want)
		}
	}
}

// With a short RAIL_PROXY_INTERRUPTED_AFTER (lockdemo's few seconds) and no test
// hook, an intent that becomes interrupted while the proxy runs is resolved by
// the periodic sweep within about a quarter of that age — well before the 10 s
// the janitor would otherwise wait.
func TestJanitorCadenceFollowsInterruptedAfter(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, rail.URL)
	cfg.RailConnectTimeout = 100 * time.Millisecond
	cfg.RailReadTimeout = 500 * time.Millisecond
	cfg.InterruptedAfter = 6800 * time.Millisecond // interval 1.7 s
	p := startProxy(t, cfg)
	// Inserted after the start-up sweep, so only the periodic one can find it.
	if _, err := db.Exec(context.Background(),
		`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary, submitted_at)
		 VALUES ('p-cadence', 'acct-c', 3, 'w', 'k', 1, 'EUR', 'b', clock_timestamp() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	// The event is waited for with the row: the sweep writes it after its commit.
	eventually(t, 5*time.Second, "the interrupted intent resolved and logged by the periodic sweep", func() bool {
		rs := rowsOf(t, db, "p-cadence")
		return len(rs) == 1 && outcomeOf(rs[0]) == "TIMEOUT" && len(p.Logs.events("rail_ambiguous")) > 0
	})
	if ev := p.Logs.events("rail_ambiguous"); len(ev) != 1 || ev[0]["cause"] != CauseInterrupted {
		t.Fatalf("rail_ambiguous: %v", ev)
	}
}
