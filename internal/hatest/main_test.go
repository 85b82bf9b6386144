package hatest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/patroni"
)

// cluster is the package's Patroni cluster, started once by TestMain: three
// members, synchronous mode strict. Every test finds it healthy (a leader, a
// synchronous standby, every member streaming) and leaves it so.
var cluster *patroni.Cluster

// clusterOptions are the timers docs/operations/high-availability.md gives:
// ttl 20 s (the minimum Patroni's documentation allows: a killed leader is
// replaced after about 20 s), loop_wait 2 s and retry_timeout 5 s, short so that
// reassignments are quick, keeping ttl >= loop_wait + 2*retry_timeout.
var clusterOptions = patroni.Options{TTL: 20 * time.Second, LoopWait: 2 * time.Second, RetryTimeout: 5 * time.Second}

func TestMain(m *testing.M) { os.Exit(run(m)) }

// run starts the cluster, runs the tests and stops the cluster. Without
// Patroni or etcd the package fails, saying what to install: these tests are
// part of the proof and are never skipped.
func run(m *testing.M) int {
	if err := patroni.Check(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: the high-availability tests need Patroni, etcd and PostgreSQL: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var logs strings.Builder
	opts := clusterOptions
	opts.Log = &logs
	c, err := patroni.Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: start the Patroni cluster: %v\n%s\n", err, logs.String())
		return 1
	}
	cluster = c
	code := m.Run()
	if code == 0 && judgedRuns.Load() > 0 && fencedTotal.Load() == 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d runs under load fenced no submission: without a stale writer at the gate, 0 stale admissions proves nothing\n", judgedRuns.Load())
		code = 1
	}
	dir := c.Dir()
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: stop the Patroni cluster: %v\n", err)
		return 1
	}
	// Nothing may outlive the package: not a process, not a file.
	if left := patroni.ProcessesUnder(dir); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: processes left running after the cluster stopped:\n%s\n", strings.Join(left, "\n"))
		return 1
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "FAIL: %s left behind after the cluster stopped (%v)\n", dir, err)
		return 1
	}
	return code
}
