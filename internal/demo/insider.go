package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/invariants"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// The insider (docs/contracts/books.md): a workload that holds genuine leases —
// real tokens and real signed grants of the accounts it works on, so neither the
// fence nor grant verification can stop it — and the settle bearer. It makes the
// moves the books never made: it presents a payout nobody created, presents real
// payouts to its own beneficiary, posts outcomes the rail never gave, and settles
// a payout as never presented although the rail accepted it.
//
// Both columns run on a system of their own (fresh databases on the demo's
// cluster), fencing on, grants signed and verified; they differ only in whether
// rail-proxy and payment-resource check every move against the books. After the
// insider's moves an honest executor works the accounts, and the ground truth is
// judged: invariant 8, only the books move money.
const (
	insiderOwner     = "insider"
	insiderUncreated = "p-insider-1" // nobody created it
	insiderBenef     = "EVIL-IBAN"
	aliceBenef       = "NL02ALICE0123456789"   // the victims' beneficiary, as booked
	malloryBenef     = "NL66MALLORY9876543210" // the insider's own
	victimAccount    = "acct-03"
	victim1          = "p-victim-1" // pending when the insider presents it
	victim1Amount    = 1_234_500
	victim2          = "p-victim-2" // claimed by the insider, then presented
	victim2Amount    = 765_400
	madeUpAccount    = "acct-02"
	madeUpPaid       = "p-madeup-1" // claimed by the insider, posted PAID, never presented
	madeUpDeclined   = "p-madeup-2" // claimed by the insider, posted DECLINED, never presented
	madeUpReference  = "RAIL-MADE-UP-1"
	madeUpReason     = "made up by the insider"
	settleAccount    = "acct-04"
	settleVictim     = "p-settle-1" // the rail accepted it, its reply was dropped: AMBIGUOUS
	settleAmount     = 98_700
	insiderWindow    = 10 * time.Minute // the settle windows: nothing settles by itself during the demo
)

// insiderMoves names the insider's moves, in the report's order.
var insiderMoves = []struct{ service, move, want, detail string }{
	{"rail-proxy", "an uncreated payout " + insiderUncreated + ", 99999999 EUR minor to " + insiderBenef, lockapi.CodeNotInBooks, lockapi.MismatchNotFound},
	{"rail-proxy", victim1 + " (pending) to MALLORY instead of ALICE", lockapi.CodeNotInBooks, lockapi.MismatchNotClaimed},
	{"rail-proxy", victim2 + ", claimed under the insider's lease, to MALLORY", lockapi.CodeNotInBooks, lockapi.MismatchBeneficiary},
	{"payment-resource", "post PAID " + madeUpPaid + " with a made-up railReference", lockapi.CodeOutcomeNotRecorded, "none"},
	{"payment-resource", "post DECLINED " + madeUpDeclined + " with a made-up reason", lockapi.CodeOutcomeNotRecorded, "none"},
	{"payment-resource", "settle NOT_PRESENTED " + settleVictim + ", which the rail accepted", lockapi.CodeSettleContradictsStatement, ""},
}

// insiderBreaks are the invariant-8 checks the insider's moves break with the
// books unchecked: each kind at least once.
var insiderBreaks = []invariants.CheckID{
	invariants.CheckAdmittedWithoutClaim, invariants.CheckAdmittedNotAsBooked, invariants.CheckPaidPostNotRecorded,
	invariants.CheckPostNotRecorded, invariants.CheckSettleContradicted,
}

// InsiderAttempt is one move of the insider and what it got.
type InsiderAttempt struct {
	Service string `json:"service"` // rail-proxy or payment-resource
	Move    string `json:"move"`
	Status  int    `json:"status"`
	Code    string `json:"code,omitempty"`   // the problem code; empty on success
	Detail  string `json:"detail,omitempty"` // NOT_IN_BOOKS's mismatch, OUTCOME_NOT_RECORDED's recorded ("none" for null)
	// Want and WantDetail are the refusal the books give this move.
	Want       string `json:"expectedCode"`
	WantDetail string `json:"expectedDetail,omitempty"`
	Answer     string `json:"answer,omitempty"` // what a success answered: the payout's status, ACKED for a submission
}

// Refused says the books refused the move as docs/contracts/books.md says.
func (a InsiderAttempt) Refused() bool {
	return a.Status == http.StatusConflict && a.Code == a.Want && (a.WantDetail == "" || a.Detail == a.WantDetail)
}

func (a InsiderAttempt) String() string {
	switch {
	case a.Code != "" && a.Detail != "":
		return fmt.Sprintf("%d %s (%s)", a.Status, a.Code, a.Detail)
	case a.Code != "":
		return fmt.Sprintf("%d %s", a.Status, a.Code)
	default:
		return fmt.Sprintf("%d %s", a.Status, a.Answer)
	}
}

// InsiderPayout is one payout the insider touched, at the end.
type InsiderPayout struct {
	PayoutID string      `json:"payoutId"`
	State    PayoutState `json:"state"`
}

// InsiderResult is one column of the insider's attack.
type InsiderResult struct {
	BooksChecked bool             `json:"booksChecked"`
	Attempts     []InsiderAttempt `json:"attempts"`
	// RailCalls are the calls the rail received to the insider's beneficiaries
	// (EVIL-IBAN, MALLORY), and AcceptedMinor what it accepted of them.
	RailCalls     int   `json:"insiderRailCalls"`
	AcceptedMinor int64 `json:"insiderAcceptedMinor"`
	// Payouts are the payouts the insider touched, once an honest executor has
	// worked the accounts again.
	Payouts []InsiderPayout `json:"payouts"`
	// Report is the ground truth of the column's system, judged with invariant 8.
	Report invariants.Report `json:"report"`
	// OK: with the books checked, every move was refused as
	// docs/contracts/books.md says, the rail paid nothing to the insider's
	// beneficiaries, invariant 8 held and the honest executor paid the victims
	// to ALICE and the insider's made-up payouts for real. Without the checks, OK
	// says the hazard showed: every move succeeded and invariant 8 is broken in
	// each of the ways the moves break it.
	OK        bool  `json:"ok"`
	ElapsedMs int64 `json:"elapsedMs"`
}

// runInsiders runs both columns, books checked first, each on fresh databases
// of cluster.
func runInsiders(ctx context.Context, cluster *pgcluster.Cluster, cfg Config, keysRoot string, log io.Writer, p *progress) ([]*InsiderResult, error) {
	var out []*InsiderResult
	for _, books := range []bool{true, false} {
		name := "insider_books_" + onOff(books)
		p.say("attack: an insider with genuine leases makes moves the books never made, books checks %s …", onOff(books))
		for _, db := range []string{"paydb_" + name, "lockdb_" + name} {
			if err := cluster.CreateDatabase(ctx, db, ""); err != nil {
				return nil, err
			}
		}
		r, err := runInsider(ctx, cfg, insiderSite{
			paydbURL: cluster.URL("paydb_" + name), lockdbURL: cluster.URL("lockdb_" + name),
			keysDir: filepath.Join(keysRoot, name), books: books, log: log,
		})
		if err != nil {
			return nil, fmt.Errorf("insider, books checks %s: %w", onOff(books), err)
		}
		out = append(out, r)
	}
	return out, nil
}

type insiderSite struct {
	paydbURL, lockdbURL string
	keysDir             string
	books               bool
	log                 io.Writer
}

// runInsider is one column: an ambiguous payout the rail accepted, the
// insider's moves, an honest executor, the verdict.
func runInsider(ctx context.Context, cfg Config, t insiderSite) (*InsiderResult, error) {
	start := time.Now()
	grants := map[string]map[string]string{}
	if cfg.UnsafeNoAuth {
		// Without identities the stack makes no grant keys; the demo's own.
		var err error
		if grants, err = stack.GrantEnv(t.keysDir); err != nil {
			return nil, err
		}
	}
	books := strconv.FormatBool(t.books)
	st, err := stack.Start(ctx, stack.Options{PaydbURL: t.paydbURL, LockdbURL: t.lockdbURL, Log: t.log, UnsafeNoAuth: cfg.UnsafeNoAuth,
		RailProtocol: cfg.RailProtocol, StatementSource: cfg.StatementSource,
		Env: stack.MergeEnv(grants, map[string]map[string]string{
			"rail-stub":        {"RAIL_STUB_SEED": strconv.FormatInt(cfg.Seed, 10), "RAIL_STUB_LATENCY_MS": strconv.Itoa(baseLatencyMs)},
			"rail-proxy":       {"RAIL_PROXY_BOOKS_CHECK": books},
			"payment-resource": {"PAYMENT_BOOKS_CHECK": books, "PAYMENT_SETTLE_AFTER": insiderWindow.String()},
		})})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// The reconciler copies the statement, which the settle's check reads. It is
	// given a settle token payment-resource does not take, so that it settles
	// nothing itself: the insider's settle comes first, as it would if it raced a
	// reconciler's pass and won.
	if _, err := st.StartReconciler(ctx, map[string]string{
		"RECONCILER_INTERVAL": "200ms", "RECONCILER_SETTLE_AFTER": insiderWindow.String(),
		"PAYMENT_SETTLE_TOKEN": "not-" + st.SettleToken}); err != nil {
		return nil, fmt.Errorf("start the reconciler: %w", err)
	}
	a := newAttack(st, cfg, t.log)
	lc, err := lockclient.New(st.LockServerURL, lockclient.WithTLSConfig(st.ClientTLS(identity.NameExecutor, identity.NameLockServer)))
	if err != nil {
		return nil, err
	}
	in := &insider{attack: a, lc: lc}
	res := &InsiderResult{BooksChecked: t.books}

	// An honest executor presents settleVictim while the rail drops every reply:
	// the rail accepts it, the payout ends AMBIGUOUS, and the reconciler copies
	// the ACCEPTED line.
	if err := in.ambiguousAccepted(ctx); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		id, account string
		amount      int64
	}{{victim1, victimAccount, victim1Amount}, {victim2, victimAccount, victim2Amount},
		{madeUpPaid, madeUpAccount, 310_000}, {madeUpDeclined, madeUpAccount, 420_000}} {
		if err := in.createFor(ctx, p.id, p.account, p.amount, aliceBenef); err != nil {
			return nil, err
		}
	}
	if res.Attempts, err = in.moves(ctx); err != nil {
		return nil, err
	}

	// The honest executor works the accounts again.
	if err := a.honestPhase(ctx, func(ctx context.Context) bool { return in.settled(ctx, t.books) }); err != nil {
		return nil, err
	}
	for _, id := range []string{victim1, victim2, madeUpPaid, madeUpDeclined, settleVictim} {
		s, err := a.state(ctx, id)
		if err != nil {
			return nil, err
		}
		res.Payouts = append(res.Payouts, InsiderPayout{PayoutID: id, State: s})
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	calls, err := st.Stub.Calls(rctx)
	if err != nil {
		return nil, fmt.Errorf("read the rail-stub's call log: %w", err)
	}
	for _, c := range calls {
		if c.Beneficiary == insiderBenef || c.Beneficiary == malloryBenef {
			res.RailCalls++
			if c.Result == "ACCEPTED" {
				res.AcceptedMinor += c.AmountMinor
			}
		}
	}
	h, err := invariants.Load(rctx, st.Paydb, st.Lockdb, calls)
	if err != nil {
		return nil, err
	}
	res.Report = invariants.Evaluate(h, invariants.Options{FencingEnabled: true, BooksBound: true})
	res.OK = res.judge()
	res.ElapsedMs = time.Since(start).Milliseconds()
	return res, nil
}

// insider is the insider's tools on one column's system.
type insider struct {
	*attack
	lc *lockclient.Client
}

func (in *insider) createFor(ctx context.Context, id, account string, amount int64, beneficiary string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := in.pc.Create(cctx, lockapi.SubmissionRequest{PayoutID: id, AccountID: account, AmountMinor: amount,
		Currency: "EUR", Beneficiary: beneficiary}); err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	return nil
}

// ambiguousAccepted makes settleVictim AMBIGUOUS although the rail accepted it,
// and waits until the reconciler has copied its line.
func (in *insider) ambiguousAccepted(ctx context.Context) error {
	chaos := func(drop float64) error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := in.st.Stub.SetChaos(cctx, baseLatencyMs, 0, drop, nil)
		return err
	}
	if err := chaos(1); err != nil {
		return fmt.Errorf("make the rail drop its replies: %w", err)
	}
	if err := in.createFor(ctx, settleVictim, settleAccount, settleAmount, aliceBenef); err != nil {
		return err
	}
	if err := in.honestPhase(ctx, func(ctx context.Context) bool { return in.final(ctx, settleVictim) }); err != nil {
		return err
	}
	if err := chaos(0); err != nil {
		return fmt.Errorf("make the rail answer again: %w", err)
	}
	if s, err := in.state(ctx, settleVictim); err != nil || s.Status != lockapi.StatusAmbiguous {
		return fmt.Errorf("%s should be AMBIGUOUS, the rail's reply dropped: %v %v", settleVictim, s, err)
	}
	deadline := time.Now().Add(attackPhase)
	for {
		var n int
		err := in.st.Paydb.QueryRow(ctx, `SELECT count(*) FROM rail_statement_line WHERE reference = $1 AND result = 'ACCEPTED'`, settleVictim).Scan(&n)
		switch {
		case err != nil:
			return fmt.Errorf("read the statement copy: %w", err)
		case n > 0:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("the reconciler did not copy %s's ACCEPTED line within %s", settleVictim, attackPhase)
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// lease takes a genuine lease of account, as the insider, for one move.
func (in *insider) lease(ctx context.Context, account string) (*lockclient.Lease, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := in.lc.Acquire(cctx, lockapi.AccountLockName(account), insiderOwner, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("the insider's lease of %s: %w", account, err)
	}
	return l, nil
}

func (in *insider) release(ctx context.Context, l *lockclient.Lease) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = l.Release(cctx) // a lease left behind expires; the honest phase waits for it
}

// moves makes the insider's six moves, each under a fresh genuine lease (a token
// admitted once is never admitted again), in insiderMoves' order.
func (in *insider) moves(ctx context.Context) ([]InsiderAttempt, error) {
	out := make([]InsiderAttempt, len(insiderMoves))
	for i, m := range insiderMoves {
		out[i] = InsiderAttempt{Service: m.service, Move: m.move, Want: m.want, WantDetail: m.detail}
	}
	present := func(i int, account string, body lockapi.SubmissionRequest, claim bool) error {
		l, err := in.lease(ctx, account)
		if err != nil {
			return err
		}
		defer in.release(ctx, l)
		if claim {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := in.exec.ClaimWithGrant(cctx, body.PayoutID, l.Token(), l.Grant(), insiderOwner)
			cancel()
			if err != nil {
				return fmt.Errorf("the insider's claim of %s: %w", body.PayoutID, err)
			}
		}
		status, p, err := in.submit(ctx, body, l.Token(), insiderOwner, []string{l.Grant()})
		out[i].record(status, p, err, "ACKED (paid)", "mismatch")
		return nil
	}
	if err := present(0, attackVictim, lockapi.SubmissionRequest{PayoutID: insiderUncreated, AccountID: attackVictim,
		AmountMinor: rogueAmount, Currency: "EUR", Beneficiary: insiderBenef}, false); err != nil {
		return nil, err
	}
	if err := present(1, victimAccount, lockapi.SubmissionRequest{PayoutID: victim1, AccountID: victimAccount,
		AmountMinor: victim1Amount, Currency: "EUR", Beneficiary: malloryBenef}, false); err != nil {
		return nil, err
	}
	if err := present(2, victimAccount, lockapi.SubmissionRequest{PayoutID: victim2, AccountID: victimAccount,
		AmountMinor: victim2Amount, Currency: "EUR", Beneficiary: malloryBenef}, true); err != nil {
		return nil, err
	}
	post := func(i int, id string, req lockapi.PostRequest) error {
		l, err := in.lease(ctx, madeUpAccount)
		if err != nil {
			return err
		}
		defer in.release(ctx, l)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := in.exec.ClaimWithGrant(cctx, id, l.Token(), l.Grant(), insiderOwner); err != nil {
			return fmt.Errorf("the insider's claim of %s: %w", id, err)
		}
		paid, err := in.exec.PostWithGrant(cctx, id, l.Token(), l.Grant(), insiderOwner, req)
		var p *lockapi.Problem
		if errors.As(err, &p) {
			err = nil
		}
		status := http.StatusOK
		if p != nil {
			status = p.Status
		}
		out[i].record(status, p, err, paid.Status, "recorded")
		return nil
	}
	ref, reason := madeUpReference, madeUpReason
	if err := post(3, madeUpPaid, lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: &ref}); err != nil {
		return nil, err
	}
	if err := post(4, madeUpDeclined, lockapi.PostRequest{Outcome: lockapi.StatusDeclined, DeclineReason: &reason}); err != nil {
		return nil, err
	}
	status, p, err := in.settle(ctx, settleVictim, lockapi.SettleRequest{Outcome: lockapi.StatusNotPresented})
	out[5].record(status, p, err, lockapi.StatusNotPresented, "")
	return out, nil
}

// record fills in an answer: on a problem its code and the member that says
// why (null read as "none"), on success what it answered.
func (a *InsiderAttempt) record(status int, p *lockapi.Problem, err error, answer, member string) {
	switch {
	case err != nil:
		a.Code = "NO_ANSWER"
	case p != nil:
		a.Status, a.Code = status, p.Code
		if member != "" {
			var v *string
			if ok, _ := p.Member(member, &v); ok {
				a.Detail = "none"
				if v != nil {
					a.Detail = *v
				}
			}
		}
	default:
		a.Status, a.Answer = status, answer
	}
}

// settle posts a settle with the stack's settle bearer, as the reconciler does
// and as the reconciler workload: with identities on only it may settle, so the
// insider's settle is a compromised reconciler's.
func (in *insider) settle(ctx context.Context, id string, req lockapi.SettleRequest) (int, *lockapi.Problem, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return 0, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := http.NewRequestWithContext(cctx, http.MethodPost, in.st.PaymentURL+"/v1/payouts/"+url.PathEscape(id)+"/settle", bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+in.st.SettleToken)
	resp, err := in.st.HTTPClient(identity.NameReconciler, identity.NamePaymentResource).Do(r)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	rb, _ := lockapi.ReadAllLimited(resp.Body, 1<<20)
	return resp.StatusCode, lockapi.ReadProblem(resp, rb), nil
}

// settled says the honest executor is done with what the insider left. With the
// books checked victim1 and the made-up payouts are final: victim1 paid to
// ALICE, the made-up ones paid for real. Without, victim1 was presented to
// MALLORY first: the executor gets DUPLICATE and either refuses the mismatching
// first attempt (executor_payout_total{result="mismatch"}) or adopts it. victim2
// is not waited for: its holder's own attempt is on record, so the executor
// leaves it for a person (docs/contracts/books.md).
func (in *insider) settled(ctx context.Context, books bool) bool {
	final := func(id string) bool { return in.final(ctx, id) }
	if books {
		return final(victim1) && final(madeUpPaid) && final(madeUpDeclined)
	}
	s1, err := in.state(ctx, victim1)
	if err != nil || !slices.Contains(s1.Outcomes, lockapi.OutcomeDuplicate) {
		return false
	}
	if final(victim1) {
		return true
	}
	fams, err := testkit.Scrape(ctx, in.st.HTTPClient(identity.NameOps, identity.NameExecutor), in.execURL+"/metrics")
	if err != nil {
		return false
	}
	n, ok, err := fams.Lookup(`executor_payout_total{result="mismatch"}`)
	return err == nil && ok && n >= 1
}

// judge is the column's verdict (see InsiderResult.OK).
func (r *InsiderResult) judge() bool {
	if r.BooksChecked {
		for _, a := range r.Attempts {
			if !a.Refused() {
				return false
			}
		}
		for _, p := range r.Payouts {
			if p.State.Status != insiderEnd(p.PayoutID) {
				return false
			}
		}
		return r.RailCalls == 0 && r.Report.Held(8)
	}
	for _, a := range r.Attempts {
		if a.Status != http.StatusOK {
			return false
		}
	}
	for _, id := range insiderBreaks {
		if r.Report.Count(id) == 0 {
			return false
		}
	}
	return r.RailCalls > 0 && !r.Report.Held(8)
}

// insiderEnd is the status each payout the insider touched ends in with the
// books checked: victim1 and the made-up ones paid by the honest executor;
// victim2, whose holder (the insider) presented it to another beneficiary, left
// CLAIMED for a person (the reconciler lists it as ATTEMPT_MISMATCH); settleVictim
// still AMBIGUOUS, for the reconciler to settle PAID from its line.
func insiderEnd(id string) string {
	switch id {
	case victim2:
		return lockapi.StatusClaimed
	case settleVictim:
		return lockapi.StatusAmbiguous
	}
	return lockapi.StatusPaid
}

// honestExecutor is honestPhase's executor configuration.
func (a *attack) honestExecutor() (executor.Config, error) {
	ln, err := stack.Listener()
	if err != nil {
		return executor.Config{}, err
	}
	cfg := executor.DefaultConfig()
	urls := a.st.ServiceURLs()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = urls["LOCK_SERVER_URL"], urls["PAYMENT_RESOURCE_URL"], urls["RAIL_PROXY_URL"]
	cfg.OwnerID = attackOwner
	cfg.Identity = workload(a.st, identity.NameExecutor)
	cfg.Workers = 1
	cfg.LeaseTTL = a.cfg.LeaseTTL
	cfg.PollInterval = 50 * time.Millisecond
	cfg.ReconcileInterval = 500 * time.Millisecond
	cfg.Listener = ln
	cfg.LogOutput = a.log
	if err := cfg.Validate(); err != nil {
		_ = ln.Close()
		return executor.Config{}, err
	}
	return cfg, nil
}

// insiderVerdict: every column with the books checked refused the insider.
func insiderVerdict(cols []*InsiderResult) bool {
	for _, c := range cols {
		if c.BooksChecked && !c.OK {
			return false
		}
	}
	return true
}

// writeInsider is the report's insider section.
func writeInsider(w io.Writer, cols []*InsiderResult) {
	if len(cols) == 0 {
		return
	}
	fmt.Fprintf(w, "\ninsider — a workload with genuine leases (real tokens and signed grants of the accounts, owner %q;\n"+
		"with identities on, the executor's certificate) and the settle bearer (the reconciler's certificate)\n"+
		"makes moves the books never made: fencing, grant verification and identities cannot stop it.\n"+
		"Each column is a system of its own, fencing on, grants verified; they differ only in whether\n"+
		"rail-proxy and payment-resource check every move against the books (docs/contracts/books.md).\n"+
		"ALICE is the victims' booked beneficiary (%s), MALLORY the insider's (%s):\n\n",
		insiderOwner, aliceBenef, malloryBenef)
	head := make([]string, len(cols))
	each := func(f func(*InsiderResult) string) []string {
		out := make([]string, len(cols))
		for i, c := range cols {
			out[i] = f(c)
		}
		return out
	}
	for i, c := range cols {
		head[i] = "books checked"
		if !c.BooksChecked {
			head[i] = "books not checked"
		}
	}
	t := invariants.Table{Head: head}
	t.Row("RAIL_PROXY_BOOKS_CHECK, PAYMENT_BOOKS_CHECK", each(func(c *InsiderResult) string { return strconv.FormatBool(c.BooksChecked) }))
	last := ""
	for i, m := range insiderMoves {
		if m.service != last {
			t.Row(m.service+":", nil)
			last = m.service
		}
		t.Row("  "+m.move, each(func(c *InsiderResult) string { return c.Attempts[i].String() }))
	}
	t.Gap()
	t.Row("rail calls to "+insiderBenef+" or MALLORY", each(func(c *InsiderResult) string {
		if c.RailCalls == 0 {
			return "0"
		}
		return fmt.Sprintf("%d, %d accepted", c.RailCalls, c.AcceptedMinor)
	}))
	t.Row("then an honest executor works the accounts:", nil)
	for i, p := range cols[0].Payouts {
		t.Row("  "+p.PayoutID, each(func(c *InsiderResult) string { return c.Payouts[i].State.String() }))
	}
	t.Gap()
	t.Row(invariants.InvariantLabel(8), each(func(c *InsiderResult) string { return c.Report.HeldCell(8) }))
	for _, ch := range cols[0].Report.Checks {
		if ch.Invariant != 8 {
			continue
		}
		t.Row("  "+ch.Title, each(func(c *InsiderResult) string { return c.Report.CheckCell(ch.ID) }))
	}
	t.Row("verdict", each(func(c *InsiderResult) string { return demonstrationVerdict(c.BooksChecked, c.OK) }))
	_ = t.Write(w)
	for _, c := range cols {
		if c.BooksChecked {
			if c.OK {
				fmt.Fprintf(w, "\nWith the books checked every move was refused, as the audit trail records (%d UNBOOKED rows),\n"+
					"although every token and grant was genuine. %s, which the insider itself claimed and presented to\n"+
					"MALLORY, stays CLAIMED for a person: the executor does not take over an attempt the books refused\n"+
					"for its fields, and the reconciler lists it as an ATTEMPT_MISMATCH exception.\n", c.Report.Submissions.Unbooked, victim2)
			}
			continue
		}
		var v8 []invariants.Finding
		for _, f := range c.Report.Violations {
			if f.Invariant == 8 {
				v8 = append(v8, f)
			}
		}
		if len(v8) == 0 {
			continue
		}
		fmt.Fprintf(w, "\ninvariant 8 violations, books not checked (%d):\n", len(v8))
		for i, f := range v8 {
			if i == invariants.MaxListed {
				fmt.Fprintf(w, "  … and %d more (--json lists them all)\n", len(v8)-invariants.MaxListed)
				break
			}
			fmt.Fprintf(w, "  %s\n", f)
		}
		fmt.Fprintf(w, "\nWithout the books checks every move succeeded: the rail paid %d EUR minor units to %s and\n"+
			"MALLORY, the ledger books a payment the rail never made, a payout the rail declined nowhere is\n"+
			"DECLINED, and %s, which the rail paid, is NOT_PRESENTED — a business that re-issues those pays\n"+
			"twice. The checker sees each from paydb's own records (invariant 8).\n", c.AcceptedMinor, insiderBenef, settleVictim)
	}
}
