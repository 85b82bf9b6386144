package adopttest

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/grant"
	"lock.dev/internal/identity"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// exampleDir is examples/adopt, from this package's directory.
const exampleDir = "../../examples/adopt"

// goTool runs the go command in the example module on a copy of its go.mod
// and go.sum (-modfile), so that resolving what the repository's go.mod now
// requires never rewrites the committed files.
func goTool(t *testing.T, ctx context.Context, args ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(exampleDir, f))
		if err != nil {
			t.Fatalf("examples/adopt/%s: %v", f, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// -modfile goes after the command's words (build; mod graph), before its
	// other flags and arguments.
	n := 0
	for n < len(args) && !strings.HasPrefix(args[n], "-") && args[n] != "." {
		n++
	}
	full := append(append(append([]string{}, args[:n]...), "-modfile="+filepath.Join(dir, "go.mod")), args[n:]...)
	cmd := exec.CommandContext(ctx, "go", full...)
	cmd.Dir = exampleDir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in examples/adopt: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// The example module — a worker with lockclient, a ledger behind fence's
// middleware and fencepg — run against a real lock-server with signed grants:
// the holder writes, a made-up token is refused 401, and once a newer holder
// has written the stale holder's write is 409 FENCED_OUT. With workload
// identity (mutual TLS everywhere, wid compared), and plaintext under
// UNSAFE_NO_AUTH=true, which the example's -unsafe-no-auth must say too.
func TestExampleRefusesTheStaleHolder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "adopt")
	goTool(t, ctx, "build", "-o", bin, ".")
	t.Run("mutual TLS", func(t *testing.T) { runExample(t, bin, true) })
	t.Run("plaintext, UNSAFE_NO_AUTH", func(t *testing.T) { runExample(t, bin, false) })
}

// runExample runs the example's binary against a lock-server of its own and
// checks what it says.
func runExample(t *testing.T, bin string, mtls bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	keys := filepath.Join(t.TempDir(), "keys")
	if _, err := grant.Keygen(keys); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: certs,
		Names: []string{identity.NameLockServer, identity.NameExecutor, "ledger"}}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := lockserver.DefaultConfig()
	cfg.LockdbURL = pgtest.LockdbURL(t)
	cfg.UnsafeNonDurableDB = true // the throwaway test cluster runs with fsync off
	cfg.LockdbMaxConns = 4
	cfg.Listener = ln
	cfg.LogOutput = io.Discard
	cfg.SigningKeyFile = filepath.Join(keys, grant.SigningKeyFile)
	cfg.Identity = identity.Files(certs, identity.NameLockServer)
	if !mtls {
		cfg.Identity = identity.Settings{UnsafeNoAuth: true}
	}
	sctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- lockserver.Run(sctx, cfg) }()
	t.Cleanup(func() {
		stop()
		if err := <-errc; err != nil {
			t.Errorf("lock-server: %v", err)
		}
	})

	args := []string{"-keys", filepath.Join(keys, grant.KeySetFile), "-db", pgtest.EmptyURL(t), "-account", "acct-7"}
	if mtls {
		executor, err := identity.Load(identity.Files(certs, identity.NameExecutor), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ready := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: executor.ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameLockServer)))}}
		testkit.WaitHTTP(t, ready, 30*time.Second, "https://"+ln.Addr().String()+"/readyz", http.StatusOK)
		args = append(args, "-lock-server", "https://"+ln.Addr().String(), "-certs", certs)
	} else {
		testkit.WaitHTTP(t, nil, 30*time.Second, "http://"+ln.Addr().String()+"/readyz", http.StatusOK)
		args = append(args, "-lock-server", "http://"+ln.Addr().String(), "-unsafe-no-auth")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the example failed: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	want := []string{
		"worker-a holds ledger:acct-7 with token 1",
		"worker-a writes under token 1: 201 Created",
		"worker-a presents a made-up token under token 9223372036854775807: 401 GRANT_REJECTED token_mismatch",
		"worker-b holds ledger:acct-7 with token 2",
		"worker-b writes under token 2: 201 Created",
		"worker-a, stale, writes under token 1: 409 FENCED_OUT token 1 is older than the mark 2",
	}
	got := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the example said:\n%s\nwant:\n%s", stdout.String(), strings.Join(want, "\n"))
	}
}

// A team that requires lock.dev gets its module graph: the repository's own
// tooling (Kubernetes manifests, compose files, OpenAPI validation) must not be
// in it, or every adopter downloads and vets it.
func TestExampleModuleGraphHoldsNoTooling(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	graph := string(goTool(t, ctx, "mod", "graph"))
	if !strings.Contains(graph, "lock.dev@v0.0.0") {
		t.Fatalf("go mod graph of examples/adopt does not list lock.dev:\n%s", graph)
	}
	for _, tooling := range []string{"sigs.k8s.io/kustomize", "github.com/compose-spec/compose-go", "github.com/pb33f/libopenapi"} {
		for _, line := range strings.Split(graph, "\n") {
			if strings.Contains(line, tooling) {
				t.Errorf("examples/adopt's module graph holds %s: %s", tooling, line)
				break
			}
		}
	}
}
