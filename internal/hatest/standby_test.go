package hatest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/identity"
	"lock.dev/internal/patroni"
	"lock.dev/internal/payment"
	"lock.dev/internal/railstub"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// The synchronous standby is lost under load, and the other replica with it:
// the leader is alone. In strict synchronous mode Patroni does not fall back to
// asynchronous replication (synchronous_standby_names becomes '*'), so every
// COMMIT waits for a standby that is not there (docs/operations/high-availability.md,
// "No standby at all"). The services must answer 503 within their bounds —
// lock-server and payment-resource UNAVAILABLE, rail-proxy RAIL_UNAVAILABLE stage
// intent_commit — and present nothing to the rail for what they refused: a payout
// claimed while the cluster was healthy and presented now reaches no rail, and no
// rail call during the outage is for a submission admitted during it. When a
// standby returns the waiting commits are released and the system pays again;
// the checker then judges the whole run.
func TestSynchronousStandbyLostUnderLoad(t *testing.T) {
	requireHealthy(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := startLoad(t, ctx, cluster)
	grantsBefore := r.grants()
	hand := claimByHand(t, ctx, r, "hand-standby")

	a := leaveLeaderAlone(t, ctx, cluster)
	got := hand.submit(t, ctx, r.st)
	lockAns, payAns := probeWrites(t, ctx, r.st, "probe-standby")
	for _, p := range []struct {
		what string
		a    answered
		code string
	}{{"rail-proxy", got, lockapi.CodeRailUnavailable}, {"lock-server", lockAns, lockapi.CodeUnavailable}, {"payment-resource", payAns, lockapi.CodeUnavailable}} {
		if p.a.status != http.StatusServiceUnavailable || p.a.code != p.code {
			t.Errorf("%s with the leader alone answered %d %s (%v); want 503 %s", p.what, p.a.status, p.a.code, p.a.err, p.code)
		}
	}
	if got.stage != "intent_commit" {
		t.Errorf("rail-proxy's 503 has stage %q; want intent_commit", got.stage)
	}
	if n := len(callsFor(railCalls(t, ctx, r.st), hand.payout.PayoutID)); n != 0 {
		t.Fatalf("the rail was presented %s %d times while no commit could be durable", hand.payout.PayoutID, n)
	}

	// One standby returns (the synchronous one, stopped last): the waiting
	// commits are released and writes are acknowledged again.
	back := time.Now()
	if err := cluster.StartMember(ctx, a.standbys[len(a.standbys)-1]); err != nil {
		t.Fatal(err)
	}
	recovered := waitAcknowledged(t, ctx, cluster)
	for _, n := range a.standbys[:len(a.standbys)-1] {
		if err := cluster.StartMember(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	requireAdmittedBefore(t, ctx, r.st, a.at, back)
	hand.handOver(t, ctx, r)
	r.create("probe-standby", 1, func(int) string { return "acct-probe-standby" })

	f := r.finish(a.at, recovered, grantsBefore)
	requireEveryInvariant(t, f)
	requirePresentedOnceAfter(t, ctx, r, hand)
	unavailable := unavailableBy(r.st, a.at, back)
	firstToken, firstCall := firstWrites(t, ctx, r.st, back)
	logFigures(t, "leader "+a.leader+" alone (standbys stopped)", f)
	t.Logf("leader alone: rail-proxy 503 %s stage %s after %s, lock-server 503 after %s, payment-resource 503 after %s; "+
		"503s while alone: lock-server %d, payment-resource %d, rail-proxy %d; standby started → writes acknowledged %s, "+
		"→ first token handed out %s, → first rail call %s",
		got.code, got.stage, got.took.Round(time.Millisecond), lockAns.took.Round(time.Millisecond), payAns.took.Round(time.Millisecond),
		unavailable["lock-server"], unavailable["payment-resource"], unavailable["rail-proxy"], recovered.Sub(back).Round(time.Millisecond),
		since(back, firstToken), since(back, firstCall))
	requireHealthy(t, cluster)
}

// ---------------------------------------------------------------------------
// What the standby, etcd and cancelled-wait tests share: the leader left alone,
// a payout claimed by hand while the cluster was healthy and presented to
// rail-proxy as an executor would, write probes at each service, and reads on
// one member.

// alone is the cluster with every standby stopped.
type alone struct {
	leader   string
	standbys []string  // stopped, the synchronous standby last
	at       time.Time // the synchronous standby stopped: commits wait from then on
}

// leaveLeaderAlone stops every member but the leader, gracefully: the
// asynchronous replica first and the synchronous standby last (stopped first,
// Patroni would hand its role to the other replica). It returns once the
// leader's PostgreSQL has no standby and, in strict mode, requires one all the
// same (synchronous_standby_names '*'): every COMMIT now waits.
func leaveLeaderAlone(t *testing.T, ctx context.Context, c *patroni.Cluster) alone {
	t.Helper()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sync, err := c.SyncStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := alone{leader: leader.Name}
	for _, n := range c.Names() {
		if n != leader.Name && n != sync.Name {
			a.standbys = append(a.standbys, n)
		}
	}
	a.standbys = append(a.standbys, sync.Name)
	// A test that fails half-way leaves no member stopped for the next one.
	t.Cleanup(func() { startAll(c) })
	for _, n := range a.standbys {
		if err := c.StopMember(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// Until its PostgreSQL is down the synchronous standby acknowledges
	// commits (a graceful stop lets it receive what the leader sent).
	a.at = time.Now()
	testkit.EventuallyState(t, time.Minute, "the leader alone, requiring a synchronous standby", func() (bool, string) {
		var names string
		var connected int
		err := queryMember(ctx, c, a.leader, "postgres",
			`SELECT current_setting('synchronous_standby_names'), (SELECT count(*) FROM pg_stat_replication)::int`, nil, &names, &connected)
		if err != nil {
			return false, err.Error()
		}
		return names == "*" && connected == 0, fmt.Sprintf("synchronous_standby_names %q, %d standbys connected", names, connected)
	})
	return a
}

// startAll starts every member that is not running (StartMember refuses the
// others).
func startAll(c *patroni.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range c.Names() {
		_ = c.StartMember(ctx, n)
	}
}

// waitAcknowledged waits until a write through the cluster's URL is
// acknowledged by a synchronous standby, and returns when it was. The write is
// a transactional logical-decoding message: it changes no table, but a
// transaction that wrote WAL waits for the standby at COMMIT (one that only
// took a transaction id writes nothing before its commit record, and does
// not). Each try is bounded; one that runs out is cancelled by pgx, and
// counts as not acknowledged.
func waitAcknowledged(t *testing.T, ctx context.Context, c *patroni.Cluster) time.Time {
	t.Helper()
	testkit.EventuallyState(t, 2*time.Minute, "a write acknowledged by a synchronous standby", func() (bool, string) {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		conn, err := pgx.Connect(wctx, c.URL("postgres"))
		if err != nil {
			return false, err.Error()
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(wctx, `SELECT pg_logical_emit_message(true, 'hatest', 'acknowledged?')`); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return time.Now()
}

// queryMember runs sql on database db of one member alone (a standby too) and
// scans its one row.
func queryMember(ctx context.Context, c *patroni.Cluster, member, db, sql string, args []any, dest ...any) error {
	url, err := c.MemberURL(member, db)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// databaseOf is the database name in a stack's URL.
func databaseOf(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// claimed is a payout claimed by hand under a lease while the cluster was
// healthy, to be presented to rail-proxy as an executor would: its lease, grant
// and claim are durable, so what rail-proxy does with the submission depends
// only on its own admission COMMIT.
type claimed struct {
	payout lockapi.SubmissionRequest
	owner  string
	lease  *lockclient.Lease
}

// handLeaseTTL outlives every outage of these tests, so that no executor's
// reconcile pass takes the payout before it is presented; it is released by
// handOver once the cluster is back.
const handLeaseTTL = 30 * time.Second

// claimByHand creates payout id on an account of its own (as ops), takes the
// account's lease and claims the payout with it (as the executor workload),
// through the taps. The run counts the payout.
func claimByHand(t *testing.T, ctx context.Context, r *loadRun, id string) claimed {
	t.Helper()
	urls := r.st.ServiceURLs()
	c := claimed{owner: "by-hand", payout: lockapi.SubmissionRequest{PayoutID: id, AccountID: "acct-" + id,
		AmountMinor: 4242, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The lease before the payout: once the payout exists the executors under
	// load look for it, and one of them could take its account first.
	lc, err := lockclient.New(urls["LOCK_SERVER_URL"], lockclient.WithTLSConfig(r.st.ClientTLS(identity.NameExecutor, identity.NameLockServer)),
		lockclient.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if c.lease, err = lc.Acquire(cctx, lockapi.AccountLockName(c.payout.AccountID), c.owner, handLeaseTTL); err != nil {
		t.Fatalf("acquire the lease of %s: %v", c.payout.AccountID, err)
	}
	t.Cleanup(func() { _ = c.lease.Release(context.Background()) }) // ends its renewals whatever happened
	ops := payment.NewTLSClient(urls["PAYMENT_RESOURCE_URL"], r.st.ClientTLS(identity.NameOps, identity.NamePaymentResource))
	if _, err := ops.Create(cctx, c.payout); err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	r.created++
	exec := payment.NewTLSClient(urls["PAYMENT_RESOURCE_URL"], r.st.ClientTLS(identity.NameExecutor, identity.NamePaymentResource))
	if _, err := exec.ClaimWithGrant(cctx, id, c.lease.Token(), c.lease.Grant(), c.owner); err != nil {
		t.Fatalf("claim %s: %v", id, err)
	}
	return c
}

// handOver releases the hand's lease once the cluster takes writes again: the
// payout, still CLAIMED, is then the executors' — their reconcile pass re-claims
// it with a newer token and, finding no forwardable attempt on record, presents
// it (docs/contracts/executor.md).
func (c claimed) handOver(t *testing.T, ctx context.Context, r *loadRun) {
	t.Helper()
	deadline, _ := ctx.Deadline()
	testkit.EventuallyState(t, time.Until(deadline), "release the hand's lease", func() (bool, string) {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := c.lease.Release(rctx); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// answered is what a service answered a write.
type answered struct {
	status int
	code   string
	stage  string // rail-proxy's 503
	took   time.Duration
	err    error // no answer, or one that is not a problem document
}

// submit presents the claimed payout to rail-proxy (through the tap) with its
// token and grant, as an executor does. It is bounded by 30 s, far beyond every
// bound of rail-proxy's: no answer within it is a failure of the test.
func (c claimed) submit(t *testing.T, ctx context.Context, st *stack.Stack) answered {
	t.Helper()
	body, err := json.Marshal(c.payout)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, st.ServiceURLs()["RAIL_PROXY_URL"]+"/v1/rail/submissions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	token := strconv.FormatInt(c.lease.Token(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, token)
	req.Header.Set(lockapi.HeaderOwnerID, c.owner)
	req.Header.Set(lockapi.HeaderIdempotencyKey, c.payout.PayoutID+":"+token)
	req.Header.Set(lockapi.HeaderFencingGrant, c.lease.Grant())
	start := time.Now()
	resp, err := st.HTTPClient(identity.NameExecutor, identity.NameRailProxy).Do(req)
	if err != nil {
		t.Fatalf("submit %s: no answer: %v", c.payout.PayoutID, err)
	}
	defer resp.Body.Close()
	rb, _ := lockapi.ReadAllLimited(resp.Body, 1<<20)
	a := answered{status: resp.StatusCode, took: time.Since(start)}
	if p := lockapi.ReadProblem(resp, rb); p != nil {
		a.code = p.Code
		_, _ = p.Member("stage", &a.stage)
	}
	return a
}

// probeWrites asks lock-server for a lease on an account of its own and
// payment-resource to create payout prefix-000 on it (the payout a later
// loadRun.create(prefix, 1, …) makes again, idempotently), as an executor and
// as ops, through the taps, each bounded by 30 s.
func probeWrites(t *testing.T, ctx context.Context, st *stack.Stack, prefix string) (lock, pay answered) {
	t.Helper()
	urls := st.ServiceURLs()
	account := "acct-" + prefix
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lc, err := lockclient.New(urls["LOCK_SERVER_URL"], lockclient.WithTLSConfig(st.ClientTLS(identity.NameExecutor, identity.NameLockServer)),
		lockclient.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lease, err := lc.Acquire(cctx, lockapi.AccountLockName(account), "probe", 5*time.Second)
	lock.took = time.Since(start)
	var le *lockclient.Error
	switch {
	case err == nil:
		lock.status = http.StatusOK
		_ = lease.Release(cctx)
	case errors.As(err, &le) && le.Status != 0:
		lock.status, lock.code = le.Status, le.Code
	default:
		lock.err = err
	}

	ops := payment.NewTLSClient(urls["PAYMENT_RESOURCE_URL"], st.ClientTLS(identity.NameOps, identity.NamePaymentResource))
	start = time.Now()
	_, err = ops.Create(cctx, lockapi.SubmissionRequest{PayoutID: prefix + "-000", AccountID: account,
		AmountMinor: 100, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
	pay.took = time.Since(start)
	var p *lockapi.Problem
	switch {
	case err == nil:
		pay.status = http.StatusOK
	case errors.As(err, &p):
		pay.status, pay.code = p.Status, p.Code
	default:
		pay.err = err
	}
	return lock, pay
}

func railCalls(t *testing.T, ctx context.Context, st *stack.Stack) []railstub.Call {
	t.Helper()
	calls, err := st.Stub.Calls(ctx)
	if err != nil {
		t.Fatalf("the rail-stub's call log: %v", err)
	}
	return calls
}

func callsFor(calls []railstub.Call, payoutID string) []railstub.Call {
	var out []railstub.Call
	for _, c := range calls {
		if c.Reference == payoutID {
			out = append(out, c)
		}
	}
	return out
}

// requireAdmittedBefore fails the test if a rail call received in [from, to)
// carries a submission admitted at or after from: while no commit could be
// durable, nothing new may reach the rail. (A call whose intent was committed
// before from may still be in flight then.) The rows are read through the
// stack's pool once the cluster takes writes again.
func requireAdmittedBefore(t *testing.T, ctx context.Context, st *stack.Stack, from, to time.Time) {
	t.Helper()
	var during []railstub.Call
	for _, c := range railCalls(t, ctx, st) {
		if !c.ReceivedAt.Before(from) && c.ReceivedAt.Before(to) {
			during = append(during, c)
		}
	}
	for _, c := range during {
		var admitted time.Time
		testkit.EventuallyState(t, time.Minute, "read the intent of "+c.Reference, func() (bool, string) {
			err := st.Paydb.QueryRow(ctx, `SELECT min(submitted_at) FROM rail_submission
				WHERE payout_id = $1 AND (outcome IS NULL OR outcome IN ('ACKED', 'REJECTED', 'TIMEOUT'))`, c.Reference).Scan(&admitted)
			if err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		if !admitted.Before(from) {
			t.Errorf("the rail received %s at %s, admitted at %s: after the outage began (%s)",
				c.Reference, c.ReceivedAt.Format(time.RFC3339Nano), admitted.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano))
		}
	}
	t.Logf("rail calls during the outage: %d, each admitted before it", len(during))
}

// requirePresentedOnceAfter fails the test unless the hand's payout reached the
// rail exactly once, on an attempt of a newer token than the one it was
// refused with: what was answered 503 was never presented. Run after the run
// finished (every attempt resolved).
func requirePresentedOnceAfter(t *testing.T, ctx context.Context, r *loadRun, c claimed) {
	t.Helper()
	var rows []string
	var forwarded []int64
	testkit.EventuallyState(t, time.Minute, "read the audit trail of "+c.payout.PayoutID, func() (bool, string) {
		rows, forwarded = nil, nil
		q, err := r.st.Paydb.Query(ctx, `SELECT submission_id, presented_token, coalesce(outcome, '') FROM rail_submission
			WHERE payout_id = $1 ORDER BY submission_id`, c.payout.PayoutID)
		if err != nil {
			return false, err.Error()
		}
		defer q.Close()
		for q.Next() {
			var id, token int64
			var outcome string
			if err := q.Scan(&id, &token, &outcome); err != nil {
				return false, err.Error()
			}
			rows = append(rows, fmt.Sprintf("%d token %d %s", id, token, outcome))
			if outcome == "" || outcome == lockapi.OutcomeAcked || outcome == lockapi.OutcomeRejected || outcome == lockapi.OutcomeTimeout {
				forwarded = append(forwarded, token)
			}
		}
		if err := q.Err(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	calls := callsFor(r.railCalls(), c.payout.PayoutID)
	if len(calls) != 1 || len(forwarded) != 1 || forwarded[0] <= c.lease.Token() {
		t.Errorf("%s, refused with token %d: %d rail calls, audit trail %v; want one call, on one forwardable attempt of a newer token",
			c.payout.PayoutID, c.lease.Token(), len(calls), rows)
	}
	t.Logf("%s: refused with token %d, then presented once after the cluster was back; audit trail %v", c.payout.PayoutID, c.lease.Token(), rows)
}

// unavailableBy counts the 503s the taps passed on in [from, to), by service.
func unavailableBy(st *stack.Stack, from, to time.Time) map[string]int {
	out := map[string]int{"lock-server": 0, "payment-resource": 0, "rail-proxy": 0}
	for _, a := range st.Answers(from, to) {
		if a.Status == http.StatusServiceUnavailable {
			out[a.Service]++
		}
	}
	return out
}

// firstWrites is when, at or after from, lock-server first handed out a token
// (as the taps recorded) and the rail first received a call: the first
// committed lease grant and the first admitted submission.
func firstWrites(t *testing.T, ctx context.Context, st *stack.Stack, from time.Time) (token, call time.Time) {
	t.Helper()
	for _, it := range st.IssuedTokens() {
		if !it.At.Before(from) && (token.IsZero() || it.At.Before(token)) {
			token = it.At
		}
	}
	for _, c := range railCalls(t, ctx, st) {
		if !c.ReceivedAt.Before(from) && (call.IsZero() || c.ReceivedAt.Before(call)) {
			call = c.ReceivedAt
		}
	}
	return token, call
}

// since is at − from rounded, or "none" for a zero at.
func since(from, at time.Time) string {
	if at.IsZero() {
		return "none"
	}
	return at.Sub(from).Round(time.Millisecond).String()
}
