package railproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// forwardedPaydb is a paydb of the test's own reached through a forwarder the
// test can take away: db is paydb itself, viaURL the forwarder's, for the proxy.
func forwardedPaydb(t *testing.T) (db dbq, fwd *pgForwarder, viaURL string) {
	dbURL := pgtest.PaydbURL(t)
	db = pgtest.Pool(t, dbURL)
	fwd, viaURL = newPGForwarder(t, dbURL)
	return db, fwd, viaURL
}

// shortestInterrupt is cfg with the shortest RAIL_PROXY_INTERRUPTED_AFTER its
// timeouts allow.
func shortestInterrupt(cfg Config) Config {
	cfg.InterruptedAfter = cfg.InFlightBound() + InterruptMargin
	return cfg
}

// wantMetrics checks that each of p's series has the value want gives it.
func wantMetrics(t *testing.T, p *proxy, want map[string]float64) {
	t.Helper()
	for series, w := range want {
		if v := metric(t, p, series); v != w {
			t.Errorf("%s = %v, want %v", series, v, w)
		}
	}
}

// outageCase is one moment at which paydb goes away while rail-proxy knows a
// submission's outcome, for TestKnownOutcomeOutlivesPaydbOutage. Each case
// carries its own setup and its own expectations.
type outageCase struct {
	name    string
	outcome string // what the row must end with: what the proxy knew
	metric  string // the rail_submission_total outcome the submission counts as
	status  int
	// member and want: the answer's member that says what the proxy knew.
	member, want string
	// railCalls is how many times the rail is to have received p-out.
	railCalls int
	// configure changes the rail and the settings before the proxy starts
	// (nil: nothing to change).
	configure func(hold *holdingRail, cfg *Config)
	// submit submits p-out, takes paydb away at this case's moment, and returns
	// the answer.
	submit func(t *testing.T, p *proxy, fwd *pgForwarder, hold *holdingRail) answer
	// landed waits, once the caller is answered, for the row the case's outage
	// may still be writing (nil: the row exists when the caller is answered).
	landed func(t *testing.T, db dbq)
	// resolved checks the resolved row's members besides its outcome (nil: none).
	resolved func(t *testing.T, r row)
}

// submitLosingPaydb submits po with token 1 and takes paydb away while the
// rail holds the call, then lets the rail answer; it returns the answer.
func submitLosingPaydb(t *testing.T, p *proxy, fwd *pgForwarder, hold *holdingRail, po payout) answer {
	done := make(chan answer, 1)
	go func() { done <- trySubmit(p.URL, 1, po) }()
	hold.waitCalls(t, 1)
	fwd.setDown(true)
	hold.release()
	return <-done
}

// paydbDownWhenTheRailAnswers is submitLosingPaydb for p-out.
func paydbDownWhenTheRailAnswers(t *testing.T, p *proxy, fwd *pgForwarder, hold *holdingRail) answer {
	return submitLosingPaydb(t, p, fwd, hold, newPayout("p-out", "acct-out"))
}

// ackedOutage: the rail accepts as paydb goes away.
func ackedOutage() outageCase {
	return outageCase{
		name: "acked", outcome: lockapi.OutcomeAcked, metric: metricAcked, status: http.StatusOK,
		member: "railReference", want: "RS-p-out", railCalls: 1,
		submit: paydbDownWhenTheRailAnswers,
		resolved: func(t *testing.T, r row) {
			if r.RailReference == nil || *r.RailReference != "RS-p-out" {
				t.Fatalf("rail reference: %+v", r)
			}
		},
	}
}

// rejectedOutage: the rail declines as paydb goes away.
func rejectedOutage() outageCase {
	return outageCase{
		name: "rejected", outcome: lockapi.OutcomeRejected, metric: metricRejected, status: http.StatusUnprocessableEntity,
		member: "declineReason", want: "insufficient funds", railCalls: 1,
		configure: func(hold *holdingRail, _ *Config) {
			hold.reply = func(w http.ResponseWriter, _ string) {
				w.WriteHeader(http.StatusUnprocessableEntity)
				_, _ = io.WriteString(w, `{"status":"DECLINED","reason":"insufficient funds"}`)
			}
		},
		submit: paydbDownWhenTheRailAnswers,
		resolved: func(t *testing.T, r row) {
			if r.DeclineReason == nil || *r.DeclineReason != "insufficient funds" {
				t.Fatalf("decline reason: %+v", r)
			}
		},
	}
}

// unsentOutage: paydb goes away while the dial to the rail is in progress,
// and the dial then fails.
func unsentOutage() outageCase {
	dialing, failDial := make(chan struct{}), make(chan struct{})
	var once sync.Once
	return outageCase{
		name: "unsent", outcome: lockapi.OutcomeUnsent, metric: metricUnavailable, status: http.StatusServiceUnavailable,
		member: "stage", want: "dial", railCalls: 0,
		configure: func(_ *holdingRail, cfg *Config) {
			cfg.RailDial = func(ctx context.Context, _, _ string) (net.Conn, error) {
				once.Do(func() { close(dialing) })
				select {
				case <-failDial:
				case <-ctx.Done():
				}
				return nil, errors.New("connect: connection refused (test)")
			}
		},
		submit: func(t *testing.T, p *proxy, fwd *pgForwarder, _ *holdingRail) answer {
			done := make(chan answer, 1)
			go func() { done <- trySubmit(p.URL, 1, newPayout("p-out", "acct-out")) }()
			select {
			case <-dialing:
			case <-time.After(10 * time.Second):
				t.Fatal("the proxy never dialled the rail")
			}
			fwd.setDown(true)
			close(failDial)
			return <-done
		},
	}
}

// lostCommitOutage: the admission's COMMIT lands, its answer is lost, and
// paydb goes away.
func lostCommitOutage() outageCase {
	return outageCase{
		name: "lost commit", outcome: lockapi.OutcomeUnsent, metric: metricUnavailable, status: http.StatusServiceUnavailable,
		member: "stage", want: "intent_commit", railCalls: 0,
		submit: func(_ *testing.T, p *proxy, fwd *pgForwarder, _ *holdingRail) answer {
			fwd.arm("after-down")
			return trySubmit(p.URL, 1, newPayout("p-out", "acct-out"))
		},
		landed: func(t *testing.T, db dbq) {
			// The forwarder closes the proxy's side before it delivers the
			// COMMIT, so the 503 can be answered before paydb has committed.
			eventually(t, 5*time.Second, "the lost COMMIT to land", func() bool {
				return len(rowsOf(t, db, "p-out")) > 0
			})
		},
	}
}

// A known outcome is never lost to the janitor. paydb refuses every write from
// the moment the rail answers (or the dial fails, or the admission's COMMIT
// answer is lost) until 3 s after the caller was answered; the janitor of this
// very proxy sweeps every 100 ms with the shortest bound its timeouts allow. The
// caller gets the rail's answer without waiting for paydb; the proxy keeps
// trying in the background, and the row ends with what the proxy knew — never
// TIMEOUT. Each submission is counted once, under its row's outcome, and the
// late write is counted.
func TestKnownOutcomeOutlivesPaydbOutage(t *testing.T) {
	t.Parallel()
	for _, c := range []outageCase{ackedOutage(), rejectedOutage(), unsentOutage(), lostCommitOutage()} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, fwd, viaURL := forwardedPaydb(t)
			hold := newHoldingRail(t)
			cfg := shortestInterrupt(testConfig(viaURL, hold.URL))
			cfg.JanitorInterval = 100 * time.Millisecond
			if c.configure != nil {
				c.configure(hold, &cfg)
			}
			p := startProxy(t, cfg)

			a := c.submit(t, p, fwd, hold)
			if a.Status != c.status {
				t.Fatalf("answer: %+v", a)
			}
			if a.str(c.member) != c.want {
				t.Fatalf("answer: %+v", a)
			}
			if c.landed != nil {
				c.landed(t, db)
			}
			if rs := rowsOf(t, db, "p-out"); len(rs) != 1 || rs[0].Outcome != nil {
				t.Fatalf("rows while paydb refuses writes: %+v", rs)
			}

			time.Sleep(3 * time.Second)
			fwd.setDown(false)
			eventually(t, 3*cfg.InterruptedAfter, "the row to be resolved", func() bool {
				rs := rowsOf(t, db, "p-out")
				return len(rs) == 1 && rs[0].Outcome != nil
			})
			rs := rowsOf(t, db, "p-out")
			if outcomeOf(rs[0]) != c.outcome {
				t.Fatalf("row resolved %s, want %s (the outcome the proxy knew): %+v", outcomeOf(rs[0]), c.outcome, rs[0])
			}
			if c.resolved != nil {
				c.resolved(t, rs[0])
			}
			// Past the row's interrupt_at, with the janitor sweeping: it stays.
			time.Sleep(time.Until(rs[0].SubmittedAt.Add(cfg.InterruptedAfter + 500*time.Millisecond)))
			if again := rowsOf(t, db, "p-out"); outcomeOf(again[0]) != c.outcome {
				t.Fatalf("row changed to %s", outcomeOf(again[0]))
			}
			wantMetrics(t, p, map[string]float64{
				"rail_resolution_late_total":                                 1,
				fmt.Sprintf(`rail_submission_total{outcome="%s"}`, c.metric): 1,
				`rail_submission_total{outcome="ambiguous"}`:                 0,
			})
			if n := hold.count("p-out"); n != c.railCalls {
				t.Fatalf("rail calls: %d", n)
			}
		})
	}
}

// A COMMIT whose answer is lost while paydb hangs is answered 503 intent_commit
// at once — the UNSENT write of the row that may exist does not hold the caller
// for its 2 s bound — and that write is made in the background once paydb
// answers again.
func TestLostCommitAnsweredWithoutWaitingForPaydb(t *testing.T) {
	t.Parallel()
	db, fwd, viaURL := forwardedPaydb(t)
	rail := startStub(t, 0)
	cfg := shortestInterrupt(testConfig(viaURL, rail.URL))
	p := startProxy(t, cfg)

	fwd.arm("after-stall") // the COMMIT lands, its answer is lost, paydb hangs
	start := time.Now()
	a := trySubmit(p.URL, 1, newPayout("p-hang", "acct-hang"))
	took := time.Since(start)
	if a.Status != http.StatusServiceUnavailable || a.str("stage") != "intent_commit" {
		t.Fatalf("answer: %+v", a)
	}
	// The admission itself ends when its COMMIT's answer is lost; what is measured
	// is whether the answer then waited for a write to a hanging paydb (2 s).
	if took >= ResolveBound {
		t.Errorf("the 503 took %s: the caller waited for the UNSENT write (bound %s)", took, ResolveBound)
	}
	if _, ok := a.Body["submissionId"]; ok {
		t.Errorf("the answer names a row nobody could read: %+v", a.Body)
	}
	eventually(t, 5*time.Second, "the lost COMMIT to land", func() bool { return len(rowsOf(t, db, "p-hang")) == 1 })
	time.Sleep(500 * time.Millisecond)
	fwd.setStall(false)
	// The proxy counts a late write after it commits (late first, then the
	// submission), so the counts are waited for with the row.
	eventually(t, cfg.InterruptedAfter, "the row to be resolved and counted", func() bool {
		rs := rowsOf(t, db, "p-hang")
		return len(rs) == 1 && rs[0].Outcome != nil && metric(t, p, "rail_resolution_late_total") > 0 &&
			metric(t, p, `rail_submission_total{outcome="unavailable"}`) > 0
	})
	if rs := rowsOf(t, db, "p-hang"); outcomeOf(rs[0]) != lockapi.OutcomeUnsent {
		t.Fatalf("row resolved %s, want UNSENT: %+v", outcomeOf(rs[0]), rs[0])
	}
	wantMetrics(t, p, map[string]float64{
		"rail_resolution_late_total":                   1,
		`rail_submission_total{outcome="unavailable"}`: 1,
	})
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("rail calls: %+v", c)
	}
}

// When paydb stays out of reach past the row's interrupt_at, the proxy stops
// trying shortly before it and the janitor resolves the row TIMEOUT once paydb
// is back. The submission — answered ACKED — is then counted once, as ambiguous
// by the janitor, not also as acked.
func TestKnownOutcomeLostOnlyPastInterruptAtCountedOnce(t *testing.T) {
	t.Parallel()
	db, fwd, viaURL := forwardedPaydb(t)
	hold := newHoldingRail(t)
	cfg := shortestInterrupt(testConfig(viaURL, hold.URL))
	cfg.JanitorInterval = 100 * time.Millisecond
	p := startProxy(t, cfg)
	if a := submitLosingPaydb(t, p, fwd, hold, newPayout("p-gone", "acct-gone")); a.Status != http.StatusOK {
		t.Fatalf("answer: %+v", a)
	}
	eventually(t, 2*cfg.InterruptedAfter, "the proxy to give up shortly before interrupt_at", func() bool {
		return len(p.Logs.filter(func(m map[string]any) bool {
			msg, _ := m["msg"].(string)
			return strings.HasPrefix(msg, "resolving write still failing")
		})) == 1
	})
	fwd.setDown(false)
	// The janitor counts a row after its statement commits, so the count is
	// waited for with the row.
	eventually(t, 2*cfg.InterruptedAfter, "the janitor to resolve the row and count it", func() bool {
		rs := rowsOf(t, db, "p-gone")
		return len(rs) == 1 && rs[0].Outcome != nil && metric(t, p, `rail_submission_total{outcome="ambiguous"}`) > 0
	})
	if rs := rowsOf(t, db, "p-gone"); outcomeOf(rs[0]) != lockapi.OutcomeTimeout {
		t.Fatalf("row: %+v", rs[0])
	}
	wantMetrics(t, p, map[string]float64{
		`rail_submission_total{outcome="acked"}`:     0,
		`rail_submission_total{outcome="ambiguous"}`: 1,
		"rail_resolution_late_total":                 0,
	})
}

// A stopping proxy does not abandon an outcome it knows. Run returns only once
// the write paydb refused has been made.
func TestDrainWaitsForLateResolution(t *testing.T) {
	t.Parallel()
	db, fwd, viaURL := forwardedPaydb(t)
	hold := newHoldingRail(t)
	p := startProxy(t, testConfig(viaURL, hold.URL))
	if a := submitLosingPaydb(t, p, fwd, hold, newPayout("p-stop", "acct-stop")); a.Status != http.StatusOK {
		t.Fatalf("answer: %+v", a)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop() }()
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) while the outcome it knew was still unwritten", err)
	case <-time.After(1500 * time.Millisecond):
	}
	fwd.setDown(false)
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rs := rowsOf(t, db, "p-stop"); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeAcked {
		t.Fatalf("rows after Run returned: %+v", rs)
	}
}
