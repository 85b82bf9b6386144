package demo

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"lock.dev/internal/invariants"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/stack"
)

// With --failover, paydb and lockdb run on a primary and a synchronous standby
// (stack.Options.Replicated), and mid-run the primary is killed with SIGKILL and
// the standby promoted while every service runs on. The services were
// given the pair's multi-host URLs, so they follow the promotion without a
// restart; meanwhile they answer 503. Taps in front of lock-server,
// payment-resource and rail-proxy record the answers the executors got and every
// token handed out, which the checker compares with lock_grant (invariant 6: no
// token handed out twice, none lost).

// failoverPoint is the share of settled payouts (in ‰) at which the primary is
// killed: after the rail-proxy crash (crashPoint), with work left on both sides.
const failoverPoint = 500

// commitHeldWait bounds the wait for a commit to hold the standby up before the
// kill: under load one comes within milliseconds; in a lull the kill goes ahead.
const commitHeldWait = 5 * time.Second

// FailoverResult is the report's failover section.
type FailoverResult struct {
	// SettledAtKillPermille is the share of payouts settled (‰) when it began.
	SettledAtKillPermille int `json:"settledAtKillPermille"`
	// CommitInFlight: a COMMIT was waiting for the held synchronous standby when
	// the primary was killed.
	CommitInFlight bool `json:"commitInFlight"`
	// PromotedMs is from the kill to the promotion confirmed: pg_ctl promote -w
	// returned and a new connection found the server out of recovery and
	// writable. The services may already be writing by then.
	PromotedMs int64 `json:"promotedMs"`
	// FirstAdmittedMs is from the kill to the first submission admitted
	// afterwards (its intent row's submitted_at, on the new primary); -1 when none was.
	FirstAdmittedMs int64 `json:"firstAdmittedMs"`
	// Unavailable counts the 503 answers the executors got from each service
	// between the kill and that first admission.
	Unavailable map[string]int `json:"unavailable"`
	// TokensHandedOut is every token lock-server answered an acquire with during
	// the run; AfterKill those handed out after the kill.
	TokensHandedOut int `json:"tokensHandedOut"`
	AfterKill       int `json:"tokensAfterKill"`

	killedAt time.Time
}

// failover holds the standby until a commit waits for it, kills the primary,
// releases what was held and promotes the standby.
func (s *scenario) failover(ctx context.Context) error {
	p := s.t.progress
	res := &FailoverResult{SettledAtKillPermille: int(s.settledFrac.Load()), FirstAdmittedMs: -1}
	if err := s.st.HoldStandby(); err != nil {
		return fmt.Errorf("failover: hold the standby: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, commitHeldWait)
	res.CommitInFlight = s.st.WaitCommitHeld(wctx) == nil
	cancel()
	f, err := s.st.Failover(ctx)
	if err != nil {
		s.st.ReleaseStandby()
		return fmt.Errorf("failover: %w", err)
	}
	res.killedAt = f.KilledAt
	res.PromotedMs = f.PromotedAt.Sub(f.KilledAt).Milliseconds()
	p.say("[fencing %s] failover: primary killed (SIGKILL) with a commit in flight: %s; standby promoted %s later",
		onOff(s.fencing), yesNo(res.CommitInFlight), f.PromotedAt.Sub(f.KilledAt).Round(time.Millisecond))
	s.mu.Lock()
	s.failed = res
	s.mu.Unlock()
	return nil
}

// firstAdmittedAfter is the submitted_at of the first submission admitted after t
// (docs/contracts/database.md: outcome NULL, ACKED, REJECTED, TIMEOUT or UNSENT).
const firstAdmittedAfter = `
SELECT min(submitted_at) FROM rail_submission
 WHERE submitted_at > $1
   AND (outcome IS NULL OR outcome IN ('ACKED','REJECTED','TIMEOUT','UNSENT'))`

// finishFailover fills the section from the ground truth of the new primary and
// the taps, once the run is over.
func (s *scenario) finishFailover(ctx context.Context, issued []invariants.IssuedToken) (*FailoverResult, error) {
	s.mu.Lock()
	res := s.failed
	s.mu.Unlock()
	if res == nil {
		return nil, nil
	}
	var first *time.Time
	if err := s.st.Paydb.QueryRow(ctx, firstAdmittedAfter, res.killedAt).Scan(&first); err != nil {
		return nil, fmt.Errorf("failover: the first admission after the kill: %w", err)
	}
	end := time.Time{}
	if first != nil {
		res.FirstAdmittedMs = first.Sub(res.killedAt).Milliseconds()
		end = *first
	}
	res.Unavailable = map[string]int{"lock-server": 0, "payment-resource": 0, "rail-proxy": 0}
	for _, a := range s.st.Answers(res.killedAt, end) {
		if a.Status == 503 {
			res.Unavailable[a.Service]++
		}
	}
	res.TokensHandedOut = len(issued)
	for _, it := range issued {
		if it.At.After(res.killedAt) {
			res.AfterKill++
		}
	}
	return res, nil
}

// writeFailover is the report's failover section.
func writeFailover(w io.Writer, runs []*Result) {
	for _, r := range runs {
		f := r.Failover
		if f == nil {
			continue
		}
		first := "none"
		if f.FirstAdmittedMs >= 0 {
			first = fmt.Sprintf("%.1fs", float64(f.FirstAdmittedMs)/1000)
		}
		var held []string
		for _, v := range r.Report.Invariants {
			state := "held"
			if !v.Held {
				state = "BROKEN"
			}
			label := fmt.Sprint(v.Invariant)
			if v.Invariant == 0 {
				label = "cross-checks"
			}
			held = append(held, label+" "+state)
		}
		fmt.Fprintf(w, "\nfailover, fencing %s — paydb and lockdb on a primary with a synchronous standby; at %d%% of the\n"+
			"payouts settled the standby was held until a commit waited for it, then the primary was killed\n"+
			"(SIGKILL) and the standby promoted, every service running on (multi-host URLs):\n",
			onOff(r.Fencing), f.SettledAtKillPermille/10)
		fmt.Fprintf(w, "  a commit was waiting for the standby at the kill   %s\n", yesNo(f.CommitInFlight))
		fmt.Fprintf(w, "  kill → first admitted submission                 %s\n", first)
		fmt.Fprintf(w, "  kill → promotion confirmed (pg_ctl promote -w, then a write check)   %.1fs\n", float64(f.PromotedMs)/1000)
		fmt.Fprintf(w, "  503 answers meanwhile: lock-server %d, payment-resource %d, rail-proxy %d\n",
			f.Unavailable["lock-server"], f.Unavailable["payment-resource"], f.Unavailable["rail-proxy"])
		fmt.Fprintf(w, "  lock tokens handed out: %d (%d after the kill); twice: %d; not in lock_grant: %d\n",
			f.TokensHandedOut, f.AfterKill, r.Report.Count(invariants.CheckTokenIssuedTwice), r.Report.Count(invariants.CheckTokenWithoutGrant))
		fmt.Fprintf(w, "  invariants across it: %s\n", strings.Join(held, ", "))
	}
}

// failoverVerdict: with --failover, the run decides only if the failover happened.
func failoverVerdict(cfg Config, runs []*Result) bool {
	if !cfg.Failover {
		return true
	}
	for _, r := range runs {
		if r.Failover == nil {
			return false
		}
	}
	return true
}

// replicatedOptions is the stack's setting for a run on a replicated pair.
func replicatedOptions(t target) stack.Options {
	if !t.replicated {
		return stack.Options{}
	}
	return stack.Options{Replicated: &pgcluster.PairOptions{Sync: true}, Tap: true}
}
