package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/invariants"
	"lock.dev/internal/patroni"
	"lock.dev/internal/payment"
	"lock.dev/internal/railstub"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// Result is one finished run of the scenario.
type Result struct {
	Fencing bool `json:"fencingEnabled"`
	// BooksChecked: rail-proxy and payment-resource checked every move against
	// the books (RAIL_PROXY_BOOKS_CHECK, PAYMENT_BOOKS_CHECK;
	// docs/contracts/books.md). On in the fenced run, as users run the system;
	// off in the fencing-off run, which shows what the fence alone prevents.
	BooksChecked bool `json:"booksChecked"`
	Grants       bool `json:"grantsVerified"` // lock-server signs, both fence points verify
	// Identities: every call was mutual TLS between named workloads, with roles
	// per route (docs/contracts/workload-identity.md); false with --unsafe-no-auth.
	Identities  bool          `json:"identities"`
	Elapsed     time.Duration `json:"-"`
	ElapsedMs   int64         `json:"elapsedMs"`
	Settled     bool          `json:"settled"` // every payout reached a final state within --max-duration
	Pauses      int64         `json:"executorPauses"`
	Crashes     int           `json:"proxyCrashes"`
	SlowWindows int           `json:"slowRailWindows"`
	// ReconcilerWaitMs is how long the run waited, after the executors stopped,
	// for the reconciler's final pass (the settle window, then one pass).
	ReconcilerWaitMs int64 `json:"reconcilerWaitMs"`
	// Failover is the --failover section: nil when the run had none.
	Failover *FailoverResult   `json:"failover,omitempty"`
	Report   invariants.Report `json:"report"`
	URLs     map[string]string `json:"urls,omitempty"` // with --keep

	stack     *stack.Stack
	keepLease *lockclient.Lease // --keep's lease (keep.go)
}

// Close stops the run's servers (kept with --keep).
func (r *Result) Close() error {
	if r.stack == nil {
		return nil
	}
	if r.keepLease != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = r.keepLease.Release(ctx) // else it ends with the servers
		cancel()
		r.keepLease = nil
	}
	err := r.stack.Close()
	r.stack = nil
	return err
}

// target says where a run's system lives.
type target struct {
	paydbURL, lockdbURL string
	wipe                bool      // empty the databases first (the second run on given databases)
	log                 io.Writer // the services' logs
	progress            *progress
	keysDir             string           // where the run's grant keys are made (with Config.Grants)
	replicated          bool             // a primary and a synchronous standby (--failover=promote), started by the stack
	patroni             *patroni.Cluster // the Patroni cluster the URLs name (--failover=patroni)
}

// scenario is one run in progress.
type scenario struct {
	cfg     Config
	fencing bool
	t       target
	st      *stack.Stack
	rec     *stack.Reconciler // settles the AMBIGUOUS payouts from the rail's statement (books.go)

	fail chan error // an executor or the crash machinery failed: the run is void

	pauses      atomic.Int64
	crashes     atomic.Int64
	slowWindows atomic.Int64
	settledFrac atomic.Uint64 // settled payouts × 1000 / total, for the crash and failover triggers

	mu     sync.Mutex
	failed *FailoverResult // set once the failover happened (failover.go)
}

// runScenario runs the seeded scenario once with fencing on or off: brings the
// system up on the given databases, seeds the payouts, runs the executors under
// chaos until every payout settles or MaxDuration passes, then judges the ground
// truth. The servers keep running when cfg.Keep is set; Close the Result to stop them.
func runScenario(ctx context.Context, cfg Config, fencing bool, t target) (*Result, error) {
	s := &scenario{cfg: cfg, fencing: fencing, t: t, fail: make(chan error, cfg.Executors+1)}
	start := time.Now()
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	run := &Result{Fencing: fencing, BooksChecked: s.books(), Grants: cfg.Grants, Identities: s.st.Secure(), stack: s.st}
	keep := false
	defer func() {
		if !keep {
			_ = run.Close()
		}
	}()
	if err := s.seed(ctx); err != nil {
		return nil, err
	}

	wctx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range cfg.Executors {
		ecfg, err := s.executorConfig(i)
		if err != nil {
			stopWork()
			wg.Wait()
			return nil, err
		}
		wg.Go(func() {
			if err := executor.Run(wctx, ecfg); err != nil {
				s.fail <- fmt.Errorf("executor %s: %w", ecfg.OwnerID, err)
			}
		})
	}
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		s.chaos(wctx)
	}()

	settled, err := s.watch(ctx, start)
	stopWork()
	<-chaosDone
	wg.Wait()
	if err != nil {
		return nil, err
	}
	// The executors have stopped, each after finishing any submission it had sent,
	// so nothing reaches the rail any more. The reconciler's final pass settles
	// what they left AMBIGUOUS; then the ground truth is final.
	waited, err := s.finalPass(ctx)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	calls, err := s.st.Stub.Calls(rctx)
	if err != nil {
		return nil, fmt.Errorf("read the rail-stub's call log: %w", err)
	}
	h, err := invariants.Load(rctx, s.st.Paydb, s.st.Lockdb, calls)
	if err != nil {
		return nil, err
	}
	// With taps (--failover), every token handed out is judged against lock_grant.
	h.Issued = s.st.IssuedTokens()
	if run.Failover, err = s.finishFailover(rctx, h.Issued); err != nil {
		return nil, err
	}
	run.Elapsed = time.Since(start)
	run.ElapsedMs = run.Elapsed.Milliseconds()
	run.Settled = settled
	run.Pauses = s.pauses.Load()
	run.Crashes = int(s.crashes.Load())
	run.SlowWindows = int(s.slowWindows.Load())
	run.ReconcilerWaitMs = waited.Milliseconds()
	run.Report = invariants.Evaluate(h, invariants.Options{FencingEnabled: fencing, RequireSettled: true, Reconciled: true,
		IssuedRecorded: h.Issued != nil, BooksBound: true, StatementAcceptedOnly: cfg.statementAcceptedOnly()})
	if cfg.Keep {
		keep = true
		run.URLs = map[string]string{
			"lock-server":      s.st.LockServerURL,
			"payment-resource": s.st.PaymentURL,
			"rail-proxy":       s.st.ProxyURL,
			"rail-stub":        s.st.StubURL,
			"reconciler":       s.rec.URL,
			"paydb":            s.st.PaydbURL,
			"lockdb":           s.st.LockdbURL,
		}
		if s.st.Secure() {
			run.URLs["certs"] = s.st.CertsDir
		}
	}
	return run, nil
}

// books says whether the run checks every move against the books
// (docs/contracts/books.md): with fencing on, as users run the system. The
// fencing-off run turns the books checks off too, so that it shows what the fence
// alone prevents: with them on, a superseded holder presenting a payout a newer
// holder has re-claimed would be refused by the books (mismatch token) whatever
// the fencing switch says.
func (s *scenario) books() bool { return s.fencing }

// start brings the system up with the demo's settings (the variable names of
// docs/contracts/configuration.md).
func (s *scenario) start(ctx context.Context) error {
	c := s.cfg
	drop, decline := s.rates()
	var grants map[string]map[string]string
	if c.Grants && c.UnsafeNoAuth {
		// Keys made with lock-server keygen's code: lock-server signs, rail-proxy
		// and payment-resource verify, the executors present their leases' grants.
		// With identities on the stack makes them itself: grants are then always
		// on (docs/contracts/workload-identity.md).
		var err error
		if grants, err = stack.GrantEnv(s.t.keysDir); err != nil {
			return fmt.Errorf("make the grant keys: %w", err)
		}
	}
	opts := replicatedOptions(s.t) // failover.go
	opts.PaydbURL, opts.LockdbURL = s.t.paydbURL, s.t.lockdbURL
	opts.ProxyAsChild, opts.Log, opts.UnsafeNoAuth = true, s.t.log, c.UnsafeNoAuth
	opts.RailProtocol, opts.StatementSource = c.RailProtocol, c.StatementSource
	opts.Env = stack.MergeEnv(grants, map[string]map[string]string{
		"rail-proxy": {
			"RAIL_PROXY_FENCING_ENABLED":   strconv.FormatBool(s.fencing),
			"RAIL_PROXY_BOOKS_CHECK":       strconv.FormatBool(s.books()),
			"RAIL_READ_TIMEOUT":            c.RailReadTimeout.String(),
			"RAIL_CONNECT_TIMEOUT":         c.RailConnectTimeout.String(),
			"RAIL_PROXY_INTERRUPTED_AFTER": c.InterruptedAfter().String(),
		},
		"payment-resource": {
			"PAYMENT_BOOKS_CHECK": strconv.FormatBool(s.books()),
			// As the reconciler's window (books.go): a NOT_PRESENTED settle needs the
			// statement read this long past the attempt.
			"PAYMENT_SETTLE_AFTER": c.SettleAfter().String(),
		},
		"rail-stub": {
			"RAIL_STUB_SEED":         strconv.FormatInt(c.Seed, 10),
			"RAIL_STUB_LATENCY_MS":   strconv.Itoa(baseLatencyMs),
			"RAIL_STUB_DROP_RATE":    strconv.FormatFloat(drop, 'g', -1, 64),
			"RAIL_STUB_DECLINE_RATE": strconv.FormatFloat(decline, 'g', -1, 64),
		},
	})
	st, err := stack.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("start the system: %w", err)
	}
	s.st = st
	if s.t.wipe {
		if err := wipe(ctx, st.Paydb, st.Lockdb); err != nil {
			_ = st.Close()
			return err
		}
	}
	empty, err := isEmpty(ctx, st.Paydb, st.Lockdb)
	if err == nil && !empty {
		err = errors.New("the given databases already hold payouts, submissions or locks; lockdemo judges everything in them, so it needs empty ones")
	}
	if err != nil {
		_ = st.Close()
		return err
	}
	if err := s.startReconciler(ctx); err != nil { // books.go
		_ = st.Close()
		return err
	}
	return nil
}

// seed creates the payouts through payment-resource: amounts, accounts and
// beneficiaries drawn from the seed, spread over the accounts at random.
func (s *scenario) seed(ctx context.Context) error {
	rng := rand.New(rand.NewPCG(uint64(s.cfg.Seed), 1))
	// Payouts are created as the ops workload (a creator).
	pc := payment.NewTLSClient(s.st.PaymentURL, s.st.ClientTLS(identity.NameOps, identity.NamePaymentResource))
	for i := 1; i <= s.cfg.Payouts; i++ {
		req := lockapi.SubmissionRequest{
			PayoutID:    fmt.Sprintf("p-%05d", i),
			AccountID:   fmt.Sprintf("acct-%02d", 1+rng.IntN(s.cfg.Accounts)),
			AmountMinor: 100 + rng.Int64N(250_000),
			Currency:    "EUR",
			Beneficiary: fmt.Sprintf("NL%02dLOCK%010d", 10+rng.IntN(90), rng.Int64N(10_000_000_000)),
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := pc.Create(cctx, req)
		cancel()
		if err != nil {
			return fmt.Errorf("seed payout %s: %w", req.PayoutID, err)
		}
	}
	return nil
}

// executorConfig is executor i's configuration: its own owner id, metrics port and
// pause draw; the pause is counted as it happens.
func (s *scenario) executorConfig(i int) (executor.Config, error) {
	ln, err := stack.Listener()
	if err != nil {
		return executor.Config{}, err
	}
	cfg := executor.DefaultConfig()
	urls := s.st.ServiceURLs()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = urls["LOCK_SERVER_URL"], urls["PAYMENT_RESOURCE_URL"], urls["RAIL_PROXY_URL"]
	cfg.OwnerID = fmt.Sprintf("executor-%d", i+1)
	cfg.Identity = workload(s.st, identity.NameExecutor)
	cfg.Workers = s.cfg.Workers
	cfg.LeaseTTL = s.cfg.LeaseTTL
	cfg.ProxyTimeout = s.cfg.ProxyTimeout()
	cfg.PollInterval = 100 * time.Millisecond
	// The reconcile pass re-claims a paused executor's payout once it has been
	// CLAIMED for a lease TTL. Looking only every 3 s lets most paused holders wake
	// first and present their stale token: that is what the run shows.
	cfg.ReconcileInterval = 3 * time.Second
	cfg.PauseProbability = s.cfg.PauseProbability * s.cfg.Chaos
	cfg.Pause = s.cfg.Pause
	cfg.Seed = s.cfg.Seed*1000 + int64(i) + 1
	cfg.PauseHook = func(ctx context.Context, _ string) {
		s.pauses.Add(1)
		sleep(ctx, s.cfg.Pause)
	}
	cfg.Listener = ln
	cfg.LogOutput = s.t.log
	return cfg, cfg.Validate()
}

// watch shows progress until every payout is settled (true) or MaxDuration
// passes (false).
func (s *scenario) watch(ctx context.Context, start time.Time) (bool, error) {
	deadline := time.NewTimer(s.cfg.MaxDuration - time.Since(start))
	defer deadline.Stop()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var lastSeq int64
	var calls int
	p := s.t.progress
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case err := <-s.fail:
			return false, err
		case <-deadline.C:
			p.done()
			return false, nil
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := readCounts(qctx, s.st.Paydb)
		if err == nil {
			var page []railstub.Call
			page, err = s.newCalls(qctx, lastSeq)
			if len(page) > 0 {
				lastSeq = page[len(page)-1].Seq
				calls += len(page)
			}
		}
		cancel()
		if err != nil {
			continue // a slow moment under chaos; the next tick tries again
		}
		if c.payouts > 0 {
			s.settledFrac.Store(uint64(c.settled * 1000 / c.payouts))
		}
		p.update(status{
			fencing: s.fencing, elapsed: time.Since(start), settled: c.settled, total: c.payouts,
			calls: calls, fenced: c.fenced, admitted: c.admitted, pauses: s.pauses.Load(), crashes: s.crashes.Load(),
		})
		if c.payouts > 0 && c.settled == c.payouts && c.pending == 0 {
			p.done()
			return true, nil
		}
	}
}

// newCalls reads the calls the rail booked after seq.
func (s *scenario) newCalls(ctx context.Context, after int64) ([]railstub.Call, error) {
	return s.st.Stub.CallsPage(ctx, after, railstub.MaxPageLimit)
}

// workload is the identity settings of the workload name on st: its SVID's files
// in the stack's certificate set, or UNSAFE_NO_AUTH when the stack runs without
// identities (--unsafe-no-auth).
func workload(st *stack.Stack, name string) identity.Settings {
	if !st.Secure() {
		return identity.Settings{UnsafeNoAuth: true}
	}
	return identity.Files(st.CertsDir, name)
}
