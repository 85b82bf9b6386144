package grant_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/grant"
	"lock.dev/internal/grant/forge"
	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// workloads is a throwaway authority with a fence point and two holder
// workloads of the same kind, each with its own SPIFFE ID.
type workloads struct {
	fence, a, b *identity.Source
}

func newWorkloads(t *testing.T) workloads {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir, Names: []string{"rail-proxy", "executor-a", "executor-b"}}); err != nil {
		t.Fatal(err)
	}
	load := func(name string) *identity.Source {
		src, err := identity.Load(identity.Files(dir, name), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	return workloads{fence: load("rail-proxy"), a: load("executor-a"), b: load("executor-b")}
}

// fencePoint serves gate's check on mutual TLS the way serve.Serve serves a
// fence point, and returns its URL. The handler answers 200 only when the gate
// lets the request through.
func fencePoint(t *testing.T, src *identity.Source, gate *grant.Gate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve.Serve(ctx, identity.NewListener(ln, src.ServerConfig()), fenced(gate), serve.NewHealth(), slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "https://" + ln.Addr().String() + "/v1/rail/submissions"
}

func fenced(gate *grant.Gate) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/rail/submissions", func(w http.ResponseWriter, r *http.Request) {
		if gate.Check(w, r, grant.Fenced{AccountID: "acct-1", PayoutID: "p-1", Token: 42, OwnerID: "executor-1"}) {
			_, _ = io.WriteString(w, "admitted")
		}
	})
	return mux
}

// present posts g to url as the workload whose TLS configuration is cfg, and
// returns the status and the problem's reason ("" on 200).
func present(t *testing.T, cfg *tls.Config, url, g string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(lockapi.HeaderFencingToken, strconv.Itoa(42))
	req.Header.Set(lockapi.HeaderFencingGrant, g)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("answer %d %q is no problem", resp.StatusCode, b)
		}
		r, _ := body["reason"].(string)
		return resp.StatusCode, r
	}
	return resp.StatusCode, ""
}

func newBoundGate(t *testing.T, k keyPair, widRequired bool) (*grant.Gate, *prometheus.Registry, *logcapture.Buffer) {
	t.Helper()
	g, reg, logs := newGate(t, k.Set)
	g.BindWorkload(true, widRequired)
	return g, reg, logs
}

func withoutWid(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "grant_without_wid_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("grant_without_wid_total is not registered")
	return 0
}

// A holder's grant replayed by another workload of the same kind is refused
// workload_mismatch, also after the holder's own use put it in the cache; the
// holder itself is admitted.
func TestGrantReplayedByAnotherWorkloadIsRefused(t *testing.T) {
	w := newWorkloads(t)
	k := newKeyPair(t)
	gate, reg, logs := newBoundGate(t, k, true)
	url := fencePoint(t, w.fence, gate)
	fenceID := w.fence.ID()
	g := mustOf(t)(k.Signer.SignFor("account:acct-1", 42, "executor-1", w.a.ID().String(), time.Unix(1_700_000_000, 0)))

	if code, reason := present(t, w.a.ClientConfig(fenceID), url, g); code != 200 {
		t.Fatalf("the holder workload: %d %s, want 200", code, reason)
	}
	if code, reason := present(t, w.b.ClientConfig(fenceID), url, g); code != 401 || reason != grant.ReasonWorkloadMismatch {
		t.Fatalf("another workload replaying the grant: %d %s, want 401 workload_mismatch", code, reason)
	}
	if v := rejected(t, reg)[grant.ReasonWorkloadMismatch]; v != 1 {
		t.Errorf("grant_rejected_total{reason=workload_mismatch} = %v, want 1", v)
	}
	if ev := logs.Events("grant_rejected"); len(ev) != 1 || ev[0]["reason"] != grant.ReasonWorkloadMismatch {
		t.Errorf("grant_rejected log: %v", ev)
	}
	if code, _ := present(t, w.a.ClientConfig(fenceID), url, g); code != 200 {
		t.Errorf("the holder after the replay: %d, want 200", code)
	}
}

// A grant without wid: refused when wid is required, else admitted, logged at
// INFO and counted.
func TestGrantWithoutWid(t *testing.T) {
	w := newWorkloads(t)
	k := newKeyPair(t)
	g := k.Sign(t, "account:acct-1", 42, "executor-1")
	fenceID := w.fence.ID()

	required, reg, _ := newBoundGate(t, k, true)
	if code, reason := present(t, w.a.ClientConfig(fenceID), fencePoint(t, w.fence, required), g); code != 401 || reason != grant.ReasonWorkloadMismatch {
		t.Errorf("no wid, wid required: %d %s, want 401 workload_mismatch", code, reason)
	}
	if v := withoutWid(t, reg); v != 0 {
		t.Errorf("grant_without_wid_total = %v after a refusal, want 0", v)
	}

	lenient, reg2, logs2 := newBoundGate(t, k, false)
	if v := withoutWid(t, reg2); v != 0 {
		t.Errorf("grant_without_wid_total starts at %v, want 0", v)
	}
	if code, reason := present(t, w.a.ClientConfig(fenceID), fencePoint(t, w.fence, lenient), g); code != 200 {
		t.Fatalf("no wid, wid not required: %d %s, want 200", code, reason)
	}
	if v := withoutWid(t, reg2); v != 1 {
		t.Errorf("grant_without_wid_total = %v, want 1", v)
	}
	ev := logs2.Events("grant_without_wid")
	if len(ev) != 1 || ev[0]["level"] != "INFO" || ev[0]["accountId"] != "acct-1" || ev[0]["ownerId"] != "executor-1" ||
		ev[0]["presentedToken"] != 42.0 || ev[0]["identity"] != w.a.ID().String() {
		t.Errorf("grant_without_wid log: %v", ev)
	}
	if v := rejected(t, reg2)[grant.ReasonWorkloadMismatch]; v != 0 {
		t.Errorf("an admitted grant counted as rejected")
	}
}

// A gate not bound to workloads (plaintext under UNSAFE_NO_AUTH) compares no
// wid; a bound gate whose request has no verified peer refuses (fail closed).
func TestUnboundGateDoesNotCompareWid(t *testing.T) {
	k := newKeyPair(t)
	other := spiffeid.RequireFromString("spiffe://lock.dev/someone-else").String()
	g := mustOf(t)(k.Signer.SignFor("account:acct-1", 42, "executor-1", other, time.Unix(1_700_000_000, 0)))

	unbound, _, _ := newGate(t, k.Set)
	unbound.BindWorkload(false, true)
	srv := httptest.NewServer(fenced(unbound))
	t.Cleanup(srv.Close)
	if code, reason := present(t, nil, srv.URL+"/v1/rail/submissions", g); code != 200 {
		t.Errorf("unbound gate: %d %s, want 200", code, reason)
	}

	bound, _, _ := newBoundGate(t, k, true)
	srv2 := httptest.NewServer(fenced(bound))
	t.Cleanup(srv2.Close)
	if code, reason := present(t, nil, srv2.URL+"/v1/rail/submissions", g); code != 401 || reason != grant.ReasonWorkloadMismatch {
		t.Errorf("bound gate, no peer: %d %s, want 401 workload_mismatch", code, reason)
	}
}

// wid is a known claim: a grant carrying it verifies; one whose wid is not a
// SPIFFE ID string is malformed; lock-server writes it last.
func TestWidClaim(t *testing.T) {
	k := newKeyPair(t)
	v := newVerifier(t, k.Set, 0)
	p := grant.Presented{Lock: "account:acct-1", Token: 42, Owner: "executor-1"}
	g := mustOf(t)(k.Signer.SignFor(p.Lock, p.Token, p.Owner, "spiffe://lock.dev/executor", time.Unix(1_700_000_000, 0)))
	if got, want := decodePart(t, g, 1), `{"iss":"lock-server","lock":"account:acct-1","tok":"42","sub":"executor-1","iat":1700000000,"wid":"spiffe://lock.dev/executor"}`; got != want {
		t.Errorf("claims %s\nwant   %s", got, want)
	}
	c, r := v.Verify(g, p)
	if r != nil || c.Workload != "spiffe://lock.dev/executor" {
		t.Fatalf("a grant with wid: %v, claims %+v", r, c)
	}
	for name, wid := range map[string]any{"a number": 7, "empty": "", "not a SPIFFE ID": "executor", "null": nil, "an object": map[string]string{}} {
		bad := mustOf(t)(forgeWith(k, p, "wid", wid))
		if r := refusal(v.Verify(bad, p)); r == nil || r.Reason != grant.ReasonMalformed {
			t.Errorf("wid %s: %v, want malformed", name, r)
		}
	}
}

// A key removed from the file stops verifying at the reload, though a grant
// of it was remembered; a broken file keeps the set in use and says so.
func TestKeySetFileIsReRead(t *testing.T) {
	old, cur := newKeyPair(t), newKeyPair(t)
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeSet(t, path, old.Set)
	set, _, sum, err := grant.ReadKeySetSum(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	logs := &logcapture.Buffer{}
	gate, err := grant.NewGate(set, 0, reg, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	kf := gate.WatchFile("RAIL_PROXY_GRANT_KEYS_FILE", path, sum)
	byOld, byCur := old.Sign(t, "account:acct-1", 42, "executor-1"), cur.Sign(t, "account:acct-1", 42, "executor-1")
	if _, ok := check(gate, byOld); !ok {
		t.Fatal("the old key's grant is refused before the rotation")
	}
	if err := kf.Reload(); err != nil || len(logs.Events("grant_keys_reloaded")) != 0 {
		t.Fatalf("an unchanged file reloaded: %v, %s", err, logs.String())
	}

	writeSet(t, path, cur.Set)
	if err := kf.Reload(); err != nil {
		t.Fatal(err)
	}
	if w, ok := check(gate, byOld); ok || !containsReason(w, grant.ReasonUnknownKey) {
		t.Errorf("the removed key's remembered grant: ok=%v %s, want unknown_key", ok, w.Body.String())
	}
	if _, ok := check(gate, byCur); !ok {
		t.Error("the new key's grant is refused after the reload")
	}

	writeRaw(t, path, []byte(`{"keys":[`))
	if err := kf.Reload(); err == nil {
		t.Error("a broken file reloaded")
	}
	ev := logs.Events("grant_keys_reload_failed")
	if len(ev) != 1 || ev[0]["level"] != "ERROR" || ev[0]["setting"] != "RAIL_PROXY_GRANT_KEYS_FILE" {
		t.Errorf("grant_keys_reload_failed log: %v", ev)
	}
	if _, ok := check(gate, byCur); !ok {
		t.Error("after a broken file the set in use was dropped")
	}
	if testutil.CollectAndCount(reg) == 0 {
		t.Error("the gate registered nothing")
	}
}

func containsReason(w *httptest.ResponseRecorder, reason string) bool {
	var body map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	return body["reason"] == reason
}

// forgeWith signs, with k's real key, lock-server's claims for p plus claim
// name = value: a shape lock-server never writes.
func forgeWith(k keyPair, p grant.Presented, name string, value any) (string, error) {
	c := forge.GrantClaims(p.Lock, p.Token, p.Owner)
	c[name] = value
	return forge.Sign(k.Priv, forge.GrantHeader(k.KID), c)
}

// writeSet replaces the key set file at path with set, by a rename as
// Kubernetes does.
func writeSet(t *testing.T, path string, set *grant.KeySet) {
	t.Helper()
	b, err := set.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	writeRaw(t, path, b)
}

func writeRaw(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
