package railstub

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkPayment measures accepted payments per second over real HTTP, many
// callers at once, with the calls kept in memory and with the fsynced file.
//
//	go test -run '^$' -bench Payment -benchtime 3s ./internal/railstub/
func BenchmarkPayment(b *testing.B) {
	for _, tc := range []struct {
		name string
		file bool
	}{{"memory", false}, {"file", true}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			seed := int64(1)
			cfg.Seed, cfg.LogOutput, cfg.LogLevel = &seed, &syncBuffer{}, "warn"
			if tc.file {
				cfg.CallLogPath = filepath.Join(b.TempDir(), "calls.jsonl")
			}
			s, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			url, shutdown := serveFast(b, s.Handler(), s)
			defer func() { _ = shutdown(); _ = s.Close() }()
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			body := mustJSON(b, payment("p-bench"))
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r, err := send(context.Background(), hc, url, http.MethodPost, "/rail/v1/payments", "application/json", body)
					if err != nil || r.status != http.StatusOK {
						b.Errorf("pay: %d %v", r.status, err)
						return
					}
				}
			})
			// Shutdown waits out connections the client opened and never used
			// (up to the 5 s read timeout): not part of a payment.
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "payments/s")
		})
	}
}
