package demo

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"lock.dev/internal/invariants"
	"lock.dev/internal/patroni"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/stack"
)

// With --failover (=promote), paydb and lockdb run on a primary and a
// synchronous standby (stack.Options.Replicated), and mid-run the primary is
// killed with SIGKILL and the standby promoted by hand while every service runs
// on. With --failover=patroni they run on a Patroni cluster (internal/patroni:
// etcd and three PostgreSQL nodes, synchronous_mode_strict), and mid-run the
// leader — its Patroni and its PostgreSQL — is killed with SIGKILL and Patroni
// promotes a standby once the leader key has expired. Either way the services
// were given multi-host URLs, so they follow the promotion without a restart;
// meanwhile they answer 503. Taps in front of lock-server, payment-resource and
// rail-proxy record the answers the executors got and every token handed out,
// which the checker compares with lock_grant (invariant 6: no token handed out
// twice, none lost).

// failoverPoint is the share of settled payouts (in ‰) at which the primary is
// killed: after the rail-proxy crash (crashPoint), with work left on both sides.
const failoverPoint = 500

// commitHeldWait bounds the wait for a commit to hold the standby up before the
// kill: under load one comes within milliseconds; in a lull the kill goes ahead.
const commitHeldWait = 5 * time.Second

// patroniPromoteBound bounds the wait for Patroni's new leader after the kill:
// the leader key's ttl, the replica's reconnection and slack for a loaded
// machine. Past it the run is void (an error), not a verdict.
const patroniPromoteBound = 2 * time.Minute

// patroniStepBound bounds each call to the Patroni cluster around the kill
// (reading the members, the kill itself).
const patroniStepBound = 15 * time.Second

// FailoverResult is the report's failover section.
type FailoverResult struct {
	// Mode is which failover ran: FailoverPromote (a pair, promoted by hand)
	// or FailoverPatroni (a Patroni cluster's leader killed, Patroni promoting).
	Mode string `json:"mode"`
	// KilledLeader, SyncStandby and NewLeader name Patroni's members
	// (FailoverPatroni only): the leader killed, the synchronous standby at the
	// kill, and the leader Patroni promoted.
	KilledLeader string `json:"killedLeader,omitempty"`
	SyncStandby  string `json:"syncStandbyAtKill,omitempty"`
	NewLeader    string `json:"newLeader,omitempty"`
	// SettledAtKillPermille is the share of payouts settled (‰) when it began.
	SettledAtKillPermille int `json:"settledAtKillPermille"`
	// CommitInFlight: a COMMIT was waiting for the held synchronous standby when
	// the primary was killed (FailoverPromote only: Patroni's standby is not
	// held, the leader is killed under the run's load).
	CommitInFlight bool `json:"commitInFlight"`
	// PromotedMs is from the kill to the promotion confirmed. FailoverPromote:
	// pg_ctl promote -w returned and a new connection found the server out of
	// recovery and writable. FailoverPatroni: Patroni's REST API named a new
	// leader and a write on it was accepted (patroni.Cluster.WaitLeader). The
	// services may already be writing by then.
	PromotedMs int64 `json:"promotedMs"`
	// FirstAdmittedMs is from the kill to the first submission admitted
	// afterwards (its intent row's submitted_at, on the new primary); -1 when none was.
	FirstAdmittedMs int64 `json:"firstAdmittedMs"`
	// Unavailable counts the 503 answers the executors got from each service
	// between the kill and that first admission.
	Unavailable map[string]int `json:"unavailable"`
	// TokensHandedOut is every token lock-server answered an acquire with during
	// the run; BeforeKill and AfterKill split them at the kill.
	TokensHandedOut int `json:"tokensHandedOut"`
	BeforeKill      int `json:"tokensBeforeKill"`
	AfterKill       int `json:"tokensAfterKill"`

	killedAt time.Time
}

// failover is the run's failover: failoverPatroni on a Patroni cluster;
// otherwise it holds the standby until a commit waits for it, kills the
// primary, releases what was held and promotes the standby.
func (s *scenario) failover(ctx context.Context) error {
	if s.t.patroni != nil {
		return s.failoverPatroni(ctx)
	}
	p := s.t.progress
	res := &FailoverResult{Mode: FailoverPromote, SettledAtKillPermille: int(s.settledFrac.Load()), FirstAdmittedMs: -1}
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

// failoverPatroni reads Patroni's leader and synchronous standby, kills the
// leader (SIGKILL: its Patroni and every process of its PostgreSQL, so the
// leader key is not released and must expire), and waits for Patroni to
// promote another member and for that member to accept a write. Nothing is
// held: the kill comes under the run's load, commits in flight die with their
// connections.
func (s *scenario) failoverPatroni(ctx context.Context) error {
	p, c := s.t.progress, s.t.patroni
	res := &FailoverResult{Mode: FailoverPatroni, SettledAtKillPermille: int(s.settledFrac.Load()), FirstAdmittedMs: -1}
	mctx, cancel := context.WithTimeout(ctx, patroniStepBound)
	leader, err := c.Leader(mctx)
	if err == nil {
		var sync patroni.Member
		if sync, err = c.SyncStandby(mctx); err == nil {
			res.SyncStandby = sync.Name
		}
	}
	cancel()
	if err != nil {
		return fmt.Errorf("failover: Patroni's leader and synchronous standby: %w", err)
	}
	res.KilledLeader = leader.Name
	kctx, cancel := context.WithTimeout(ctx, patroniStepBound)
	err = c.Kill(kctx, leader.Name)
	cancel()
	if err != nil {
		return fmt.Errorf("failover: kill Patroni's leader %s: %w", leader.Name, err)
	}
	res.killedAt = time.Now()
	p.say("[fencing %s] failover: Patroni's leader %s killed (SIGKILL); waiting for Patroni to promote …", onOff(s.fencing), leader.Name)
	wctx, cancel := context.WithTimeout(ctx, patroniPromoteBound)
	next, err := c.WaitLeader(wctx, leader.Name)
	cancel()
	if err != nil {
		return fmt.Errorf("failover: no new leader accepting writes after killing %s: %w", leader.Name, err)
	}
	promoted := time.Since(res.killedAt)
	res.PromotedMs = promoted.Milliseconds()
	res.NewLeader = next.Name
	p.say("[fencing %s] failover: Patroni promoted %s (the synchronous standby at the kill: %s), accepting writes %s after the kill",
		onOff(s.fencing), next.Name, res.SyncStandby, promoted.Round(time.Millisecond))
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
	res.BeforeKill = res.TokensHandedOut - res.AfterKill
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
		if f.Mode == FailoverPatroni {
			fmt.Fprintf(w, "\nfailover (patroni), fencing %s — paydb and lockdb on a Patroni cluster (etcd, three PostgreSQL\n"+
				"nodes, synchronous_mode_strict); at %d%% of the payouts settled Patroni's leader %s was killed\n"+
				"(SIGKILL: its Patroni and its PostgreSQL) and Patroni promoted %s, every service running on\n"+
				"(multi-host URLs):\n",
				onOff(r.Fencing), f.SettledAtKillPermille/10, f.KilledLeader, f.NewLeader)
			fmt.Fprintf(w, "  the new leader was the synchronous standby at the kill   %s (%s)\n", yesNo(f.NewLeader == f.SyncStandby), f.SyncStandby)
			fmt.Fprintf(w, "  kill → new leader accepting writes (Patroni's REST API, then a write)   %.1fs\n", float64(f.PromotedMs)/1000)
			fmt.Fprintf(w, "  kill → first admitted submission                 %s\n", first)
		} else {
			fmt.Fprintf(w, "\nfailover (promote), fencing %s — paydb and lockdb on a primary with a synchronous standby; at %d%% of\n"+
				"the payouts settled the standby was held until a commit waited for it, then the primary was killed\n"+
				"(SIGKILL) and the standby promoted by hand, every service running on (multi-host URLs):\n",
				onOff(r.Fencing), f.SettledAtKillPermille/10)
			fmt.Fprintf(w, "  a commit was waiting for the standby at the kill   %s\n", yesNo(f.CommitInFlight))
			fmt.Fprintf(w, "  kill → first admitted submission                 %s\n", first)
			fmt.Fprintf(w, "  kill → promotion confirmed (pg_ctl promote -w, then a write check)   %.1fs\n", float64(f.PromotedMs)/1000)
		}
		fmt.Fprintf(w, "  503 answers meanwhile: lock-server %d, payment-resource %d, rail-proxy %d\n",
			f.Unavailable["lock-server"], f.Unavailable["payment-resource"], f.Unavailable["rail-proxy"])
		fmt.Fprintf(w, "  lock tokens handed out: %d (%d before the kill, %d after); twice: %d; not in lock_grant: %d\n",
			f.TokensHandedOut, f.BeforeKill, f.AfterKill, r.Report.Count(invariants.CheckTokenIssuedTwice), r.Report.Count(invariants.CheckTokenWithoutGrant))
		fmt.Fprintf(w, "  invariants across it: %s\n", strings.Join(held, ", "))
	}
}

// failoverVerdict: with --failover, the run decides only if the failover happened.
func failoverVerdict(cfg Config, runs []*Result) bool {
	if cfg.Failover == "" {
		return true
	}
	for _, r := range runs {
		if r.Failover == nil {
			return false
		}
	}
	return true
}

// replicatedOptions is the stack's setting for a run on a replicated pair or a
// Patroni cluster.
func replicatedOptions(t target) stack.Options {
	switch {
	case t.patroni != nil:
		return stack.Options{Tap: true}
	case t.replicated:
		return stack.Options{Replicated: &pgcluster.PairOptions{Sync: true}, Tap: true}
	}
	return stack.Options{}
}

// patroniStartBound bounds starting the Patroni cluster and creating the
// databases: etcd, the first node's bootstrap, the other two cloned with
// pg_basebackup and a synchronous standby streaming (about 15 s alone on two
// cores; much more under load).
const patroniStartBound = 3 * time.Minute

// startPatroni starts the Patroni cluster of --failover=patroni and creates
// paydb and lockdb on its leader. etcd's and Patroni's logs go to log, the
// services' log file.
func startPatroni(ctx context.Context, log io.Writer, p *progress) (*patroni.Cluster, error) {
	if err := patroni.Check(); err != nil {
		return nil, fmt.Errorf("--failover=patroni: %w", err)
	}
	p.say("starting a Patroni cluster: etcd and three PostgreSQL nodes, synchronous_mode_strict …")
	sctx, cancel := context.WithTimeout(ctx, patroniStartBound)
	defer cancel()
	pc, err := patroni.Start(sctx, patroni.Options{Log: log})
	if err != nil {
		return nil, fmt.Errorf("start the Patroni cluster: %w", err)
	}
	for _, db := range []string{"paydb", "lockdb"} {
		if err := pc.CreateDatabase(sctx, db); err != nil {
			_ = pc.Stop()
			return nil, fmt.Errorf("create %s on Patroni's leader: %w", db, err)
		}
	}
	return pc, nil
}
