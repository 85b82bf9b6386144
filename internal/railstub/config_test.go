package railstub

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/serve"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfig(t *testing.T) {
	t.Parallel()
	cmd, cfg, err := ParseConfig(nil, env(nil))
	if err != nil || cmd != "serve" || cfg.Addr != ":8084" || cfg.LogLevel != "info" || cfg.LatencyMs != 0 ||
		cfg.DeclineRate != 0 || cfg.DropRate != 0 || cfg.Seed != nil || cfg.CallLogPath != "" ||
		cfg.Protocol != ProtocolStub || cfg.StatementDir != "" || cfg.StatementEvery != 5*time.Second {
		t.Fatalf("defaults = %q %+v %v", cmd, cfg, err)
	}
	e := env(map[string]string{"RAIL_STUB_ADDR": "127.0.0.1:9", "RAIL_STUB_LATENCY_MS": "250", "RAIL_STUB_DECLINE_RATE": "0.1",
		"RAIL_STUB_DROP_RATE": "0.2", "RAIL_STUB_SEED": "-5", "RAIL_STUB_CALL_LOG": "/tmp/x", "LOG_LEVEL": "debug",
		"RAIL_STUB_PROTOCOL": "iso20022", "RAIL_STUB_STATEMENT_DIR": "/tmp/st", "RAIL_STUB_STATEMENT_EVERY": "250ms"})
	_, cfg, err = ParseConfig([]string{"serve", "--rail-stub-latency-ms=300"}, e)
	if err != nil || cfg.Addr != "127.0.0.1:9" || cfg.LatencyMs != 300 || cfg.DeclineRate != 0.1 || cfg.DropRate != 0.2 ||
		cfg.Seed == nil || *cfg.Seed != -5 || cfg.CallLogPath != "/tmp/x" || cfg.LogLevel != "debug" ||
		cfg.Protocol != ProtocolISO20022 || cfg.StatementDir != "/tmp/st" || cfg.StatementEvery != 250*time.Millisecond {
		t.Fatalf("from env with a flag winning: %+v %v", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		name string
	}{
		{nil, map[string]string{"RAIL_STUB_DECLINE_RATE": "1.01"}, "RAIL_STUB_DECLINE_RATE"},
		{nil, map[string]string{"RAIL_STUB_DROP_RATE": "-0.5"}, "RAIL_STUB_DROP_RATE"},
		{nil, map[string]string{"RAIL_STUB_DROP_RATE": "NaN"}, "RAIL_STUB_DROP_RATE"},
		{nil, map[string]string{"RAIL_STUB_LATENCY_MS": "-1"}, "RAIL_STUB_LATENCY_MS"},
		{nil, map[string]string{"RAIL_STUB_LATENCY_MS": "60001"}, "RAIL_STUB_LATENCY_MS"},
		{nil, map[string]string{"RAIL_STUB_LATENCY_MS": "2s"}, "RAIL_STUB_LATENCY_MS"},
		{nil, map[string]string{"RAIL_STUB_SEED": "1.5"}, "RAIL_STUB_SEED"},
		{nil, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{nil, map[string]string{"RAIL_STUB_PROTOCOL": "json"}, "RAIL_STUB_PROTOCOL"},
		{nil, map[string]string{"RAIL_STUB_PROTOCOL": "ISO20022"}, "RAIL_STUB_PROTOCOL"},
		{nil, map[string]string{"RAIL_STUB_STATEMENT_EVERY": "0s"}, "RAIL_STUB_STATEMENT_EVERY"},
		{nil, map[string]string{"RAIL_STUB_STATEMENT_EVERY": "-1s"}, "RAIL_STUB_STATEMENT_EVERY"},
		{nil, map[string]string{"RAIL_STUB_STATEMENT_EVERY": "5"}, "RAIL_STUB_STATEMENT_EVERY"},
		{[]string{"--rail-stub-addr="}, nil, "RAIL_STUB_ADDR"},
		{[]string{"migrate"}, nil, "migrate"},
		{[]string{"serve", "extra"}, nil, "extra"},
		{[]string{"--no-such-flag"}, nil, "no-such-flag"},
	} {
		_, _, err := ParseConfig(tc.args, env(tc.env))
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, tc.name) {
			t.Errorf("%v %v: err = %v, want a UsageError naming %s", tc.args, tc.env, err, tc.name)
		}
	}
	var usage bytes.Buffer
	if _, _, err := ParseConfigTo([]string{"--help"}, env(nil), &usage); !errors.Is(err, serve.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, v := range []string{"RAIL_STUB_ADDR", "LOG_LEVEL", "RAIL_STUB_LATENCY_MS", "RAIL_STUB_DECLINE_RATE", "RAIL_STUB_DROP_RATE", "RAIL_STUB_SEED", "RAIL_STUB_CALL_LOG",
		"RAIL_STUB_PROTOCOL", "RAIL_STUB_STATEMENT_DIR", "RAIL_STUB_STATEMENT_EVERY", ":8084"} {
		if !strings.Contains(usage.String(), v) {
			t.Errorf("usage lacks %s", v)
		}
	}
}
