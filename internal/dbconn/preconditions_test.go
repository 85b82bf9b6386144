package dbconn_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/testkit"
)

// synchronous_standby_names as PostgreSQL 15's grammar reads it: the number of
// synchronous standbys each commit waits for.
func TestParseSyncStandbyNames(t *testing.T) {
	t.Parallel()
	for _, c := range syncNamesValid {
		got, err := dbconn.ParseSyncStandbyNames(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSyncStandbyNames(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range syncNamesInvalid {
		if n, err := dbconn.ParseSyncStandbyNames(in); !errors.Is(err, dbconn.ErrSyncStandbyNames) {
			t.Errorf("ParseSyncStandbyNames(%q) = %d, %v; want ErrSyncStandbyNames", in, n, err)
		}
	}
}

// syncNamesValid and syncNamesInvalid are the parser's table; the single-server
// test has PostgreSQL itself accept and refuse the same values.
var (
	syncNamesValid = []struct {
		in   string
		want int
	}{
		{"", 0},
		{"standby", 1},
		{"a, b", 1},
		{"a,b,c", 1},
		{"*", 1},
		{"2", 1}, // a standby named 2
		{"FIRST 2 (a, b, c)", 2},
		{"first 1 (a)", 1},
		{"First 3 (a, b)", 3}, // more than listed: what is required, not what exists
		{"2 (a, b)", 2},
		{"2(a,b)", 2},
		{"ANY 2 (a, b, c)", 2},
		{"any 1 (*)", 1},
		{"aNy 3 (s1, s2, s3, s4)", 3},
		{"ANY 2 (*)", 2},
		{`"my standby", other`, 1},
		{`ANY 2 ("ANY", "FIRST", "a""b")`, 2},
		{`""`, 1},
		{"anyone, firstly", 1}, // identifiers that merely begin with a keyword
		{"s$1, _s2, ñ", 1},
		{" \t\n ANY  2\n( a ,\tb ) ", 2},
		{"FIRST 2 (a, 3)", 2}, // a number as a name
	}
	syncNamesInvalid = []string{
		" ",           // PostgreSQL refuses a value that is only whitespace
		"any",         // a keyword as a name must be quoted
		"first, a",    //
		"ANY (a, b)",  // a method needs a number
		"FIRST a (b)", //
		"0 (a)",       // at least one
		"ANY 0 (a)",   //
		"2 (a, b",     //
		"2 (a) b",     //
		"2 ()",        //
		"2 (a,)",      //
		"a,, b",       //
		"a b",         //
		`"unterminated`,
		"a; b",
	}
)

// The pooling verdict: what a direct or session-pooled connection shows passes;
// a connection served by two server sessions, or two connections sharing one,
// is refused; a rewritten backend key is refused only where it matters.
func TestPoolingVerdict(t *testing.T) {
	t.Parallel()
	direct := dbconn.PoolingProbe{AnnouncedPID: 100, First: 100, Other: 101, Again: 100}
	if err := direct.Verdict(true); err != nil {
		t.Errorf("direct connection: %v", err)
	}
	session := dbconn.PoolingProbe{AnnouncedPID: 0x5eedf00d, First: 100, Other: 101, Again: 100}
	if err := session.Verdict(false); err != nil {
		t.Errorf("session pooling, the backend pid not relied upon: %v", err)
	}
	if err := session.Verdict(true); !errors.Is(err, dbconn.ErrBackendKeyRewritten) {
		t.Errorf("session pooling, the backend pid relied upon: %v; want ErrBackendKeyRewritten", err)
	}
	for _, p := range []dbconn.PoolingProbe{
		{AnnouncedPID: 7, First: 100, Other: 100, Again: 101}, // PgBouncer's LIFO reuse: both signs
		{AnnouncedPID: 7, First: 100, Other: 101, Again: 102}, // the first connection moved
		{AnnouncedPID: 7, First: 100, Other: 100, Again: 100}, // two open connections, one session
		{AnnouncedPID: 100, First: 100, Other: 101, Again: 102},
	} {
		for _, backendPID := range []bool{false, true} {
			err := p.Verdict(backendPID)
			if !errors.Is(err, dbconn.ErrTransactionPooling) || !strings.Contains(err.Error(), "session pooling") {
				t.Errorf("%+v (backendPID %v): %v; want ErrTransactionPooling naming session pooling", p, backendPID, err)
			}
		}
	}
}

func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// waitGauge waits until the gauge shows want (the re-read is periodic).
func waitGauge(t *testing.T, reg *prometheus.Registry, want float64) {
	t.Helper()
	testkit.EventuallyState(t, 30*time.Second, fmt.Sprintf("%s = %v", dbconn.SyncStandbysGauge, want), func() (bool, string) {
		v, ok := gaugeOf(t, reg, dbconn.SyncStandbysGauge)
		return ok && v == want, fmt.Sprintf("%s = %v (registered %v)", dbconn.SyncStandbysGauge, v, ok)
	})
}

// On a single server (no synchronous standby) the gauge is 0 from start-up and
// the WARN says so, naming the service and the database; the re-read follows the
// setting as an operator changes it, logging each change once; a direct
// connection passes the pooling probe.
func TestCheckPreconditionsSingleServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{MaxConnections: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	pool := open(t, c.URL("postgres"))

	probe, err := dbconn.ProbePooling(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if probe.First != probe.Again || probe.Other == probe.First || probe.AnnouncedPID != probe.First {
		t.Errorf("direct connection probe: %+v; want one stable session per connection, announced truthfully", probe)
	}

	var logs logcapture.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil)).With("service", "lock-server")
	reg := prometheus.NewRegistry()
	stop, err := dbconn.CheckPreconditions(ctx, pool, dbconn.Preconditions{Database: "lockdb", BackendPID: true, Interval: 50 * time.Millisecond}, logger, reg)
	if err != nil {
		t.Fatalf("CheckPreconditions on a direct connection: %v", err)
	}
	defer stop()
	if v, ok := gaugeOf(t, reg, dbconn.SyncStandbysGauge); !ok || v != 0 {
		t.Errorf("%s = %v (registered %v) at start-up, want 0", dbconn.SyncStandbysGauge, v, ok)
	}
	warns := logs.Events(dbconn.NotSynchronousEvent)
	if len(warns) != 1 {
		t.Fatalf("%s lines at start-up: %v; want 1\n%s", dbconn.NotSynchronousEvent, warns, logs.String())
	}
	w := warns[0]
	msg, _ := w["msg"].(string)
	if w["level"] != "WARN" || w["service"] != "lock-server" || w["database"] != "lockdb" ||
		!strings.Contains(msg, "failover") || !strings.Contains(msg, "synchronous_standby_names") || !strings.Contains(msg, "LockdevReplicationNotSynchronous") {
		t.Errorf("start-up WARN: %v", w)
	}

	// The parser's table agrees with the server's own grammar: ALTER SYSTEM runs
	// the setting's check.
	for _, c := range syncNamesValid {
		if strings.Contains(c.in, "\n") {
			continue // ALTER SYSTEM refuses a newline in any value
		}
		if _, err := pool.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(c.in)); err != nil {
			t.Errorf("PostgreSQL refuses %q, which the parser reads as %d: %v", c.in, c.want, err)
		}
	}
	for _, in := range syncNamesInvalid {
		if in == "ANY 99999999999999999999 (a)" {
			continue // PostgreSQL's atoi overflows rather than refusing it
		}
		if _, err := pool.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(in)); err == nil {
			t.Errorf("PostgreSQL accepts %q, which the parser refuses", in)
		}
	}
	mustExec(t, pool, `ALTER SYSTEM SET synchronous_standby_names = 'FIRST 2 (a, "b c")'`)
	mustExec(t, pool, `SELECT pg_reload_conf()`)
	waitGauge(t, reg, 2)
	if infos := logs.Events(dbconn.SynchronousEvent); len(infos) != 1 || infos[0]["level"] != "INFO" || infos[0]["synchronousStandbys"] != 2.0 {
		t.Errorf("%s lines after the change: %v", dbconn.SynchronousEvent, infos)
	}

	mustExec(t, pool, `ALTER SYSTEM RESET synchronous_standby_names`)
	mustExec(t, pool, `SELECT pg_reload_conf()`)
	waitGauge(t, reg, 0)
	if n := len(logs.Events(dbconn.NotSynchronousEvent)); n != 2 {
		t.Errorf("%s lines after the setting was emptied again: %d, want 2 (one per change)", dbconn.NotSynchronousEvent, n)
	}
	stop()
	if strings.Contains(logs.String(), "replication_check_failed") {
		t.Errorf("a re-read failed:\n%s", logs.String())
	}
}

// With a synchronous standby the gauge is 1 and nothing is logged at WARN.
func TestCheckPreconditionsSynchronousPair(t *testing.T) {
	p, db := sharedPair(t)
	pool := open(t, p.URL(db))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var logs logcapture.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil)).With("service", "rail-proxy")
	reg := prometheus.NewRegistry()
	stop, err := dbconn.CheckPreconditions(ctx, pool, dbconn.Preconditions{Database: "paydb", BackendPID: true}, logger, reg)
	if err != nil {
		t.Fatalf("CheckPreconditions on a synchronous pair: %v", err)
	}
	stop()
	if v, ok := gaugeOf(t, reg, dbconn.SyncStandbysGauge); !ok || v != 1 {
		t.Errorf("%s = %v (registered %v), want 1", dbconn.SyncStandbysGauge, v, ok)
	}
	if strings.Contains(logs.String(), `"level":"WARN"`) {
		t.Errorf("logged at WARN with a synchronous standby:\n%s", logs.String())
	}
	if infos := logs.Events(dbconn.SynchronousEvent); len(infos) != 1 || infos[0]["synchronousStandbyNames"] != "standby" {
		t.Errorf("%s lines: %v", dbconn.SynchronousEvent, infos)
	}
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
