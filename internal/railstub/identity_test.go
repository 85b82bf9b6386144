package railstub

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/fastserve"
	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// writeCerts is a throwaway authority with every default workload's SVID.
func writeCerts(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// clientAs is a rail-stub client presenting name's SVID from dir and expecting
// the stub's.
func clientAs(t *testing.T, dir, name, url string) *Client {
	t.Helper()
	src, err := identity.Load(identity.Files(dir, name), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return NewTLSClient(url, src.ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameRailStub))))
}

// idStub is a stub with its identity served over mutual TLS the way Run serves
// it (identity.NewListener in front of fastserve), its handler wrapped by the
// conformance checker so that the 403s are checked against the document.
type idStub struct {
	*Stub
	URL  string
	dir  string
	logs *syncBuffer
}

func startIDStub(t *testing.T) *idStub { return startIDStubWith(t, nil) }

func startIDStubWith(t *testing.T, mutate func(*Config)) *idStub {
	t.Helper()
	dir := writeCerts(t)
	cfg := DefaultConfig()
	seed := int64(1)
	logs := &syncBuffer{}
	cfg.Seed, cfg.LogOutput, cfg.Identity = &seed, logs, identity.Files(dir, identity.NameRailStub)
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := conformance.Handler(s.Handler())
	if cfg.Protocol == ProtocolISO20022 {
		h = outsideDocument(s.Handler(), h)
	}
	srv := fastserve.NewFastServer(h, s.logger)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(identity.NewListener(ln, s.source.ServerConfig())) }()
	url := "https://" + ln.Addr().String()
	conformance.Track(t, url)
	t.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &idStub{Stub: s, URL: url, dir: dir, logs: logs}
}

func (s *idStub) as(t *testing.T, name string) *Client { return clientAs(t, s.dir, name, s.URL) }

// forbidden checks err is 403 FORBIDDEN naming name's identity.
func forbidden(t *testing.T, what string, err error, name string) {
	t.Helper()
	var p *lockapi.Problem
	if !errors.As(err, &p) || p.Status != http.StatusForbidden || p.Code != lockapi.CodeForbidden {
		t.Fatalf("%s: %v, want 403 FORBIDDEN", what, err)
	}
	var id string
	if _, err := p.Member("identity", &id); err != nil || id != identity.DefaultID(name) {
		t.Fatalf("%s: identity member %q (%v), want %s", what, id, err, identity.DefaultID(name))
	}
}

// Each route lets only its role through: a workload other than rail-proxy
// presenting a payment is refused 403 with no call booked; ops reads the call
// log, resets it and reads and sets chaos; rail-proxy pays and reads the call
// log but cannot touch chaos or reset the log; the rail's health needs no role.
// Each refusal is counted per route and logged.
func TestRolesGuardEachRoute(t *testing.T) {
	t.Parallel()
	s := startIDStub(t)
	ctx := t.Context()
	executor, proxy, ops := s.as(t, identity.NameExecutor), s.as(t, identity.NameRailProxy), s.as(t, identity.NameOps)

	_, err := executor.Pay(ctx, payment("p-exec"))
	forbidden(t, "executor pays", err, identity.NameExecutor)
	if cs, err := ops.Calls(ctx); err != nil || len(cs) != 0 {
		t.Fatalf("after a refused payment the call log holds %+v (%v), want nothing", cs, err)
	}
	if n, _ := s.calls.count(); n != 0 {
		t.Fatalf("the stub booked %d calls after a refused payment", n)
	}
	if reply, err := proxy.Pay(ctx, payment("p-proxy")); err != nil || reply.Status != ResultAccepted {
		t.Fatalf("rail-proxy pays: %+v %v", reply, err)
	}
	if cs, err := proxy.Calls(ctx); err != nil || len(cs) != 1 || cs[0].Reference != "p-proxy" {
		t.Fatalf("rail-proxy reads the call log: %+v %v", cs, err)
	}
	if cs, err := ops.Calls(ctx); err != nil || len(cs) != 1 {
		t.Fatalf("ops reads the call log: %+v %v", cs, err)
	}
	_, err = executor.Calls(ctx)
	forbidden(t, "executor reads the call log", err, identity.NameExecutor)

	_, err = proxy.SetChaos(ctx, 0, 1, 0, nil)
	forbidden(t, "rail-proxy sets chaos", err, identity.NameRailProxy)
	_, err = proxy.Chaos(ctx)
	forbidden(t, "rail-proxy reads chaos", err, identity.NameRailProxy)
	forbidden(t, "rail-proxy resets the call log", proxy.Reset(ctx), identity.NameRailProxy)
	if ch, err := ops.Chaos(ctx); err != nil || ch.DeclineRate != 0 {
		t.Fatalf("chaos after rail-proxy's refused change: %+v %v", ch, err)
	}
	if ch, err := ops.SetChaos(ctx, 0, 1, 0, nil); err != nil || ch.DeclineRate != 1 {
		t.Fatalf("ops sets chaos: %+v %v", ch, err)
	}
	if err := ops.Reset(ctx); err != nil {
		t.Fatalf("ops resets the call log: %v", err)
	}
	if err := executor.Health(ctx); err != nil {
		t.Fatalf("the rail's health needs a certificate and no role: %v", err)
	}

	metrics := metricsOf(t, executor, s.URL)
	for _, want := range []string{`authz_denied_total{route="pay"} 1`, `authz_denied_total{route="listCalls"} 1`,
		`authz_denied_total{route="resetCalls"} 1`, `authz_denied_total{route="getChaos"} 1`, `authz_denied_total{route="putChaos"} 1`,
		`tls_cert_expiry_seconds{file="cert"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	ev := s.logs.events(t, "forbidden")
	if len(ev) != 5 || ev[0]["identity"] != identity.DefaultID(identity.NameExecutor) || ev[0]["route"] != routePay {
		t.Fatalf("forbidden events: %v", ev)
	}
}

// In ISO 20022 mode the same roles guard the same duties: only rail-proxy
// presents a pain.001 (a refused one is not booked), the statement is the
// readers', the rail's health needs no role.
func TestISORolesGuardEachRoute(t *testing.T) {
	t.Parallel()
	s := startIDStubWith(t, func(c *Config) { c.Protocol = ProtocolISO20022 })
	ctx := t.Context()
	executor, proxy, ops := s.as(t, identity.NameExecutor), s.as(t, identity.NameRailProxy), s.as(t, identity.NameOps)
	doc := pain001(t, initiation("p-1"))
	do := func(c *Client, method, path string, body []byte) reply {
		t.Helper()
		ct := ""
		if body != nil {
			ct = "application/xml"
		}
		r, err := send(ctx, c.HTTP, s.URL, method, path, ct, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return r
	}
	problem(t, do(executor, http.MethodPost, "/iso20022/pain.001", doc), http.StatusForbidden, lockapi.CodeForbidden)
	if n, _ := s.calls.count(); n != 0 {
		t.Fatalf("the stub booked %d calls after a refused pain.001", n)
	}
	if rep := statusReport(t, do(proxy, http.MethodPost, "/iso20022/pain.001", doc)); rep.Status != StatusAccepted {
		t.Fatalf("rail-proxy pays: %+v", rep)
	}
	problem(t, do(executor, http.MethodGet, "/iso20022/camt.053", nil), http.StatusForbidden, lockapi.CodeForbidden)
	for _, c := range []*Client{proxy, ops} {
		r := do(c, http.MethodGet, "/iso20022/camt.053", nil)
		if r.status != http.StatusOK {
			t.Fatalf("a reader's statement: %d %s", r.status, r.body)
		}
		if st := readStatements(t, r.body); len(st) != 1 || len(st[0].Entries) != 1 {
			t.Fatalf("statement = %+v, want the one call", st)
		}
	}
	if r := do(executor, http.MethodGet, "/iso20022/health", nil); r.status != http.StatusOK {
		t.Fatalf("the rail's health needs a certificate and no role: %d", r.status)
	}
	metrics := metricsOf(t, executor, s.URL)
	for _, want := range []string{`authz_denied_total{route="payPain001"} 1`, `authz_denied_total{route="readCamt053"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func metricsOf(t *testing.T, c *Client, base string) string {
	t.Helper()
	r, err := send(t.Context(), c.HTTP, base, http.MethodGet, "/metrics", "", nil)
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("/metrics: %d %v", r.status, err)
	}
	return string(r.body)
}

// A caller whose certificate is from another authority, or that presents none,
// fails the handshake: the stub books nothing.
func TestStubRefusesCallersOutsideTheBundle(t *testing.T) {
	t.Parallel()
	s := startIDStub(t)
	other := writeCerts(t)
	if _, err := clientAs(t, other, identity.NameRailProxy, s.URL).Pay(t.Context(), payment("p-other")); err == nil {
		t.Fatal("a rail-proxy certificate of another authority was accepted")
	}
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if _, err := send(t.Context(), noCert, s.URL, http.MethodGet, "/rail/v1/health", "", nil); err == nil {
		t.Fatal("a caller without a certificate was answered")
	}
	if n, _ := s.calls.count(); n != 0 {
		t.Fatalf("the stub booked %d calls", n)
	}
}

// Run refuses to start without identity files unless UNSAFE_NO_AUTH lifts the
// refusal, naming the first empty setting (exit 2), and closes the listeners it
// was handed.
func TestRunRefusesWithoutIdentity(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Listener, cfg.LogOutput = ln, &syncBuffer{}
	err = Run(t.Context(), cfg)
	var ue *serve.UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "TLS_CERT_FILE") {
		t.Fatalf("Run without identity = %v, want a UsageError naming TLS_CERT_FILE", err)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("the handed-in listener is still open")
	}
	dir := writeCerts(t)
	cfg = DefaultConfig()
	cfg.Identity = identity.Files(dir, identity.NameRailStub)
	cfg.Identity.KeyFile = ""
	if err := Run(t.Context(), cfg); !errors.As(err, &ue) || !strings.Contains(ue.Msg, "TLS_KEY_FILE") {
		t.Fatalf("Run without a key = %v, want a UsageError naming TLS_KEY_FILE", err)
	}
	cfg.Identity = identity.Files(dir, identity.NameRailStub)
	cfg.Clients = "rail-proxy"
	if err := Run(t.Context(), cfg); !errors.As(err, &ue) || !strings.Contains(ue.Msg, "RAIL_STUB_CLIENTS") {
		t.Fatalf("Run with a role that is no SPIFFE ID = %v, want a UsageError naming RAIL_STUB_CLIENTS", err)
	}
}

// Run with identity files serves mutual TLS only, announces auth_enabled 1, and
// serves /livez, /readyz and /metrics — nothing else — plaintext on HEALTH_ADDR
// for probes that present no SVID. Under UNSAFE_NO_AUTH it serves plaintext and
// says so: auth_enabled 0 and auth_disabled at ERROR.
func TestRunServesMutualTLSAndProbesPlaintext(t *testing.T) {
	t.Parallel()
	dir := writeCerts(t)
	ln, hln := listen(t), listen(t)
	cfg := DefaultConfig()
	logs := &syncBuffer{}
	cfg.Listener, cfg.HealthListener, cfg.LogOutput = ln, hln, logs
	cfg.Identity = identity.Files(dir, identity.NameRailStub)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	url := "https://" + ln.Addr().String()
	proxy := clientAs(t, dir, identity.NameRailProxy, url)
	testkit.Eventually(t, 5*time.Second, "the stub to be healthy", func() bool { return proxy.Health(t.Context()) == nil })
	if reply, err := proxy.Pay(t.Context(), payment("p-1")); err != nil || reply.Status != ResultAccepted {
		t.Fatalf("rail-proxy pays over mutual TLS: %+v %v", reply, err)
	}
	if _, err := NewClient("http://"+ln.Addr().String()).Pay(t.Context(), payment("p-plain")); err == nil {
		t.Fatal("a plaintext payment was answered on the mutual-TLS listener")
	}
	health := "http://" + hln.Addr().String()
	for _, p := range []string{"/livez", "/readyz", "/metrics"} {
		if r := get(t, health+p); r.status != http.StatusOK {
			t.Fatalf("HEALTH_ADDR %s = %d", p, r.status)
		}
	}
	if r := get(t, health+"/rail/v1/calls"); r.status != http.StatusNotFound {
		t.Fatalf("HEALTH_ADDR serves the call log: %d", r.status)
	}
	m := string(get(t, health+"/metrics").body)
	for _, want := range []string{"auth_enabled 1", `authz_denied_total{route="pay"} 0`, `tls_cert_expiry_seconds{file="ca"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if ev := logs.events(t, "tls_enabled"); len(ev) != 1 || ev[0]["id"] != identity.DefaultID(identity.NameRailStub) {
		t.Fatalf("tls_enabled: %v", ev)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}

	// UNSAFE_NO_AUTH: plaintext, and said.
	ln, hln = listen(t), listen(t)
	cfg = DefaultConfig()
	logs = &syncBuffer{}
	cfg.Listener, cfg.HealthListener, cfg.LogOutput, cfg.Identity = ln, hln, logs, unsafeNoAuth()
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	go func() { done <- Run(ctx, cfg) }()
	plain := NewClient("http://" + ln.Addr().String())
	testkit.Eventually(t, 5*time.Second, "the stub to be healthy", func() bool { return plain.Health(t.Context()) == nil })
	if m := string(get(t, "http://"+hln.Addr().String()+"/metrics").body); !strings.Contains(m, "auth_enabled 0") {
		t.Error("auth_enabled is not 0 under UNSAFE_NO_AUTH")
	}
	if ev := logs.events(t, "auth_disabled"); len(ev) != 1 || ev[0]["level"] != "ERROR" {
		t.Fatalf("auth_disabled: %v", ev)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
