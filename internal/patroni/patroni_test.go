package patroni_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/patroni"
)

// The harness itself: a cluster starts with a leader and a synchronous standby,
// a switchover hands the leadership to the standby, a killed leader is replaced
// by the synchronous standby and rejoins when started again, and Stop leaves
// no process and no directory behind.
func TestClusterFailsOverAndStops(t *testing.T) {
	if err := patroni.Check(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var logs strings.Builder
	t0 := time.Now()
	c, err := patroni.Start(ctx, patroni.Options{Log: &logs})
	if err != nil {
		t.Fatalf("start: %v\n%s", err, logs.String())
	}
	stopped := false
	defer func() {
		if t.Failed() {
			_ = c.WriteLogs(&logs)
			t.Logf("logs:\n%s", tail(logs.String(), 200))
		}
		if !stopped {
			_ = c.Stop()
		}
	}()
	l, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.SyncStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started in %s: leader %s, synchronous standby %s", time.Since(t0).Round(time.Millisecond), l.Name, s.Name)
	if err := c.CreateDatabase(ctx, "probe"); err != nil {
		t.Fatal(err)
	}

	t0 = time.Now()
	if err := c.Switchover(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	t.Logf("switchover to %s: %s", s.Name, time.Since(t0).Round(time.Millisecond))
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}

	l, err = c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err = c.SyncStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := c.Kill(ctx, l.Name); err != nil {
		t.Fatal(err)
	}
	nl, err := c.WaitLeader(ctx, l.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kill -9 %s: %s leads after %s", l.Name, nl.Name, time.Since(t0).Round(time.Millisecond))
	if nl.Name != s.Name {
		t.Errorf("the new leader is %s, not the synchronous standby %s", nl.Name, s.Name)
	}
	t0 = time.Now()
	if err := c.StartMember(ctx, l.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s rejoined in %s", l.Name, time.Since(t0).Round(time.Millisecond))
	url, err := c.MemberURL(nl.Name, "probe")
	if err != nil || !strings.Contains(c.URL("probe"), "target_session_attrs=read-write") || url == "" {
		t.Errorf("URLs: %v", err)
	}

	dir := c.Dir()
	stopped = true
	t0 = time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped in %s", time.Since(t0).Round(time.Millisecond))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left behind after Stop (%v)", dir, err)
	}
	if left := patroni.ProcessesUnder(dir); len(left) > 0 {
		t.Errorf("processes left behind after Stop: %v", left)
	}
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
