package reconcile_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/testkit"
)

// The reconciler shows on /metrics, from start-up, how many synchronous standbys
// paydb's primary requires, and on a single server (none) says so once at WARN,
// naming itself.
func TestReportsSynchronousStandbys(t *testing.T) {
	t.Parallel()
	logs := &logcapture.Buffer{}
	cfg := reconcile.DefaultConfig()
	cfg.PaydbURL, cfg.SettleToken, cfg.LogOutput = pgtest.PaydbURL(t), goodToken, logs
	cfg.UnsafeNonDurableDB = true // the throwaway test cluster runs with fsync off
	// About the database's standbys, not identity
	// (docs/contracts/workload-identity.md).
	cfg.Identity.UnsafeNoAuth = true
	cfg.Interval = time.Hour
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reconcile.Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	}()
	body := ""
	testkit.Eventually(t, 20*time.Second, "the reconciler to serve /metrics", func() bool {
		resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	if !strings.Contains(body, "\n"+dbconn.SyncStandbysGauge+" 0\n") {
		t.Errorf("/metrics on a single server lacks %s 0", dbconn.SyncStandbysGauge)
	}
	warns := logs.Events(dbconn.NotSynchronousEvent)
	if len(warns) != 1 || warns[0]["level"] != "WARN" || warns[0]["service"] != "reconciler" || warns[0]["database"] != "paydb" {
		t.Errorf("%s lines: %v; want one WARN naming the reconciler and paydb", dbconn.NotSynchronousEvent, warns)
	}
}
