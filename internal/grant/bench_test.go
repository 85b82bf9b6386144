package grant_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/grant"
	"lock.dev/lockapi"
)

// BenchmarkGateCheck is what docs/contracts/signed-grants.md adds to one
// submission: the gate's whole check — reading X-Fencing-Grant, verifying,
// comparing lock, token and owner — as a fence point runs it.
//
//	go test -run '^$' -bench GateCheck -benchtime 2s ./internal/grant/
//
// cached: the lease's grant was verified before (every submission of a lease but
// its first). uncached: every grant is new to the verifier (a lease's first
// submission; the cost is one Ed25519 verification plus parsing). Both run in
// parallel on every core, as submissions do.
func BenchmarkGateCheck(b *testing.B) {
	k := newKeyPair(b)
	const pool = 1024
	reqs := make([]*http.Request, pool)
	fenced := make([]grant.Fenced, pool)
	for i := range pool {
		acct := fmt.Sprintf("acct-%04d", i)
		g := k.Sign(b, lockapi.AccountLockName(acct), int64(1000+i), "executor-1")
		r := httptest.NewRequest(http.MethodPost, "/v1/rail/submissions", nil)
		r.Header.Set(lockapi.HeaderFencingGrant, g)
		reqs[i] = r
		fenced[i] = grant.Fenced{AccountID: acct, PayoutID: "p-1", Token: int64(1000 + i), OwnerID: "executor-1"}
	}
	run := func(b *testing.B, cacheSize int) {
		g, err := grant.NewGate(k.Set, cacheSize, prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		for i := range pool { // warm: cached runs start with every grant verified
			if !g.Check(httptest.NewRecorder(), reqs[i], fenced[i]) {
				b.Fatal("a real grant was refused")
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			w := httptest.NewRecorder()
			i := 0
			for pb.Next() {
				i = (i + 7) % pool
				if !g.Check(w, reqs[i], fenced[i]) {
					b.Error("a real grant was refused")
					return
				}
			}
		})
	}
	b.Run("cached", func(b *testing.B) { run(b, pool) })
	// A cache of one, cycling through a thousand grants: every check misses.
	b.Run("uncached", func(b *testing.B) { run(b, 1) })
}
