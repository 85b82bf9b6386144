package executor

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/logcapture"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// A failure that repeats is logged once, then summarised with its count at most
// every interval, a different error at once, and its end in one line — where
// four workers polling every 500 ms used to write eight identical WARNs a second.
func TestRepeatLogLogsAFailureOnceThenSummaries(t *testing.T) {
	t.Parallel()
	var buf logcapture.Buffer
	now := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	r := newRepeatLog(slog.New(slog.NewJSONHandler(&buf, nil)), 30*time.Second, clock)
	down := errors.New(`list payouts: Get "http://127.0.0.1:8082/v1/payouts": connection refused`)

	// four workers, every 500 ms, for 29.5 s: one line
	for range 60 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { r.failed("scan_failed", "looking for PENDING payouts failed", down) })
		}
		wg.Wait()
		advance(500 * time.Millisecond)
	}
	lines := buf.Lines()
	if len(lines) != 1 || lines[0]["event"] != "scan_failed" || lines[0]["level"] != "WARN" || lines[0]["error"] != down.Error() || lines[0]["repeated"] != nil {
		t.Fatalf("240 identical failures in 30 s logged %d lines, want the first alone:\n%s", len(lines), buf.String())
	}
	// the next one, 30 s after the first line: the summary with the count
	r.failed("scan_failed", "looking for PENDING payouts failed", down)
	lines = buf.Lines()
	if len(lines) != 2 || lines[1]["repeated"] != float64(240) || lines[1]["failingFor"] != "30s" || lines[1]["event"] != "scan_failed" {
		t.Fatalf("the summary: %v, want repeated 240 after 30s", lines[len(lines)-1])
	}
	// another error of the same step: at once
	other := errors.New("list payouts: 503 UNAVAILABLE")
	r.failed("scan_failed", "looking for PENDING payouts failed", other)
	// another event is a failure of its own
	r.failed("reconcile_scan_failed", "looking for stale CLAIMED payouts failed", down)
	lines = buf.Lines()
	if len(lines) != 4 || lines[2]["error"] != other.Error() || lines[3]["event"] != "reconcile_scan_failed" {
		t.Fatalf("a new error and another event: %s", buf.String())
	}
	advance(time.Second)
	r.recovered("scan_failed")
	r.recovered("scan_failed") // no failure in progress: nothing
	r.recovered("acquire_failed")
	lines = buf.Lines()
	if len(lines) != 5 {
		t.Fatalf("recovery: %d lines, want one more:\n%s", len(lines), buf.String())
	}
	if l := lines[4]; l["event"] != "failure_recovered" || l["failedEvent"] != "scan_failed" || l["failures"] != float64(242) ||
		l["failingFor"] != "31s" || l["level"] != "INFO" || l["lastError"] != other.Error() {
		t.Fatalf("recovery line %v", l)
	}
	// failing again after the recovery is a new failure: logged at once
	r.failed("scan_failed", "looking for PENDING payouts failed", down)
	if lines = buf.Lines(); len(lines) != 6 || lines[5]["repeated"] != nil {
		t.Fatalf("a failure after the recovery: %s", buf.String())
	}
}

// An executor whose payment-resource keeps failing — four workers looking for
// work every 20 ms, dozens of failed looks — logs scan_failed once (a summary
// line, with repeated, only after repeatEvery), then one failure_recovered
// when the looks succeed again.
func TestExecutorLogsARepeatedScanFailureOnce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	up, looks := false, 0
	pay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Query().Get("status") == lockapi.StatusPending {
			looks++
		}
		if !up {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"about:blank","title":"Service Unavailable","status":503,"code":"UNAVAILABLE","detail":"paydb is down"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"payouts":[]}`))
	}))
	t.Cleanup(pay.Close)
	lookCount := func() int { mu.Lock(); defer mu.Unlock(); return looks }

	cfg := DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = pay.URL, pay.URL, pay.URL
	cfg.Workers, cfg.PollInterval = 4, 20*time.Millisecond
	s := startRun(t, cfg)
	testkit.Eventually(t, 60*time.Second, "50 failed looks for work", func() bool { return lookCount() >= 50 })
	scans := s.logs.Events("scan_failed")
	var first int
	for _, l := range scans {
		if l["repeated"] == nil {
			first++
		}
	}
	if first != 1 || len(scans) > 1+int(time.Since(startedAt(t, s))/repeatEvery) {
		t.Fatalf("%d failed looks logged %d scan_failed lines (%d without a count), want the first alone and a summary per %s:\n%s",
			lookCount(), len(scans), first, repeatEvery, s.logs.String())
	}
	mu.Lock()
	up = true
	mu.Unlock()
	testkit.Eventually(t, 60*time.Second, "failure_recovered for scan_failed", func() bool {
		for _, l := range s.logs.Events("failure_recovered") {
			if l["failedEvent"] == "scan_failed" && l["failures"].(float64) >= 50 {
				return true
			}
		}
		return false
	})
}

// startedAt is when the executor logged executor_started.
func startedAt(t *testing.T, s *started) time.Time {
	t.Helper()
	for _, l := range s.logs.Events("executor_started") {
		if ts, err := time.Parse(time.RFC3339Nano, l["time"].(string)); err == nil {
			return ts
		}
	}
	t.Fatal("no executor_started line")
	return time.Time{}
}
