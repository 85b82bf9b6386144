package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
)

// secret is the password in the URLs given to the binary: it must never show.
const secret = "s3cr3t-Pw"

// With runMainEnv set the test binary is rail-proxy itself: main() with the
// arguments after "--".
const runMainEnv = "RAIL_PROXY_RUN_MAIN"

func TestMain(m *testing.M) {
	if testkit.RunMainIfChild(runMainEnv, "rail-proxy", main) {
		return
	}
	os.Exit(pgtest.Main(m))
}

// The binary's surface (docs/contracts/configuration.md): --help lists every
// setting and exits 0; a bad setting or an unknown subcommand exits 2 with one
// line; serve on an unmigrated paydb exits 1 naming `rail-proxy migrate`; migrate
// exits 0; serve then runs and a SIGTERM ends it with exit 0.
func TestBinary(t *testing.T) {
	var out bytes.Buffer
	cmd := testkit.MainCommand(runMainEnv, nil, "--help")
	cmd.Stdout = &out
	if err := cmd.Run(); testkit.ExitCode(err) != 0 || !strings.Contains(out.String(), "RAIL_PROXY_INTERRUPTED_AFTER") ||
		!strings.Contains(out.String(), "RAIL_READ_TIMEOUT") || !strings.Contains(out.String(), "RAIL_PROTOCOL") {
		t.Fatalf("--help: %v\n%s", err, out.String())
	}
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{[]string{"RAIL_PROXY_INTERRUPTED_AFTER=5s"}, nil},
		{nil, []string{"--rail-read-timeout=never"}},
		{nil, []string{"frobnicate"}},
		// A language no adapter speaks.
		{[]string{"RAIL_PROTOCOL=acme"}, nil},
		// A bad URL is a bad setting, and the message never shows its password.
		{[]string{"RAIL_BASE_URL=http://rail-user:" + secret + "@127.0.0.1:1/?x=1"}, nil},
		{[]string{"PAYDB_URL=postgres://postgres:" + secret + "@[::1"}, nil},
		{nil, []string{"--paydb-url=host=x port=notaport password=" + secret}},
	} {
		stdout, stderr, code := testkit.RunMain(runMainEnv, c.env, c.args...)
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || stderr == "" {
			t.Errorf("%v %v: exit %d, stderr %q", c.env, c.args, code, stderr)
		}
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("%v %v: the password is shown: %q %q", c.env, c.args, stdout, stderr)
		}
	}

	// URLs with passwords from here on (the test cluster trusts, any will do).
	u, err := url.Parse(pgtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), secret)
	dbURL := u.String()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	// About the schema check, not identity (docs/contracts/workload-identity.md).
	env := []string{"PAYDB_URL=" + dbURL, "RAIL_PROXY_ADDR=" + addr, "LOG_LEVEL=info", "UNSAFE_NON_DURABLE_DB=true", "UNSAFE_NO_AUTH=true",
		"RAIL_BASE_URL=http://rail-user:" + secret + "@127.0.0.1:1"}
	var stderr bytes.Buffer
	cmd = testkit.MainCommand(runMainEnv, env, "serve")
	cmd.Stderr = &stderr
	cmd.Stdout = io.Discard
	if err := cmd.Run(); testkit.ExitCode(err) != 1 || !strings.Contains(stderr.String(), "rail-proxy migrate") || strings.Contains(stderr.String(), secret) {
		t.Fatalf("serve on an empty paydb: exit %d, %s", testkit.ExitCode(err), stderr.String())
	}
	if err := testkit.MainCommand(runMainEnv, env, "migrate").Run(); err != nil {
		t.Fatalf("migrate: %v", err)
	}

	cmd, lines := testkit.StartMain(t, runMainEnv, env)
	testkit.WaitHTTP(t, nil, 20*time.Second, "http://"+addr+"/livez", 0)
	// Readiness is DOWN (the rail is not there) and says so without details.
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(ready), secret) || strings.Contains(string(ready), "127.0.0.1") {
		t.Errorf("readiness: %d %s", resp.StatusCode, ready)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for l := range lines { // until the process closes its stdout
		if !strings.Contains(l, `"service":"rail-proxy"`) {
			t.Errorf("log line without service: %s", l)
		}
		if strings.Contains(l, secret) {
			t.Errorf("log line shows the password: %s", l)
		}
	}
	if err := cmd.Wait(); testkit.ExitCode(err) != 0 {
		t.Fatalf("after SIGTERM: exit %d", testkit.ExitCode(err))
	}
}
