package railproxy

import (
	"strings"
	"testing"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
)

// rail-proxy says, at start-up and on its /metrics, how many synchronous
// standbys paydb's primary requires: 0 on a single server, with one WARN that
// names the service and the database; 1 on a primary with a synchronous
// standby, without that WARN. Through the running process's HTTP.
func TestReportsSynchronousStandbys(t *testing.T) {
	single := startProxy(t, testConfig(pgtest.PaydbURL(t), "http://127.0.0.1:1"))
	if v := metric(t, single, dbconn.SyncStandbysGauge); v != 0 {
		t.Errorf("single server: %s = %v, want 0 (-1: not exposed)", dbconn.SyncStandbysGauge, v)
	}
	warns := single.Logs.events(dbconn.NotSynchronousEvent)
	if len(warns) != 1 || warns[0]["level"] != "WARN" || warns[0]["service"] != "rail-proxy" || warns[0]["database"] != "paydb" {
		t.Errorf("single server: %s lines %v; want one WARN naming rail-proxy and paydb", dbconn.NotSynchronousEvent, warns)
	}
	for _, w := range warns {
		if msg, _ := w["msg"].(string); !strings.Contains(msg, "failover") {
			t.Errorf("the WARN does not say what it means: %q", msg)
		}
	}

	p := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	pair := startProxy(t, testConfig(p.URL("paydb"), "http://127.0.0.1:1"))
	if v := metric(t, pair, dbconn.SyncStandbysGauge); v != 1 {
		t.Errorf("synchronous pair: %s = %v, want 1 (-1: not exposed)", dbconn.SyncStandbysGauge, v)
	}
	if warns := pair.Logs.events(dbconn.NotSynchronousEvent); len(warns) != 0 {
		t.Errorf("synchronous pair: %s logged: %v", dbconn.NotSynchronousEvent, warns)
	}
	if infos := pair.Logs.events(dbconn.SynchronousEvent); len(infos) != 1 || infos[0]["synchronousStandbys"] != 1.0 {
		t.Errorf("synchronous pair: %s lines %v", dbconn.SynchronousEvent, infos)
	}
}
