package fence_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/fence"
	"lock.dev/internal/identity"
	"lock.dev/lockapi"
)

// ledgerLock is the LockFunc of the tests: the account in the path, "none"
// naming no lock.
func ledgerLock(r *http.Request) (string, error) {
	a := r.PathValue("account")
	if a == "none" {
		return "", errors.New("the path names no account")
	}
	return "ledger:" + a, nil
}

// refusal is one refusal OnRefusal saw.
type refusal struct {
	status int
	err    error
}

// guarded is a resource behind Middleware: its handler answers 200 with the
// claims it found in the context, and counts its calls.
type guarded struct {
	handler  http.Handler
	calls    atomic.Int64
	refusals chan refusal
}

func newGuarded(v *fence.Verifier, opts ...fence.Option) *guarded {
	g := &guarded{refusals: make(chan refusal, 16)}
	opts = append(opts, fence.OnRefusal(func(r *http.Request, status int, err error) {
		g.refusals <- refusal{status, err}
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /ledger/{account}", fence.Middleware(v, ledgerLock, opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.calls.Add(1)
		c, ok := fence.FromContext(r.Context())
		if !ok {
			http.Error(w, "no claims in the context", http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "%s %d %s %s", c.Lock, c.Token, c.Subject, c.Workload)
	})))
	g.handler = mux
	return g
}

// answer is what a guarded resource answered.
type answer struct {
	status    int
	header    http.Header
	body      string
	problem   map[string]any
	reason    string
	errFields []string
}

func read(t *testing.T, resp *http.Response) answer {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if resp.StatusCode != http.StatusOK {
		if ct := resp.Header.Get("Content-Type"); ct != lockapi.ContentTypeProblem {
			t.Errorf("a refusal's Content-Type is %q, want %s", ct, lockapi.ContentTypeProblem)
		}
		if err := json.Unmarshal(b, &a.problem); err != nil {
			t.Fatalf("a refusal's body is not JSON: %s", b)
		}
		a.reason, _ = a.problem["reason"].(string)
		errs, _ := a.problem["errors"].([]any)
		for _, e := range errs {
			f, _ := e.(map[string]any)["field"].(string)
			a.errFields = append(a.errFields, f)
		}
	}
	return a
}

// The headers are read strictly before the grant (400, every fault listed);
// then the grant, each reason answered 401 GRANT_REJECTED with the challenge;
// the handler runs only for a grant of the lock, token and owner presented,
// and finds its claims in the context.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	k := newKeyPair(t)
	v := newVerifier(t, k.Set, 0)
	real := k.Sign(t, "ledger:acct-1", 42, "worker-1")
	hdr := func(token, owner string, grants ...string) http.Header {
		h := http.Header{}
		if token != "" {
			h.Set(lockapi.HeaderFencingToken, token)
		}
		if owner != "" {
			h.Set(lockapi.HeaderOwnerID, owner)
		}
		for _, g := range grants {
			h.Add(lockapi.HeaderFencingGrant, g)
		}
		return h
	}
	cases := []struct {
		name    string
		account string
		h       http.Header
		status  int
		reason  string   // 401
		fields  []string // 400
	}{
		{"a grant of the lock, token and owner", "acct-1", hdr("42", "worker-1", real), 200, "", nil},
		{"no token", "acct-1", hdr("", "worker-1", real), 400, "", []string{"X-Fencing-Token"}},
		{"a token with a leading zero", "acct-1", hdr("042", "worker-1", real), 400, "", []string{"X-Fencing-Token"}},
		{"a token beyond int64", "acct-1", hdr("9223372036854775808", "worker-1", real), 400, "", []string{"X-Fencing-Token"}},
		{"the owner twice", "acct-1", func() http.Header { h := hdr("42", "worker-1", real); h.Add(lockapi.HeaderOwnerID, "w2"); return h }(), 400, "", []string{"X-Owner-Id"}},
		{"every fault listed", "none", hdr("", "", real), 400, "", []string{"X-Fencing-Token", "X-Owner-Id", "lock"}},
		{"no lock", "none", hdr("42", "worker-1", real), 400, "", []string{"lock"}},
		{"headers before the grant", "acct-1", hdr("x", "worker-1", "nonsense"), 400, "", []string{"X-Fencing-Token"}},
		{"no grant", "acct-1", hdr("42", "worker-1"), 401, fence.ReasonMissing, nil},
		{"an empty grant", "acct-1", hdr("42", "worker-1", ""), 401, fence.ReasonMissing, nil},
		{"the grant twice", "acct-1", hdr("42", "worker-1", real, real), 401, fence.ReasonMalformed, nil},
		{"not a grant", "acct-1", hdr("42", "worker-1", "a.b.c"), 401, fence.ReasonMalformed, nil},
		{"a grant of another lock", "acct-2", hdr("42", "worker-1", real), 401, fence.ReasonLockMismatch, nil},
		{"a grant of another token", "acct-1", hdr("43", "worker-1", real), 401, fence.ReasonTokenMismatch, nil},
		{"a grant to another owner", "acct-1", hdr("42", "worker-2", real), 401, fence.ReasonOwnerMismatch, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			g := newGuarded(v, fence.WithoutMutualTLS())
			srv := httptest.NewServer(g.handler)
			defer srv.Close()
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/ledger/"+c.account, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = c.h
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			a := read(t, resp)
			if a.status != c.status {
				t.Fatalf("answered %d %s, want %d", a.status, a.body, c.status)
			}
			switch c.status {
			case 200:
				if a.body != "ledger:acct-1 42 worker-1 " || g.calls.Load() != 1 {
					t.Errorf("the handler saw %q (%d calls), want the grant's claims once", a.body, g.calls.Load())
				}
				return
			case 400:
				if a.problem["code"] != lockapi.CodeInvalidRequest || fmt.Sprint(a.errFields) != fmt.Sprint(c.fields) {
					t.Errorf("problem %v, want INVALID_REQUEST on %v", a.problem, c.fields)
				}
			case 401:
				if a.problem["code"] != lockapi.CodeGrantRejected || a.reason != c.reason || a.problem["status"] != 401.0 ||
					a.header.Get("WWW-Authenticate") != fence.Challenge {
					t.Errorf("problem %v, WWW-Authenticate %q; want GRANT_REJECTED %s with the challenge",
						a.problem, a.header.Get("WWW-Authenticate"), c.reason)
				}
			}
			if g.calls.Load() != 0 {
				t.Errorf("the handler ran on a refusal")
			}
			select {
			case r := <-g.refusals:
				var rej *fence.Rejection
				if r.status != c.status || (c.status == 401) != errors.As(r.err, &rej) || (rej != nil && rej.Reason != c.reason) {
					t.Errorf("OnRefusal saw %d %v", r.status, r.err)
				}
			default:
				t.Errorf("OnRefusal was not called")
			}
		})
	}
}

// A middleware without a verifier refuses everything.
func TestMiddlewareWithoutVerifierFailsClosed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newGuarded(nil, fence.WithoutMutualTLS()).handler)
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/ledger/acct-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := read(t, resp); a.status != http.StatusInternalServerError {
		t.Errorf("answered %d %s, want 500", a.status, a.body)
	}
}

// mtls is a trust domain with a ledger (the resource) and two workloads of
// the executor kind, each with its own SPIFFE ID.
type mtls struct {
	ledger, a, b *identity.Source
}

func newMTLS(t *testing.T) mtls {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir, Names: []string{"ledger", "executor-a", "executor-b"}}); err != nil {
		t.Fatal(err)
	}
	load := func(name string) *identity.Source {
		src, err := identity.Load(identity.Files(dir, name), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	return mtls{ledger: load("ledger"), a: load("executor-a"), b: load("executor-b")}
}

// serveTLS serves h with net/http's own TLS (so r.TLS is set) on cfg, which
// requires and verifies a client certificate, and returns its URL.
func serveTLS(t *testing.T, h http.Handler, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeTLS(ln, "", "")
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "https://" + ln.Addr().String()
}

// present posts a grant of token 42 to owner worker-1 as the workload whose
// client configuration cfg is (plain HTTP when cfg is nil).
func present(t *testing.T, cfg *tls.Config, url, g string) answer {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, url+"/ledger/acct-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = lockapi.FencingHeaders(42, g, "worker-1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return read(t, resp)
}

// Over mutual TLS the grant's wid must name the caller: the holder's grant
// passes for the holder and is worthless to another workload; a grant
// without wid is refused unless AcceptGrantsWithoutWorkload; a request that
// did not come over mutual TLS is refused (fail closed) unless the resource
// says it serves plaintext.
func TestMiddlewareWorkload(t *testing.T) {
	t.Parallel()
	k := newKeyPair(t)
	v := newVerifier(t, k.Set, 0)
	w := newMTLS(t)
	ledgerID := w.ledger.ID()
	held := mustOf(t)(k.Signer.SignFor("ledger:acct-1", 42, "worker-1", w.a.ID().String(), time.Unix(1_700_000_000, 0)))
	noWid := k.Sign(t, "ledger:acct-1", 42, "worker-1")

	strict := serveTLS(t, newGuarded(v).handler, w.ledger.ServerConfig())
	rollout := serveTLS(t, newGuarded(v, fence.AcceptGrantsWithoutWorkload()).handler, w.ledger.ServerConfig())
	plaintext := httptest.NewServer(newGuarded(v).handler)
	defer plaintext.Close()
	unsafe := httptest.NewServer(newGuarded(v, fence.WithoutMutualTLS()).handler)
	defer unsafe.Close()

	asA, asB := w.a.ClientConfig(ledgerID), w.b.ClientConfig(ledgerID)
	for _, c := range []struct {
		name   string
		cfg    *tls.Config
		url    string
		grant  string
		status int
		body   string
	}{
		{"the holder", asA, strict, held, 200, "ledger:acct-1 42 worker-1 " + w.a.ID().String()},
		{"another workload replaying the holder's grant", asB, strict, held, 401, ""},
		{"a grant without wid", asA, strict, noWid, 401, ""},
		{"a grant without wid during a rollout", asA, rollout, noWid, 200, "ledger:acct-1 42 worker-1 "},
		{"a replayed grant during a rollout", asB, rollout, held, 401, ""},
		{"plaintext where mutual TLS is expected", nil, plaintext.URL, held, 401, ""},
		{"plaintext without wid where mutual TLS is expected", nil, plaintext.URL, noWid, 401, ""},
		{"plaintext, said so", nil, unsafe.URL, noWid, 200, "ledger:acct-1 42 worker-1 "},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := present(t, c.cfg, c.url, c.grant)
			if a.status != c.status {
				t.Fatalf("answered %d %s, want %d", a.status, a.body, c.status)
			}
			if c.status == 200 && a.body != c.body {
				t.Errorf("the handler saw %q, want %q", a.body, c.body)
			}
			if c.status == 401 && a.reason != fence.ReasonWorkloadMismatch {
				t.Errorf("reason %q (%v), want workload_mismatch", a.reason, a.problem["detail"])
			}
		})
	}
}

// MatchWorkload's answers, in its order.
func TestMatchWorkload(t *testing.T) {
	t.Parallel()
	const a, b = "spiffe://lock.dev/executor-a", "spiffe://lock.dev/executor-b"
	for _, c := range []struct {
		wid, caller string
		require     bool
		ok          bool
	}{
		{a, a, true, true},
		{a, b, true, false},
		{a, "", true, false},
		{a, "", false, false},
		{"", a, true, false},
		{"", a, false, true},
		{"", "", false, true},
	} {
		err := fence.MatchWorkload(fence.Claims{Workload: c.wid}, c.caller, c.require)
		var rej *fence.Rejection
		if (err == nil) != c.ok || (err != nil && (!errors.As(err, &rej) || rej.Reason != fence.ReasonWorkloadMismatch)) {
			t.Errorf("wid %q caller %q require %v: %v", c.wid, c.caller, c.require, err)
		}
	}
	if _, err := fence.PeerID(nil); err == nil {
		t.Error("PeerID of no TLS state: no error")
	}
	if _, err := fence.PeerID(&tls.ConnectionState{}); err == nil {
		t.Error("PeerID without a client certificate: no error")
	}
}
