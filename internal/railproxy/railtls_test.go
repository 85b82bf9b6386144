package railproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
	"lock.dev/internal/serve"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// The hop to the rail over TLS (docs/contracts/rail-proxy.md, "The hop to the
// rail over TLS"): rail-stub verified by its SPIFFE ID, a real rail by its host
// name, and which refusals of a handshake leave a payment UNSENT.

// writeRailCerts is a throwaway authority with every default workload's SVID.
func writeRailCerts(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startTLSStub runs a real rail-stub (railstub.Run) serving mutual TLS with
// name's SVID from certs — rail-stub's, or another workload's for a rail that
// is not who the proxy expects — and reads and steers it as ops.
func startTLSStub(t testing.TB, certs, name string, latencyMs int) *stub {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := railstub.DefaultConfig()
	seed := int64(1)
	cfg.Listener, cfg.LogOutput, cfg.LogLevel, cfg.Seed, cfg.LatencyMs = ln, io.Discard, "error", &seed, latencyMs
	cfg.Identity = identity.Files(certs, name)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- railstub.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("rail-stub Run: %v", err)
		}
	})
	url := "https://" + ln.Addr().String()
	ops := railstub.NewTLSClient(url, clientSource(t, certs, identity.NameOps).ClientConfig(spiffeid.RequireFromString(identity.DefaultID(name))))
	testkit.Eventually(t, 10*time.Second, "rail-stub to be healthy", func() bool { return ops.Health(context.Background()) == nil })
	return &stub{URL: url, Client: ops}
}

func clientSource(t testing.TB, certs, name string) *identity.Source {
	t.Helper()
	src, err := identity.Load(identity.Files(certs, name), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// tlsRail is a TLS server on a loopback port, each connection served by serve
// once its handshake is done; it counts handshakes refused and connections
// whose handler ran.
type tlsRail struct {
	URL string

	mu      sync.Mutex
	refused []error
	handled int
	resumed int
	refs    map[string]int
}

func newTLSRail(t testing.TB, cfg *tls.Config, serve func(conn *tls.Conn, r *tlsRail)) *tlsRail {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tlsRail{URL: "https://" + ln.Addr().String(), refs: map[string]int{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				tc := tls.Server(c, cfg)
				defer tc.Close()
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					// As net/http does: the alert is sent, the connection closed.
					r.mu.Lock()
					r.refused = append(r.refused, err)
					r.mu.Unlock()
					return
				}
				r.mu.Lock()
				r.handled++
				if tc.ConnectionState().DidResume {
					r.resumed++
				}
				r.mu.Unlock()
				serve(tc, r)
			})
		}
	})
	return r
}

func (r *tlsRail) counts() (refused, handled, resumed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.refused), r.handled, r.resumed
}

// answerAll answers every payment on the connection ACCEPTED, keeping it alive.
func answerAll(conn *tls.Conn, r *tlsRail) {
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		var p railPayment
		_ = json.NewDecoder(req.Body).Decode(&p)
		r.mu.Lock()
		r.refs[p.Reference]++
		r.mu.Unlock()
		reply := fmt.Sprintf(`{"status":"ACCEPTED","railReference":"RS-%s"}`, p.Reference)
		if _, err := fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(reply), reply); err != nil {
			return
		}
	}
}

// readThenClose reads the request and closes without a byte of reply.
func readThenClose(conn *tls.Conn, r *tlsRail) {
	if req, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
		var p railPayment
		_ = json.NewDecoder(req.Body).Decode(&p)
		r.mu.Lock()
		r.refs[p.Reference]++
		r.mu.Unlock()
	}
}

// serverTLS is a rail's TLS 1.3 configuration presenting name's SVID from
// certs and requiring a client certificate from clientCAs' authority.
func serverTLS(t testing.TB, certs, name, clientCAs string) *tls.Config {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(filepath.Join(certs, name+".pem"), filepath.Join(certs, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{kp}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: pool(t, filepath.Join(clientCAs, "ca.pem")), MinVersion: tls.VersionTLS13}
}

func pool(t testing.TB, file string) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", file)
	}
	return p
}

// tlsProxy starts a rail-proxy serving mutual TLS with rail-proxy's SVID from
// certs in front of railURL, and returns it with an executor's client.
func tlsProxy(t *testing.T, certs, railURL string, mutate func(*Config)) (*proxy, *http.Client, dbq) {
	t.Helper()
	dbURL := pgtest.PaydbURL(t)
	cfg := testConfig(dbURL, railURL)
	cfg.Identity = identity.Files(certs, identity.NameRailProxy)
	// About the rail hop, not grants (docs/contracts/workload-identity.md): the
	// proxy serves and calls mutual TLS, and verifies no grant.
	cfg.Identity.UnsafeNoAuth = true
	if mutate != nil {
		mutate(&cfg)
	}
	executor := tlsClient(t, identity.Files(certs, identity.NameExecutor))
	return startTLSProxy(t, cfg, executor), executor, pgtest.Pool(t, dbURL)
}

// submitTLS presents a submission as the executor, with a grant when the proxy
// verifies them.
func submitTLS(t *testing.T, c *http.Client, baseURL string, token int64, p payout) answer {
	t.Helper()
	return presentAs(t, c, baseURL, token, "worker-1", "", p)
}

// unsentAtDial checks a submission answered 503 RAIL_UNAVAILABLE stage dial
// with one UNSENT row.
func unsentAtDial(t *testing.T, a answer, db dbq, payoutID string) {
	t.Helper()
	if a.Status != http.StatusServiceUnavailable || a.code() != lockapi.CodeRailUnavailable || a.str("stage") != "dial" {
		t.Fatalf("answer: %+v, want 503 RAIL_UNAVAILABLE stage dial", a)
	}
	if rs := rowsOf(t, db, payoutID); len(rs) != 1 || outcomeOf(rs[0]) != "UNSENT" {
		t.Fatalf("rows: %+v, want one UNSENT", rs)
	}
}

// Over mutual TLS to a real rail-stub the payment is made, and a rail that
// presents another workload's SVID fails the handshake: nothing was sent, the
// submission is UNSENT at stage dial and the stub's call log is empty.
func TestRailPresentingAnotherIDIsUnsent(t *testing.T) {
	t.Parallel()
	certs := writeRailCerts(t)
	good := startTLSStub(t, certs, identity.NameRailStub, 0)
	p, executor, db := tlsProxy(t, certs, good.URL, nil)
	if a := submitTLS(t, executor, p.URL, 1, newPayout("p-tls-ok", "acct-tls")); a.Status != http.StatusOK {
		t.Fatalf("over mutual TLS to rail-stub: %+v", a)
	}
	if rs := rowsOf(t, db, "p-tls-ok"); len(rs) != 1 || outcomeOf(rs[0]) != "ACKED" {
		t.Fatalf("rows: %+v", rs)
	}
	if n := good.callsFor(t, "p-tls-ok"); n != 1 {
		t.Fatalf("rail-stub booked p-tls-ok %d times", n)
	}

	impostor := startTLSStub(t, certs, identity.NameLockServer, 0) // a real stub, with lock-server's SVID
	p2, executor, db2 := tlsProxy(t, certs, impostor.URL, nil)
	unsentAtDial(t, submitTLS(t, executor, p2.URL, 1, newPayout("p-impostor", "acct-imp")), db2, "p-impostor")
	if cs := impostor.calls(t); len(cs) != 0 {
		t.Fatalf("the rail presenting another ID was called: %+v", cs)
	}
	ev := p2.Logs.events("rail_unavailable")
	if len(ev) != 1 || ev[0]["stage"] != "dial" || !strings.Contains(fmt.Sprint(ev[0]["error"]), "unexpected ID") {
		t.Fatalf("rail_unavailable: %v", ev)
	}
}

// A rail that requires a client certificate of another authority refuses ours
// under TLS 1.3 only after the proxy wrote the request (the client's side of
// the handshake ends with its Finished): its alert, read before any byte of a
// reply, means the rail's application never had the request — UNSENT at stage
// dial, and the rail's handler never ran.
func TestRailRefusingOurCertificateAfterTheWriteIsUnsent(t *testing.T) {
	t.Parallel()
	certs, otherCA := writeRailCerts(t), writeRailCerts(t)
	rail := newTLSRail(t, serverTLS(t, certs, identity.NameRailStub, otherCA), answerAll)
	p, executor, db := tlsProxy(t, certs, rail.URL, nil)
	unsentAtDial(t, submitTLS(t, executor, p.URL, 1, newPayout("p-refused", "acct-ref")), db, "p-refused")
	refused, handled, _ := rail.counts()
	if handled != 0 || refused == 0 {
		t.Fatalf("the rail refused %d handshakes and ran its handler %d times; want refusals and no handler", refused, handled)
	}
	ev := p.Logs.events("rail_unavailable")
	if len(ev) != 1 || !strings.Contains(fmt.Sprint(ev[0]["error"]), errHandshakeRefused.Error()) {
		t.Fatalf("rail_unavailable: %v", ev)
	}
	if ev := p.Logs.events("rail_ambiguous"); len(ev) != 0 {
		t.Fatalf("rail_ambiguous: %v", ev)
	}
}

// A rail that completes the handshake, reads the request and closes without a
// byte of reply may have acted: the TLS rule changes nothing, TIMEOUT as ever.
func TestRailClosingAfterTheHandshakeStaysAmbiguous(t *testing.T) {
	t.Parallel()
	certs := writeRailCerts(t)
	rail := newTLSRail(t, serverTLS(t, certs, identity.NameRailStub, certs), readThenClose)
	p, executor, db := tlsProxy(t, certs, rail.URL, nil)
	a := submitTLS(t, executor, p.URL, 1, newPayout("p-closed", "acct-closed"))
	if a.code() != lockapi.CodeRailAmbiguous {
		t.Fatalf("answer: %+v, want RAIL_AMBIGUOUS", a)
	}
	if rs := rowsOf(t, db, "p-closed"); len(rs) != 1 || outcomeOf(rs[0]) != "TIMEOUT" {
		t.Fatalf("rows: %+v, want one TIMEOUT", rs)
	}
	if _, handled, _ := rail.counts(); handled == 0 {
		t.Fatal("the rail's handler never ran")
	}
	if ev := p.Logs.events("rail_ambiguous"); len(ev) != 1 || ev[0]["cause"] != CauseConnectionDropped {
		t.Fatalf("rail_ambiguous: %v", ev)
	}
}

// The payment hop over mutual TLS keeps its connection alive between calls,
// and a new connection resumes the TLS session of the last: the callbacks and
// the session cache of the identity's configuration survive its clones.
func TestRailTLSKeepsConnectionsAndResumesSessions(t *testing.T) {
	t.Parallel()
	certs := writeRailCerts(t)
	rail := newTLSRail(t, serverTLS(t, certs, identity.NameRailStub, certs), answerAll)
	tc := clientSource(t, certs, identity.NameRailProxy).ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameRailStub)))
	c := newRailClientTLS(hopConfig(rail.URL), tc)
	defer c.close()
	pay := func(ref string) {
		t.Helper()
		if rc := c.Pay(context.Background(), railPayment{Reference: ref, AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}.payment()); rc.Result != RailAccepted {
			t.Fatalf("%s: %+v", ref, rc)
		}
	}
	pay("k-1")
	pay("k-2")
	if _, handled, _ := rail.counts(); handled != 1 {
		t.Fatalf("two payments took %d connections, want one kept alive", handled)
	}
	c.hop.CloseIdleConnections()
	pay("k-3")
	if _, handled, resumed := rail.counts(); handled != 2 || resumed != 1 {
		t.Fatalf("after the pool was emptied: %d connections, %d resumed; want the second to resume the first's session", handled, resumed)
	}
}

// A real rail is no SPIFFE workload: with RAIL_TLS_SERVER_NAME the proxy
// speaks ordinary TLS — 1.2 allowed, the host name verified against
// RAIL_TLS_CA_FILE, its client certificate from RAIL_TLS_CERT_FILE — and a
// rail whose certificate does not name that host fails the handshake, UNSENT.
func TestRealRailOverOrdinaryTLS(t *testing.T) {
	t.Parallel()
	certs, clientCerts := writeRailCerts(t), writeRailCerts(t)
	srv := serverTLS(t, certs, identity.NameRailStub, clientCerts) // its leaf names localhost and rail-stub
	srv.MinVersion, srv.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	rail := newTLSRail(t, srv, answerAll)
	rt := RailTLS{ServerName: "localhost", CAFile: filepath.Join(certs, "ca.pem"),
		CertFile: filepath.Join(clientCerts, "ops.pem"), KeyFile: filepath.Join(clientCerts, "ops.key")}
	tc, err := realRailTLS(rt, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c := newRailClientTLS(hopConfig(rail.URL), tc)
	defer c.close()
	if rc := c.Pay(context.Background(), railPayment{Reference: "r-1", AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}.payment()); rc.Result != RailAccepted {
		t.Fatalf("to a TLS 1.2 rail named localhost: %+v", rc)
	}

	rt.ServerName = "rail.example"
	tc, err = realRailTLS(rt, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c2 := newRailClientTLS(hopConfig(rail.URL), tc)
	defer c2.close()
	rc := c2.Pay(context.Background(), railPayment{Reference: "r-2", AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}.payment())
	var host x509.HostnameError
	if rc.Result != RailUnsent || !errors.As(rc.Err, &host) {
		t.Fatalf("to a rail not named rail.example: %+v, want UNSENT on the host name", rc)
	}
	rail.mu.Lock()
	defer rail.mu.Unlock()
	if rail.refs["r-2"] != 0 || rail.refs["r-1"] != 1 {
		t.Fatalf("the rail read %v", rail.refs)
	}
}

// Which alerts leave a payment UNSENT: those only a handshake sends, received
// from the rail; never one this side sent, nor one any record layer may send.
func TestHandshakeAlertsArePrecise(t *testing.T) {
	t.Parallel()
	remote := func(a uint8) error {
		return fmt.Errorf("read: %w", &net.OpError{Op: "remote error", Err: tls.AlertError(a)})
	}
	for _, a := range []uint8{40, 42, 48, 70, 116} {
		if _, ok := handshakeAlert(remote(a)); !ok {
			t.Errorf("alert %d received is a handshake refusal", a)
		}
	}
	for _, a := range []uint8{0, 10, 20, 50, 80, 90, 100} {
		if _, ok := handshakeAlert(remote(a)); ok {
			t.Errorf("alert %d is no handshake refusal", a)
		}
	}
	if _, ok := handshakeAlert(&net.OpError{Op: "local error", Err: tls.AlertError(42)}); ok {
		t.Error("an alert this side sent counts as the rail's refusal")
	}
	if _, ok := handshakeAlert(io.EOF); ok {
		t.Error("EOF counts as a handshake refusal")
	}
}

// The rail hop's settings are refused at parse, exit 2 naming the setting:
// RAIL_BASE_URL must be https once the proxy has an identity or a real rail's
// name; RAIL_ID must be a SPIFFE ID and not given for a real rail; the real
// rail's files only go with its name, the certificate with its key. Files that
// cannot be used are refused at start, naming their setting.
func TestRailTLSSettingsAreChecked(t *testing.T) {
	t.Parallel()
	certs := writeRailCerts(t)
	id := fmt.Sprintf("TLS_CERT_FILE=%s,TLS_KEY_FILE=%s,TLS_CA_FILE=%s", filepath.Join(certs, "rail-proxy.pem"),
		filepath.Join(certs, "rail-proxy.key"), filepath.Join(certs, "ca.pem"))
	for _, tc := range []struct {
		vars string
		name string
	}{
		{id + ",RAIL_BASE_URL=http://rail:8084", "RAIL_BASE_URL"},
		{"UNSAFE_NO_AUTH=true,RAIL_ID=rail-stub", "RAIL_ID"},
		{"UNSAFE_NO_AUTH=true,RAIL_TLS_CA_FILE=/x", "RAIL_TLS_CA_FILE"},
		{"UNSAFE_NO_AUTH=true,RAIL_TLS_CERT_FILE=/x", "RAIL_TLS_CERT_FILE"},
		{"UNSAFE_NO_AUTH=true,RAIL_TLS_SERVER_NAME=rail.example,RAIL_BASE_URL=http://rail:8084", "RAIL_BASE_URL"},
		{"UNSAFE_NO_AUTH=true,RAIL_TLS_SERVER_NAME=rail.example,RAIL_BASE_URL=https://rail:8084,RAIL_ID=spiffe://lock.dev/rail-stub", "RAIL_ID"},
		{"UNSAFE_NO_AUTH=true,RAIL_TLS_SERVER_NAME=rail.example,RAIL_BASE_URL=https://rail:8084,RAIL_TLS_CERT_FILE=/x", "RAIL_TLS_KEY_FILE"},
		{"UNSAFE_NO_AUTH=true,RAIL_TLS_SERVER_NAME=rail.example,RAIL_BASE_URL=https://rail:8084,RAIL_TLS_KEY_FILE=/x", "RAIL_TLS_CERT_FILE"},
	} {
		vars := map[string]string{}
		for _, kv := range strings.Split(tc.vars, ",") {
			k, v, _ := strings.Cut(kv, "=")
			vars[k] = v
		}
		_, _, err := ParseConfig(nil, func(k string) string { return vars[k] })
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, tc.name) {
			t.Errorf("%s: %v, want a UsageError naming %s", tc.vars, err, tc.name)
		}
	}
	vars := map[string]string{"UNSAFE_NO_AUTH": "true", "RAIL_TLS_SERVER_NAME": "rail.example", "RAIL_BASE_URL": "https://rail:8084"}
	if _, _, err := ParseConfig(nil, func(k string) string { return vars[k] }); err != nil {
		t.Fatalf("a real rail by its name: %v", err)
	}

	empty := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		r    RailTLS
		name string
	}{
		{RailTLS{ServerName: "rail.example", CAFile: filepath.Join(certs, "missing.pem")}, "RAIL_TLS_CA_FILE"},
		{RailTLS{ServerName: "rail.example", CAFile: empty}, "RAIL_TLS_CA_FILE"},
		{RailTLS{ServerName: "rail.example", CertFile: filepath.Join(certs, "missing.pem"), KeyFile: filepath.Join(certs, "ops.key")}, "RAIL_TLS_CERT_FILE"},
		{RailTLS{ServerName: "rail.example", CertFile: filepath.Join(certs, "ops.pem"), KeyFile: filepath.Join(certs, "missing.key")}, "RAIL_TLS_KEY_FILE"},
		{RailTLS{ServerName: "rail.example", CertFile: filepath.Join(certs, "ops.pem"), KeyFile: filepath.Join(certs, "executor.key")}, "RAIL_TLS_CERT_FILE"},
	} {
		_, err := realRailTLS(tc.r, slog.New(slog.DiscardHandler))
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, tc.name) {
			t.Errorf("%+v: %v, want a UsageError naming %s", tc.r, err, tc.name)
		}
	}
}

// A real rail's client certificate is re-read when its files change: the next
// handshake after the look presents the new one, and a broken new pair keeps
// the old one, logged tls_reload_failed.
func TestRealRailClientCertificateIsReRead(t *testing.T) {
	t.Parallel()
	a, b := writeRailCerts(t), writeRailCerts(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")
	put := func(src, name string) {
		t.Helper()
		for from, to := range map[string]string{filepath.Join(src, name+".pem"): cert, filepath.Join(src, name+".key"): key} {
			pem, err := os.ReadFile(from)
			if err != nil {
				t.Fatal(err)
			}
			// Replaced by a rename, as certificate managers do.
			if err := os.WriteFile(to+".tmp", pem, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(to+".tmp", to); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(a, identity.NameOps)
	logs := &syncBuffer{}
	kp, err := newKeyPairFiles(cert, key, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		t.Helper()
		c, err := kp.get(nil)
		if err != nil || c.Leaf == nil {
			t.Fatalf("get: %v", err)
		}
		return c.Leaf.SerialNumber.String()
	}
	first := serial()
	put(b, identity.NameOps)
	if got := serial(); got != first {
		t.Fatal("the files were re-read before keyPairReloadEvery passed")
	}
	kp.mu.Lock()
	kp.checked = time.Time{} // as if keyPairReloadEvery had passed
	kp.mu.Unlock()
	second := serial()
	if second == first {
		t.Fatal("a changed certificate was not re-read")
	}
	if err := os.WriteFile(cert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	kp.mu.Lock()
	kp.checked = time.Time{}
	kp.mu.Unlock()
	if got := serial(); got != second {
		t.Fatal("a broken file replaced the certificate in force")
	}
	if ev := logs.events("tls_reload_failed"); len(ev) != 1 {
		t.Fatalf("tls_reload_failed: %v", ev)
	}
}
