package identity

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/serve"
)

func certs(t *testing.T, o CertsOptions) string {
	t.Helper()
	if o.Dir == "" {
		o.Dir = filepath.Join(t.TempDir(), "certs")
	}
	if err := WriteCerts(o); err != nil {
		t.Fatal(err)
	}
	return o.Dir
}

func load(t *testing.T, dir, name string) *Source {
	t.Helper()
	src, err := Load(Files(dir, name), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// serveGuarded serves one route guarded for allowed on a mutual-TLS listener
// the way serve.Serve does (its connections wrapped beyond *tls.Conn), and
// returns its URL and the guard's registry.
func serveGuarded(t *testing.T, src *Source, allowed []spiffeid.ID) (string, *prometheus.Registry) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	g := NewGuard(true, []string{"doIt", "other"}, reg, slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /do", g.Allow("doIt", allowed, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, g.Caller(r))
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve.Serve(ctx, NewListener(ln, src.ServerConfig()), mux, serve.NewHealth(), slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "https://" + ln.Addr().String() + "/do", reg
}

func client(src *Source, expect spiffeid.ID) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: src.ClientConfig(expect)}}
}

func TestGuardAllowsTheRoleAndRefusesEveryoneElse(t *testing.T) {
	dir := certs(t, CertsOptions{})
	server := load(t, dir, NameLockServer)
	executorID := spiffeid.RequireFromString(DefaultID(NameExecutor))
	url, reg := serveGuarded(t, server, []spiffeid.ID{executorID})

	res, err := client(load(t, dir, NameExecutor), server.ID()).Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(body) != executorID.String() {
		t.Fatalf("executor: %d %q, want 200 naming the executor", res.StatusCode, body)
	}

	res, err = client(load(t, dir, NameReconciler), server.ID()).Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Code     string `json:"code"`
		Identity string `json:"identity"`
	}
	_ = json.NewDecoder(res.Body).Decode(&p)
	res.Body.Close()
	if res.StatusCode != 403 || p.Code != "FORBIDDEN" || p.Identity != DefaultID(NameReconciler) {
		t.Fatalf("reconciler: %d %+v, want 403 FORBIDDEN naming it", res.StatusCode, p)
	}
	if got := testutil.ToFloat64(mustCounter(t, reg, "doIt")); got != 1 {
		t.Errorf("authz_denied_total{route=doIt} = %v, want 1", got)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, route string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "authz_denied_total" && m.GetLabel()[0].GetValue() == route {
				c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
				c.Add(m.GetCounter().GetValue())
				return c
			}
		}
	}
	t.Fatalf("authz_denied_total{route=%q} not exported", route)
	return nil
}

func TestAnotherAuthorityFailsTheHandshake(t *testing.T) {
	dir := certs(t, CertsOptions{})
	other := certs(t, CertsOptions{})
	server := load(t, dir, NameLockServer)
	url, _ := serveGuarded(t, server, []spiffeid.ID{spiffeid.RequireFromString(DefaultID(NameExecutor))})
	// The same name, the same trust domain, another authority.
	_, err := client(load(t, other, NameExecutor), server.ID()).Post(url, "", nil)
	if err == nil {
		t.Fatal("a client certificate of another authority was accepted")
	}
}

func TestClientRefusesAServerWithAnotherID(t *testing.T) {
	dir := certs(t, CertsOptions{})
	server := load(t, dir, NameRailStub)
	url, _ := serveGuarded(t, server, []spiffeid.ID{spiffeid.RequireFromString(DefaultID(NameRailProxy))})
	_, err := client(load(t, dir, NameRailProxy), spiffeid.RequireFromString(DefaultID(NameLockServer))).Post(url, "", nil)
	if err == nil || !strings.Contains(err.Error(), "unexpected ID") {
		t.Fatalf("a server presenting rail-stub was taken for lock-server: %v", err)
	}
}

func TestReloadServesANewCertificateAndKeepsTheOldOnABrokenOne(t *testing.T) {
	dir := certs(t, CertsOptions{})
	src := load(t, dir, NameLockServer)
	first := src.cur.Load().svid.Certificates[0].SerialNumber

	// A broken file: the old material stays.
	set := Files(dir, NameLockServer)
	if err := os.WriteFile(set.CertFile+".tmp", []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(set.CertFile+".tmp", set.CertFile); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err == nil {
		t.Fatal("a broken certificate file was taken")
	}
	if src.cur.Load().svid.Certificates[0].SerialNumber.Cmp(first) != 0 {
		t.Fatal("a broken file replaced the served certificate")
	}

	// A new SVID set from the same authority is not possible with WriteCerts
	// (it makes a new one), so rotate the whole set, as a new authority rollout
	// would, by renaming a fresh set's files into place.
	rotate(t, dir, certs(t, CertsOptions{}), "ca.pem", NameLockServer+".pem", NameLockServer+".key")
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if src.cur.Load().svid.Certificates[0].SerialNumber.Cmp(first) == 0 {
		t.Fatal("the new certificate is not served")
	}
}

func TestWriteCertsRefusesToOverwrite(t *testing.T) {
	dir := certs(t, CertsOptions{Names: []string{"a"}})
	before, _ := os.ReadFile(filepath.Join(dir, "a.pem"))
	err := WriteCerts(CertsOptions{Dir: dir, Names: []string{"b", "a"}})
	if !errors.Is(err, ErrExists) {
		t.Fatalf("WriteCerts over an existing set: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.pem")); err == nil {
		t.Error("b.pem was written although the set could not be")
	}
	after, _ := os.ReadFile(filepath.Join(dir, "a.pem"))
	if string(before) != string(after) {
		t.Error("a.pem was overwritten")
	}
	for _, f := range []string{"ca.key", "a.key"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", f, fi.Mode().Perm(), err)
		}
	}
}

func TestCheckRefusesMissingIdentityUnlessUnsafe(t *testing.T) {
	var ue *serve.UsageError
	err := Settings{CertFile: "c", KeyFile: "k"}.Check()
	if !errors.As(err, &ue) || !strings.HasPrefix(ue.Msg, "invalid TLS_CA_FILE") {
		t.Fatalf("Check without TLS_CA_FILE: %v", err)
	}
	if err := (Settings{UnsafeNoAuth: true}).Check(); err != nil {
		t.Fatalf("UNSAFE_NO_AUTH did not lift the refusal: %v", err)
	}
	if err := (Settings{CertFile: "c", KeyFile: "k", CAFile: "a"}).CheckURL("X_URL", "http://h:1"); err == nil {
		t.Fatal("an http:// URL was taken with TLS set")
	}
}

// get makes one HTTP/1.1 request on a fresh TLS connection made with cfg, and
// reports whether the session resumed and the answer's status. The response is
// read whole, so a TLS 1.3 session ticket sent after the handshake is taken.
func get(t *testing.T, addr string, cfg *tls.Config) (resumed bool, status int, err error) {
	t.Helper()
	d := &tls.Dialer{Config: cfg, NetDialer: &net.Dialer{Timeout: 5 * time.Second}}
	c, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		return false, 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "POST /do HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"); err != nil {
		return false, 0, err
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c.(*tls.Conn).ConnectionState().DidResume, 0, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return c.(*tls.Conn).ConnectionState().DidResume, res.StatusCode, nil
}

// A resumed session is verified again against the bundle as it is now: a
// client whose authority has left the server's bundle is not let back in on a
// session ticket, while before the rotation resumption works (a reconnect
// pays no full handshake).
func TestResumedSessionIsVerifiedAgainstTheCurrentBundle(t *testing.T) {
	dir := certs(t, CertsOptions{})
	server := load(t, dir, NameLockServer)
	url, _ := serveGuarded(t, server, []spiffeid.ID{spiffeid.RequireFromString(DefaultID(NameExecutor))})
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "https://"), "/do")
	cfg := load(t, dir, NameExecutor).ClientConfig(server.ID())

	if _, status, err := get(t, addr, cfg); err != nil || status != 200 {
		t.Fatalf("first call: %d %v", status, err)
	}
	resumed, status, err := get(t, addr, cfg)
	if err != nil || status != 200 || !resumed {
		t.Fatalf("second call: resumed %v, %d %v; want a resumed session answered 200", resumed, status, err)
	}

	// The server's whole set moves to a new authority; the client keeps its
	// ticket and its old certificate.
	rotate(t, dir, certs(t, CertsOptions{}), "ca.pem", NameLockServer+".pem", NameLockServer+".key")
	if err := server.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, status, err := get(t, addr, cfg); err == nil && status == 200 {
		t.Fatal("a client of the old authority was answered on a resumed session after the bundle moved on")
	}
}

// rotate renames the files of src over those of dir, one by one, as Kubernetes
// and cert-manager replace mounted files.
func rotate(t *testing.T, dir, src string, files ...string) {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f+".tmp"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, f+".tmp"), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}
