package lockserver

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"lock.dev/internal/pgtest"
)

// Benchmarks of lock-server end to end: HTTP in, lockdb (the tests' throwaway
// PostgreSQL, fsync off) behind. Run with
//
//	go test -run '^$' -bench . -benchtime 5s ./internal/lockserver/
//
// They report grants/s (and attempts/s for the contended case); ns/op is per
// acquire+release, or per acquire attempt.

func benchServer(b *testing.B) *testServer {
	cfg := testConfig(pgtest.LockdbURL(b))
	cfg.LockdbMaxConns = 20
	cfg.LogLevel = "warn"
	cfg.LogOutput = io.Discard
	return startServer(b, cfg)
}

// BenchmarkGrantRelease: uncontended acquire + release cycles, each goroutine on
// its own lock.
func BenchmarkGrantRelease(b *testing.B) {
	s := benchServer(b)
	var ids atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		name := fmt.Sprintf("bench:%d", ids.Add(1))
		for pb.Next() {
			a, l, err := acquireCall(s.URL, name, "bench", 10000)
			if err != nil || a.Status != http.StatusOK {
				b.Errorf("acquire: %v %v", a, err)
				return
			}
			if a, err := releaseCall(s.URL, name, "bench", l.Token); err != nil || a.Status != http.StatusNoContent {
				b.Errorf("release: %v %v", a, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
}

// BenchmarkContendedAcquire: every goroutine keeps trying one lock; whoever gets
// it releases it at once. Most attempts are answered LOCK_HELD.
func BenchmarkContendedAcquire(b *testing.B) {
	s := benchServer(b)
	var ids, grants atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		owner := fmt.Sprintf("w%d", ids.Add(1))
		for pb.Next() {
			a, l, err := acquireCall(s.URL, "bench:hot", owner, 10000)
			if err != nil {
				b.Errorf("acquire: %v", err)
				return
			}
			switch a.Status {
			case http.StatusConflict:
			case http.StatusOK:
				grants.Add(1)
				if a, err := releaseCall(s.URL, "bench:hot", owner, l.Token); err != nil || a.Status != http.StatusNoContent {
					b.Errorf("release: %v %v", a, err)
					return
				}
			default:
				b.Errorf("acquire: %v", a)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "attempts/s")
	b.ReportMetric(float64(grants.Load())/b.Elapsed().Seconds(), "grants/s")
}
