package lockclient_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// A lease carries lock-server's signed grant of its token; renewals keep it.
func TestLeaseGrant(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	if _, err := grant.Keygen(dir); err != nil {
		t.Fatal(err)
	}
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
	cfg.SigningKeyFile = filepath.Join(dir, grant.SigningKeyFile)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- lockserver.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("lock-server: %v", err)
		}
	})
	c := lockclient.New("http://" + ln.Addr().String())
	var lease *lockclient.Lease
	for i := 0; ; i++ { // until the server is up
		if lease, err = c.Acquire(context.Background(), "account:acct-1", "worker-1", 3*time.Second); err == nil {
			break
		}
		if i > 500 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer func() { _ = lease.Release(context.Background()) }()

	set, _, err := grant.ReadKeySet(filepath.Join(dir, grant.KeySetFile))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := grant.NewVerifier(set, 0)
	g := lease.Grant()
	if r := v.Verify(g, grant.Presented{Lock: "account:acct-1", Token: lease.Token(), Owner: "worker-1"}); r != nil {
		t.Fatalf("Lease.Grant() = %q does not verify: %v", g, r)
	}
	first := lease.ExpiresAt()
	deadline := time.Now().Add(15 * time.Second)
	for !lease.ExpiresAt().After(first) { // renewed at least once
		if time.Now().After(deadline) || lease.Err() != nil {
			t.Fatalf("no renewal: %v", lease.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	lease, err := lockclient.New(srv.URL).Acquire(context.Background(), "account:a", "o", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	if lease.Grant() != "" {
		t.Errorf("Grant() = %q from an answer without one", lease.Grant())
	}
	deadline := time.Now().Add(5 * time.Second)
	for renewals.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("no renewals")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if lease.Grant() != "rotated" {
		t.Errorf("Grant() = %q after renewals, want the one the renewal answered", lease.Grant())
	}
}
