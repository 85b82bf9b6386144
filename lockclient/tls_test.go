package lockclient_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/identity"
	"lock.dev/lockclient"
	"lock.dev/workload"
)

// Over mutual TLS, with the configuration lock.dev/workload builds from the
// SVID files: the executor's Lock waits for lock-server to come up and holds
// the lock; ops, which lacks the holder role, is refused FORBIDDEN after one
// request, since asking again cannot give it the role.
func TestLockOverMutualTLS(t *testing.T) {
	t.Parallel()
	keys := filepath.Join(t.TempDir(), "keys")
	if _, err := grant.Keygen(keys); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: certs,
		Names: []string{identity.NameLockServer, identity.NameExecutor, identity.NameOps}}); err != nil {
		t.Fatal(err)
	}
	url := startTLSLockServer(t, certs, filepath.Join(keys, grant.SigningKeyFile))
	tlsAs := func(name string) *workload.Identity {
		id, err := workload.Load(workload.FilesIn(certs, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	cfg, err := tlsAs(identity.NameExecutor).ClientTLS(identity.DefaultID(identity.NameLockServer))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := newClient(t, url, lockclient.WithTLSConfig(cfg)).Lock(ctx, "account:tls", "worker-1", 3*time.Second)
	if err != nil {
		t.Fatalf("the executor's Lock: %v", err)
	}
	defer lease.Release(context.Background())
	if lease.Token() != 1 || lease.Grant() == "" {
		t.Errorf("lease token %d grant %q, want token 1 with a grant", lease.Token(), lease.Grant())
	}

	opsCfg, err := tlsAs(identity.NameOps).ClientTLS(identity.DefaultID(identity.NameLockServer))
	if err != nil {
		t.Fatal(err)
	}
	cnt := &acquireCounter{base: &http.Transport{TLSClientConfig: opsCfg}}
	t.Cleanup(cnt.base.CloseIdleConnections)
	ops := newClient(t, url, lockclient.WithHTTPClient(&http.Client{Transport: cnt}))
	if _, err := ops.Lock(ctx, "account:tls-ops", "ops-1", 3*time.Second); !errors.Is(err, lockclient.ErrForbidden) {
		t.Errorf("ops' Lock: %v, want ErrForbidden", err)
	}
	if n := cnt.acquires.Load(); n != 1 {
		t.Errorf("ops' Lock sent %d acquires, want 1", n)
	}
}
