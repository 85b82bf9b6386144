package railproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/grant/granttest"
	"lock.dev/internal/identity"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// The tests about who may call rail-proxy and what it records of them
// (docs/contracts/workload-identity.md): real mutual TLS with certificates from
// identity.WriteCerts, a real paydb and a real rail-stub.

// idSystem is a rail-proxy serving mutual TLS with its own SVID, in front of a
// rail-stub and a fresh paydb, and the certificate set its callers draw from.
type idSystem struct {
	p     *proxy
	rail  *stub
	db    dbq
	certs string // the certificate set's directory
	// sign signs a grant with the key set the proxy verifies with.
	sign func(account string, token int64, owner, wid string) string
	id   func(name string) string // name's SPIFFE ID in the default trust domain
}

// extraNames are workloads the tests add to the default set: two holders of
// the submitter role, for a replayed grant.
var extraNames = []string{"executor-a", "executor-b"}

// startIdentity starts an idSystem; mutate adjusts the proxy's configuration
// (roles) before it starts. The proxy verifies grants with a key set of its own.
func startIdentity(t *testing.T, mutate func(*Config)) *idSystem {
	t.Helper()
	certs := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: certs, Names: append(identity.DefaultNames(), extraNames...)}); err != nil {
		t.Fatal(err)
	}
	rail := startTLSStub(t, certs, identity.NameRailStub, 0) // railtls_test.go: an https rail, as once TLS is set
	dbURL := pgtest.PaydbURL(t)
	key, keysFile := granttest.Keys(t)
	cfg := testConfig(dbURL, rail.URL)
	cfg.Identity = identity.Files(certs, identity.NameRailProxy)
	cfg.GrantKeysFile = keysFile
	if mutate != nil {
		mutate(&cfg)
	}
	s := &idSystem{rail: rail, db: pgtest.Pool(t, dbURL), certs: certs,
		sign: func(account string, token int64, owner, wid string) string {
			return granttest.SignFor(t, key, account, token, owner, wid)
		},
		id: identity.DefaultID}
	s.p = startTLSProxy(t, cfg, s.client(t, identity.NameOps))
	return s
}

// metric reads one series of the proxy's /metrics (-1 when absent) as ops.
func (s *idSystem) metric(t testing.TB, series string) float64 {
	t.Helper()
	return testkit.MetricOr(t, s.client(t, identity.NameOps), s.p.URL, series, -1)
}

// client is an HTTP client presenting workload name's SVID and expecting
// rail-proxy's, its exchanges checked against api/rail-proxy.json.
func (s *idSystem) client(t testing.TB, name string) *http.Client {
	t.Helper()
	return tlsClient(t, identity.Files(s.certs, name))
}

func tlsClient(t testing.TB, set identity.Settings) *http.Client {
	t.Helper()
	src, err := identity.Load(set, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	peer, err := spiffeid.FromSegments(src.TrustDomain(), identity.NameRailProxy)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 30 * time.Second,
		Transport: conformance.TrackedRoundTripper(&http.Transport{TLSClientConfig: src.ClientConfig(peer)})}
}

// startTLSProxy is startProxy for a proxy serving mutual TLS: it is polled,
// and tracked, over https with poll's certificate.
func startTLSProxy(t *testing.T, cfg Config, poll *http.Client) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg.Listener, cfg.LogOutput = ln, logs
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxy{URL: "https://" + ln.Addr().String(), Logs: logs, stop: cancel, done: make(chan error, 1)}
	go func() { p.done <- Run(ctx, cfg) }()
	live := false
	for deadline := time.Now().Add(20 * time.Second); !live && time.Now().Before(deadline); {
		select {
		case err := <-p.done:
			cancel()
			t.Fatalf("Run returned early: %v (logs: %s)", err, logs.String())
		default:
		}
		if resp, err := poll.Get(p.URL + "/livez"); err == nil {
			resp.Body.Close()
			live = resp.StatusCode == http.StatusOK
		}
		if !live {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !live {
		cancel()
		t.Fatalf("not live after 20s (logs: %s)", logs.String())
	}
	conformance.Track(t, p.URL)
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("rail-proxy Run returned %v", err)
		}
	})
	return p
}

// presentAs posts a submission of p with token, owner and grant through c.
func presentAs(t testing.TB, c *http.Client, baseURL string, token int64, owner, grant string, p payout) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, baseURL+"/v1/rail/submissions", bytes.NewReader(p.body()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(lockapi.HeaderFencingToken, strconv.FormatInt(token, 10))
	req.Header.Set(lockapi.HeaderOwnerID, owner)
	req.Header.Set(lockapi.HeaderIdempotencyKey, p.PayoutID+":"+strconv.FormatInt(token, 10))
	if grant != "" {
		req.Header.Set(lockapi.HeaderFencingGrant, grant)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	a, err := decode(resp)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func getWith(t testing.TB, c *http.Client, url string) answer {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	a, err := decode(resp)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// submitterOf reads every rail_submission row's submitter_identity of payout
// ("" for NULL), in row order.
func submitterOf(t testing.TB, db dbq, payoutID string) []string {
	t.Helper()
	rs, err := db.Query(context.Background(),
		`SELECT coalesce(submitter_identity, '') FROM rail_submission WHERE payout_id = $1 ORDER BY submission_id`, payoutID)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A workload without the submitter role — the reconciler, which may read —
// presents a submission with a genuine grant: 403 FORBIDDEN naming its
// identity, and nothing else happens: no rail_submission row, no rail call,
// the mark where the executor left it, authz_denied_total{route="submitPayment"}
// 1 and no other counter moved. A workload without the reader role is refused
// the audit trail and the statement alike. The executor's own submission is
// admitted and its row names the executor's workload, which the audit trail
// shows.
func TestSubmitterRoleRefusesOtherWorkloads(t *testing.T) {
	t.Parallel()
	s := startIdentity(t, nil)
	exec, recon, creator := s.client(t, identity.NameExecutor), s.client(t, identity.NameReconciler), s.client(t, identity.NamePayoutCreator)
	execID := s.id(identity.NameExecutor)

	honest := newPayout("p-honest", "acct-1")
	if a := presentAs(t, exec, s.p.URL, 5, "worker-1", s.sign("acct-1", 5, "worker-1", execID), honest); a.Status != http.StatusOK {
		t.Fatalf("the executor's submission: %d %v", a.Status, a.Body)
	}
	callsBefore := len(s.rail.calls(t))
	rowsBefore := countRows(t, s.db)
	admittedBefore := s.metric(t, `rail_submission_total{outcome="ACKED"}`)

	// The reconciler presents a submission with a grant lock-server would have
	// signed for it (the role is checked before the grant: it never gets that far).
	a := presentAs(t, recon, s.p.URL, 6, "worker-1", s.sign("acct-1", 6, "worker-1", s.id(identity.NameReconciler)), newPayout("p-stolen", "acct-1"))
	if a.Status != http.StatusForbidden || a.code() != lockapi.CodeForbidden || a.str("identity") != s.id(identity.NameReconciler) {
		t.Fatalf("a reconciler's submission: %d %v, want 403 FORBIDDEN naming %s", a.Status, a.Body, s.id(identity.NameReconciler))
	}
	if n := countRows(t, s.db); n != rowsBefore {
		t.Errorf("rail_submission rows %d after the refusal, want %d", n, rowsBefore)
	}
	if n := len(s.rail.calls(t)); n != callsBefore {
		t.Errorf("rail calls %d after the refusal, want %d", n, callsBefore)
	}
	if m := mark(t, s.db, "acct-1"); m != 5 {
		t.Errorf("acct-1's mark %d after the refusal, want 5", m)
	}
	for series, want := range map[string]float64{
		`authz_denied_total{route="submitPayment"}`:        1,
		`authz_denied_total{route="listSubmissions"}`:      0,
		`authz_denied_total{route="readStatement"}`:        0,
		`rail_submission_total{outcome="ACKED"}`:           admittedBefore,
		`grant_rejected_total{reason="workload_mismatch"}`: 0,
	} {
		if got := s.metric(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if ev := s.p.Logs.events("forbidden"); len(ev) != 1 || ev[0]["identity"] != s.id(identity.NameReconciler) || ev[0]["route"] != "submitPayment" {
		t.Errorf("forbidden events %v, want one naming the reconciler and submitPayment", ev)
	}

	// The payout creator may neither read the audit trail nor the statement.
	for _, path := range []string{"/v1/rail/submissions?payoutId=p-honest", "/v1/rail/statement"} {
		if a := getWith(t, creator, s.p.URL+path); a.Status != http.StatusForbidden || a.code() != lockapi.CodeForbidden {
			t.Errorf("GET %s by the payout creator: %d %v, want 403 FORBIDDEN", path, a.Status, a.Body)
		}
	}

	// The reconciler may read the audit trail: the row names the executor's workload.
	list := getWith(t, recon, s.p.URL+"/v1/rail/submissions?payoutId=p-honest")
	subs, _ := list.Body["submissions"].([]any)
	if list.Status != http.StatusOK || len(subs) != 1 {
		t.Fatalf("audit trail: %d %v", list.Status, list.Body)
	}
	if got := subs[0].(map[string]any)["submitterIdentity"]; got != execID {
		t.Errorf("audit trail's submitterIdentity %v, want %s", got, execID)
	}
	if got := submitterOf(t, s.db, "p-honest"); len(got) != 1 || got[0] != execID {
		t.Errorf("submitter_identity %q, want [%s]", got, execID)
	}
}

// Another workload that holds the submitter role replays a holder's grant: the
// grant names executor-a's workload (wid), executor-b presents it → 401
// GRANT_REJECTED workload_mismatch, no row, no rail call, no mark. Executor-a
// presenting the same grant is admitted, and its row names executor-a.
func TestGrantReplayedByAnotherWorkloadIsRefused(t *testing.T) {
	t.Parallel()
	a, b := identity.DefaultID("executor-a"), identity.DefaultID("executor-b")
	s := startIdentity(t, func(c *Config) { c.Submitters = a + "," + b })
	execA, execB := s.client(t, "executor-a"), s.client(t, "executor-b")

	p := newPayout("p-replayed", "acct-7")
	g := s.sign("acct-7", 9, "worker-a", a)
	if ans := presentAs(t, execB, s.p.URL, 9, "worker-a", g, p); ans.Status != http.StatusUnauthorized ||
		ans.code() != lockapi.CodeGrantRejected || ans.str("reason") != "workload_mismatch" {
		t.Fatalf("executor-b presenting executor-a's grant: %d %v, want 401 GRANT_REJECTED workload_mismatch", ans.Status, ans.Body)
	}
	if n := countRows(t, s.db); n != 0 {
		t.Errorf("%d rail_submission rows after the refusal, want 0", n)
	}
	if n := len(s.rail.calls(t)); n != 0 {
		t.Errorf("%d rail calls after the refusal, want 0", n)
	}
	if m := mark(t, s.db, "acct-7"); m != 0 {
		t.Errorf("acct-7's mark %d after the refusal, want none", m)
	}
	if got := s.metric(t, `grant_rejected_total{reason="workload_mismatch"}`); got != 1 {
		t.Errorf(`grant_rejected_total{reason="workload_mismatch"} = %v, want 1`, got)
	}

	if ans := presentAs(t, execA, s.p.URL, 9, "worker-a", g, p); ans.Status != http.StatusOK {
		t.Fatalf("executor-a presenting its own grant: %d %v", ans.Status, ans.Body)
	}
	if got := submitterOf(t, s.db, "p-replayed"); len(got) != 1 || got[0] != a {
		t.Errorf("submitter_identity %q, want [%s]", got, a)
	}
}

// A proxy serving mutual TLS takes no request from a caller that is not a
// workload of its bundle: plaintext HTTP, TLS without a client certificate,
// and a certificate from another authority all fail before any handler runs —
// no row, no rail call.
func TestProxyServingTLSRefusesUnverifiedCallers(t *testing.T) {
	t.Parallel()
	s := startIdentity(t, nil)
	plainURL := "http://" + s.p.URL[len("https://"):]
	p := newPayout("p-plain", "acct-1")

	plain := &http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequest(http.MethodPost, plainURL+"/v1/rail/submissions", bytes.NewReader(p.body()))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := plain.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("a plaintext request to the TLS listener answered %d, want the connection refused", resp.StatusCode)
	}

	// TLS trusting the bundle but presenting no certificate.
	caPEM, err := os.ReadFile(filepath.Join(s.certs, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	anon := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}}}
	if resp, err := anon.Post(s.p.URL+"/v1/rail/submissions", "application/json", bytes.NewReader(p.body())); err == nil {
		resp.Body.Close()
		t.Errorf("a TLS request without a client certificate answered %d, want the handshake refused", resp.StatusCode)
	}

	// An executor whose certificate another authority issued.
	other := filepath.Join(t.TempDir(), "other")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: other, Names: []string{identity.NameExecutor}}); err != nil {
		t.Fatal(err)
	}
	foreign := identity.Files(other, identity.NameExecutor)
	src, err := identity.Load(foreign, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cfg := src.ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameRailProxy)))
	cfg.InsecureSkipVerify = true // the client's own check of the server aside: the server must refuse it
	cfg.VerifyPeerCertificate = nil
	forged := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	if resp, err := forged.Post(s.p.URL+"/v1/rail/submissions", "application/json", bytes.NewReader(p.body())); err == nil {
		resp.Body.Close()
		t.Errorf("a certificate from another authority answered %d, want the handshake refused", resp.StatusCode)
	}

	if n := countRows(t, s.db); n != 0 {
		t.Errorf("%d rail_submission rows, want 0", n)
	}
	if n := len(s.rail.calls(t)); n != 0 {
		t.Errorf("%d rail calls, want 0", n)
	}
}

// Every row a submission leaves names its submitter, whatever its outcome and
// path: one by one and in a group, books off and on — intents, FENCED,
// DUPLICATE and UNBOOKED rows alike — and NULL for one presented without.
func TestEveryRowNamesItsSubmitter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := groupTestStore(t)
	type member struct {
		sub  Submission
		want Verdict
		book bool // booked as presented (books on)
	}
	for _, books := range []bool{false, true} {
		for _, group := range []bool{false, true} {
			tag := fmt.Sprintf("books%v-group%v", books, group)
			acct := "acct-" + tag
			ms := []member{
				{groupTestSub("p-0-"+tag, acct, 10), Admitted, true},
				{groupTestSub("p-2-"+tag, acct, 5), Fenced, true},
				{groupTestSub("p-3-"+tag, acct, 12), Admitted, true},
			}
			if books {
				ms = append(ms, member{groupTestSub("p-4-"+tag, acct, 13), Unbooked, false})
			} else {
				ms = append(ms, member{groupTestSub("p-0-"+tag, acct, 13), Duplicate, false})
			}
			subs := make([]Submission, len(ms))
			for i, m := range ms {
				subs[i] = m.sub
				if i != 2 { // member 2 is presented without identity: NULL
					subs[i].SubmitterIdentity = "spiffe://lock.dev/executor-" + strconv.Itoa(i)
				}
				if books && m.book {
					book(t, pool, booked(payout{PayoutID: m.sub.PayoutID, AccountID: m.sub.AccountID, AmountMinor: m.sub.AmountMinor,
						Currency: m.sub.Currency, Beneficiary: m.sub.Beneficiary}, m.sub.Token, m.sub.OwnerID))
				}
			}
			var verdicts []Verdict
			if group {
				for i, r := range store.AdmitGroup(ctx, subs, true, books, time.Minute) {
					if r.Err != nil {
						t.Fatalf("%s member %d: %v", tag, i, r.Err)
					}
					verdicts = append(verdicts, r.Admission.Verdict)
				}
			} else {
				for i, s := range subs {
					a, err := store.Admit(ctx, s, true, books, time.Minute)
					if err != nil {
						t.Fatalf("%s submission %d: %v", tag, i, err)
					}
					verdicts = append(verdicts, a.Verdict)
				}
			}
			// Per payout, its rows' submitters in arrival order.
			var payouts []string
			want := map[string][]string{}
			for i, m := range ms {
				if verdicts[i] != m.want {
					t.Fatalf("%s member %d: verdict %v, want %v", tag, i, verdicts[i], m.want)
				}
				if _, seen := want[m.sub.PayoutID]; !seen {
					payouts = append(payouts, m.sub.PayoutID)
				}
				want[m.sub.PayoutID] = append(want[m.sub.PayoutID], subs[i].SubmitterIdentity)
			}
			for _, p := range payouts {
				if got := submitterOf(t, pool, p); fmt.Sprint(got) != fmt.Sprint(want[p]) {
					t.Errorf("%s %s: submitter_identity %q, want %q", tag, p, got, want[p])
				}
			}
		}
	}
}

// The role settings are SPIFFE IDs: anything else is a bad setting (exit 2)
// naming it; and the proxy refuses to start without its grant key set unless
// UNSAFE_NO_AUTH lifts the refusal (docs/contracts/workload-identity.md).
func TestRoleAndGrantSettingsFailClosed(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, name := range []string{"RAIL_PROXY_SUBMITTERS", "RAIL_PROXY_READERS"} {
		_, _, err := ParseConfigTo(nil, env(map[string]string{name: "spiffe://lock.dev/executor,executor"}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=executor: %v, want a bad setting naming it", name, err)
		}
	}
	certs := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: certs}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("postgres://127.0.0.1:1/none", "https://127.0.0.1:1")
	cfg.Identity = identity.Files(certs, identity.NameRailProxy)
	cfg.LogOutput = io.Discard
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "RAIL_PROXY_GRANT_KEYS_FILE") {
		t.Errorf("Run without a grant key set: %v, want a refusal naming RAIL_PROXY_GRANT_KEYS_FILE", err)
	}
}
