package lockserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// Metrics: every lock_* series exists at 0 from start-up, on both
// metrics paths, and then counts what lockdb decided.
func TestMetricsZeroInitialisedAndCounting(t *testing.T) {
	t.Parallel()
	s := startServer(t, testConfig(pgtest.LockdbURL(t)))
	zero := []string{
		`lock_grant_total{result="granted"} 0`,
		`lock_grant_total{result="held"} 0`,
		`lock_renew_total{result="renewed"} 0`,
		`lock_renew_total{result="lost"} 0`,
		`lock_release_total{result="released"} 0`,
		`lock_release_total{result="lost"} 0`,
	}
	for _, path := range []string{"/metrics", "/actuator/prometheus"} {
		a, err := send(http.MethodGet, s.URL+path, nil, nil)
		if err != nil || a.Status != http.StatusOK {
			t.Fatalf("%s: %v %v", path, a, err)
		}
		for _, line := range zero {
			if !strings.Contains(string(a.Body), "\n"+line+"\n") {
				t.Errorf("%s lacks %q at start-up", path, line)
			}
		}
		if !strings.Contains(string(a.Body), "go_goroutines") || !strings.Contains(string(a.Body), "process_") {
			t.Errorf("%s lacks the Go and process collectors", path)
		}
	}

	l := mustAcquire(t, s.URL, "m", "a", 5000)
	acquireCall(s.URL, "m", "b", 5000) // held
	mustRenew(t, s.URL, "m", "a", l.Token, 5000)
	renewCall(s.URL, "m", "b", l.Token, 5000) // lost: another owner
	renewCall(s.URL, "never", "b", 1, 5000)   // lost: no such lock
	releaseCall(s.URL, "m", "b", l.Token)     // lost
	mustRelease(t, s.URL, "m", "a", l.Token)  // released
	mustRelease(t, s.URL, "m", "a", l.Token)  // released again: still success
	acquireCall(s.URL, "m", "a b", 5000)      // malformed: not counted
	got := countersText(t, s.URL)
	for _, line := range []string{
		`lock_grant_total{result="granted"} 1`,
		`lock_grant_total{result="held"} 1`,
		`lock_renew_total{result="renewed"} 1`,
		`lock_renew_total{result="lost"} 2`,
		`lock_release_total{result="released"} 2`,
		`lock_release_total{result="lost"} 1`,
	} {
		if !strings.Contains(got, line) {
			t.Errorf("after the calls, metrics lack %q:\n%s", line, got)
		}
	}
}

func ready(t *testing.T, base string) (int, serve.Readiness) {
	t.Helper()
	var r serve.Readiness
	a, err := send(http.MethodGet, base+"/readyz", nil, nil)
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	if err := json.Unmarshal(a.Body, &r); err != nil {
		t.Fatalf("readyz body %s: %v", a.Body, err)
	}
	return a.Status, r
}

// Readiness: DOWN while lockdb cannot be reached, UP again when it
// can; meanwhile liveness stays UP and lease calls answer 503 UNAVAILABLE, both
// when lockdb refuses connections and when it stalls past the 2 s bound.
func TestReadinessAndUnavailableFollowLockdb(t *testing.T) {
	t.Parallel()
	s, proxy := startBehindProxy(t)

	if code, r := ready(t, s.URL); code != http.StatusOK || r.Status != "UP" || r.Components["db"].Status != "UP" {
		t.Fatalf("readyz with lockdb up: %d %+v", code, r)
	}
	l := mustAcquire(t, s.URL, "r", "a", 60000)

	proxy.Down()
	if code, r := ready(t, s.URL); code != http.StatusServiceUnavailable || r.Status != "DOWN" || r.Components["db"].Status != "DOWN" {
		t.Errorf("readyz with lockdb down: %d %+v", code, r)
	}
	if a, err := send(http.MethodGet, s.URL+"/livez", nil, nil); err != nil || a.Status != http.StatusOK {
		t.Errorf("livez with lockdb down: %v %v", a, err)
	}
	a, _, _ := acquireCall(s.URL, "r2", "a", 60000)
	wantProblem(t, "acquire with lockdb down", a, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	a, _, _ = renewCall(s.URL, "r", "a", l.Token, 60000)
	wantProblem(t, "renew with lockdb down", a, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	a = getJSON(t, lockURL(s.URL, "r", ""), nil)
	wantProblem(t, "GET with lockdb down", a, http.StatusServiceUnavailable, lockapi.CodeUnavailable)

	proxy.Hold()
	start := time.Now()
	a, _ = releaseCall(s.URL, "r", "a", l.Token)
	wantProblem(t, "release with lockdb stalled", a, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	if d := time.Since(start); d < dbTimeout {
		t.Errorf("stalled call answered after %s, before its %s bound: it cannot have waited for lockdb", d, dbTimeout)
	}

	proxy.Down() // drop the stalled connections
	proxy.Forward()
	testkit.EventuallyState(t, 10*time.Second, "readyz to recover", func() (bool, string) {
		code, r := ready(t, s.URL)
		return code == http.StatusOK && r.Components["db"].Status == "UP", fmt.Sprintf("%d %+v", code, r)
	})
	// Nothing the failed calls tried happened: the lease is still a's, token 1.
	var st lockapi.LockState
	if a := getJSON(t, lockURL(s.URL, "r", ""), &st); a.Status != http.StatusOK || !st.Held || *st.OwnerID != "a" || st.Token != 1 {
		t.Errorf("after recovery: %v %+v", a, st)
	}
	mustRelease(t, s.URL, "r", "a", l.Token)
}
