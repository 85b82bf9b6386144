package service

import (
	"context"
	"errors"
	"io"
	"lock.dev/internal/identity"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lock.dev/internal/logcapture"
	"lock.dev/internal/serve"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

func TestStartClosesTheListenerOnABadSetting(t *testing.T) {
	ln := listen(t)
	bad := serve.Invalid("DEMO_ADDR", "must not be empty")
	_, err := Start(Spec{Name: "demo-svc", Identity: noAuth, LogLevel: "info", LogOutput: io.Discard, Listener: ln, Validate: func() error { return bad }})
	if !errors.Is(err, bad) {
		t.Fatalf("Start = %v, want the setting's refusal", err)
	}
	if !closed(ln) {
		t.Error("the listener handed in is still open")
	}
	ln = listen(t)
	_, err = Start(Spec{Name: "demo-svc", Identity: noAuth, LogLevel: "loud", LogOutput: io.Discard, Listener: ln, Validate: func() error { return nil }})
	var ue *serve.UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "LOG_LEVEL") || !closed(ln) {
		t.Fatalf("Start with a bad level = %v (listener closed: %v), want a LOG_LEVEL refusal and the listener closed", err, closed(ln))
	}
}

// A service without a database: readiness with its own component, metrics, a
// start-up line with the address, then a drain when ctx ends.
func TestServeUntilCancelled(t *testing.T) {
	ln := listen(t)
	var log logcapture.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(Spec{Name: "demo-svc", Identity: noAuth, LogLevel: "info", LogOutput: &log, Listener: ln, Validate: func() error { return nil }},
			func(sv *Service) error {
				sv.Health.Add("workers", func(context.Context) error { return nil })
				mux := http.NewServeMux()
				serve.Mount(mux, sv.Health, sv.Registry)
				return sv.Serve(ctx, serve.Handler(mux, sv.Logger), serve.Serve, func(addr string) {
					sv.Logger.Info("demo-svc starting", "addr", addr)
					started <- addr
				})
			})
	}()
	var addr string
	select {
	case addr = <-started:
	case err := <-done:
		t.Fatalf("Run ended before serving: %v", err)
	}
	if addr != ln.Addr().String() {
		t.Fatalf("started with %s, want the listener's %s", addr, ln.Addr())
	}
	for path, want := range map[string]string{"/readyz": `"workers":{"status":"UP"`, "/metrics": "go_goroutines"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %s, want 200 with %s", path, resp.StatusCode, body, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v, want nil after a clean drain", err)
	}
	lines := log.Lines()
	if len(lines) == 0 || lines[0]["msg"] != "demo-svc starting" || lines[0]["service"] != "demo-svc" {
		t.Errorf("log %v, want the start-up line first, with service=demo-svc", lines)
	}
}

func TestRunDispatchesTheSubcommand(t *testing.T) {
	type cfg struct{ n int }
	parse := func(args []string, getenv func(string) string) (string, cfg, error) {
		if len(args) == 0 {
			return "", cfg{}, &serve.UsageError{Msg: "demo-svc: no command"}
		}
		return args[0], cfg{n: len(getenv("N"))}, nil
	}
	var ran string
	commands := Commands[cfg]{
		"serve":   func(_ context.Context, c cfg) error { ran = "serve"; return nil },
		"migrate": func(_ context.Context, c cfg) error { ran = "migrate"; return errors.New("paydb unreachable") },
	}
	getenv := func(string) string { return "xy" }
	ctx := context.Background()
	if err := run(ctx, []string{"serve"}, getenv, parse, commands); err != nil || ran != "serve" {
		t.Fatalf("serve: %v, ran %q", err, ran)
	}
	if err := run(ctx, []string{"migrate"}, getenv, parse, commands); err == nil || ran != "migrate" || serve.ExitCode(err, io.Discard) != 1 {
		t.Fatalf("migrate: %v, ran %q, want its error (exit 1)", err, ran)
	}
	ran = ""
	if err := run(ctx, nil, getenv, parse, commands); serve.ExitCode(err, io.Discard) != 2 || ran != "" {
		t.Fatalf("a bad command line: %v, ran %q, want exit 2 and nothing run", err, ran)
	}
	if err := run(ctx, []string{"keygen"}, getenv, parse, commands); err == nil {
		t.Fatal("a command parse accepts but nothing runs: nil, want an error")
	}
}

func TestRegistryHasEveryFamilyWithoutStarting(t *testing.T) {
	reg := Registry(DatabaseFamilies, GrantFamilies)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, n := range []string{"go_goroutines", "process_open_fds", "db_synchronous_standbys", "grant_rejected_total"} {
		if !names[n] {
			t.Errorf("the registry lacks %s", n)
		}
	}
}

func TestGrantKeys(t *testing.T) {
	var log logcapture.Buffer
	sv, err := Start(Spec{Name: "demo-svc", Identity: noAuth, LogLevel: "info", LogOutput: &log, Validate: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := ReadGrantKeys("DEMO_GRANT_KEYS_FILE", "")
	if err != nil {
		t.Fatalf("no file: %v", err)
	}
	gate, err := sv.GrantGate(t.Context(), keys, true)
	if err != nil || gate.Verifying() {
		t.Fatalf("gate %v, %v: want one that verifies nothing", gate, err)
	}
	if ev := log.Events("grants_not_verified"); len(ev) != 1 || ev[0]["setting"] != "DEMO_GRANT_KEYS_FILE" {
		t.Errorf("grants_not_verified events %v, want one naming the setting", ev)
	}

	bad := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(bad, []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = ReadGrantKeys("DEMO_GRANT_KEYS_FILE", bad)
	var ue *serve.UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "DEMO_GRANT_KEYS_FILE") || serve.ExitCode(err, io.Discard) != 2 {
		t.Fatalf("a file with no usable key: %v, want a usage error naming the setting (exit 2)", err)
	}
}

func TestLoggers(t *testing.T) {
	var log logcapture.Buffer
	l, closeLog, err := NewBatchedLogger(&log, "demo-svc", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("dropped")
	l.Warn("kept", "event", "demo")
	closeLog()
	if lines := log.Lines(); len(lines) != 1 || lines[0]["msg"] != "kept" || lines[0]["service"] != "demo-svc" {
		t.Fatalf("log %v, want the one WARN line with service=demo-svc", lines)
	}
	if _, _, err := NewBatchedLogger(nil, "demo-svc", "loud"); err == nil {
		t.Fatal("a bad level: nil, want LOG_LEVEL's refusal")
	}
	if Output(nil) != os.Stdout || Output(&log) != &log {
		t.Fatal("Output: nil is stdout, anything else itself")
	}
}

// noAuth runs a test's service without identity: those tests are about the
// skeleton's other parts, not identity (docs/contracts/workload-identity.md).
var noAuth = identity.Settings{UnsafeNoAuth: true}
