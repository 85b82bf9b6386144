package stack_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// The stack runs with identities by default (docs/contracts/workload-identity.md):
// every service is https with its own SVID, a plaintext call or a certificate of
// another authority gets nothing, and a tap in front of lock-server calls it as
// the caller — the executor acquires (and the tap records the token), ops,
// without the holder role, is refused 403 FORBIDDEN through the same tap. Close
// removes the throwaway certificates.
func TestStackRunsWithIdentitiesAndTheTapCallsAsTheCaller(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := &logcapture.Buffer{}
	defer func() {
		if t.Failed() {
			t.Logf("service warnings and errors:\n%s", logs.Problems(60))
		}
	}()
	s, err := stack.Start(ctx, stack.Options{Tap: true, Log: logs})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = s.Close()
		}
	}()
	if s.CertsDir == "" || !s.Secure() {
		t.Fatalf("the stack runs without identities by default (CertsDir %q)", s.CertsDir)
	}
	if _, err := os.Stat(filepath.Join(s.CertsDir, "ca.pem")); err != nil {
		t.Fatal(err)
	}
	for name, u := range map[string]string{identity.NameLockServer: s.LockServerURL, identity.NamePaymentResource: s.PaymentURL,
		identity.NameRailProxy: s.ProxyURL, identity.NameRailStub: s.StubURL} {
		resp, err := s.HTTPClient(identity.NameOps, name).Get(u + "/readyz")
		if err != nil {
			t.Fatalf("%s over mutual TLS as ops: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s readyz: %d", name, resp.StatusCode)
		}
		if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + u[len("https://"):] + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("%s answered a plaintext readyz 200", name)
			}
		}
	}

	tapURL := s.ServiceURLs()["LOCK_SERVER_URL"]
	lc, err := lockclient.New(tapURL, lockclient.WithTLSConfig(s.ClientTLS(identity.NameExecutor, identity.NameLockServer)))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := lc.Acquire(ctx, "account:acct-01", "exec-a", 10*time.Second)
	if err != nil {
		t.Fatalf("the executor acquires through the tap: %v", err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	issued := s.IssuedTokens()
	if len(issued) != 1 || issued[0].Token != lease.Token() || issued[0].LockName != "account:acct-01" {
		t.Errorf("the tap recorded %+v, want token %d of account:acct-01", issued, lease.Token())
	}

	ops, err := lockclient.New(tapURL, lockclient.WithTLSConfig(s.ClientTLS(identity.NameOps, identity.NameLockServer)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ops.Acquire(ctx, "account:acct-02", "ops-a", 10*time.Second)
	var le *lockclient.Error
	if !errors.As(err, &le) || le.Status != http.StatusForbidden || le.Code != lockapi.CodeForbidden {
		t.Errorf("ops acquiring through the tap: %v, want 403 %s (the tap must call as the caller)", err, lockapi.CodeForbidden)
	}

	// A workload of another authority fails the tap's handshake.
	other := filepath.Join(t.TempDir(), "other")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: other}); err != nil {
		t.Fatal(err)
	}
	src, err := identity.Load(identity.Files(other, identity.NameExecutor), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cfg := src.ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameLockServer)))
	foreign := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	if resp, err := foreign.Get(tapURL + "/readyz"); err == nil {
		resp.Body.Close()
		t.Errorf("a certificate of another authority was answered %d by the tap", resp.StatusCode)
	}

	dir := s.CertsDir
	closed = true
	_ = lease.Release(ctx)
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the certificates outlive Close: %v", err)
	}
}
