package demo

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/internal/executor"
	"lock.dev/internal/grant"
	"lock.dev/internal/grant/forge"
	"lock.dev/internal/identity"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// The attack (docs/contracts/signed-grants.md): a rogue client with network access and no lease
// presents a huge fencing token for an account, to rail-proxy and to
// payment-resource. Without signed grants a token is only a number: the gate
// admits anything above the mark, the rail pays, and the mark — which never goes
// down — fences every honest holder of the account out for ever. With grants
// verified, every attempt is refused before anything is written or forwarded.
//
// Both columns run on a system of their own (fresh databases on the demo's
// cluster), with fencing on, after the same honest warm-up; they differ in
// whether rail-proxy and payment-resource are given lock-server's key set. The
// column without it runs without the books checks too (docs/contracts/books.md),
// so that it shows what signed grants alone prevent: with the books checked, the
// rogue's made-up payout would be refused as not in the books whatever its token.
const (
	attackVictim   = "acct-01"
	attackOther    = "acct-02"
	attackOwner    = "executor-1"
	rogueOwner     = "rogue"
	rogueAmount    = 99_999_999
	rogueBenef     = "EVIL"
	roguePrefix    = "p-rogue-"
	attackTarget   = "p-target"   // the victim's pending payout the rogue claims
	attackHonest1  = "p-honest-1" // paid before the attack: sets the victim's mark
	attackHonest2  = "p-honest-2" // created after the attack: can an honest holder still pay?
	attackOtherPay = "p-other-1"
	attackPhase    = 30 * time.Second // bound of each honest phase
)

// variant is one way the rogue tries: its grant for a token, and the reason a
// verifying fence point gives it.
type variant struct {
	name   string
	grant  func(token int64) ([]string, error)
	reason string
}

// runAttacks runs both columns, grants verified first, each on fresh databases
// of cluster, and returns them.
func runAttacks(ctx context.Context, cluster *pgcluster.Cluster, cfg Config, keysRoot string, log io.Writer, p *progress) ([]*AttackResult, error) {
	var out []*AttackResult
	for _, verified := range []bool{true, false} {
		name := "attack_" + map[bool]string{true: "verified", false: "unverified"}[verified]
		p.say("attack: a rogue with no lease presents a huge token, grants %s …", map[bool]string{true: "verified", false: "not verified"}[verified])
		for _, db := range []string{"paydb_" + name, "lockdb_" + name} {
			if err := cluster.CreateDatabase(ctx, db, ""); err != nil {
				return nil, err
			}
		}
		r, err := runAttack(ctx, cfg, attackSite{
			paydbURL: cluster.URL("paydb_" + name), lockdbURL: cluster.URL("lockdb_" + name),
			keysDir: filepath.Join(keysRoot, name), verified: verified, log: log,
		})
		if err != nil {
			return nil, fmt.Errorf("attack, grants %s: %w", onOff(verified), err)
		}
		out = append(out, r)
	}
	return out, nil
}

type attackSite struct {
	paydbURL, lockdbURL string
	keysDir             string
	verified            bool
	log                 io.Writer
}

// runAttack is one column: warm-up, attack, honest holder again.
func runAttack(ctx context.Context, cfg Config, t attackSite) (*AttackResult, error) {
	start := time.Now()
	env := map[string]map[string]string{}
	if cfg.UnsafeNoAuth {
		// Without identities the stack makes no grant keys; the demo's own.
		var err error
		if env, err = stack.GrantEnv(t.keysDir); err != nil {
			return nil, err
		}
	}
	if !t.verified {
		// lock-server still signs (the rogue has real grants to replay); the
		// fence points are not given the key set, and check nothing against the
		// books. With identities on they would refuse to start without the key
		// set: UNSAFE_NO_AUTH lifts that refusal alone — their TLS settings are
		// given, so they still serve mutual TLS and check roles.
		env["rail-proxy"] = map[string]string{"RAIL_PROXY_BOOKS_CHECK": "false", "RAIL_PROXY_GRANT_KEYS_FILE": "", "UNSAFE_NO_AUTH": "true"}
		env["payment-resource"] = map[string]string{"PAYMENT_BOOKS_CHECK": "false", "PAYMENT_GRANT_KEYS_FILE": "", "UNSAFE_NO_AUTH": "true"}
	}
	st, err := stack.Start(ctx, stack.Options{PaydbURL: t.paydbURL, LockdbURL: t.lockdbURL, Log: t.log, UnsafeNoAuth: cfg.UnsafeNoAuth,
		RailProtocol: cfg.RailProtocol, StatementSource: cfg.StatementSource,
		Env: stack.MergeEnv(env, map[string]map[string]string{"rail-stub": {"RAIL_STUB_SEED": strconv.FormatInt(cfg.Seed, 10)}})})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	a := newAttack(st, cfg, t.log)
	res := &AttackResult{GrantsVerified: t.verified, BooksChecked: t.verified, Account: attackVictim}

	// Warm-up: an honest executor pays one payout of each account, so the victim
	// has a mark and lock-server has granted real tokens.
	if err := a.create(ctx, attackHonest1, attackVictim, 125_000); err != nil {
		return nil, err
	}
	if err := a.create(ctx, attackOtherPay, attackOther, 80_000); err != nil {
		return nil, err
	}
	if err := a.honestPhase(ctx, func(ctx context.Context) bool {
		return a.final(ctx, attackHonest1) && a.final(ctx, attackOtherPay)
	}); err != nil {
		return nil, err
	}
	if !a.final(ctx, attackHonest1) {
		return nil, errors.New("warm-up: the honest executor did not pay " + attackHonest1)
	}
	variants, err := a.variants(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.create(ctx, attackTarget, attackVictim, 240_000); err != nil {
		return nil, err
	}

	res.MarkBefore, err = mark(ctx, st.Paydb, attackVictim)
	if err != nil {
		return nil, err
	}
	// Strictly increasing huge tokens, so that without verification every
	// attempt is above the mark the previous one left.
	for i, v := range variants {
		token := lockapi.MaxInt64 - int64(len(variants)-1-i)
		grants, err := v.grant(token)
		if err != nil {
			return nil, err
		}
		res.Attempts = append(res.Attempts, a.rogueSubmit(ctx, fmt.Sprintf("%s%d", roguePrefix, i+1), token, grants, v))
		res.Attempts = append(res.Attempts, a.rogueClaim(ctx, token, grants, v))
	}
	if res.MarkAfter, err = mark(ctx, st.Paydb, attackVictim); err != nil {
		return nil, err
	}
	if res.TargetAfterAttack, err = a.state(ctx, attackTarget); err != nil {
		return nil, err
	}

	// The honest holder comes back: a new payout of the victim account, and the
	// one the rogue tried to claim.
	if err := a.create(ctx, attackHonest2, attackVictim, 55_000); err != nil {
		return nil, err
	}
	if err := a.honestPhase(ctx, func(ctx context.Context) bool {
		if a.final(ctx, attackHonest2) && a.final(ctx, attackTarget) {
			return true
		}
		s, err := a.state(ctx, attackHonest2)
		return err == nil && len(s.Outcomes) > 0 && s.Outcomes[len(s.Outcomes)-1] == lockapi.OutcomeFenced
	}); err != nil {
		return nil, err
	}
	if res.Target, err = a.state(ctx, attackTarget); err != nil {
		return nil, err
	}
	if res.Honest, err = a.state(ctx, attackHonest2); err != nil {
		return nil, err
	}
	if res.RogueRailCalls, res.RogueAcceptedMinor, err = a.rogueCalls(ctx); err != nil {
		return nil, err
	}
	res.OK = res.judge()
	res.ElapsedMs = time.Since(start).Milliseconds()
	return res, nil
}

// attack is one column's system and helpers. With identities on the rogue and
// the insider call as the executor workload: a certificate the services accept
// and the executor's roles (holder, worker, submitter) — what a process on an
// executor's host has. Grants and the books are what stop it then.
type attack struct {
	st   *stack.Stack
	pc   *payment.Client // as ops: creates payouts and reads them
	exec *payment.Client // as the executor: claims and posts
	cfg  Config
	log  io.Writer

	execURL string // the honest executor's metrics and health, while honestPhase runs
}

func newAttack(st *stack.Stack, cfg Config, log io.Writer) *attack {
	return &attack{st: st, cfg: cfg, log: log,
		pc:   payment.NewTLSClient(st.PaymentURL, st.ClientTLS(identity.NameOps, identity.NamePaymentResource)),
		exec: payment.NewTLSClient(st.PaymentURL, st.ClientTLS(identity.NameExecutor, identity.NamePaymentResource)),
	}
}

func (a *attack) create(ctx context.Context, id, account string, amount int64) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := a.pc.Create(cctx, lockapi.SubmissionRequest{PayoutID: id, AccountID: account, AmountMinor: amount,
		Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
	if err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	return nil
}

func (a *attack) final(ctx context.Context, id string) bool {
	s, err := a.state(ctx, id)
	return err == nil && (s.Status == lockapi.StatusPaid || s.Status == lockapi.StatusDeclined || s.Status == lockapi.StatusAmbiguous)
}

func (a *attack) state(ctx context.Context, id string) (PayoutState, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := a.pc.Get(cctx, id)
	if err != nil {
		return PayoutState{}, fmt.Errorf("read %s: %w", id, err)
	}
	s := PayoutState{Status: p.Status, FenceToken: p.FenceToken}
	if p.ClaimedBy != nil {
		s.ClaimedBy = *p.ClaimedBy
	}
	rows, err := a.st.Paydb.Query(cctx, `SELECT coalesce(outcome, 'unresolved') FROM rail_submission WHERE payout_id = $1 ORDER BY submission_id`, id)
	if err != nil {
		return s, fmt.Errorf("read %s's submissions: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			return s, err
		}
		s.Outcomes = append(s.Outcomes, o)
	}
	return s, rows.Err()
}

// honestPhase runs one honest executor until done holds or attackPhase passes.
// While it runs, execURL is its metrics' base URL.
func (a *attack) honestPhase(ctx context.Context, done func(context.Context) bool) error {
	cfg, err := a.honestExecutor() // insider.go
	if err != nil {
		return err
	}
	a.execURL = map[bool]string{true: "https://", false: "http://"}[a.st.Secure()] + cfg.Listener.Addr().String()
	ectx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = executor.Run(ectx, cfg) })
	deadline := time.Now().Add(attackPhase)
	for !done(ctx) && time.Now().Before(deadline) && ctx.Err() == nil {
		sleep(ctx, 50*time.Millisecond)
	}
	stop()
	wg.Wait()
	if runErr != nil {
		return fmt.Errorf("honest executor: %w", runErr)
	}
	return ctx.Err()
}

// variants are the rogue's five tries. Two of them replay real grants it saw in
// transit: one of the victim account, one of another account, both taken here
// from lock-server as an honest holder would get them.
func (a *attack) variants(ctx context.Context) ([]variant, error) {
	lc, err := lockclient.New(a.st.LockServerURL, lockclient.WithTLSConfig(a.st.ClientTLS(identity.NameExecutor, identity.NameLockServer)))
	if err != nil {
		return nil, err
	}
	seen := func(account string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l, err := lc.Acquire(cctx, lockapi.AccountLockName(account), attackOwner, 5*time.Second)
		if err != nil {
			return "", fmt.Errorf("take a real grant of %s: %w", account, err)
		}
		g := l.Grant()
		if err := l.Release(cctx); err != nil {
			return "", err
		}
		if g == "" {
			return "", errors.New("lock-server answered no grant")
		}
		return g, nil
	}
	victimGrant, err := seen(attackVictim)
	if err != nil {
		return nil, err
	}
	otherGrant, err := seen(attackOther)
	if err != nil {
		return nil, err
	}
	_, rogueKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	lock := lockapi.AccountLockName(attackVictim)
	one := func(g string, err error) ([]string, error) { return []string{g}, err }
	return []variant{
		{"no grant", func(int64) ([]string, error) { return nil, nil }, grant.ReasonMissing},
		{"a grant signed by the rogue's own key", func(tok int64) ([]string, error) {
			return one(forge.OwnKey(rogueKey, lock, tok, rogueOwner))
		}, grant.ReasonUnknownKey},
		{"a real grant of " + attackOther, func(int64) ([]string, error) { return []string{otherGrant}, nil }, grant.ReasonLockMismatch},
		{"a real grant of " + attackVictim + ", token edited", func(tok int64) ([]string, error) {
			return one(forge.EditToken(victimGrant, tok))
		}, grant.ReasonBadSignature},
		{"a real grant of " + attackVictim + ", as seen", func(int64) ([]string, error) { return []string{victimGrant}, nil }, grant.ReasonTokenMismatch},
	}, nil
}

// rogueSubmit presents a payout nobody created to rail-proxy: 99,999,999 minor
// units to EVIL, with the huge token.
func (a *attack) rogueSubmit(ctx context.Context, payoutID string, token int64, grants []string, v variant) AttackAttempt {
	at := AttackAttempt{Service: "rail-proxy", Variant: v.name, Token: token, Want: v.reason}
	status, p, err := a.submit(ctx, lockapi.SubmissionRequest{PayoutID: payoutID, AccountID: attackVictim,
		AmountMinor: rogueAmount, Currency: "EUR", Beneficiary: rogueBenef}, token, rogueOwner, grants)
	switch {
	case err != nil:
		at.Code = "NO_ANSWER"
	case p != nil:
		at.Status, at.Code = status, p.Code
		_, _ = p.Member("reason", &at.Reason)
	default:
		at.Status = status
	}
	return at
}

// submit presents body to rail-proxy with token, owner and grants, as an
// executor does, and returns the answer's status and problem (nil on success).
func (a *attack) submit(ctx context.Context, body lockapi.SubmissionRequest, token int64, owner string, grants []string) (int, *lockapi.Problem, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, a.st.ProxyURL+"/v1/rail/submissions", io.NopCloser(bytes.NewReader(b)))
	if err != nil {
		return 0, nil, err
	}
	req.ContentLength = int64(len(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	req.Header.Set(lockapi.HeaderOwnerID, owner)
	req.Header.Set(lockapi.HeaderIdempotencyKey, body.PayoutID+":"+strconv.FormatInt(token, 10))
	for _, g := range grants {
		req.Header.Add(lockapi.HeaderFencingGrant, g)
	}
	resp, err := a.st.HTTPClient(identity.NameExecutor, identity.NameRailProxy).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	rb, _ := lockapi.ReadAllLimited(resp.Body, 1<<20)
	return resp.StatusCode, lockapi.ReadProblem(resp, rb), nil
}

// rogueClaim claims the victim's pending payout at payment-resource with the
// huge token.
func (a *attack) rogueClaim(ctx context.Context, token int64, grants []string, v variant) AttackAttempt {
	at := AttackAttempt{Service: "payment-resource", Variant: v.name, Token: token, Want: v.reason}
	g := ""
	if len(grants) > 0 {
		g = grants[0]
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := a.exec.ClaimWithGrant(cctx, attackTarget, token, g, rogueOwner)
	var p *lockapi.Problem
	switch {
	case err == nil:
		at.Status = http.StatusOK
	case errors.As(err, &p):
		at.Status, at.Code = p.Status, p.Code
		_, _ = p.Member("reason", &at.Reason)
	default:
		at.Code = "NO_ANSWER"
	}
	return at
}

// rogueCalls counts what the rail received of the rogue's made-up payouts.
func (a *attack) rogueCalls(ctx context.Context) (int, int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	calls, err := a.st.Stub.Calls(cctx)
	if err != nil {
		return 0, 0, err
	}
	n, accepted := 0, int64(0)
	for _, c := range calls {
		if strings.HasPrefix(c.Reference, roguePrefix) {
			n++
			if c.Result == "ACCEPTED" {
				accepted += c.AmountMinor
			}
		}
	}
	return n, accepted, nil
}

// mark is the account's high-water mark, 0 when it has none.
func mark(ctx context.Context, paydb *pgxpool.Pool, account string) (int64, error) {
	var v int64
	err := paydb.QueryRow(ctx, `SELECT coalesce(max(highest_token), 0) FROM rail_high_water WHERE account_id = $1`, account).Scan(&v)
	return v, err
}

// makeKeysRoot is the directory the demo's keys are made in (lock-server
// keygen's code), removed at the end.
func makeKeysRoot() (string, func(), error) {
	dir, err := os.MkdirTemp("", "lockdemo-keys-*")
	if err != nil {
		return "", nil, fmt.Errorf("create the keys directory: %w", err)
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}
