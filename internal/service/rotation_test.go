package service

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/serve"
	"lock.dev/internal/testkit"
)

// replace puts src's files of names into dir the way Kubernetes and
// cert-manager do: each written beside and renamed over the old one.
func replace(t *testing.T, dir, src string, files ...string) {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f+".new"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, f+".new"), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

// A running service serves a rotated SVID without a restart, within the
// contract's 60 s; a broken file set keeps the certificate it serves and says
// so in the log (tls_reload_failed).
func TestRotatedCertificateIsServedWithoutARestart(t *testing.T) {
	root := t.TempDir()
	dir, next := filepath.Join(root, "certs"), filepath.Join(root, "next")
	for _, d := range []string{dir, next} {
		if err := identity.WriteCerts(identity.CertsOptions{Dir: d}); err != nil {
			t.Fatal(err)
		}
	}
	ln := listen(t)
	var log logcapture.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan *Service, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(Spec{Name: "demo-svc", Identity: identity.Files(dir, identity.NameLockServer), LogLevel: "info", LogOutput: &log,
			Listener: ln, Validate: func() error { return nil }},
			func(sv *Service) error {
				mux := http.NewServeMux()
				serve.Mount(mux, sv.Health, sv.Registry)
				return sv.Serve(ctx, serve.Handler(mux, sv.Logger), serve.Serve, func(string) { started <- sv })
			})
	}()
	var sv *Service
	select {
	case sv = <-started:
	case err := <-done:
		t.Fatalf("Run ended before serving: %v", err)
	}
	url := "https://" + ln.Addr().String() + "/livez"
	served := func(clientDir string) (serial string, ok bool) {
		src, err := identity.Load(identity.Files(clientDir, identity.NameExecutor), sv.Logger)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		cfg := src.ClientConfig(sv.Identity.ID())
		cfg.ClientSessionCache = nil // a full handshake each time: the certificate served now
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			got = cs.PeerCertificates[0].SerialNumber.String()
			return nil
		}
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
		res, err := c.Get(url)
		if err != nil {
			return "", false
		}
		res.Body.Close()
		return got, res.StatusCode == http.StatusOK
	}
	first, ok := served(dir)
	if !ok {
		t.Fatal("the service does not answer a workload of its bundle")
	}

	// A broken certificate file: the old one is still served, and the log says why.
	if err := os.WriteFile(filepath.Join(dir, "lock-server.pem.new"), []byte("-----BEGIN CERTIFICATE-----\nbroken\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "lock-server.pem.new"), filepath.Join(dir, "lock-server.pem")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Minute, "tls_reload_failed logged", func() bool {
		for _, l := range log.Lines() {
			if l["event"] == "tls_reload_failed" && l["level"] == "ERROR" {
				return true
			}
		}
		return false
	})
	if serial, ok := served(dir); !ok || serial != first {
		t.Fatalf("after a broken file the service serves %q (answered: %v), want the old certificate %s", serial, ok, first)
	}

	// The whole set moves on, as an authority's rotation does: the new
	// certificate is served within the contract's bound, with no restart.
	replace(t, dir, next, "ca.pem", "lock-server.pem", "lock-server.key")
	var now string
	testkit.Eventually(t, time.Minute, "the rotated certificate served", func() bool {
		serial, ok := served(next)
		now = serial
		return ok && serial != first
	})
	if now == first {
		t.Fatal("the old certificate is still served")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
}
