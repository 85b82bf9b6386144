package payment_test

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/grant/granttest"
	"lock.dev/internal/identity"
	"lock.dev/internal/payment"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// These tests run payment-resource with identities: mutual TLS with SVIDs from
// identity.WriteCerts, roles per route and grants bound to the workload
// (docs/contracts/workload-identity.md).

const identitySettleToken = "identity-settle-token-0123456789"

// signFor is the grant lock-server issues to workload wid ("" : none) for a
// lease of account's lock at token, held by owner.
func signFor(t testing.TB, key ed25519.PrivateKey, account string, token int64, owner, wid string) string {
	t.Helper()
	s, err := grant.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.SignFor(lockapi.AccountLockName(account), token, owner, wid, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// answer is one refusal's status and problem body.
type answer struct {
	status int
	body   map[string]any
}

func (e *env) sendAs(t testing.TB, hc *http.Client, method, path string, h map[string][]string, body string) answer {
	t.Helper()
	status, b, err := e.tryRawWith(hc, method, path, h, body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return answer{status, m}
}

// historyActors lists payout id's history as status=actor, oldest first ("-"
// for a NULL actor).
func (e *env) historyActors(t testing.TB, id string) []string {
	t.Helper()
	return e.texts(t, `SELECT status || '=' || coalesce(actor, '-') FROM payout_history WHERE payout_id = $1 ORDER BY history_id`, id)
}

// historySnapshot renders the payout history too: a refusal adds no row.
func (e *env) historySnapshot(t testing.TB) string {
	t.Helper()
	var s string
	err := e.db.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(row_to_json(h)::text, E'\n' ORDER BY history_id), '') FROM payout_history h`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return e.settleSnapshot(t) + "\n--\n" + s
}

// Each payout route lets only its role's workloads through: a workload
// without the creator role (the executor) creates a payout → 403 FORBIDDEN
// naming it, no row, authz_denied_total{route="createPayout"} 1, forbidden
// logged; likewise the workers', settlers' and readers' routes refuse other
// workloads, before the request is read (an invalid body or an unknown payout
// is still 403), and writing nothing. The readers may read.
func TestRolesRefuseOtherWorkloads(t *testing.T) {
	t.Parallel()
	certs := writeCerts(t)
	key, keysFile := granttest.Keys(t)
	e := start(t, withIdentities(certs, keysFile), booksUnchecked, func(c *payment.Config) { c.SettleToken = identitySettleToken })
	executor, reconciler, creator, ops := e.httpAs(t, identity.NameExecutor), e.httpAs(t, identity.NameReconciler),
		e.httpAs(t, identity.NamePayoutCreator), e.httpAs(t, identity.NameOps)
	id := func(name string) string { return identity.DefaultID(name) }
	const createBody = `{"payoutId":"p-1","accountId":"acct-1","amountMinor":500,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`
	jsonCT := map[string][]string{"Content-Type": {"application/json"}}

	// Attack: the executor creates a payout.
	a := e.sendAs(t, executor, http.MethodPost, "/v1/payouts", jsonCT, createBody)
	if a.status != http.StatusForbidden || a.body["code"] != lockapi.CodeForbidden || a.body["identity"] != id(identity.NameExecutor) {
		t.Fatalf("create by the executor: %d %v, want 403 FORBIDDEN naming %s", a.status, a.body, id(identity.NameExecutor))
	}
	if n := e.queryInt(t, "SELECT count(*) FROM payout"); n != 0 {
		t.Fatalf("%d payouts after a refused create, want none", n)
	}
	if v := e.metric(t, `authz_denied_total{route="createPayout"}`); v != 1 {
		t.Errorf(`authz_denied_total{route="createPayout"} = %v, want 1`, v)
	}
	if ev := e.logs.events(t, "forbidden"); len(ev) != 1 || ev[0]["level"] != "WARN" ||
		ev[0]["identity"] != id(identity.NameExecutor) || ev[0]["route"] != "createPayout" {
		t.Errorf("forbidden log lines: %v, want one WARN naming the executor and createPayout", ev)
	}

	// The creators create; ops is one of them.
	for _, c := range []*http.Client{creator, ops} {
		if a := e.sendAs(t, c, http.MethodPost, "/v1/payouts", jsonCT, createBody); a.status != http.StatusCreated && a.status != http.StatusOK {
			t.Fatalf("create by a creator: %d %v", a.status, a.body)
		}
	}
	// The executor claims p-1, so a post has something to refuse.
	if _, err := e.client.ClaimWithGrant(context.Background(), "p-1", 7,
		signFor(t, key, "acct-1", 7, "exec-a", id(identity.NameExecutor)), "exec-a"); err != nil {
		t.Fatalf("claim by the executor: %v", err)
	}
	before := e.historySnapshot(t)

	fencing := func(grant string) map[string][]string {
		return map[string][]string{lockapi.HeaderFencingToken: {"8"}, lockapi.HeaderOwnerID: {"exec-a"},
			lockapi.HeaderFencingGrant: {grant}, "Content-Type": {"application/json"}}
	}
	// Each refused caller holds what the route needs but the role: a grant
	// signed for it, the settle bearer.
	settleH := map[string][]string{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + identitySettleToken}}
	for _, c := range []struct {
		route, who   string
		hc           *http.Client
		method, path string
		h            map[string][]string
		body         string
	}{
		{"createPayout", identity.NameReconciler, reconciler, http.MethodPost, "/v1/payouts", jsonCT, createBody},
		{"createPayout", identity.NameExecutor, executor, http.MethodPost, "/v1/payouts", jsonCT, `{"not":"valid"}`},
		{"claimPayout", identity.NameReconciler, reconciler, http.MethodPost, "/v1/payouts/p-1/claim",
			fencing(signFor(t, key, "acct-1", 8, "exec-a", id(identity.NameReconciler))), ""},
		{"claimPayout", identity.NameOps, ops, http.MethodPost, "/v1/payouts/p-absent/claim", nil, ""},
		{"postPayout", identity.NameOps, ops, http.MethodPost, "/v1/payouts/p-1/post",
			fencing(signFor(t, key, "acct-1", 7, "exec-a", id(identity.NameOps))), `{"outcome":"AMBIGUOUS"}`},
		{"postPayout", identity.NamePayoutCreator, creator, http.MethodPost, "/v1/payouts/p-1/post", nil, `{`},
		{"settlePayout", identity.NameExecutor, executor, http.MethodPost, "/v1/payouts/p-1/settle", settleH, `{"outcome":"NOT_PRESENTED"}`},
		{"settlePayout", identity.NameOps, ops, http.MethodPost, "/v1/payouts/p-1/settle", nil, ""},
		{"getPayout", identity.NamePayoutCreator, creator, http.MethodGet, "/v1/payouts/p-1", nil, ""},
		{"getPayout", identity.NamePayoutCreator, creator, http.MethodGet, "/v1/payouts/p-absent", nil, ""},
		{"listPayouts", identity.NamePayoutCreator, creator, http.MethodGet, "/v1/payouts", nil, ""},
		{"listPayouts", identity.NamePayoutCreator, creator, http.MethodGet, "/v1/payouts?limit=nonsense", nil, ""},
	} {
		a := e.sendAs(t, c.hc, c.method, c.path, c.h, c.body)
		if a.status != http.StatusForbidden || a.body["code"] != lockapi.CodeForbidden || a.body["identity"] != id(c.who) {
			t.Errorf("%s %s by %s: %d %v, want 403 FORBIDDEN naming it", c.method, c.path, c.who, a.status, a.body)
		}
	}
	if after := e.historySnapshot(t); after != before {
		t.Errorf("refusals wrote:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	for route, want := range map[string]float64{"createPayout": 3, "claimPayout": 2, "postPayout": 2, "settlePayout": 2,
		"getPayout": 2, "listPayouts": 2} {
		if v := e.metric(t, `authz_denied_total{route="`+route+`"}`); v != want {
			t.Errorf(`authz_denied_total{route=%q} = %v, want %v`, route, v, want)
		}
	}

	// The readers read.
	for _, name := range []string{identity.NameExecutor, identity.NameReconciler, identity.NameOps} {
		c := e.as(t, name)
		if p, err := c.Get(context.Background(), "p-1"); err != nil || p.Status != lockapi.StatusClaimed {
			t.Errorf("get by %s: %+v %v", name, p, err)
		}
		if ps, err := c.List(context.Background(), "", "", nil, 0); err != nil || len(ps) != 1 {
			t.Errorf("list by %s: %d payouts, %v", name, len(ps), err)
		}
	}
	// No role is needed for the probes and the document, a certificate is.
	for _, p := range []string{"/livez", "/readyz", "/metrics", "/openapi.json"} {
		if a := e.sendAs(t, creator, http.MethodGet, p, nil, ""); a.status != http.StatusOK {
			t.Errorf("GET %s by the payout creator: %d", p, a.status)
		}
	}
}

// A caller without a certificate from the bundle fails the handshake: nothing
// of its request is read.
func TestCallerWithoutACertificateFailsTheHandshake(t *testing.T) {
	t.Parallel()
	certs := writeCerts(t)
	_, keysFile := granttest.Keys(t)
	e := start(t, withIdentities(certs, keysFile))
	other := writeCerts(t) // another CA's SVIDs
	stranger := &env{base: e.base, certs: other}
	for name, hc := range map[string]*http.Client{
		"no certificate":       {Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}},
		"another CA's creator": stranger.httpAs(t, identity.NamePayoutCreator),
	} {
		if _, _, err := e.tryRawWith(hc, http.MethodPost, "/v1/payouts", map[string][]string{"Content-Type": {"application/json"}},
			`{"payoutId":"p-1","accountId":"acct-1","amountMinor":500,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`); err == nil {
			t.Errorf("%s: the request was answered, want a failed handshake", name)
		}
	}
	if n := e.queryInt(t, "SELECT count(*) FROM payout"); n != 0 {
		t.Errorf("%d payouts, want none", n)
	}
}

// Each move's history row names the verified workload that made it: the
// creator at creation, the executor at claim and post, the reconciler at
// settle (docs/contracts/workload-identity.md, who did it). Without
// identities nobody was verified: the actor is NULL.
func TestHistoryNamesTheActingWorkload(t *testing.T) {
	t.Parallel()
	certs := writeCerts(t)
	key, keysFile := granttest.Keys(t)
	e := start(t, withIdentities(certs, keysFile), booksUnchecked, func(c *payment.Config) { c.SettleToken = identitySettleToken })
	ctx := context.Background()
	id := func(name string) string { return identity.DefaultID(name) }
	if _, err := e.as(t, identity.NamePayoutCreator).Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-1", AccountID: "acct-1",
		AmountMinor: 500, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}); err != nil {
		t.Fatal(err)
	}
	g := signFor(t, key, "acct-1", 7, "exec-a", id(identity.NameExecutor))
	if _, err := e.client.ClaimWithGrant(ctx, "p-1", 7, g, "exec-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.PostWithGrant(ctx, "p-1", 7, g, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}); err != nil {
		t.Fatal(err)
	}
	a := e.sendAs(t, e.httpAs(t, identity.NameReconciler), http.MethodPost, "/v1/payouts/p-1/settle",
		map[string][]string{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + identitySettleToken}},
		`{"outcome":"NOT_PRESENTED"}`)
	if a.status != http.StatusOK {
		t.Fatalf("settle by the reconciler: %d %v", a.status, a.body)
	}
	want := []string{"PENDING=" + id(identity.NamePayoutCreator), "CLAIMED=" + id(identity.NameExecutor),
		"AMBIGUOUS=" + id(identity.NameExecutor), "NOT_PRESENTED=" + id(identity.NameReconciler)}
	if got := e.historyActors(t, "p-1"); !equalStrings(got, want) {
		t.Errorf("history: %v, want %v", got, want)
	}

	plain := start(t, booksUnchecked)
	plain.create(t, "p-1", "acct-1", 500)
	plain.claim(t, "p-1", 7, "exec-a")
	if got := plain.historyActors(t, "p-1"); !equalStrings(got, []string{"PENDING=-", "CLAIMED=-"}) {
		t.Errorf("history without identities: %v, want no actor", got)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A grant is worth something only to the workload it was issued to: another
// workload holding the workers role replays it → 401 GRANT_REJECTED
// workload_mismatch, for a claim and for a post, the payout unchanged and no
// history row. A grant without wid is refused so too unless
// GRANT_WID_REQUIRED=false (a rolling upgrade), which takes it.
func TestGrantOfAnotherWorkloadIsWorthless(t *testing.T) {
	t.Parallel()
	certs := writeCerts(t, "executor-a", "executor-b")
	key, keysFile := granttest.Keys(t)
	both := identity.DefaultIDs("executor-a", "executor-b")
	e := start(t, withIdentities(certs, keysFile), booksUnchecked, func(c *payment.Config) { c.Workers = both })
	ctx := context.Background()
	e.create(t, "p-1", "acct-1", 500)
	e.create(t, "p-2", "acct-1", 600)
	a, b := e.as(t, "executor-a"), e.as(t, "executor-b")
	aID := identity.DefaultID("executor-a")

	// p-2 is claimed by executor-a with token 5, awaiting its post.
	g5 := signFor(t, key, "acct-1", 5, "exec-a", aID)
	if _, err := a.ClaimWithGrant(ctx, "p-2", 5, g5, "exec-a"); err != nil {
		t.Fatal(err)
	}
	before := e.historySnapshot(t)
	g7 := signFor(t, key, "acct-1", 7, "exec-a", aID)
	_, err := b.ClaimWithGrant(ctx, "p-1", 7, g7, "exec-a")
	if p := asProblem(t, err, http.StatusUnauthorized, lockapi.CodeGrantRejected); member[string](t, p, "reason") != "workload_mismatch" {
		t.Errorf("claim with executor-a's grant by executor-b: reason %v, want workload_mismatch", p.Detail)
	}
	_, err = b.PostWithGrant(ctx, "p-2", 5, g5, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous})
	if p := asProblem(t, err, http.StatusUnauthorized, lockapi.CodeGrantRejected); member[string](t, p, "reason") != "workload_mismatch" {
		t.Errorf("post with executor-a's grant by executor-b: reason %v, want workload_mismatch", p.Detail)
	}
	// A grant without wid, wid required (the default).
	_, err = a.ClaimWithGrant(ctx, "p-1", 7, signFor(t, key, "acct-1", 7, "exec-a", ""), "exec-a")
	if p := asProblem(t, err, http.StatusUnauthorized, lockapi.CodeGrantRejected); member[string](t, p, "reason") != "workload_mismatch" {
		t.Errorf("claim with a grant without wid: reason %v, want workload_mismatch", p.Detail)
	}
	if after := e.historySnapshot(t); after != before {
		t.Errorf("replays wrote:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if v := e.metric(t, `grant_rejected_total{reason="workload_mismatch"}`); v != 3 {
		t.Errorf(`grant_rejected_total{reason="workload_mismatch"} = %v, want 3`, v)
	}
	// The workload the grant names uses it.
	if _, err := a.ClaimWithGrant(ctx, "p-1", 7, g7, "exec-a"); err != nil {
		t.Errorf("claim by executor-a with its own grant: %v", err)
	}

	// GRANT_WID_REQUIRED=false: a grant without wid is taken; one naming another workload is not.
	lenient := start(t, withIdentities(certs, keysFile), booksUnchecked, func(c *payment.Config) { c.Workers = both; c.GrantWidRequired = false })
	lenient.create(t, "p-1", "acct-1", 500)
	la, lb := lenient.as(t, "executor-a"), lenient.as(t, "executor-b")
	_, err = lb.ClaimWithGrant(ctx, "p-1", 7, g7, "exec-a")
	if p := asProblem(t, err, http.StatusUnauthorized, lockapi.CodeGrantRejected); member[string](t, p, "reason") != "workload_mismatch" {
		t.Errorf("GRANT_WID_REQUIRED=false, another workload's grant: reason %v, want workload_mismatch", p.Detail)
	}
	if _, err := la.ClaimWithGrant(ctx, "p-1", 7, signFor(t, key, "acct-1", 7, "exec-a", ""), "exec-a"); err != nil {
		t.Errorf("GRANT_WID_REQUIRED=false, a grant without wid: %v, want taken", err)
	}
}

// The client keeps its connection over mutual TLS: sequential calls pay one
// handshake, not one each (the executor's workers call all day long).
func TestClientReusesItsTLSConnection(t *testing.T) {
	t.Parallel()
	certs := writeCerts(t)
	_, keysFile := granttest.Keys(t)
	e := start(t, withIdentities(certs, keysFile))
	e.create(t, "p-1", "acct-1", 500)
	var handshakes atomic.Int64
	cfg := e.tlsAs(t, identity.NameExecutor)
	// VerifyConnection runs at the end of every handshake, a resumed one too.
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		handshakes.Add(1)
		if verify != nil {
			return verify(cs)
		}
		return nil
	}
	c := payment.NewTLSClient(e.base, cfg)
	c.HTTP.Transport = conformance.TrackedRoundTripper(c.HTTP.Transport)
	t.Cleanup(c.HTTP.CloseIdleConnections)
	const calls = 20
	for i := range calls {
		if _, err := c.Get(context.Background(), "p-1"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := handshakes.Load(); n != 1 {
		t.Errorf("%d sequential calls made %d TLS handshakes, want 1", calls, n)
	}
}

// The role settings default to the default workloads, are SPIFFE IDs (anything
// else exits 2 naming the setting), and GRANT_WID_REQUIRED defaults to true.
func TestRoleSettings(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	_, cfg, err := payment.ParseConfig(nil, env(nil))
	if err != nil || cfg.Creators != "spiffe://lock.dev/payout-creator,spiffe://lock.dev/ops" ||
		cfg.Workers != "spiffe://lock.dev/executor" || cfg.Settlers != "spiffe://lock.dev/reconciler" ||
		cfg.Readers != "spiffe://lock.dev/executor,spiffe://lock.dev/reconciler,spiffe://lock.dev/ops" || !cfg.GrantWidRequired {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}
	_, cfg, err = payment.ParseConfig([]string{"--grant-wid-required=false"},
		env(map[string]string{"PAYMENT_WORKERS": "spiffe://example.org/ns/pay/sa/executor, spiffe://example.org/ns/pay/sa/sweeper"}))
	if err != nil || cfg.GrantWidRequired || cfg.Workers != "spiffe://example.org/ns/pay/sa/executor, spiffe://example.org/ns/pay/sa/sweeper" {
		t.Fatalf("set: %+v %v", cfg, err)
	}
	for _, name := range []string{"PAYMENT_CREATORS", "PAYMENT_WORKERS", "PAYMENT_SETTLERS", "PAYMENT_READERS"} {
		_, _, err := payment.ParseConfig(nil, env(map[string]string{name: "spiffe://lock.dev/ops,executor"}))
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, name) || serve.ExitCode(err, io.Discard) != 2 {
			t.Errorf("%s with a bare name: %v, want exit 2 naming it", name, err)
		}
	}
}

// With identities on, an empty PAYMENT_GRANT_KEYS_FILE refuses to start (exit
// 2 naming it): a fence point that took any token at its word would fail open.
func TestRunRefusesWithoutGrantKeys(t *testing.T) {
	t.Parallel()
	certs := writeCerts(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := payment.DefaultConfig()
	cfg.Identity = identity.Files(certs, identity.NamePaymentResource)
	cfg.Listener, cfg.LogOutput = ln, io.Discard
	cfg.PaydbURL = unreachablePaydb // refused before any connection
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = payment.Run(ctx, cfg)
	var ue *serve.UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "PAYMENT_GRANT_KEYS_FILE") || serve.ExitCode(err, io.Discard) != 2 {
		t.Errorf("Run without a grant key set: %v, want exit 2 naming PAYMENT_GRANT_KEYS_FILE", err)
	}
}
