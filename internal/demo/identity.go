package demo

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"lock.dev/internal/identity"
	"lock.dev/internal/invariants"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// The workloads' attacks on each other (docs/contracts/workload-identity.md):
// a process that can reach the services — another workload of the system, or
// one from elsewhere — tries what only another workload may do. With identities
// on every call is mutual TLS, each service allows each workload only its part,
// and a lease and its grant belong to the workload that acquired it: each row is
// refused and nothing is written or called. With --unsafe-no-auth rows 1–6 are
// made — that is what identities stop — while row 7, the books' (the executor
// itself presenting what the books do not hold), stays refused.
//
// The system is one of its own (fresh databases on the demo's cluster), fencing
// on, grants signed and verified, the books checked, with two executor
// identities in every holder role (LOCK_SERVER_HOLDERS, PAYMENT_WORKERS,
// RAIL_PROXY_SUBMITTERS): with the default roles every holder is the one
// executor workload, and a lease bound to it binds a workload kind; the second
// identity shows the binding between two workloads.
const (
	secondExecutor = "executor-2" // the second holder identity
	identityOwner  = "executor-1" // X-Owner-Id of the genuine holder
	identityBenef  = "NL02ALICE0123456789"
	identityEvil   = "NL66MALLORY9876543210"
	identityAmount = 50_000
	identityTTL    = 30 * time.Second
)

// IdentityRow is one attack and what came of it.
type IdentityRow struct {
	Row     string `json:"row"`     // the contract's numbering: 1 … 7, 4a/4b and 7a/7b for the two forms
	Attack  string `json:"attack"`  // who tries what
	Service string `json:"service"` // the service it calls
	Status  int    `json:"status"`  // 0: no answer (the TLS handshake failed)
	Code    string `json:"code,omitempty"`
	Reason  string `json:"reason,omitempty"` // GRANT_REJECTED's reason, NOT_IN_BOOKS' mismatch
	Error   string `json:"error,omitempty"`  // no answer: why
	// Written is what lockdb, paydb and the rail-stub's call log hold of the
	// attempt afterwards, read there.
	Written string `json:"written"`
	// Want is the refusal identities (row 7: the books) give it.
	Want string `json:"expected"`
	// Refused: answered Want and nothing was written or called (row 7: no rail
	// call; the books' audit row is the refusal's record). Made: the service did
	// what was asked and it is on record.
	Refused bool `json:"refused"`
	Made    bool `json:"made"`
}

func (r IdentityRow) answer() string {
	switch {
	case r.Status == 0:
		return "no answer: the TLS handshake failed"
	case r.Code != "" && r.Reason != "":
		return fmt.Sprintf("%d %s %s", r.Status, r.Code, r.Reason)
	case r.Code != "":
		return fmt.Sprintf("%d %s", r.Status, r.Code)
	}
	return strconv.Itoa(r.Status)
}

// IdentityResult is the identity section: one column, identities as the run
// has them.
type IdentityResult struct {
	Identities bool          `json:"identities"`
	Rows       []IdentityRow `json:"rows"`
	// OK: with identities on, every row was refused with nothing written or
	// called. Without, OK says the hazard showed: rows 1–6 were made, and row 7
	// was still refused by the books.
	OK        bool  `json:"ok"`
	ElapsedMs int64 `json:"elapsedMs"`
}

// judge is the column's verdict (see IdentityResult.OK).
func (r *IdentityResult) judge() bool {
	if len(r.Rows) == 0 {
		return false
	}
	for _, row := range r.Rows {
		books := strings.HasPrefix(row.Row, "7")
		switch {
		case r.Identities || books:
			if !row.Refused {
				return false
			}
		case !row.Made:
			return false
		}
	}
	return true
}

// identityVerdict: with identities on, every row refused.
func identityVerdict(r *IdentityResult) bool { return r == nil || !r.Identities || r.OK }

// runIdentity runs the identity section on fresh databases of cluster.
func runIdentity(ctx context.Context, cluster *pgcluster.Cluster, cfg Config, keysRoot string, log io.Writer, p *progress) (*IdentityResult, error) {
	p.say("attack: workloads try what only another workload may do, identities %s …", onOff(!cfg.UnsafeNoAuth))
	const name = "identity"
	for _, db := range []string{"paydb_" + name, "lockdb_" + name} {
		if err := cluster.CreateDatabase(ctx, db, ""); err != nil {
			return nil, err
		}
	}
	return runIdentitySite(ctx, cfg, identitySite{paydbURL: cluster.URL("paydb_" + name), lockdbURL: cluster.URL("lockdb_" + name),
		keysDir: filepath.Join(keysRoot, name), log: log})
}

type identitySite struct {
	paydbURL, lockdbURL string
	keysDir             string // the demo's grant keys (--unsafe-no-auth) and another authority's certificates
	log                 io.Writer
}

// runIdentitySite is the identity section on the given empty databases.
func runIdentitySite(ctx context.Context, cfg Config, t identitySite) (*IdentityResult, error) {
	start := time.Now()
	env := map[string]map[string]string{}
	if cfg.UnsafeNoAuth {
		// Grants signed and verified in both modes: without identities they carry
		// no wid, which is what row 3 shows.
		var err error
		if env, err = stack.GrantEnv(filepath.Join(t.keysDir, "grants")); err != nil {
			return nil, err
		}
	}
	holders := identity.DefaultIDs(identity.NameExecutor, secondExecutor)
	st, err := stack.Start(ctx, stack.Options{PaydbURL: t.paydbURL, LockdbURL: t.lockdbURL,
		Log: t.log, UnsafeNoAuth: cfg.UnsafeNoAuth, Workloads: []string{secondExecutor},
		RailProtocol: cfg.RailProtocol, StatementSource: cfg.StatementSource,
		Env: stack.MergeEnv(env, map[string]map[string]string{
			"lock-server":      {"LOCK_SERVER_HOLDERS": holders},
			"payment-resource": {"PAYMENT_WORKERS": holders},
			"rail-proxy":       {"RAIL_PROXY_SUBMITTERS": holders},
			"rail-stub":        {"RAIL_STUB_SEED": strconv.FormatInt(cfg.Seed, 10), "RAIL_STUB_LATENCY_MS": strconv.Itoa(baseLatencyMs)},
		})})
	if err != nil {
		return nil, fmt.Errorf("identity: start the system: %w", err)
	}
	defer st.Close()
	x := &intruder{st: st, foreignDir: filepath.Join(t.keysDir, "foreign")}
	res := &IdentityResult{Identities: st.Secure()}
	for _, step := range []func(context.Context) ([]IdentityRow, error){
		x.acquireWithoutRole, x.foreignAuthority, x.replay, x.othersLease, x.createWithoutRole, x.submitWithoutRole, x.books,
	} {
		rows, err := step(ctx)
		if err != nil {
			return nil, fmt.Errorf("identity: %w", err)
		}
		res.Rows = append(res.Rows, rows...)
	}
	res.OK = res.judge()
	res.ElapsedMs = time.Since(start).Milliseconds()
	return res, nil
}

// intruder is the identity section's tools on its system.
type intruder struct {
	st         *stack.Stack
	foreignDir string
}

// reply is a raw call's outcome.
type reply struct {
	status  int
	problem *lockapi.Problem
	err     error
}

// call sends one request through client and reads the answer.
func call(ctx context.Context, client *http.Client, method, u string, h http.Header, body any) reply {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{err: err}
		}
		rd = bytes.NewReader(b)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, method, u, rd)
	if err != nil {
		return reply{err: err}
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	rb, _ := lockapi.ReadAllLimited(resp.Body, 1<<20)
	return reply{status: resp.StatusCode, problem: lockapi.ReadProblem(resp, rb)}
}

// row fills in a row's answer from r.
func (r reply) row(row IdentityRow) IdentityRow {
	row.Status = r.status
	if r.err != nil {
		row.Status, row.Error = 0, r.err.Error()
	}
	if r.problem != nil {
		row.Code = r.problem.Code
		for _, m := range []string{"reason", "mismatch"} {
			if ok, _ := r.problem.Member(m, &row.Reason); ok {
				break
			}
		}
	}
	return row
}

// refusedAs says r is the refusal want ("403 FORBIDDEN", "401 GRANT_REJECTED
// workload_mismatch", "handshake").
func (row IdentityRow) refusedAs(want string) bool {
	if want == "handshake" {
		return row.Status == 0 && row.Error != ""
	}
	return row.answer() == want
}

func (row IdentityRow) ok() bool { return row.Status >= 200 && row.Status < 300 }

func (x *intruder) locks(name string) (*lockclient.Client, error) {
	return lockclient.New(x.st.LockServerURL, lockclient.WithTLSConfig(x.st.ClientTLS(name, identity.NameLockServer)))
}

// grants counts lock_grant rows of lock and the highest token.
func (x *intruder) grants(ctx context.Context, lock string) (int, int64, error) {
	var n int
	var top int64
	err := x.st.Lockdb.QueryRow(ctx, `SELECT count(*), coalesce(max(token), 0) FROM lock_grant WHERE lock_name = $1`, lock).Scan(&n, &top)
	return n, top, err
}

func (x *intruder) leaseWritten(ctx context.Context, lock string) (string, bool, error) {
	n, top, err := x.grants(ctx, lock)
	if err != nil {
		return "", false, fmt.Errorf("read lockdb: %w", err)
	}
	if n == 0 {
		return "no lease in lockdb", false, nil
	}
	return fmt.Sprintf("lease written (token %d)", top), true, nil
}

// acquireAs acquires lock through client with a raw call. A lease granted
// (without identities) is left to expire: no other row uses its lock.
func (x *intruder) acquireAs(ctx context.Context, client *http.Client, lock, owner string) reply {
	return call(ctx, client, http.MethodPost, x.st.LockServerURL+"/v1/locks/"+url.PathEscape(lock)+"/acquire",
		http.Header{lockapi.HeaderOwnerID: {owner}}, lockapi.LeaseRequest{TTLMs: identityTTL.Milliseconds()})
}

// Row 1: a workload without the holder role acquires account:acct-01.
func (x *intruder) acquireWithoutRole(ctx context.Context) ([]IdentityRow, error) {
	lock := lockapi.AccountLockName("acct-01")
	row := x.acquireAs(ctx, x.st.HTTPClient(identity.NamePayoutCreator, identity.NameLockServer), lock, "creator-1").row(IdentityRow{
		Row: "1", Service: "lock-server", Want: "403 " + lockapi.CodeForbidden,
		Attack: "payout-creator (no holder role) acquires " + lock,
	})
	var written bool
	var err error
	if row.Written, written, err = x.leaseWritten(ctx, lock); err != nil {
		return nil, err
	}
	row.Refused, row.Made = row.refusedAs(row.Want) && !written, row.ok() && written
	return []IdentityRow{row}, nil
}

// Row 2: a workload whose certificate another authority issued — the SPIFFE ID
// of the executor, the key its own — acquires account:acct-02. It trusts the
// system's authority (a bundle is public), so the handshake fails on the
// server's side: lock-server does not accept its certificate.
func (x *intruder) foreignAuthority(ctx context.Context) ([]IdentityRow, error) {
	lock := lockapi.AccountLockName("acct-02")
	client := x.st.HTTPClient(identity.NameExecutor, identity.NameLockServer) // plaintext without identities
	if x.st.Secure() {
		if err := identity.WriteCerts(identity.CertsOptions{Dir: x.foreignDir, Names: []string{identity.NameExecutor}}); err != nil {
			return nil, fmt.Errorf("another authority's certificates: %w", err)
		}
		foreign, err := identity.Load(identity.Files(x.foreignDir, identity.NameExecutor), slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, err
		}
		bundle, err := x.st.Source(identity.NameOps) // the system's bundle, as anyone may hold it
		if err != nil {
			return nil, err
		}
		cfg := tlsconfig.MTLSClientConfig(foreign, bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromString(identity.DefaultID(identity.NameLockServer))))
		cfg.MinVersion = tls.VersionTLS13
		tr := &http.Transport{TLSClientConfig: cfg, TLSHandshakeTimeout: 5 * time.Second}
		defer tr.CloseIdleConnections()
		client = &http.Client{Timeout: 10 * time.Second, Transport: tr}
	}
	row := x.acquireAs(ctx, client, lock, identityOwner).row(IdentityRow{
		Row: "2", Service: "lock-server", Want: "handshake",
		Attack: "an executor certificate from another authority acquires " + lock,
	})
	var written bool
	var err error
	if row.Written, written, err = x.leaseWritten(ctx, lock); err != nil {
		return nil, err
	}
	row.Refused, row.Made = row.refusedAs(row.Want) && !written, row.ok() && written
	return []IdentityRow{row}, nil
}

// held is a genuine lease of account as the executor workload, with a payout of
// the account created as ops and, when claim is set, claimed under the lease.
type held struct {
	lease  *lockclient.Lease
	payout lockapi.SubmissionRequest
}

func (x *intruder) hold(ctx context.Context, account, payout string, claim bool) (*held, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lc, err := x.locks(identity.NameExecutor)
	if err != nil {
		return nil, err
	}
	l, err := lc.Acquire(cctx, lockapi.AccountLockName(account), identityOwner, identityTTL)
	if err != nil {
		return nil, fmt.Errorf("the executor's lease of %s: %w", account, err)
	}
	h := &held{lease: l, payout: lockapi.SubmissionRequest{PayoutID: payout, AccountID: account, AmountMinor: identityAmount,
		Currency: "EUR", Beneficiary: identityBenef}}
	if payout == "" {
		return h, nil
	}
	r := call(ctx, x.st.HTTPClient(identity.NameOps, identity.NamePaymentResource), http.MethodPost, x.st.PaymentURL+"/v1/payouts", nil, h.payout)
	if r.err != nil || r.status >= 300 {
		x.drop(ctx, h)
		return nil, fmt.Errorf("create %s as ops: %d %v %v", payout, r.status, r.problem, r.err)
	}
	if claim {
		r := call(ctx, x.st.HTTPClient(identity.NameExecutor, identity.NamePaymentResource), http.MethodPost,
			x.st.PaymentURL+"/v1/payouts/"+url.PathEscape(payout)+"/claim", lockapi.FencingHeaders(l.Token(), l.Grant(), identityOwner), nil)
		if r.err != nil || r.status != http.StatusOK {
			x.drop(ctx, h)
			return nil, fmt.Errorf("claim %s as the executor: %d %v %v", payout, r.status, r.problem, r.err)
		}
	}
	return h, nil
}

func (x *intruder) drop(ctx context.Context, h *held) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = h.lease.Release(cctx) // refused or failed: it expires with its TTL
}

// submitAs presents h's payout (body: the payout as the caller sends it) to
// rail-proxy as the workload name, with h's token, grant and owner.
func (x *intruder) submitAs(ctx context.Context, name string, h *held, body lockapi.SubmissionRequest) reply {
	hd := lockapi.FencingHeaders(h.lease.Token(), h.lease.Grant(), identityOwner)
	hd.Set(lockapi.HeaderIdempotencyKey, body.PayoutID+":"+strconv.FormatInt(h.lease.Token(), 10))
	return call(ctx, x.st.HTTPClient(name, identity.NameRailProxy), http.MethodPost, x.st.ProxyURL+"/v1/rail/submissions", hd, body)
}

// submitted reads what rail-proxy wrote of payout and what the rail received.
func (x *intruder) submitted(ctx context.Context, payout string) (rows, calls int, outcomes string, err error) {
	var os []string
	if err = x.st.Paydb.QueryRow(ctx, `SELECT count(*), coalesce(array_agg(coalesce(outcome, 'unresolved') ORDER BY submission_id), '{}')
		FROM rail_submission WHERE payout_id = $1`, payout).Scan(&rows, &os); err != nil {
		return 0, 0, "", fmt.Errorf("read paydb: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	all, err := x.st.Stub.Calls(cctx)
	if err != nil {
		return 0, 0, "", fmt.Errorf("read the rail-stub's call log: %w", err)
	}
	for _, c := range all {
		if c.Reference == payout {
			calls++
		}
	}
	return rows, calls, strings.Join(os, ", "), nil
}

func submissionWritten(rows, calls int, outcomes string) string {
	if rows == 0 && calls == 0 {
		return "no submission row, no rail call"
	}
	s := fmt.Sprintf("%d submission row(s)", rows)
	if outcomes != "" {
		s += " (" + outcomes + ")"
	}
	return s + fmt.Sprintf(", %d rail call(s)", calls)
}

// Row 3: the second executor identity replays the executor's grant — read from
// a log or a response — presenting the payout the holder claimed.
func (x *intruder) replay(ctx context.Context) ([]IdentityRow, error) {
	h, err := x.hold(ctx, "acct-03", "p-identity-3", true)
	if err != nil {
		return nil, err
	}
	defer x.drop(ctx, h)
	row := x.submitAs(ctx, secondExecutor, h, h.payout).row(IdentityRow{
		Row: "3", Service: "rail-proxy", Want: "401 " + lockapi.CodeGrantRejected + " workload_mismatch",
		Attack: secondExecutor + " replays the executor's grant of account:acct-03 (p-identity-3, claimed by its holder)",
	})
	rows, calls, outcomes, err := x.submitted(ctx, h.payout.PayoutID)
	if err != nil {
		return nil, err
	}
	row.Written = submissionWritten(rows, calls, outcomes)
	row.Refused, row.Made = row.refusedAs(row.Want) && rows == 0 && calls == 0, row.ok() && rows > 0 && calls > 0
	return []IdentityRow{row}, nil
}

// leaseRow is lock_lease's row of lock.
type leaseRow struct {
	owner    *string
	token    int64
	expires  *time.Time
	released bool
}

func (x *intruder) lease(ctx context.Context, lock string, token int64) (leaseRow, error) {
	var l leaseRow
	err := x.st.Lockdb.QueryRow(ctx, `SELECT l.owner_id, l.token, l.expires_at,
		coalesce((SELECT g.released_at IS NOT NULL FROM lock_grant g WHERE g.lock_name = l.lock_name AND g.token = $2), false)
		FROM lock_lease l WHERE l.lock_name = $1`, lock, token).Scan(&l.owner, &l.token, &l.expires, &l.released)
	if err != nil {
		return l, fmt.Errorf("read lockdb: %w", err)
	}
	return l, nil
}

// Row 4: the second executor identity renews, then releases, the executor's
// lease, naming its owner and token.
func (x *intruder) othersLease(ctx context.Context) ([]IdentityRow, error) {
	h, err := x.hold(ctx, "acct-04", "", false)
	if err != nil {
		return nil, err
	}
	defer x.drop(ctx, h)
	lock := h.lease.Name()
	// The holder's own renewals run in the background; the row compares the
	// lease's expiry as the intruder's renewal would set it, not before and after.
	before, err := x.lease(ctx, lock, h.lease.Token())
	if err != nil {
		return nil, err
	}
	client := x.st.HTTPClient(secondExecutor, identity.NameLockServer)
	want := "403 " + lockapi.CodeNotLeaseHolder
	const longTTL = 2 * time.Minute // far beyond what the holder's renewals set: its effect shows
	renew := call(ctx, client, http.MethodPost, x.st.LockServerURL+"/v1/locks/"+url.PathEscape(lock)+"/renew",
		lockapi.FencingHeaders(h.lease.Token(), "", identityOwner), lockapi.LeaseRequest{TTLMs: longTTL.Milliseconds()}).row(IdentityRow{
		Row: "4a", Service: "lock-server", Want: want,
		Attack: secondExecutor + " renews the executor's lease of " + lock + " (its token and owner)",
	})
	after, err := x.lease(ctx, lock, h.lease.Token())
	if err != nil {
		return nil, err
	}
	extended := after.expires != nil && before.expires != nil && after.expires.After(before.expires.Add(identityTTL))
	renew.Written = "lease unchanged"
	if extended {
		renew.Written = fmt.Sprintf("lease extended to %s", after.expires.Format(time.RFC3339))
	}
	renew.Refused, renew.Made = renew.refusedAs(want) && !extended, renew.ok() && extended

	release := call(ctx, client, http.MethodPost, x.st.LockServerURL+"/v1/locks/"+url.PathEscape(lock)+"/release",
		lockapi.FencingHeaders(h.lease.Token(), "", identityOwner), nil).row(IdentityRow{
		Row: "4b", Service: "lock-server", Want: want,
		Attack: secondExecutor + " releases the executor's lease of " + lock,
	})
	if after, err = x.lease(ctx, lock, h.lease.Token()); err != nil {
		return nil, err
	}
	stillHeld := after.owner != nil && *after.owner == identityOwner && after.token == h.lease.Token() && !after.released
	release.Written = "lease still held by the executor"
	if !stillHeld {
		release.Written = "lease released"
	}
	release.Refused, release.Made = release.refusedAs(want) && stillHeld, release.ok() && !stillHeld
	return []IdentityRow{renew, release}, nil
}

func (x *intruder) payoutRows(ctx context.Context, payout string) (int, error) {
	var n int
	if err := x.st.Paydb.QueryRow(ctx, `SELECT count(*) FROM payout WHERE payout_id = $1`, payout).Scan(&n); err != nil {
		return 0, fmt.Errorf("read paydb: %w", err)
	}
	return n, nil
}

// Row 5: the executor (no creator role) creates a payout to its own beneficiary.
func (x *intruder) createWithoutRole(ctx context.Context) ([]IdentityRow, error) {
	const payout = "p-identity-5"
	r := call(ctx, x.st.HTTPClient(identity.NameExecutor, identity.NamePaymentResource), http.MethodPost, x.st.PaymentURL+"/v1/payouts", nil,
		lockapi.SubmissionRequest{PayoutID: payout, AccountID: "acct-05", AmountMinor: identityAmount, Currency: "EUR", Beneficiary: identityEvil})
	row := r.row(IdentityRow{Row: "5", Service: "payment-resource", Want: "403 " + lockapi.CodeForbidden,
		Attack: "the executor (no creator role) creates " + payout + " to MALLORY"})
	n, err := x.payoutRows(ctx, payout)
	if err != nil {
		return nil, err
	}
	row.Written = "no payout row"
	if n > 0 {
		row.Written = "payout row written"
	}
	row.Refused, row.Made = row.refusedAs(row.Want) && n == 0, row.ok() && n > 0
	return []IdentityRow{row}, nil
}

// Row 6: payout-creator (no submitter role) presents a submission — a real
// claimed payout, with its holder's token and grant, so that only the role can
// stop it.
func (x *intruder) submitWithoutRole(ctx context.Context) ([]IdentityRow, error) {
	h, err := x.hold(ctx, "acct-06", "p-identity-6", true)
	if err != nil {
		return nil, err
	}
	defer x.drop(ctx, h)
	row := x.submitAs(ctx, identity.NamePayoutCreator, h, h.payout).row(IdentityRow{
		Row: "6", Service: "rail-proxy", Want: "403 " + lockapi.CodeForbidden,
		Attack: "payout-creator (no submitter role) presents p-identity-6 (claimed, with its holder's grant)",
	})
	rows, calls, outcomes, err := x.submitted(ctx, h.payout.PayoutID)
	if err != nil {
		return nil, err
	}
	row.Written = submissionWritten(rows, calls, outcomes)
	row.Refused, row.Made = row.refusedAs(row.Want) && rows == 0 && calls == 0, row.ok() && rows > 0 && calls > 0
	return []IdentityRow{row}, nil
}

// Row 7: the executor itself, with its genuine lease, presents what the books
// do not hold — a payout nobody created, and its claimed payout to another
// beneficiary. Identities cannot stop the workload whose part submitting is;
// the books do, and record the refusal (an UNBOOKED row), calling nothing.
func (x *intruder) books(ctx context.Context) ([]IdentityRow, error) {
	h, err := x.hold(ctx, "acct-07", "p-identity-7", true)
	if err != nil {
		return nil, err
	}
	defer x.drop(ctx, h)
	uncreated := h.payout
	uncreated.PayoutID, uncreated.Beneficiary = "p-identity-7x", identityEvil
	other := h.payout
	other.Beneficiary = identityEvil
	var out []IdentityRow
	for _, c := range []struct {
		row, attack, mismatch string
		body                  lockapi.SubmissionRequest
	}{
		{"7a", "the executor presents p-identity-7x, which nobody created", lockapi.MismatchNotFound, uncreated},
		{"7b", "the executor presents its claimed p-identity-7 to MALLORY", lockapi.MismatchBeneficiary, other},
	} {
		row := x.submitAs(ctx, identity.NameExecutor, h, c.body).row(IdentityRow{
			Row: c.row, Service: "rail-proxy", Want: "409 " + lockapi.CodeNotInBooks + " " + c.mismatch, Attack: c.attack,
		})
		rows, calls, outcomes, err := x.submitted(ctx, c.body.PayoutID)
		if err != nil {
			return nil, err
		}
		row.Written = submissionWritten(rows, calls, outcomes)
		row.Refused, row.Made = row.refusedAs(row.Want) && calls == 0, row.ok() && calls > 0
		out = append(out, row)
	}
	return out, nil
}

// writeIdentity is the report's identity section.
func writeIdentity(w io.Writer, r *IdentityResult) {
	if r == nil {
		return
	}
	head := "identities on"
	if !r.Identities {
		head = "identities OFF (--unsafe-no-auth)"
	}
	fmt.Fprintf(w, "\nidentity — workloads try what only another workload may do (docs/contracts/workload-identity.md).\n"+
		"A system of its own, fencing on, grants verified, the books checked, two executor identities\n"+
		"(executor, %s) in every holder role. Each cell is the service's answer, then what lockdb,\n"+
		"paydb and the rail-stub's call log hold of the attempt:\n\n", secondExecutor)
	t := invariants.Table{Head: []string{head}}
	for _, row := range r.Rows {
		t.Row(fmt.Sprintf("%-3s %s", row.Row, row.Attack), []string{row.answer() + "; " + row.Written})
	}
	t.Row("verdict", []string{demonstrationVerdict(r.Identities, r.OK)})
	_ = t.Write(w)
	switch {
	case r.Identities && r.OK:
		fmt.Fprintln(w, "\nWith identities on every attempt was refused — at the handshake, by the route's role, by the\n"+
			"lease's holder, by the grant's wid — and nothing was written or called; the executor's own\n"+
			"attempts (7) were refused by the books, which record them as UNBOOKED and call nothing.")
	case !r.Identities && r.OK:
		fmt.Fprintln(w, "\nWithout identities (UNSAFE_NO_AUTH) rows 1–6 were made: any process that can reach the services\n"+
			"acts as any workload. Only the books (7) still refuse — what the executor itself presents.")
	}
}
