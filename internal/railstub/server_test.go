package railstub

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

func get(t *testing.T, url string) reply {
	t.Helper()
	r, err := send(t.Context(), http.DefaultClient, url, http.MethodGet, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Health and metrics: the rail's health and /livez, /readyz answer UP; /metrics
// and /actuator/prometheus carry rail_stub_calls_total with its closed set at 0
// from the start, the Go and process collectors, and count each kind of call.
func TestHealthAndMetrics(t *testing.T) {
	t.Parallel()
	ts := startStub(t, nil)
	for _, p := range []string{"/rail/v1/health", "/livez", "/readyz", "/actuator/health"} {
		r := get(t, ts.URL+p)
		var body struct{ Status string }
		if err := json.Unmarshal(r.body, &body); err != nil || r.status != http.StatusOK || body.Status != "UP" {
			t.Fatalf("%s = %d %s, want 200 UP", p, r.status, r.body)
		}
	}
	if err := ts.Client.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/metrics", "/actuator/prometheus"} {
		body := string(get(t, ts.URL+p).body)
		for _, want := range []string{
			`rail_stub_calls_total{result="accepted"} 0`, `rail_stub_calls_total{result="declined"} 0`,
			`rail_stub_calls_total{result="dropped"} 0`, "go_goroutines ", "process_cpu_seconds_total ",
		} {
			if !strings.Contains(body, want) {
				t.Fatalf("%s lacks %q", p, want)
			}
		}
	}
	pay(t, ts, payment("p-1"))
	if _, err := ts.Client.SetChaos(t.Context(), 0, 1, 0, nil); err != nil {
		t.Fatal(err)
	}
	pay(t, ts, payment("p-2"))
	pay(t, ts, payment("p-3"))
	if _, err := ts.Client.SetChaos(t.Context(), 0, 0, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Client.Pay(t.Context(), payment("p-4")); !isDropped(err) {
		t.Fatalf("want a drop, got %v", err)
	}
	body := string(get(t, ts.URL+"/metrics").body)
	for _, want := range []string{`rail_stub_calls_total{result="accepted"} 1`, `rail_stub_calls_total{result="declined"} 2`, `rail_stub_calls_total{result="dropped"} 1`} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q after the calls", want)
		}
	}
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "rail_stub_calls_total{") && !strings.Contains(line, `result="`) {
			t.Fatalf("unexpected series %q", line)
		}
	}
}

// Unknown routes and methods answer problem+json 404 and 405.
func TestUnknownRouteAndMethod(t *testing.T) {
	t.Parallel()
	ts := startStub(t, nil)
	problem(t, get(t, ts.URL+"/rail/v1/nope"), http.StatusNotFound, lockapi.CodeNotFound)
	r := get(t, ts.URL+"/rail/v1/payments")
	problem(t, r, http.StatusMethodNotAllowed, lockapi.CodeMethodNotAllowed)
	if !strings.Contains(r.header.Get("Allow"), "POST") {
		t.Fatalf("Allow = %q", r.header.Get("Allow"))
	}
}

// Run serves on the given listener until its context ends, then drains and
// returns nil, leaving the call-log file closed and complete.
func TestRunServesUntilCancelled(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	cfg := DefaultConfig()
	cfg.Listener, cfg.LogOutput, cfg.CallLogPath, cfg.LatencyMs = ln, &syncBuffer{}, path, 1
	cfg.Identity = unsafeNoAuth()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	c := NewClient("http://" + ln.Addr().String() + "/")
	testkit.Eventually(t, 5*time.Second, "the stub to be healthy", func() bool { return c.Health(t.Context()) == nil })
	reply, err := c.Pay(t.Context(), payment("p-1"))
	if err != nil || reply.Status != ResultAccepted {
		t.Fatalf("Pay = %+v, %v", reply, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v, want nil after a clean drain", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if cs := fileLines(t, path); len(cs) != 1 || cs[0].RailReference != reply.RailReference {
		t.Fatalf("file after Run = %+v", cs)
	}
}

// A stub without a seed picks one, logs it, and GET chaos reports it, so the run
// can be replayed.
func TestRandomSeedIsLoggedAndShown(t *testing.T) {
	t.Parallel()
	ts := startStub(t, func(c *Config) { c.Seed = nil })
	var logged struct {
		Event      string
		Seed       int64
		SeedChosen bool
	}
	for line := range strings.Lines(ts.logs.String()) {
		if strings.Contains(line, `"rail_stub_started"`) {
			if err := json.Unmarshal([]byte(line), &logged); err != nil {
				t.Fatal(err)
			}
		}
	}
	if logged.Event != "rail_stub_started" || !logged.SeedChosen {
		t.Fatalf("rail_stub_started = %+v", logged)
	}
	ch, err := ts.Client.Chaos(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if logged.Seed != ch.Seed {
		t.Fatalf("logged seed %d, chaos says %d", logged.Seed, ch.Seed)
	}
}

// On shutdown a delayed reply that comes due within the drain is still sent; one
// that would come later is dropped (the payment stays booked), so Run returns nil
// promptly instead of outliving its grace.
func TestShutdownDrainsDelayedReplies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		latencyMs int
		wantDrop  bool
	}{{"reply due inside the drain", 300, false}, {"reply due after the drain", 60_000, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.Listener, cfg.LogOutput, cfg.LatencyMs, cfg.drainReplies = ln, &syncBuffer{}, tc.latencyMs, 2*time.Second
			cfg.Identity = unsafeNoAuth()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			c := NewClient("http://" + ln.Addr().String())
			testkit.Eventually(t, 5*time.Second, "the stub to be healthy", func() bool { return c.Health(t.Context()) == nil })
			paid := make(chan error, 1)
			go func() {
				_, err := c.Pay(t.Context(), payment("p-1"))
				paid <- err
			}()
			testkit.Eventually(t, 5*time.Second, "the call to be booked", func() bool { cs, err := c.Calls(t.Context()); return err == nil && len(cs) == 1 })
			cancel()
			err = <-paid
			if tc.wantDrop != isDropped(err) || (!tc.wantDrop && err != nil) {
				t.Fatalf("caller got %v, want dropped=%v", err, tc.wantDrop)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run = %v, want nil", err)
				}
			case <-time.After(8 * time.Second):
				t.Fatal("Run did not return within the drain")
			}
		})
	}
}
