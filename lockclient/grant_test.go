package lockclient_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/grant"
	"lock.dev/internal/identity"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// A lease carries lock-server's signed grant of its token, naming the calling
// workload (wid); renewals keep it. The client calls over mutual TLS
// (WithTLSConfig) as the executor.
func TestLeaseGrant(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	if _, err := grant.Keygen(dir); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: certs, Names: []string{identity.NameLockServer, identity.NameExecutor}}); err != nil {
		t.Fatal(err)
	}
	executor, err := identity.Load(identity.Files(certs, identity.NameExecutor), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	url := startTLSLockServer(t, certs, filepath.Join(dir, grant.SigningKeyFile))
	c := newClient(t, url,
		lockclient.WithTLSConfig(executor.ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameLockServer)))))
	var lease *lockclient.Lease
	testkit.EventuallyState(t, 10*time.Second, "an acquire once the server is up", func() (bool, string) {
		lease, err = c.Acquire(context.Background(), "account:acct-1", "worker-1", 3*time.Second)
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	defer func() { _ = lease.Release(context.Background()) }()

	set, _, err := grant.ReadKeySet(filepath.Join(dir, grant.KeySetFile))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := grant.NewVerifier(set, 0)
	g := lease.Grant()
	claims, r := v.VerifyClaims(g, grant.Presented{Lock: "account:acct-1", Token: lease.Token(), Owner: "worker-1"})
	if r != nil {
		t.Fatalf("Lease.Grant() = %q does not verify: %v", g, r)
	}
	if claims.Workload != executor.ID().String() {
		t.Errorf("the grant names workload %q, want the executor %s", claims.Workload, executor.ID())
	}
	req := httptest.NewRequest(http.MethodPost, "http://resource/claim", nil)
	lease.SetHeaders(req)
	if got := req.Header.Values(lockapi.HeaderFencingGrant); len(got) != 1 || got[0] != g {
		t.Errorf("SetHeaders put %s %q, want the lease's grant", lockapi.HeaderFencingGrant, got)
	}
	first := lease.ExpiresAt()
	testkit.Eventually(t, 15*time.Second, "a renewal", func() bool {
		if err := lease.Err(); err != nil {
			t.Fatalf("no renewal: %v", err)
		}
		return lease.ExpiresAt().After(first)
	})
	if lease.Grant() != g {
		t.Errorf("the grant changed with a renewal")
	}
}

// Grant is "" when lock-server signs nothing, and follows what renewals answer.
func TestLeaseGrantFollowsRenewals(t *testing.T) {
	t.Parallel()
	var renewals atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l := lockapi.Lease{LockName: "account:a", OwnerID: "o", Token: 3, AcquiredAt: time.Now(),
			ExpiresAt: time.Now().Add(time.Second), TTLMs: 300}
		switch r.URL.Path {
		case "/v1/locks/account:a/acquire":
		case "/v1/locks/account:a/renew":
			// The first renewal answers the grant re-signed by a rotated key, the
			// next ones none (as if signing had been switched off): the last
			// grant answered stays.
			if renewals.Add(1) == 1 {
				l.Grant = "rotated"
			}
		default:
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(l)
	}))
	defer srv.Close()
	lease, err := newClient(t, srv.URL).Acquire(context.Background(), "account:a", "o", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	if lease.Grant() != "" {
		t.Errorf("Grant() = %q from an answer without one", lease.Grant())
	}
	testkit.Eventually(t, 5*time.Second, "three renewals", func() bool { return renewals.Load() >= 3 })
	if lease.Grant() != "rotated" {
		t.Errorf("Grant() = %q after renewals, want the one the renewal answered", lease.Grant())
	}
}

// startTLSLockServer runs a lock-server on a real lockdb serving mutual TLS as
// the lock-server SVID in certs (written by identity.WriteCerts), signing
// grants with keyFile ("" signs nothing), and returns its https URL.
func startTLSLockServer(t *testing.T, certs, keyFile string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := lockserver.DefaultConfig()
	cfg.LockdbURL = pgtest.LockdbURL(t)
	cfg.MinTTL = 100 * time.Millisecond
	cfg.UnsafeNonDurableDB = true // the throwaway test cluster runs with fsync off
	cfg.Listener = ln
	cfg.LogOutput = io.Discard
	cfg.SigningKeyFile = keyFile
	cfg.Identity = identity.Files(certs, identity.NameLockServer)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- lockserver.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("lock-server: %v", err)
		}
	})
	return "https://" + ln.Addr().String()
}
