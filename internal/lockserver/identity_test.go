package lockserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/grant"
	"lock.dev/internal/identity"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// The workloads of these tests: two executors (two holder identities, so a
// lease can belong to one and not the other), a reader, and one with no role.
const (
	wkExecutorA = "executor-a"
	wkExecutorB = "executor-b"
	wkReconcile = identity.NameReconciler
	wkCreator   = identity.NamePayoutCreator
)

// idServer is a lock-server serving mutual TLS, signing grants, with
// LOCK_SERVER_HOLDERS naming executor-a and executor-b, and a client per
// workload.
type idServer struct {
	*testServer
	db      *pgxpool.Pool
	keys    *grant.KeySet
	clients map[string]*http.Client
	ids     map[string]string
}

func startIdentityServer(t *testing.T) *idServer {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	names := []string{identity.NameLockServer, wkExecutorA, wkExecutorB, wkReconcile, wkCreator}
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir, Names: names}); err != nil {
		t.Fatal(err)
	}
	s := &idServer{clients: map[string]*http.Client{}, ids: map[string]string{}}
	for _, n := range names {
		src, err := identity.Load(identity.Files(dir, n), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		s.ids[n] = src.ID().String()
		tr := &http.Transport{TLSClientConfig: src.ClientConfig(mustID(t, identity.DefaultID(identity.NameLockServer)))}
		t.Cleanup(tr.CloseIdleConnections)
		s.clients[n] = &http.Client{Timeout: 15 * time.Second, Transport: conformance.TrackedRoundTripper(tr)}
	}
	kd := keyDir(t)
	set, _, err := grant.ReadKeySet(filepath.Join(kd, grant.KeySetFile))
	if err != nil {
		t.Fatal(err)
	}
	s.keys = set
	dbURL := pgtest.LockdbURL(t)
	cfg := testConfig(dbURL)
	cfg.Identity = identity.Files(dir, identity.NameLockServer)
	cfg.SigningKeyFile = filepath.Join(kd, grant.SigningKeyFile)
	cfg.Holders = s.ids[wkExecutorA] + "," + s.ids[wkExecutorB]
	s.testServer = startServerWith(t, cfg, "https", s.clients[wkReconcile])
	s.db = pgtest.Pool(t, dbURL)
	return s
}

// as performs one request as workload.
func (s *idServer) as(t *testing.T, workload, method, u string, h http.Header, body []byte) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := s.clients[workload].Do(req)
	if err != nil {
		t.Fatalf("%s %s as %s: %v", method, u, workload, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func (s *idServer) acquire(t *testing.T, workload, name, owner string) answer {
	t.Helper()
	return s.as(t, workload, http.MethodPost, lockURL(s.URL, name, "/acquire"), leaseHeaders(owner, 0), ttlBody(60_000))
}

func (s *idServer) renew(t *testing.T, workload, name, owner string, token int64) answer {
	t.Helper()
	return s.as(t, workload, http.MethodPost, lockURL(s.URL, name, "/renew"), leaseHeaders(owner, token), ttlBody(60_000))
}

func (s *idServer) release(t *testing.T, workload, name, owner string, token int64) answer {
	t.Helper()
	h := leaseHeaders(owner, token)
	h.Del("Content-Type")
	return s.as(t, workload, http.MethodPost, lockURL(s.URL, name, "/release"), h, nil)
}

// metric is the value of the series line (name{labels}) on /metrics, or -1.
func (s *idServer) metric(t *testing.T, series string) string {
	t.Helper()
	a := s.as(t, wkCreator, http.MethodGet, s.URL+"/metrics", nil, nil)
	for _, line := range strings.Split(string(a.Body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return "absent"
}

// leaseRow is lock_lease's row of name as it stands.
func leaseRow(t *testing.T, db *pgxpool.Pool, name string) string {
	t.Helper()
	var row string
	err := db.QueryRow(context.Background(),
		`SELECT concat_ws('|', owner_id, token, acquired_at, expires_at, holder_identity) FROM lock_lease WHERE lock_name = $1`, name).Scan(&row)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// Insider attack 1: a workload without the holder role acquires a lock → 403
// FORBIDDEN naming it, no lease row, authz_denied_total{route="acquireLock"} 1.
// A workload with no role at all is refused on every lease route.
func TestWorkloadWithoutHolderRoleIsForbidden(t *testing.T) {
	t.Parallel()
	s := startIdentityServer(t)
	const name = "account:acct-01"
	a := s.acquire(t, wkReconcile, name, "reconciler-1")
	p := wantProblem(t, "acquire by the reconciler", a, http.StatusForbidden, lockapi.CodeForbidden)
	if who := member(t, p, "identity"); who != s.ids[wkReconcile] {
		t.Errorf("FORBIDDEN names %q, want %s", who, s.ids[wkReconcile])
	}
	var n int
	if err := s.db.QueryRow(context.Background(), `SELECT count(*) FROM lock_lease`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("lease rows after a forbidden acquire: %d %v, want 0", n, err)
	}
	if v := s.metric(t, `authz_denied_total{route="acquireLock"}`); v != "1" {
		t.Errorf(`authz_denied_total{route="acquireLock"} = %s, want 1`, v)
	}
	if v := s.metric(t, `authz_denied_total{route="listGrants"}`); v != "0" {
		t.Errorf(`authz_denied_total{route="listGrants"} = %s, want 0 (zero-initialised)`, v)
	}
	if ev := s.logs.Events("forbidden"); len(ev) != 1 || ev[0]["route"] != "acquireLock" || ev[0]["identity"] != s.ids[wkReconcile] {
		t.Errorf("forbidden log: %v", ev)
	}

	l := mustDecodeLease(t, s.acquire(t, wkExecutorA, name, "executor-1"))
	for what, a := range map[string]answer{
		"acquire": s.acquire(t, wkCreator, "account:acct-02", "c"),
		"renew":   s.renew(t, wkCreator, name, "executor-1", l.Token),
		"release": s.release(t, wkCreator, name, "executor-1", l.Token),
		"get":     s.as(t, wkCreator, http.MethodGet, lockURL(s.URL, name, ""), nil, nil),
		"grants":  s.as(t, wkCreator, http.MethodGet, lockURL(s.URL, name, "/grants"), nil, nil),
		// A holder is no reader of the history.
		"grants by a holder": s.as(t, wkExecutorA, http.MethodGet, lockURL(s.URL, name, "/grants"), nil, nil),
	} {
		wantProblem(t, what+" by a workload without the role", a, http.StatusForbidden, lockapi.CodeForbidden)
	}
	// Readers and holders read a lock's state.
	for _, w := range []string{wkReconcile, wkExecutorB} {
		if a := s.as(t, w, http.MethodGet, lockURL(s.URL, name, ""), nil, nil); a.Status != http.StatusOK {
			t.Errorf("GET of the lock by %s: %v, want 200", w, a)
		}
	}
	if row := leaseRow(t, s.db, name); !strings.HasSuffix(row, s.ids[wkExecutorA]) {
		t.Errorf("the refused calls changed the lease: %s", row)
	}
}

// Insider attack 4: with two holder identities, executor-b renews or releases
// executor-a's lease → 403 NOT_LEASE_HOLDER and the lease is unchanged; a's own
// calls still work. A token a acquired stays a's: after its release, b's
// repeat of that release is still NOT_LEASE_HOLDER, and a's stale token once b
// holds the lock is LEASE_LOST.
func TestAnotherWorkloadCannotRenewOrReleaseTheLease(t *testing.T) {
	t.Parallel()
	s := startIdentityServer(t)
	const name = "account:acct-04"
	l := mustDecodeLease(t, s.acquire(t, wkExecutorA, name, "executor-1"))
	before := leaseRow(t, s.db, name)

	p := wantProblem(t, "renew by executor-b", s.renew(t, wkExecutorB, name, "executor-1", l.Token), http.StatusForbidden, lockapi.CodeNotLeaseHolder)
	if who := member(t, p, "identity"); who != s.ids[wkExecutorB] {
		t.Errorf("NOT_LEASE_HOLDER names %q, want the caller %s", who, s.ids[wkExecutorB])
	}
	wantProblem(t, "release by executor-b", s.release(t, wkExecutorB, name, "executor-1", l.Token), http.StatusForbidden, lockapi.CodeNotLeaseHolder)
	wantProblem(t, "renew by executor-b under its own owner id", s.renew(t, wkExecutorB, name, "executor-9", l.Token), http.StatusForbidden, lockapi.CodeNotLeaseHolder)
	if after := leaseRow(t, s.db, name); after != before {
		t.Fatalf("the lease changed:\nbefore %s\nafter  %s", before, after)
	}
	if ev := s.logs.Events("not_lease_holder"); len(ev) != 3 || ev[0]["identity"] != s.ids[wkExecutorB] {
		t.Errorf("not_lease_holder log: %v", ev)
	}

	mustDecodeLease(t, s.renew(t, wkExecutorA, name, "executor-1", l.Token))
	if a := s.release(t, wkExecutorA, name, "executor-1", l.Token); a.Status != http.StatusNoContent {
		t.Fatalf("release by executor-a: %v", a)
	}
	wantProblem(t, "executor-b repeating a's release", s.release(t, wkExecutorB, name, "executor-1", l.Token), http.StatusForbidden, lockapi.CodeNotLeaseHolder)

	l2 := mustDecodeLease(t, s.acquire(t, wkExecutorB, name, "executor-2"))
	wantProblem(t, "executor-a renewing its old token", s.renew(t, wkExecutorA, name, "executor-1", l.Token), http.StatusConflict, lockapi.CodeLeaseLost)
	wantProblem(t, "executor-a renewing b's token", s.renew(t, wkExecutorA, name, "executor-2", l2.Token), http.StatusForbidden, lockapi.CodeNotLeaseHolder)
}

// The grant names the acquiring workload (wid) and the renewal answers the same
// bytes; GET answers no grant; the history names each grant's workload.
func TestGrantNamesTheWorkloadAndHistoryShowsIt(t *testing.T) {
	t.Parallel()
	s := startIdentityServer(t)
	const name = "account:acct-03"
	l := mustDecodeLease(t, s.acquire(t, wkExecutorA, name, "executor-1"))
	v, err := grant.NewVerifier(s.keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, r := v.VerifyClaims(l.Grant, grant.Presented{Lock: name, Token: l.Token, Owner: "executor-1"})
	if r != nil || c.Workload != s.ids[wkExecutorA] {
		t.Fatalf("the grant: %v, wid %q, want %s", r, c.Workload, s.ids[wkExecutorA])
	}
	if r2 := mustDecodeLease(t, s.renew(t, wkExecutorA, name, "executor-1", l.Token)); r2.Grant != l.Grant {
		t.Errorf("the renewal answered another grant")
	}
	for _, w := range []string{wkExecutorA, wkReconcile} {
		if a := s.as(t, w, http.MethodGet, lockURL(s.URL, name, ""), nil, nil); a.Status != http.StatusOK || bytes.Contains(a.Body, []byte(`"grant"`)) {
			t.Errorf("GET of the live lease by %s: %v, want 200 without a grant", w, a)
		}
	}
	if a := s.release(t, wkExecutorA, name, "executor-1", l.Token); a.Status != http.StatusNoContent {
		t.Fatal(a)
	}
	mustDecodeLease(t, s.acquire(t, wkExecutorB, name, "executor-2"))

	a := s.as(t, wkReconcile, http.MethodGet, lockURL(s.URL, name, "/grants"), nil, nil)
	var gl lockapi.GrantList
	if a.Status != http.StatusOK || json.Unmarshal(a.Body, &gl) != nil || len(gl.Grants) != 2 {
		t.Fatalf("grants history: %v", a)
	}
	got := []string{deref(gl.Grants[0].HolderIdentity), deref(gl.Grants[1].HolderIdentity)}
	if want := []string{s.ids[wkExecutorB], s.ids[wkExecutorA]}; !slices.Equal(got, want) {
		t.Errorf("history holders %v, want %v (newest first)", got, want)
	}
	if bytes.Contains(a.Body, []byte(strings.Split(l.Grant, ".")[2])) {
		t.Error("the history shows a grant")
	}
}

// Without a signing key lock-server refuses to start (exit 2 naming the
// setting) unless UNSAFE_NO_AUTH=true.
func TestSigningKeyIsRequiredUnlessUnsafe(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir, Names: []string{identity.NameLockServer}}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("postgres://nobody@127.0.0.1:1/none")
	cfg.LogOutput = &syncBuffer{}
	cfg.Identity = identity.Files(dir, identity.NameLockServer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := Run(ctx, cfg)
	var ue *serve.UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "LOCK_SERVER_SIGNING_KEY_FILE") || serve.ExitCode(err, io.Discard) != 2 {
		t.Errorf("Run without a signing key = %v, want exit 2 naming LOCK_SERVER_SIGNING_KEY_FILE", err)
	}
}

// A role setting that is not a list of SPIFFE IDs is a bad setting.
func TestRoleSettingsAreSPIFFEIDs(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"LOCK_SERVER_HOLDERS", "LOCK_SERVER_READERS"} {
		_, _, err := parseConfig(nil, func(k string) string {
			if k == env {
				return "executor"
			}
			return ""
		}, &bytes.Buffer{})
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, env) {
			t.Errorf("%s=executor: %v, want a usage error naming it", env, err)
		}
	}
	_, cfg, err := parseConfig(nil, env(nil), &bytes.Buffer{})
	if err != nil || cfg.Holders != "spiffe://lock.dev/executor" || cfg.Readers != "spiffe://lock.dev/reconciler,spiffe://lock.dev/ops" {
		t.Errorf("defaults: %q %q %v", cfg.Holders, cfg.Readers, err)
	}
}

// lock-server certs writes the authority and an SVID per name, refuses to
// overwrite any of them (exit 2, one line, nothing written), and refuses bad
// flags (exit 2).
func TestCertsCommand(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "certs")
	cmd, _, err := ParseConfig([]string{"certs", "--out", dir}, env(map[string]string{"LOCK_MAX_TTL": "bad"}))
	if err != nil || cmd != CmdCerts {
		t.Fatalf("ParseConfig(certs) = %q, %v: certs needs none of the service's settings", cmd, err)
	}
	var out bytes.Buffer
	if err := Certs([]string{"--out", dir, "--names", "a,b", "--trust-domain", "example.org", "--valid", "1h"}, &out); err != nil {
		t.Fatal(err)
	}
	src, err := identity.Load(identity.Files(dir, "b"), slog.New(slog.DiscardHandler))
	if err != nil || src.ID().String() != "spiffe://example.org/b" {
		t.Fatalf("the SVID of b: %v %v", src, err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("DIR mode: %v %v, want 0700", st, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "a.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("a.key mode: %v %v, want 0600", st, err)
	}
	listing := func(d string) []string {
		es, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	before := listing(dir)
	caBefore, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))

	// One file of the set exists (c's are new): nothing is written.
	err = Certs([]string{"--out", dir, "--names", "c,a"}, &out)
	var stderr bytes.Buffer
	if code := serve.ExitCode(err, &stderr); code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
		t.Errorf("certs over an existing set: exit %d %q, want 2 with one line", code, stderr.String())
	}
	caAfter, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if !slices.Equal(listing(dir), before) || !bytes.Equal(caBefore, caAfter) {
		t.Errorf("a refused certs wrote files: %v", listing(dir))
	}

	for _, args := range [][]string{
		nil,
		{"--out", filepath.Join(t.TempDir(), "x"), "--valid", "-1h"},
		{"--out", filepath.Join(t.TempDir(), "x"), "--valid", "soon"},
		{"--out", filepath.Join(t.TempDir(), "x"), "--names", "a/b"},
		{"--out", filepath.Join(t.TempDir(), "x"), "--names", ","},
		{"--out", filepath.Join(t.TempDir(), "x"), "--trust-domain", "Not A Domain"},
		{"--out", filepath.Join(t.TempDir(), "x"), "extra"},
		{"--no-such-flag"},
	} {
		if code := serve.ExitCode(Certs(args, &out), io.Discard); code != 2 {
			t.Errorf("certs %v: exit %d, want 2", args, code)
		}
	}
}

// Deployment checks see what a running lock-server exports about identity.
func TestRegistryHasTheIdentityFamilies(t *testing.T) {
	t.Parallel()
	reg := MetricsRegistry()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		got[mf.GetName()] = len(mf.GetMetric())
	}
	if got["authz_denied_total"] != len(routes) {
		t.Errorf("authz_denied_total has %d series, want one per route (%d)", got["authz_denied_total"], len(routes))
	}
	if _, ok := got["auth_enabled"]; !ok {
		t.Error("the registry lacks auth_enabled")
	}
	// tls_cert_expiry_seconds has no series before a certificate is read: it
	// is there when the same family cannot be registered again.
	err = reg.Register(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tls_cert_expiry_seconds",
		Help: "When the earliest certificate of each identity file expires, in seconds since the epoch."}, []string{"file"}))
	if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
		t.Errorf("the registry lacks tls_cert_expiry_seconds: registering it again gave %v", err)
	}
}

func mustDecodeLease(t *testing.T, a answer) lockapi.Lease {
	t.Helper()
	var l lockapi.Lease
	if a.Status != http.StatusOK || json.Unmarshal(a.Body, &l) != nil {
		t.Fatalf("lease call: %v, want 200", a)
	}
	return l
}

func member(t *testing.T, p *lockapi.Problem, name string) string {
	t.Helper()
	var v string
	if ok, err := p.Member(name, &v); !ok || err != nil {
		t.Errorf("problem member %s: %v %v", name, ok, err)
	}
	return v
}

func mustID(t *testing.T, s string) spiffeid.ID {
	t.Helper()
	id, err := spiffeid.FromString(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
