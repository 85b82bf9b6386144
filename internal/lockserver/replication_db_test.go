package lockserver

import (
	"net/http"
	"strings"
	"testing"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgtest"
)

// lock-server shows on /metrics, from start-up, how many synchronous standbys
// lockdb's primary requires, and on a single server (none) says so once at WARN,
// naming itself.
func TestReportsSynchronousStandbys(t *testing.T) {
	t.Parallel()
	s := startServer(t, testConfig(pgtest.LockdbURL(t)))
	a, err := send(http.MethodGet, s.URL+"/metrics", nil, nil)
	if err != nil || !strings.Contains(string(a.Body), "\n"+dbconn.SyncStandbysGauge+" 0\n") {
		t.Errorf("/metrics on a single server lacks %s 0 (%v)", dbconn.SyncStandbysGauge, err)
	}
	warns := s.logs.Events(dbconn.NotSynchronousEvent)
	if len(warns) != 1 || warns[0]["level"] != "WARN" || warns[0]["service"] != "lock-server" || warns[0]["database"] != "lockdb" {
		t.Errorf("%s lines: %v; want one WARN naming lock-server and lockdb", dbconn.NotSynchronousEvent, warns)
	}
}
