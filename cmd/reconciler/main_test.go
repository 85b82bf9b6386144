package main

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
)

// With runMainEnv set the test binary is the reconciler itself: main() with the
// arguments after "--".
const runMainEnv = "RECONCILER_RUN_MAIN"

func TestMain(m *testing.M) {
	if testkit.RunMainIfChild(runMainEnv, "reconciler", main) {
		return
	}
	os.Exit(pgtest.Main(m))
}

const token = "PAYMENT_SETTLE_TOKEN=binary-test-token-0123456789"

// The binary's surface (docs/contracts/configuration.md,
// docs/contracts/reconciliation.md): --help lists every setting and exits 0; a bad
// setting or an unknown subcommand exits 2 with one line; serve on an unmigrated
// paydb exits 1 naming `reconciler migrate`; migrate exits 0; serve then runs and a
// SIGTERM ends it with exit 0, every log line carrying service=reconciler and none
// the token. badURLSecret is the password of an unparsable PAYDB_URL; it must never
// be shown.
const badURLSecret = "s3cr3t-in-the-url"

func TestBinary(t *testing.T) {
	var out bytes.Buffer
	cmd := testkit.MainCommand(runMainEnv, nil, "--help")
	cmd.Stdout = &out
	if err := cmd.Run(); testkit.ExitCode(err) != 0 {
		t.Fatalf("--help: %v\n%s", err, out.String())
	}
	for _, s := range []string{"RECONCILER_ADDR", "PAYDB_URL", "PAYDB_MAX_CONNS", "RAIL_PROXY_URL", "PAYMENT_RESOURCE_URL",
		"PAYMENT_SETTLE_TOKEN", "RECONCILER_INTERVAL", "RECONCILER_SETTLE_AFTER", "LOG_LEVEL", "UNSAFE_NON_DURABLE_DB",
		"TLS_CERT_FILE", "UNSAFE_NO_AUTH", "HEALTH_ADDR", "RAIL_PROXY_ID", "PAYMENT_RESOURCE_ID",
		"RECONCILER_STATEMENT_SOURCE", "RECONCILER_STATEMENT_DIR"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("--help lacks %s:\n%s", s, out.String())
		}
	}
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{nil, nil}, // serve without a settle token
		{[]string{token}, []string{"--reconciler-settle-after=later"}},
		{[]string{token}, []string{"frobnicate"}},
		{[]string{token, "RECONCILER_STATEMENT_SOURCE=dir"}, nil}, // no RECONCILER_STATEMENT_DIR
		{[]string{token, "RECONCILER_STATEMENT_SOURCE=sftp"}, nil},
		// An unparsable PAYDB_URL is a bad setting, for serve and migrate alike
		// and its password is never shown.
		{[]string{token, "PAYDB_URL=postgres://u:" + badURLSecret + "@host:notaport/db"}, nil},
		{[]string{"PAYDB_URL=postgres://u:" + badURLSecret + "@host:notaport/db"}, []string{"migrate"}},
	} {
		stdout, stderr, code := testkit.RunMain(runMainEnv, c.env, c.args...)
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || stderr == "" {
			t.Errorf("%v %v: exit %d, stderr %q", c.env, c.args, code, stderr)
		}
		if strings.Contains(stdout+stderr, badURLSecret) {
			t.Errorf("%v %v: the password was shown: %q %q", c.env, c.args, stdout, stderr)
		}
	}

	dbURL := pgtest.EmptyURL(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	// Without TLS settings serve refuses to start, exit 2 naming the first; with
	// them, an http:// URL is refused, exit 2 naming it
	// (docs/contracts/workload-identity.md). Neither reaches paydb.
	certs := t.TempDir() + "/certs"
	if err := identity.WriteCerts(identity.CertsOptions{Dir: certs}); err != nil {
		t.Fatal(err)
	}
	f := identity.Files(certs, identity.NameReconciler)
	tlsEnv := []string{"TLS_CERT_FILE=" + f.CertFile, "TLS_KEY_FILE=" + f.KeyFile, "TLS_CA_FILE=" + f.CAFile}
	for _, c := range []struct {
		env  []string
		name string
	}{
		{[]string{"PAYDB_URL=" + dbURL, token}, "TLS_CERT_FILE"},
		{append([]string{"PAYDB_URL=" + dbURL, token, "RAIL_PROXY_URL=https://127.0.0.1:1"}, tlsEnv...), "PAYMENT_RESOURCE_URL"},
		{append([]string{"PAYDB_URL=" + dbURL, token, "PAYMENT_RESOURCE_URL=https://127.0.0.1:1"}, tlsEnv...), "RAIL_PROXY_URL"},
		{append([]string{"PAYDB_URL=" + dbURL, token, "RAIL_PROXY_URL=https://127.0.0.1:1", "PAYMENT_RESOURCE_URL=https://127.0.0.1:1",
			"RAIL_PROXY_ID=rail-proxy"}, tlsEnv...), "RAIL_PROXY_ID"},
	} {
		_, stderr, code := testkit.RunMain(runMainEnv, c.env, "serve")
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, c.name) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line naming %s", c.env, code, stderr, c.name)
		}
	}
	// Statements from files: rail-proxy's URL (the http:// default) and identity
	// are not used, so not refused; serve goes on to paydb (empty: exit 1).
	dirEnv := append([]string{"PAYDB_URL=" + dbURL, token, "PAYMENT_RESOURCE_URL=https://127.0.0.1:1", "RAIL_PROXY_ID=rail-proxy",
		"RECONCILER_STATEMENT_SOURCE=dir", "RECONCILER_STATEMENT_DIR=" + t.TempDir()}, tlsEnv...)
	if _, stderr, code := testkit.RunMain(runMainEnv, dirEnv, "serve"); code != 1 || !strings.Contains(stderr, "reconciler migrate") {
		t.Errorf("dir mode without rail-proxy settings: exit %d, stderr %q; want 1 naming reconciler migrate", code, stderr)
	}

	// The rest is about the schema, the database's durability and the process,
	// not identity: plaintext.
	env := []string{"PAYDB_URL=" + dbURL, "RECONCILER_ADDR=" + addr, "LOG_LEVEL=debug", token, "UNSAFE_NO_AUTH=true"}
	var stderr bytes.Buffer
	cmd = testkit.MainCommand(runMainEnv, env, "serve")
	cmd.Stderr = &stderr
	cmd.Stdout = io.Discard
	if err := cmd.Run(); testkit.ExitCode(err) != 1 || !strings.Contains(stderr.String(), "reconciler migrate") {
		t.Fatalf("serve on an empty paydb: exit %d, %s", testkit.ExitCode(err), stderr.String())
	}
	if err := testkit.MainCommand(runMainEnv, []string{"PAYDB_URL=" + dbURL}, "migrate").Run(); err != nil {
		t.Fatalf("migrate without a token: %v", err)
	}

	// The test cluster runs with fsync off: refused (exit 1, naming the setting)
	// without UNSAFE_NON_DURABLE_DB, served with it.
	stderr.Reset()
	cmd = testkit.MainCommand(runMainEnv, env)
	cmd.Stderr = &stderr
	cmd.Stdout = io.Discard
	if err := cmd.Run(); testkit.ExitCode(err) != 1 || !strings.Contains(stderr.String(), "UNSAFE_NON_DURABLE_DB") {
		t.Fatalf("serve on a paydb with fsync off: exit %d, %s", testkit.ExitCode(err), stderr.String())
	}
	env = append(env, "UNSAFE_NON_DURABLE_DB=true")
	cmd, lines := testkit.StartMain(t, runMainEnv, env)
	testkit.WaitHTTP(t, nil, 20*time.Second, "http://"+addr+"/livez", 0)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimPrefix(token, "PAYMENT_SETTLE_TOKEN=")
	for l := range lines {
		if !strings.Contains(l, `"service":"reconciler"`) || strings.Contains(l, secret) {
			t.Errorf("log line without service=reconciler, or with the token: %s", l)
		}
	}
	if err := cmd.Wait(); testkit.ExitCode(err) != 0 {
		t.Fatalf("after SIGTERM: exit %d", testkit.ExitCode(err))
	}
}

// `reconciler exceptions` as the binary runs it (docs/operations/reconciliation-exceptions.md):
// help says a decision moves nothing and exits 0; on a paydb that is behind it
// exits 1 naming `reconciler migrate`; then list answers, and a refused
// resolve (an unknown id, a missing --by) exits 2 with one line.
func TestExceptionsSubcommand(t *testing.T) {
	t.Parallel()
	stdout, _, code := testkit.RunMain(runMainEnv, nil, "exceptions", "help")
	if code != 0 || !strings.Contains(stdout, "never settles or unsettles") || !strings.Contains(stdout, "PAYDB_URL") ||
		!strings.Contains(stdout, "written-off") {
		t.Fatalf("exceptions help: exit %d\n%s", code, stdout)
	}
	dbURL := pgtest.EmptyURL(t)
	env := []string{"PAYDB_URL=" + dbURL}
	if _, stderr, code := testkit.RunMain(runMainEnv, env, "exceptions", "list"); code != 1 || !strings.Contains(stderr, "reconciler migrate") {
		t.Fatalf("list on an empty paydb: exit %d, %q", code, stderr)
	}
	if err := testkit.MainCommand(runMainEnv, env, "migrate").Run(); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if stdout, stderr, code := testkit.RunMain(runMainEnv, env, "exceptions", "list"); code != 0 || !strings.Contains(stdout, "0 open exceptions") {
		t.Fatalf("list: exit %d, %q %q", code, stdout, stderr)
	}
	for _, args := range [][]string{
		{"exceptions", "resolve", "7", "--decision", "refunded", "--by", "alice", "--note", "recalled"},
		{"exceptions", "resolve", "7", "--decision", "refunded", "--note", "recalled"},
		{"exceptions", "frobnicate"},
		{"exceptions"},
	} {
		_, stderr, code := testkit.RunMain(runMainEnv, env, args...)
		if code != 2 || stderr == "" || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, code, stderr)
		}
	}
}
