package main

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/testkit"
)

// With runMainEnv set the test binary is the executor itself: main() with the
// arguments after "--".
const runMainEnv = "EXECUTOR_RUN_MAIN"

func TestMain(m *testing.M) {
	if testkit.RunMainIfChild(runMainEnv, "executor", main) {
		return
	}
	os.Exit(m.Run())
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// The binary's surface with workload identity
// (docs/contracts/workload-identity.md, docs/contracts/executor.md): --help
// lists the identity and peer settings; without TLS settings (and without
// UNSAFE_NO_AUTH) it refuses to start, exit 2 naming TLS_CERT_FILE; with them,
// an http:// base URL is refused, exit 2 naming the setting; with https URLs it
// runs, its main port speaks only mutual TLS, HEALTH_ADDR answers probes
// plaintext, and SIGTERM ends it with exit 0.
func TestBinary(t *testing.T) {
	var out bytes.Buffer
	cmd := testkit.MainCommand(runMainEnv, nil, "--help")
	cmd.Stdout = &out
	if err := cmd.Run(); testkit.ExitCode(err) != 0 {
		t.Fatalf("--help: %v\n%s", err, out.String())
	}
	for _, s := range []string{"TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CA_FILE", "UNSAFE_NO_AUTH", "HEALTH_ADDR",
		"LOCK_SERVER_ID", "PAYMENT_RESOURCE_ID", "RAIL_PROXY_ID"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("--help lacks %s", s)
		}
	}

	certs := t.TempDir() + "/certs"
	if err := identity.WriteCerts(identity.CertsOptions{Dir: certs}); err != nil {
		t.Fatal(err)
	}
	f := identity.Files(certs, identity.NameExecutor)
	tlsEnv := []string{"TLS_CERT_FILE=" + f.CertFile, "TLS_KEY_FILE=" + f.KeyFile, "TLS_CA_FILE=" + f.CAFile}
	// Nothing listens at these: the executor runs, and its scans fail, anyway.
	dead := "https://" + freeAddr(t)
	https := []string{"LOCK_SERVER_URL=" + dead, "PAYMENT_RESOURCE_URL=" + dead, "RAIL_PROXY_URL=" + dead}
	for _, c := range []struct {
		env  []string
		name string
	}{
		{nil, "TLS_CERT_FILE"},
		{tlsEnv, "LOCK_SERVER_URL"}, // the http:// default
		{append(append([]string{}, tlsEnv...), "LOCK_SERVER_URL="+dead, "PAYMENT_RESOURCE_URL="+dead, "RAIL_PROXY_URL=http://127.0.0.1:8083"), "RAIL_PROXY_URL"},
		{append(append([]string{}, tlsEnv...), append(https, "PAYMENT_RESOURCE_ID=payment-resource")...), "PAYMENT_RESOURCE_ID"},
	} {
		_, stderr, code := testkit.RunMain(runMainEnv, c.env)
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, c.name) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line naming %s", c.env, code, stderr, c.name)
		}
	}

	addr, health := freeAddr(t), freeAddr(t)
	env := append(append([]string{"EXECUTOR_ADDR=" + addr, "HEALTH_ADDR=" + health, "EXECUTOR_POLL_INTERVAL=200ms"}, tlsEnv...), https...)
	cmd, lines := testkit.StartMain(t, runMainEnv, env)
	testkit.WaitHTTP(t, nil, 20*time.Second, "http://"+health+"/livez", http.StatusOK)

	// The main port: no answer to plaintext, nor to TLS without a certificate
	// from the bundle; /livez to a workload of the bundle (ops).
	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Get("http://" + addr + "/livez"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("the main port answered plaintext /livez 200")
		}
	}
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := noCert.Get("https://" + addr + "/livez"); err == nil {
		resp.Body.Close()
		t.Errorf("the main port answered TLS without a client certificate: %d", resp.StatusCode)
	}
	ops, err := identity.Load(identity.Files(certs, identity.NameOps), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	execID := spiffeid.RequireFromString(identity.DefaultID(identity.NameExecutor))
	mtls := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: ops.ClientConfig(execID)}}
	resp, err := mtls.Get("https://" + addr + "/livez")
	if err != nil {
		t.Fatalf("/livez over mutual TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/livez over mutual TLS: %d", resp.StatusCode)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var started, tlsOn bool
	for l := range lines {
		if !strings.Contains(l, `"service":"executor"`) {
			t.Errorf("log line without service=executor: %s", l)
		}
		started = started || strings.Contains(l, `"event":"executor_started"`) &&
			strings.Contains(l, `"lockServerId":"spiffe://lock.dev/lock-server"`) &&
			strings.Contains(l, `"railProxyId":"spiffe://lock.dev/rail-proxy"`)
		tlsOn = tlsOn || strings.Contains(l, `"event":"tls_enabled"`)
	}
	if !started || !tlsOn {
		t.Errorf("start-up lines: executor_started naming the peers %v, tls_enabled %v", started, tlsOn)
	}
	if err := cmd.Wait(); testkit.ExitCode(err) != 0 {
		t.Fatalf("after SIGTERM: exit %d", testkit.ExitCode(err))
	}
}
