package railproxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
)

// UNSAFE_NON_DURABLE_DB is a setting (environment and flag, in --help), false by
// default.
func TestUnsafeNonDurableDBSetting(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if _, cfg, err := ParseConfigTo(nil, env(nil), io.Discard); err != nil || cfg.UnsafeNonDurableDB {
		t.Fatalf("default: %v %v", cfg.UnsafeNonDurableDB, err)
	}
	if _, cfg, err := ParseConfigTo(nil, env(map[string]string{"UNSAFE_NON_DURABLE_DB": "true"}), io.Discard); err != nil || !cfg.UnsafeNonDurableDB {
		t.Fatalf("environment: %v %v", cfg.UnsafeNonDurableDB, err)
	}
	if _, cfg, err := ParseConfigTo([]string{"--unsafe-non-durable-db=false"}, env(map[string]string{"UNSAFE_NON_DURABLE_DB": "true"}), io.Discard); err != nil || cfg.UnsafeNonDurableDB {
		t.Fatalf("flag over environment: %v %v", cfg.UnsafeNonDurableDB, err)
	}
	var usage bytes.Buffer
	if _, _, err := ParseConfigTo([]string{"--help"}, env(nil), &usage); !errors.Is(err, serve.ErrHelp) || !strings.Contains(usage.String(), "UNSAFE_NON_DURABLE_DB") {
		t.Fatalf("--help (%v) lacks UNSAFE_NON_DURABLE_DB:\n%s", err, usage.String())
	}
}

// A paydb whose fsync is off is refused unless UNSAFE_NON_DURABLE_DB is set
// (docs/contracts/configuration.md); with it, rail-proxy serves, says so at ERROR
// and shows the gauge. A real standby is refused as well: no connection of the pool
// may reach one.
func TestRefusesPaydbWithFsyncOffAndAStandby(t *testing.T) {
	p := pgtest.Pair(t, pgcluster.PairOptions{}) // throwaway servers: fsync off
	cfg := testConfig(p.URL("paydb"), "http://127.0.0.1:1")
	cfg.UnsafeNonDurableDB = false
	_, err := tryStartProxy(cfg)
	if !errors.Is(err, dbconn.ErrNonDurable) || !strings.Contains(err.Error(), "UNSAFE_NON_DURABLE_DB") {
		t.Fatalf("serve on a paydb with fsync off: %v; want a refusal naming UNSAFE_NON_DURABLE_DB", err)
	}

	proxy := startProxy(t, testConfig(p.URL("paydb"), "http://127.0.0.1:1"))
	resp, err := http.Get(proxy.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\ndb_unsafe_non_durable 1\n") {
		t.Errorf("metrics with UNSAFE_NON_DURABLE_DB=true lack db_unsafe_non_durable 1")
	}
	if logs := proxy.Logs.String(); !strings.Contains(logs, `"event":"unsafe_non_durable_db"`) || !strings.Contains(logs, `"level":"ERROR"`) {
		t.Errorf("start-up log lacks the unsafe_non_durable_db ERROR:\n%s", logs)
	}

	_, err = tryStartProxy(testConfig(p.Standby().URL("paydb"), "http://127.0.0.1:1"))
	if err == nil || !strings.Contains(err.Error(), "read only") {
		t.Fatalf("serve on a standby: %v; want a refusal (read only connection)", err)
	}
}
