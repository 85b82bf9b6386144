package workload_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/lockclient"
	"lock.dev/workload"
)

// writeCerts writes an authority and SVIDs for names into a new directory.
func writeCerts(t *testing.T, names ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir, Names: names}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serveAs runs an HTTPS server with the SVID of name in dir, requiring a client
// certificate from dir's authority; it answers the caller's SPIFFE ID.
func serveAs(t *testing.T, dir, name string) string {
	t.Helper()
	src, err := identity.Load(identity.Files(dir, name), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.TLS.PeerCertificates[0].URIs[0].String())
	}))
	srv.Listener = tls.NewListener(srv.Listener, src.ServerConfig())
	srv.Start()
	t.Cleanup(srv.Close)
	return "https://" + srv.Listener.Addr().String()
}

// call makes one request with cfg on a fresh connection and returns the answer.
func call(url string, cfg *tls.Config) (string, error) {
	tr := &http.Transport{TLSClientConfig: cfg, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// The client's configuration presents the workload's SVID and accepts only the
// server it names, by SPIFFE ID.
func TestClientTLSAcceptsOnlyTheExpectedServer(t *testing.T) {
	t.Parallel()
	dir := writeCerts(t, identity.NameLockServer, identity.NamePaymentResource, identity.NameExecutor)
	url := serveAs(t, dir, identity.NameLockServer)
	id, err := workload.Load(workload.FilesIn(dir, identity.NameExecutor), nil)
	if err != nil {
		t.Fatal(err)
	}
	if id.ID() != "spiffe://lock.dev/executor" {
		t.Errorf("ID() = %s", id.ID())
	}
	cfg, err := id.ClientTLS("spiffe://lock.dev/lock-server")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := call(url, cfg); err != nil || got != "spiffe://lock.dev/executor" {
		t.Errorf("calling lock-server: %q %v, want it to see spiffe://lock.dev/executor", got, err)
	}
	other, err := id.ClientTLS("spiffe://lock.dev/payment-resource")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := call(url, other); err == nil {
		t.Errorf("a client expecting payment-resource accepted lock-server (answer %q)", got)
	}
	if _, err := id.ClientTLS("lock-server"); err == nil {
		t.Error("ClientTLS accepted a server that is no SPIFFE ID")
	}
	if _, err := workload.Load(workload.FilesIn(dir, "nobody"), nil); err == nil || !strings.Contains(err.Error(), "workload:") {
		t.Errorf("Load of missing files: %v", err)
	}
}

// Reload serves rotated files from the next handshake on: a server of a new
// authority is reached only once the workload's files hold that authority's
// SVID and bundle.
func TestReloadFollowsRotation(t *testing.T) {
	t.Parallel()
	oldSet := writeCerts(t, identity.NameExecutor)
	newSet := writeCerts(t, identity.NameLockServer, identity.NameExecutor)
	live := t.TempDir()
	install := func(from string) {
		t.Helper()
		src, dst := workload.FilesIn(from, identity.NameExecutor), workload.FilesIn(live, identity.NameExecutor)
		for _, f := range [][2]string{{src.Cert, dst.Cert}, {src.Key, dst.Key}, {src.Bundle, dst.Bundle}} {
			b, err := os.ReadFile(f[0])
			if err != nil {
				t.Fatal(err)
			}
			// A rename, as a rotation replaces the files.
			if err := os.WriteFile(f[1]+".new", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(f[1]+".new", f[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(oldSet)
	id, err := workload.Load(workload.FilesIn(live, identity.NameExecutor), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := id.ClientTLS("spiffe://lock.dev/lock-server")
	if err != nil {
		t.Fatal(err)
	}
	url := serveAs(t, newSet, identity.NameLockServer)
	if _, err := call(url, cfg); err == nil {
		t.Fatal("a server of another authority was reached before the rotation")
	}
	install(newSet)
	if err := id.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, err := call(url, cfg); err != nil || got != "spiffe://lock.dev/executor" {
		t.Errorf("after the rotation: %q %v", got, err)
	}
}

// A worker's client of lock-server, over mutual TLS as the executor workload.
func Example() {
	dir, err := os.MkdirTemp("", "svids")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	// `lock-server certs --out dir` writes these for demos; in production the
	// files come from SPIRE or cert-manager's csi-driver-spiffe.
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir, Names: []string{"lock-server", "executor"}}); err != nil {
		fmt.Println(err)
		return
	}

	id, err := workload.Load(workload.FilesIn(dir, "executor"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// go id.Watch(ctx) would re-read the files as they rotate.
	cfg, err := id.ClientTLS("spiffe://lock.dev/lock-server")
	if err != nil {
		fmt.Println(err)
		return
	}
	locks, err := lockclient.New("https://lock-server:8081", lockclient.WithTLSConfig(cfg))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = locks // locks.Lock(ctx, name, owner, ttl) …
	fmt.Println("calling lock-server as", id.ID())
	// Output: calling lock-server as spiffe://lock.dev/executor
}
