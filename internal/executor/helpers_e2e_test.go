package executor_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/leasepause"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

func TestMain(m *testing.M) {
	// A child started by stack.StartChild runs an executor and exits here.
	stack.ChildMain(map[string]stack.Runner{"executor": func(ctx context.Context, getenv func(string) string, log io.Writer) error {
		_, cfg, err := executor.ParseConfig(nil, getenv)
		if err != nil {
			return err
		}
		cfg.LogOutput = log
		return executor.Run(ctx, cfg)
	}})
	os.Exit(pgtest.Main(m))
}

// logTail keeps the last lines written to it, for a failing test's report.
type logTail struct {
	mu     sync.Mutex
	lines  []string
	part   []byte
	events map[string]int // lines per "event" value, over the whole run
}

const tailLines = 400

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			break
		}
		line := string(l.part[:i])
		l.lines = append(l.lines, line)
		l.part = l.part[i+1:]
		if _, rest, ok := strings.Cut(line, `"event":"`); ok {
			if ev, _, ok := strings.Cut(rest, `"`); ok {
				if l.events == nil {
					l.events = map[string]int{}
				}
				l.events[ev]++
			}
		}
		if len(l.lines) > 2*tailLines {
			l.lines = append([]string(nil), l.lines[len(l.lines)-tailLines:]...)
		}
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.lines
	if len(lines) > tailLines {
		lines = lines[len(lines)-tailLines:]
	}
	return strings.Join(lines, "\n")
}

// events counts the lines logged with event ev since the start, however many
// lines the tail has dropped.
func (l *logTail) eventCount(ev string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events[ev]
}

// contains reports whether a line has every one of the fragments.
func (l *logTail) contains(frags ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, f := range frags {
			if !strings.Contains(line, f) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// startStack runs the whole system on fresh databases of the test binary's
// cluster, with identities: every hop mutual TLS, every grant naming its
// workload (the stack's default).
func startStack(t *testing.T, env map[string]map[string]string) (*stack.Stack, *logTail) {
	t.Helper()
	return startStackWith(t, stack.Options{Env: env})
}

// startPlainStack is startStack without identities (UNSAFE_NO_AUTH): for a
// test that puts a plaintext HTTP intermediary between the executor and a
// service — about connections and lost answers, not identity
// (docs/contracts/workload-identity.md).
func startPlainStack(t *testing.T, env map[string]map[string]string) (*stack.Stack, *logTail) {
	t.Helper()
	return startStackWith(t, stack.Options{Env: env, UnsafeNoAuth: true})
}

func startStackWith(t *testing.T, opts stack.Options) (*stack.Stack, *logTail) {
	t.Helper()
	logs := &logTail{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts.PaydbURL, opts.LockdbURL, opts.Log = pgtest.PaydbURL(t), pgtest.LockdbURL(t), logs
	st, err := stack.Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the system: %v\nlast service log lines:\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("stopping the system: %v", err)
		}
		if t.Failed() {
			t.Logf("last service log lines:\n%s", logs.String())
		}
	})
	return st, logs
}

// workloadIdentity is the identity settings of workload name in st: its SVID's
// files, or UNSAFE_NO_AUTH on a stack without identities.
func workloadIdentity(st *stack.Stack, name string) identity.Settings {
	if !st.Secure() {
		return identity.Settings{UnsafeNoAuth: true}
	}
	return identity.Files(st.CertsDir, name)
}

// paymentsAs is a client of payment-resource calling as workload name.
func paymentsAs(st *stack.Stack, name string) *payment.Client {
	return payment.NewTLSClient(st.PaymentURL, st.ClientTLS(name, identity.NamePaymentResource))
}

// locksAs is a client of lock-server calling as workload name, whose leases
// the returned pauser can freeze.
func locksAs(t *testing.T, st *stack.Stack, name string) (*lockclient.Client, *leasepause.Pauser[*lockclient.Lease]) {
	t.Helper()
	p := leasepause.New[*lockclient.Lease]()
	c, err := lockclient.New(st.LockServerURL, lockclient.WithTLSConfig(st.ClientTLS(name, identity.NameLockServer)), lockclient.WithPauser(p))
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

// runningExecutor is an executor running in this process.
type runningExecutor struct {
	owner   string
	url     string
	logs    *logTail
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// startExecutor runs an executor against st, with test-sized defaults that
// configure may change.
func startExecutor(t *testing.T, st *stack.Stack, owner string, configure func(*executor.Config)) *runningExecutor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = st.LockServerURL, st.PaymentURL, st.ProxyURL
	cfg.OwnerID = owner
	cfg.Workers = 2
	cfg.LeaseTTL = 2 * time.Second
	cfg.PollInterval = 50 * time.Millisecond
	cfg.ReconcileInterval = 200 * time.Millisecond
	cfg.Listener = ln
	// Its metrics are read where probes and scrapes read them: HEALTH_ADDR,
	// plaintext (the main port serves mutual TLS with identities).
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.HealthListener = hln
	cfg.Identity = workloadIdentity(st, identity.NameExecutor)
	logs := &logTail{}
	cfg.LogOutput = logs
	if configure != nil {
		configure(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningExecutor{owner: owner, url: "http://" + hln.Addr().String(), logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- executor.Run(ctx, cfg) }()
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("executor %s, last log lines:\n%s", owner, logs.String())
		}
	})
	return r
}

// stop cancels the executor and checks that it stops cleanly.
func (r *runningExecutor) stop(t *testing.T) {
	t.Helper()
	if r.stopped {
		return
	}
	r.stopped = true
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("executor %s returned %v, want nil after a stop", r.owner, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("executor %s did not stop within 30s", r.owner)
	}
}

// metric reads one sample of the executor's /metrics, e.g.
// `executor_payout_total{result="paid"}`.
func (r *runningExecutor) metric(t *testing.T, series string) float64 {
	t.Helper()
	v, err := testkit.ReadMetric(context.Background(), r.url, series)
	if err != nil {
		t.Fatalf("executor %s: %v", r.owner, err)
	}
	return v
}

func paidCount(t *testing.T, r *runningExecutor, result string) float64 {
	return r.metric(t, `executor_payout_total{result="`+result+`"}`)
}

func createPayouts(t *testing.T, st *stack.Stack, prefix string, n, accounts int) []lockapi.Payout {
	t.Helper()
	c := paymentsAs(st, identity.NamePayoutCreator)
	out := make([]lockapi.Payout, 0, n)
	for i := range n {
		p, err := c.Create(context.Background(), lockapi.SubmissionRequest{
			PayoutID:    fmt.Sprintf("%s-%03d", prefix, i),
			AccountID:   fmt.Sprintf("%s-acct-%02d", prefix, i%accounts),
			AmountMinor: int64(1000 + 37*i),
			Currency:    "EUR",
			Beneficiary: fmt.Sprintf("NL91ABNA%010d", i),
		})
		if err != nil {
			t.Fatalf("create payout %d: %v", i, err)
		}
		out = append(out, p)
	}
	return out
}

// payoutRow is a payout as paydb holds it.
type payoutRow struct {
	status        string
	fenceToken    int64
	claimedBy     *string
	railReference *string
	amount        int64
}

func payoutRows(t *testing.T, st *stack.Stack, prefix string) map[string]payoutRow {
	t.Helper()
	rows, err := st.Paydb.Query(context.Background(),
		`SELECT payout_id, status, fence_token, claimed_by, rail_reference, amount_minor FROM payout WHERE payout_id LIKE $1 || '%'`, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]payoutRow{}
	for rows.Next() {
		var id string
		var r payoutRow
		if err := rows.Scan(&id, &r.status, &r.fenceToken, &r.claimedBy, &r.railReference, &r.amount); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func payout(t *testing.T, st *stack.Stack, id string) payoutRow {
	t.Helper()
	r, ok := payoutRows(t, st, id)[id]
	if !ok {
		t.Fatalf("payout %s not found", id)
	}
	return r
}

// waitSettled waits until no payout with the prefix is PENDING or CLAIMED.
func waitSettled(t *testing.T, st *stack.Stack, prefix string, n int, within time.Duration) map[string]payoutRow {
	t.Helper()
	var rows map[string]payoutRow
	testkit.EventuallyState(t, within, "every payout to settle", func() (bool, string) {
		rows = payoutRows(t, st, prefix)
		open := 0
		for _, r := range rows {
			if r.status == lockapi.StatusPending || r.status == lockapi.StatusClaimed {
				open++
			}
		}
		return len(rows) == n && open == 0, fmt.Sprintf("%d of %d payouts still open", open, len(rows))
	})
	return rows
}

// ledgerEntry is a ledger_entry row.
type ledgerEntry struct {
	amount int64
	token  int64
}

func ledger(t *testing.T, st *stack.Stack, prefix string) map[string][]ledgerEntry {
	t.Helper()
	rows, err := st.Paydb.Query(context.Background(),
		`SELECT payout_id, amount_minor, posted_token FROM ledger_entry WHERE payout_id LIKE $1 || '%'`, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]ledgerEntry{}
	for rows.Next() {
		var id string
		var e ledgerEntry
		if err := rows.Scan(&id, &e.amount, &e.token); err != nil {
			t.Fatal(err)
		}
		out[id] = append(out[id], e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// attempt is a rail_submission row.
type attempt struct {
	token   int64
	owner   string
	outcome *string
	ref     *string
}

func (a attempt) String() string {
	o := "NULL"
	if a.outcome != nil {
		o = *a.outcome
	}
	return fmt.Sprintf("%s@%d(%s)", o, a.token, a.owner)
}

func attempts(t *testing.T, st *stack.Stack, payoutID string) []attempt {
	t.Helper()
	rows, err := st.Paydb.Query(context.Background(),
		`SELECT presented_token, owner_id, outcome, rail_reference FROM rail_submission WHERE payout_id = $1 ORDER BY submission_id`, payoutID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []attempt
	for rows.Next() {
		var a attempt
		if err := rows.Scan(&a.token, &a.owner, &a.outcome, &a.ref); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// railCalls is the stub's call log — what the rail was presented — by reference.
func railCalls(t *testing.T, st *stack.Stack) map[string][]railstub.Call {
	t.Helper()
	calls, err := st.Stub.Calls(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]railstub.Call{}
	for _, c := range calls {
		out[c.Reference] = append(out[c.Reference], c)
	}
	return out
}

// waitLeaseExpired waits until lockdb holds the account's lease expired (by the
// database clock, which is the only one that decides).
func waitLeaseExpired(t *testing.T, st *stack.Stack, accountID string) {
	t.Helper()
	testkit.EventuallyState(t, 20*time.Second, "the lease of "+accountID+" to expire", func() (bool, string) {
		var expired bool
		err := st.Lockdb.QueryRow(context.Background(),
			`SELECT expires_at <= clock_timestamp() FROM lock_lease WHERE lock_name = $1`, lockapi.AccountLockName(accountID)).Scan(&expired)
		if err != nil {
			return false, err.Error()
		}
		return expired, "lease still valid"
	})
}

// gate holds an executor frozen in its pause for one payout until opened.
type gate struct {
	payoutID string
	entered  chan struct{}
	open     chan struct{}
	once     sync.Once
}

func newGate(payoutID string) *gate {
	return &gate{payoutID: payoutID, entered: make(chan struct{}), open: make(chan struct{})}
}

// hook is a PauseHook: other payouts pass straight through.
func (g *gate) hook(ctx context.Context, payoutID string) {
	if payoutID != g.payoutID {
		return
	}
	g.once.Do(func() { close(g.entered) })
	select {
	case <-g.open:
	case <-ctx.Done():
	}
}

func (g *gate) waitEntered(t *testing.T, who string) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never paused on %s", who, g.payoutID)
	}
}

func (g *gate) release() { close(g.open) }

type stackT = *stack.Stack
