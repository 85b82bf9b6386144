package gate_test

import (
	"os"
	"strings"
	"testing"

	"lock.dev/internal/testkit"
	"lock.dev/rail"
	"lock.dev/rail/gate"
	"lock.dev/rail/stubjson"
)

// With runMainEnv set the test binary is a team's own rail-proxy: gate.Main
// with the acme adapter, the arguments after "--".
const runMainEnv = "RAIL_GATE_RUN_MAIN"

// acme is a team's adapter: rail-stub's language under another name.
type acme struct{ rail.Adapter }

func (acme) Protocol() string { return "acme" }

func TestMain(m *testing.M) {
	if testkit.RunMainIfChild(runMainEnv, "acme-rail-proxy", func() { gate.Main(acme{stubjson.New()}) }) {
		return
	}
	os.Exit(m.Run())
}

// A binary built with gate.Main is rail-proxy with the team's adapter: its
// settings, RAIL_PROTOCOL defaulting to the adapter's name; any other value of
// RAIL_PROTOCOL exits 2 naming the setting, as any bad setting does.
func TestOwnBinary(t *testing.T) {
	stdout, _, code := testkit.RunMain(runMainEnv, nil, "--help")
	if code != 0 || !strings.Contains(stdout, "RAIL_PROTOCOL") || !strings.Contains(stdout, "acme") ||
		!strings.Contains(stdout, "RAIL_PROXY_INTERRUPTED_AFTER") {
		t.Fatalf("--help: exit %d\n%s", code, stdout)
	}
	for _, env := range [][]string{{"RAIL_PROTOCOL=stub"}, {"RAIL_PROTOCOL=iso20022"}, {"RAIL_PROXY_INTERRUPTED_AFTER=5s"}} {
		_, stderr, code := testkit.RunMain(runMainEnv, env, "serve")
		want := strings.SplitN(env[0], "=", 2)[0]
		if code != 2 || !strings.Contains(stderr, want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", env, code, stderr, want)
		}
	}
	// Its own name is accepted: the binary gets as far as paydb, which is not
	// there (exit 1, not 2).
	_, stderr, code := testkit.RunMain(runMainEnv, []string{"RAIL_PROTOCOL=acme", "UNSAFE_NO_AUTH=true",
		"PAYDB_URL=postgres://nobody@127.0.0.1:1/paydb?connect_timeout=1", "RAIL_PROXY_ADDR=127.0.0.1:0"}, "serve")
	if code != 1 || strings.Contains(stderr, "RAIL_PROTOCOL") {
		t.Fatalf("RAIL_PROTOCOL=acme: exit %d, stderr %q; want 1 (paydb unreachable)", code, stderr)
	}
}
