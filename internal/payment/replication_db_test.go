package payment_test

import (
	"testing"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgtest"
)

// payment-resource shows on /metrics, from start-up, how many synchronous
// standbys paydb's primary requires, and on a single server (none) says so once
// at WARN, naming itself.
func TestReportsSynchronousStandbys(t *testing.T) {
	t.Parallel()
	e := startOn(t, pgtest.PaydbURL(t))
	if v := e.metric(t, dbconn.SyncStandbysGauge); v != 0 {
		t.Errorf("%s = %v on a single server, want 0", dbconn.SyncStandbysGauge, v)
	}
	warns := e.logs.events(t, dbconn.NotSynchronousEvent)
	if len(warns) != 1 || warns[0]["level"] != "WARN" || warns[0]["service"] != "payment-resource" || warns[0]["database"] != "paydb" {
		t.Errorf("%s lines: %v; want one WARN naming payment-resource and paydb", dbconn.NotSynchronousEvent, warns)
	}
}
