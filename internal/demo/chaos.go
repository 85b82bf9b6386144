package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// The chaos at intensity 1. Each is scaled by Config.Chaos.
const (
	dropRate        = 0.03 // the rail accepts, then closes the connection without a reply
	declineRate     = 0.05 // the rail declines (no money moves)
	slowProbability = 0.06 // per chaos tick: the rail turns slow for slowWindow
	chaosTick       = 250 * time.Millisecond
	slowWindow      = time.Second
	baseLatencyMs   = 20 // a rail is never instant; it also keeps calls in flight for the crash
)

func (s *scenario) rates() (drop, decline float64) {
	return dropRate * s.cfg.Chaos, declineRate * s.cfg.Chaos
}

// slowLatencyMs is the rail's latency in a slow window: past the proxy's read
// timeout, so every call then ends TIMEOUT although the rail booked the payment.
func (s *scenario) slowLatencyMs() int {
	return int((s.cfg.RailReadTimeout + 300*time.Millisecond).Milliseconds())
}

// crashPoint is the share of settled payouts (in ‰) at which crash i of n happens:
// early enough that its interrupted intents are settled within the run.
func crashPoint(i, n int) uint64 {
	return uint64(250 + 500*i/n)
}

// chaos runs the rail's slow windows and the rail-proxy crashes until ctx ends.
// The schedule is drawn from the seed; when a window falls depends on the clock.
func (s *scenario) chaos(ctx context.Context) {
	rng := rand.New(rand.NewPCG(uint64(s.cfg.Seed), 2))
	tick := time.NewTicker(chaosTick)
	defer tick.Stop()
	var slowUntil time.Time
	crashes := 0
	failedOver := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if crashes < s.cfg.Crashes && s.settledFrac.Load() >= crashPoint(crashes, s.cfg.Crashes) {
			crashes++
			if err := s.crash(ctx); err != nil {
				if ctx.Err() == nil {
					s.fail <- err
				}
				return
			}
			slowUntil = time.Time{}
			continue
		}
		if s.cfg.Failover != "" && !failedOver && crashes == s.cfg.Crashes && s.settledFrac.Load() >= failoverPoint {
			failedOver = true
			if err := s.failover(ctx); err != nil { // failover.go
				if ctx.Err() == nil {
					s.fail <- err
				}
				return
			}
			continue
		}
		now := time.Now()
		if !slowUntil.IsZero() {
			if now.After(slowUntil) {
				s.setLatency(ctx, baseLatencyMs)
				slowUntil = time.Time{}
			}
			continue
		}
		if rng.Float64() < slowProbability*s.cfg.Chaos {
			s.slowWindows.Add(1)
			s.setLatency(ctx, s.slowLatencyMs())
			slowUntil = now.Add(slowWindow)
		}
	}
}

// crash kills rail-proxy with SIGKILL while submissions are in flight and starts
// it again on the same port. The rail holds its replies first, and the kill comes
// just after it has booked a call it has not answered: that intent, and any other
// in flight, stays unresolved until the restarted proxy's janitor, after
// RAIL_PROXY_INTERRUPTED_AFTER, resolves it TIMEOUT (money may have moved).
func (s *scenario) crash(ctx context.Context) error {
	var after int64
	if calls, err := s.st.Stub.Calls(ctx); err == nil && len(calls) > 0 {
		after = calls[len(calls)-1].Seq
	}
	// Held past the read timeout: a call booked now is unresolved until the
	// proxy gives up on it, RailReadTimeout after sending it.
	s.setLatency(ctx, int(2*s.cfg.RailReadTimeout.Milliseconds()))
	giveUp := time.Now().Add(3 * time.Second)
	for time.Now().Before(giveUp) {
		if page, err := s.st.Stub.CallsPage(ctx, after, 1); err == nil && len(page) > 0 {
			break
		}
		if !sleep(ctx, 20*time.Millisecond) {
			return nil
		}
	}
	if !sleep(ctx, s.cfg.RailReadTimeout/8) { // let a few more in
		return nil
	}
	err := s.st.CrashProxy(ctx)
	s.crashes.Add(1)
	s.setLatency(ctx, baseLatencyMs)
	if err != nil {
		return fmt.Errorf("restart rail-proxy after the crash: %w", err)
	}
	return nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// setLatency changes the rail's latency and keeps its other knobs; the draw
// sequence carries on (no seed is sent).
func (s *scenario) setLatency(ctx context.Context, ms int) {
	drop, decline := s.rates()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// A failure leaves the rail as it was: the run goes on with less chaos.
	_, _ = s.st.Stub.SetChaos(cctx, ms, decline, drop, nil)
}
