package executor

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigDefaultsAreTheDocumentedOnes(t *testing.T) {
	t.Parallel()
	cmd, cfg, err := ParseConfigTo(nil, env(nil), &bytes.Buffer{})
	if err != nil || cmd != "run" {
		t.Fatalf("ParseConfig() = %q, %v", cmd, err)
	}
	host, _ := os.Hostname()
	want := Config{
		Addr: ":8085", LogLevel: "info",
		LockServerURL: "http://127.0.0.1:8081", PaymentResourceURL: "http://127.0.0.1:8082", RailProxyURL: "http://127.0.0.1:8083",
		OwnerID: host + ":" + strconv.Itoa(os.Getpid()),
		Workers: 4, LeaseTTL: 15 * time.Second, ProxyTimeout: 10 * time.Second, PollInterval: 500 * time.Millisecond,
		PauseProbability: 0, Pause: 0,
	}
	if lockapi.ValidateOwnerID(want.OwnerID) != nil {
		want.OwnerID = DefaultOwnerID() // a hostname an owner id cannot carry is cleaned
	}
	if cfg.PauseHook != nil || cfg.Listener != nil {
		t.Fatalf("hooks set by default")
	}
	cfg.PauseHook = nil
	if cfg.Addr != want.Addr || cfg.LogLevel != want.LogLevel || cfg.LockServerURL != want.LockServerURL ||
		cfg.PaymentResourceURL != want.PaymentResourceURL || cfg.RailProxyURL != want.RailProxyURL ||
		cfg.OwnerID != want.OwnerID || cfg.Workers != want.Workers || cfg.LeaseTTL != want.LeaseTTL ||
		cfg.ProxyTimeout != want.ProxyTimeout || cfg.PollInterval != want.PollInterval ||
		cfg.PauseProbability != 0 || cfg.Pause != 0 || cfg.ReconcileInterval != 0 || cfg.Seed != 0 {
		t.Fatalf("defaults\n got %+v\nwant %+v", cfg, want)
	}
	if cfg.reconcileInterval() != 2*time.Second || cfg.requestTimeout() != 5*time.Second {
		t.Fatalf("derived intervals %s %s", cfg.reconcileInterval(), cfg.requestTimeout())
	}
}

func TestConfigFromEnvironmentAndFlags(t *testing.T) {
	t.Parallel()
	e := env(map[string]string{
		"EXECUTOR_ADDR": "127.0.0.1:9999", "LOG_LEVEL": "debug",
		"LOCK_SERVER_URL": "http://locks:1", "PAYMENT_RESOURCE_URL": "http://pay:2", "RAIL_PROXY_URL": "https://proxy:3/",
		"EXECUTOR_OWNER_ID": "pod-7@zone/a", "EXECUTOR_WORKERS": "9", "EXECUTOR_LEASE_TTL": "2s",
		"EXECUTOR_PROXY_TIMEOUT": "8s", "EXECUTOR_POLL_INTERVAL": "75ms",
		"EXECUTOR_PAUSE_PROBABILITY": "0.25", "EXECUTOR_PAUSE": "3s",
	})
	_, cfg, err := ParseConfigTo([]string{"run", "--executor-workers", "11", "--executor-pause=4s"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "127.0.0.1:9999" || cfg.LogLevel != "debug" || cfg.LockServerURL != "http://locks:1" ||
		cfg.PaymentResourceURL != "http://pay:2" || cfg.RailProxyURL != "https://proxy:3/" || cfg.OwnerID != "pod-7@zone/a" ||
		cfg.Workers != 11 || cfg.LeaseTTL != 2*time.Second || cfg.ProxyTimeout != 8*time.Second ||
		cfg.PollInterval != 75*time.Millisecond || cfg.PauseProbability != 0.25 || cfg.Pause != 4*time.Second {
		t.Fatalf("got %+v", cfg)
	}
}

// A bad setting is a *serve.UsageError whose one line names the variable.
func TestConfigRejectsBadSettings(t *testing.T) {
	t.Parallel()
	cases := []struct{ env, val string }{
		{"EXECUTOR_ADDR", "no-port"},
		{"LOG_LEVEL", "loud"},
		{"LOCK_SERVER_URL", "127.0.0.1:8081"},
		{"PAYMENT_RESOURCE_URL", "ftp://pay"},
		{"RAIL_PROXY_URL", "http://user:secret@proxy:8083"},
		{"EXECUTOR_OWNER_ID", "has space"},
		{"EXECUTOR_WORKERS", "0"},
		{"EXECUTOR_WORKERS", "many"},
		{"EXECUTOR_LEASE_TTL", "0s"},
		{"EXECUTOR_LEASE_TTL", "1500us"},
		{"EXECUTOR_LEASE_TTL", "1h"},
		{"EXECUTOR_PROXY_TIMEOUT", "0s"},
		{"EXECUTOR_POLL_INTERVAL", "-1s"},
		{"EXECUTOR_PAUSE_PROBABILITY", "1.5"},
		{"EXECUTOR_PAUSE_PROBABILITY", "NaN"},
		{"EXECUTOR_PAUSE", "-2s"},
		{"LOCK_SERVER_ID", "lock-server"},
		{"PAYMENT_RESOURCE_ID", "https://payment-resource"},
		{"RAIL_PROXY_ID", "spiffe://lock.dev/rail proxy"},
	}
	for _, tc := range cases {
		t.Run(tc.env+"="+tc.val, func(t *testing.T) {
			t.Parallel()
			_, _, err := ParseConfigTo(nil, env(map[string]string{tc.env: tc.val}), &bytes.Buffer{})
			var ue *serve.UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("err %v, want a usage error", err)
			}
			if !strings.Contains(ue.Msg, tc.env) {
				t.Fatalf("message %q does not name %s", ue.Msg, tc.env)
			}
			if strings.Contains(ue.Msg, "secret") {
				t.Fatalf("message %q echoes a password", ue.Msg)
			}
			var out bytes.Buffer
			if code := serve.ExitCode(err, &out); code != 2 || strings.Count(out.String(), "\n") != 1 {
				t.Fatalf("exit %d with %q, want 2 and one line", code, out.String())
			}
		})
	}
}

// With TLS set every call is mutual TLS (docs/contracts/workload-identity.md):
// a base URL that is not https is refused at start, exit 2 naming the
// setting, whichever of the three it is; the peer IDs are read.
func TestConfigRefusesPlaintextURLsOnceTLSIsSet(t *testing.T) {
	t.Parallel()
	tlsEnv := map[string]string{"TLS_CERT_FILE": "/certs/executor.pem", "TLS_KEY_FILE": "/certs/executor.key", "TLS_CA_FILE": "/certs/ca.pem",
		"LOCK_SERVER_URL": "https://locks:1", "PAYMENT_RESOURCE_URL": "https://pay:2", "RAIL_PROXY_URL": "https://proxy:3",
		"LOCK_SERVER_ID": "spiffe://prod.example/ns/locks/sa/lock-server"}
	_, cfg, err := ParseConfigTo(nil, env(tlsEnv), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("https URLs with TLS set: %v", err)
	}
	if cfg.LockServerID != "spiffe://prod.example/ns/locks/sa/lock-server" || cfg.PaymentResourceID != "" || cfg.RailProxyID != "" {
		t.Fatalf("peer IDs %q %q %q", cfg.LockServerID, cfg.PaymentResourceID, cfg.RailProxyID)
	}
	for _, name := range []string{"LOCK_SERVER_URL", "PAYMENT_RESOURCE_URL", "RAIL_PROXY_URL"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := maps.Clone(tlsEnv)
			e[name] = strings.Replace(e[name], "https://", "http://", 1)
			_, _, err := ParseConfigTo(nil, env(e), &bytes.Buffer{})
			var ue *serve.UsageError
			if !errors.As(err, &ue) || !strings.Contains(ue.Msg, name) || !strings.Contains(ue.Msg, "https") {
				t.Fatalf("http:// %s with TLS set: %v, want a usage error naming it", name, err)
			}
			if code := serve.ExitCode(err, io.Discard); code != 2 {
				t.Fatalf("exit %d, want 2", code)
			}
		})
	}
	// Without TLS (UNSAFE_NO_AUTH) plaintext URLs stay as they were.
	if _, _, err := ParseConfigTo(nil, env(map[string]string{"UNSAFE_NO_AUTH": "true"}), &bytes.Buffer{}); err != nil {
		t.Fatalf("the http:// defaults without TLS: %v", err)
	}
}

func TestConfigHelpAndSubcommands(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, _, err := ParseConfigTo([]string{"--help"}, env(nil), &out)
	if !errors.Is(err, serve.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, s := range []string{"EXECUTOR_ADDR", "LOG_LEVEL", "LOCK_SERVER_URL", "PAYMENT_RESOURCE_URL", "RAIL_PROXY_URL",
		"EXECUTOR_OWNER_ID", "EXECUTOR_WORKERS", "EXECUTOR_LEASE_TTL", "EXECUTOR_PROXY_TIMEOUT", "EXECUTOR_POLL_INTERVAL",
		"EXECUTOR_PAUSE_PROBABILITY", "EXECUTOR_PAUSE", "LOCK_SERVER_ID", "PAYMENT_RESOURCE_ID", "RAIL_PROXY_ID", "-executor-lease-ttl", "15s", "500ms", ":8085", "(default 0)", "(default 0s)"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("usage lacks %q", s)
		}
	}
	_, _, err = ParseConfigTo([]string{"serve"}, env(nil), &out)
	var ue *serve.UsageError
	if !errors.As(err, &ue) {
		t.Fatalf("unknown subcommand: %v, want a usage error", err)
	}
	_, _, err = ParseConfigTo([]string{"run", "extra"}, env(nil), &out)
	if !errors.As(err, &ue) {
		t.Fatalf("extra argument: %v, want a usage error", err)
	}
}
