package executor

import (
	"context"
	"encoding/json"
	"io"
	"lock.dev/internal/logcapture"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// syncBuffer is a log sink safe for concurrent writes and reads.
type syncBuffer struct{ logcapture.Buffer }

// started is an executor run in the background of a test.
type started struct {
	url  string
	logs *syncBuffer
	stop context.CancelFunc
	done chan error
}

func startRun(t *testing.T, cfg Config) *started {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg.Listener, cfg.LogOutput = ln, logs
	cfg.Identity.UnsafeNoAuth = noAuth
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{url: "http://" + ln.Addr().String(), logs: logs, stop: cancel, done: make(chan error, 1)}
	go func() { s.done <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Errorf("executor did not stop")
		}
		if t.Failed() {
			t.Logf("executor log:\n%s", logs.String())
		}
	})
	return s
}

func (s *started) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of the stop")
		return nil
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Health and metrics from start-up (docs/contracts/observability.md): liveness,
// readiness with the workers as its only component (no db), every
// executor_payout_total result and the pause counter at zero; and the warning, not
// a refusal, for a lease shorter than the proxy timeout.
func TestHealthMetricsAndShortLeaseWarning(t *testing.T) {
	t.Parallel()
	// Nothing listens there: the executor runs (and logs its failed scans) anyway.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	cfg := DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = deadURL, deadURL, deadURL
	cfg.LeaseTTL, cfg.ProxyTimeout = time.Second, 3*time.Second
	cfg.PollInterval = 50 * time.Millisecond
	s := startRun(t, cfg)

	testkit.Eventually(t, 30*time.Second, "readiness", func() bool { code, _ := get(t, s.url+"/readyz"); return code == 200 })
	_, body := get(t, s.url+"/readyz")
	var ready struct {
		Status     string
		Components map[string]struct{ Status string }
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil {
		t.Fatal(err)
	}
	if ready.Status != "UP" || len(ready.Components) != 1 || ready.Components["workers"].Status != "UP" {
		t.Fatalf("readiness %s, want UP with only the workers component", body)
	}
	if code, body := get(t, s.url+"/livez"); code != 200 || !strings.Contains(body, `"UP"`) {
		t.Fatalf("livez %d %s", code, body)
	}
	for _, path := range []string{"/metrics", "/actuator/prometheus"} {
		_, m := get(t, s.url+path)
		for _, r := range results {
			if !strings.Contains(m, `executor_payout_total{result="`+r+`"} 0`+"\n") {
				t.Errorf("%s lacks executor_payout_total{result=%q} 0", path, r)
			}
		}
		if !strings.Contains(m, "executor_pause_total 0\n") {
			t.Errorf("%s lacks executor_pause_total 0", path)
		}
		if strings.Count(m, "executor_payout_total{") != len(results) {
			t.Errorf("%s has executor_payout_total series beyond the closed set", path)
		}
	}
	if !strings.Contains(s.logs.String(), `"event":"lease_ttl_below_proxy_timeout"`) {
		t.Errorf("no warning about the lease TTL being shorter than the proxy timeout")
	}
	s.stop()
	if err := s.wait(t); err != nil {
		t.Fatalf("Run returned %v after a stop, want nil", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		if !strings.Contains(line, `"service":"executor"`) {
			t.Errorf("log line without service: %s", line)
		}
	}
}

// A stop while a submission is in flight: the submission is not abandoned, its
// answer is posted, the lease released, and Run returns nil.
func TestStopFinishesTheSubmissionInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := stack.Start(ctx, stack.Options{UnsafeNoAuth: noAuth, PaydbURL: pgtest.PaydbURL(t), LockdbURL: pgtest.LockdbURL(t), Env: scriptedRail})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	received, answer := make(chan struct{}), make(chan struct{})
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the audit trail: nothing on record
			lockapi.WriteJSON(w, 200, lockapi.SubmissionList{Submissions: []lockapi.Submission{}})
			return
		}
		close(received)
		<-answer
		if r.Context().Err() != nil {
			return // the executor hung up: it abandoned the submission
		}
		acceptAs("RS-late")(w, r)
	}))
	defer fake.Close()
	pc := payment.NewClient(st.PaymentURL)
	if _, err := pc.Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-stop", AccountID: "acct-stop", AmountMinor: 700,
		Currency: "EUR", Beneficiary: "FR7630006000011234567890189"}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = st.LockServerURL, st.PaymentURL, fake.URL
	cfg.OwnerID, cfg.Workers, cfg.LeaseTTL, cfg.PollInterval = "stopper", 1, 2*time.Second, 20*time.Millisecond
	s := startRun(t, cfg)
	<-received
	s.stop()
	// Readiness goes DOWN only after the stop reached the workers' context.
	testkit.Eventually(t, 30*time.Second, "readiness DOWN", func() bool { code, _ := get(t, s.url+"/readyz"); return code == 503 })
	close(answer)
	if err := s.wait(t); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	p, err := pc.Get(ctx, "p-stop")
	if err != nil {
		t.Fatal(err)
	}
	if p.Status != lockapi.StatusPaid || deref(p.RailReference) != "RS-late" {
		t.Fatalf("payout %s %q after a stop mid-submission, want PAID RS-late", p.Status, deref(p.RailReference))
	}
	var released bool
	if err := st.Lockdb.QueryRow(ctx, `SELECT released_at IS NOT NULL FROM lock_grant WHERE lock_name = 'account:acct-stop' AND token = $1`,
		p.FenceToken).Scan(&released); err != nil || !released {
		t.Fatalf("the lease was not released (%v)", err)
	}
}

// A stop during a pause abandons the cycle before anything is sent: the payout
// stays CLAIMED for the reconcile pass, the lease is released, Run returns nil.
func TestStopDuringPauseSubmitsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := stack.Start(ctx, stack.Options{UnsafeNoAuth: noAuth, PaydbURL: pgtest.PaydbURL(t), LockdbURL: pgtest.LockdbURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	pc := payment.NewClient(st.PaymentURL)
	if _, err := pc.Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-pause", AccountID: "acct-pause", AmountMinor: 700,
		Currency: "EUR", Beneficiary: "FR7630006000011234567890189"}); err != nil {
		t.Fatal(err)
	}
	paused := make(chan struct{})
	cfg := DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = st.LockServerURL, st.PaymentURL, st.ProxyURL
	cfg.OwnerID, cfg.Workers, cfg.LeaseTTL, cfg.PollInterval = "sleeper", 1, 2*time.Second, 20*time.Millisecond
	cfg.PauseProbability = 1
	cfg.PauseHook = func(ctx context.Context, _ string) {
		close(paused)
		<-ctx.Done()
	}
	s := startRun(t, cfg)
	<-paused
	s.stop()
	if err := s.wait(t); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	p, err := pc.Get(ctx, "p-pause")
	if err != nil {
		t.Fatal(err)
	}
	if p.Status != lockapi.StatusClaimed {
		t.Fatalf("payout %s, want CLAIMED", p.Status)
	}
	calls, err := st.Stub.Calls(ctx)
	if err != nil || len(calls) != 0 {
		t.Fatalf("the rail saw %d calls (%v), want none", len(calls), err)
	}
	var rows int
	if err := st.Paydb.QueryRow(ctx, `SELECT count(*) FROM rail_submission`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d submissions reached rail-proxy (%v), want none", rows, err)
	}
	var released bool
	if err := st.Lockdb.QueryRow(ctx, `SELECT released_at IS NOT NULL FROM lock_grant WHERE lock_name = 'account:acct-pause' AND token = $1`,
		p.FenceToken).Scan(&released); err != nil || !released {
		t.Fatalf("the lease was not released (%v)", err)
	}
}

// A post refused at fence point (a) — someone re-claimed the payout meanwhile — is
// logged and not retried.
func TestRefusedPostIsNotRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := stack.Start(ctx, stack.Options{UnsafeNoAuth: noAuth, PaydbURL: pgtest.PaydbURL(t), LockdbURL: pgtest.LockdbURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	pc := payment.NewClient(st.PaymentURL)
	if _, err := pc.Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-refused", AccountID: "acct-refused", AmountMinor: 700,
		Currency: "EUR", Beneficiary: "FR7630006000011234567890189"}); err != nil {
		t.Fatal(err)
	}
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A newer claimant takes the payout while the rail answers.
		if _, err := pc.Claim(r.Context(), "p-refused", 1_000_000, "interloper"); err != nil {
			t.Errorf("interloper's claim: %v", err)
		}
		acceptAs("RS-refused")(w, r)
	}))
	defer fake.Close()
	cfg := DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = st.LockServerURL, st.PaymentURL, fake.URL
	cfg.OwnerID, cfg.Workers, cfg.LeaseTTL, cfg.PollInterval = "refused", 1, 2*time.Second, 20*time.Millisecond
	cfg.ReconcileInterval = -1
	s := startRun(t, cfg)
	testkit.Eventually(t, 30*time.Second, "the refused post", func() bool { return strings.Contains(s.logs.String(), `"event":"post_refused"`) })
	s.stop()
	if err := s.wait(t); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(s.logs.String(), `"event":"post_refused"`); n != 1 {
		t.Fatalf("%d refused posts logged, want 1", n)
	}
	_, m := get(t, st.PaymentURL+"/metrics")
	if !strings.Contains(m, `lock_fenced_out_total{resource="payout"} 1`+"\n") {
		t.Fatalf("payment-resource fenced %s, want exactly one fenced post", grepLine(m, "lock_fenced_out_total{"))
	}
	p, err := pc.Get(ctx, "p-refused")
	if err != nil {
		t.Fatal(err)
	}
	if p.Status != lockapi.StatusClaimed || deref(p.ClaimedBy) != "interloper" {
		t.Fatalf("payout %s by %q, want still CLAIMED by the interloper", p.Status, deref(p.ClaimedBy))
	}
}

func grepLine(s, prefix string) string {
	for line := range strings.SplitSeq(s, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return "(none)"
}
