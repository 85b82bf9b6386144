package footprint

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// root is lock.dev's module root: two levels above this file.
func root(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", dir, err)
	}
	return dir
}

// goCmd runs the go command (go test puts its own first on PATH) in dir, with
// go.mod read-only, and returns its standard output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// clientPackages are the patterns of what a user takes: the lock client, and
// the fence kit once it is in the tree.
func clientPackages(t *testing.T, dir string) []string {
	pkgs := []string{"./lockclient/"}
	if _, err := os.Stat(filepath.Join(dir, "fence")); err == nil {
		pkgs = append(pkgs, "./fence/...")
	}
	return pkgs
}

// The modules a program of the client packages may link besides the standard
// library and lock.dev: JOSE (grant verification), SPIFFE (workload identity),
// and pgx (the fence kit's PostgreSQL side) with the modules it needs itself —
// jackc's pgpassfile, pgservicefile and puddle, and golang.org/x/text (its
// SASLprep of passwords).
var clientModules = []string{"github.com/go-jose/", "github.com/spiffe/", "github.com/jackc/", "golang.org/x/text"}

// A program that imports only lockclient and the fence kit links the standard
// library, lock.dev and clientModules — no deployment check, no OpenAPI
// validator, no metrics stack.
func TestClientLinksOnlyWhatItNeeds(t *testing.T) {
	t.Parallel()
	dir := root(t)
	pkgs := clientPackages(t, dir)
	out := goCmd(t, dir, append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}{{end}}"}, pkgs...)...)
	linked := 0
	for _, line := range strings.Split(out, "\n") {
		pkg, mod, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		linked++
		if mod == "lock.dev" {
			continue
		}
		allowed := false
		for _, m := range clientModules {
			allowed = allowed || strings.HasPrefix(mod, m)
		}
		if !allowed {
			t.Errorf("%s links %s (module %q), outside the standard library, lock.dev and %v", strings.Join(pkgs, " "), pkg, mod, clientModules)
		}
	}
	if linked == 0 {
		t.Fatalf("go list found no package of %v", pkgs)
	}
}

// The heavy modules of the deployment checks and of the OpenAPI validator
// (checks/cmd/apivalidate, which internal/apitest runs as a process), which
// lock.dev's go.mod must not require: a user's module graph takes every
// requirement of it.
var deployCheckModules = []string{
	"sigs.k8s.io/kustomize/",
	"github.com/compose-spec/compose-go",
	"github.com/prometheus/prometheus",
	"github.com/santhosh-tekuri/jsonschema",
	"k8s.io/",
	"github.com/pb33f/",
}

// lock.dev's own requirements (the first column of go mod graph being the main
// module) name none of the deployment checks' modules: those are required by
// checks/go.mod alone — pb33f/libopenapi too: the services' conformance tests
// stay in their packages, but internal/apitest has checks/cmd/apivalidate, a
// process of the checks module, do the validating.
func TestModuleRequiresNoDeploymentCheck(t *testing.T) {
	t.Parallel()
	dir := root(t)
	out := goCmd(t, dir, "mod", "graph")
	n := 0
	for _, line := range strings.Split(out, "\n") {
		from, to, ok := strings.Cut(line, " ")
		if !ok || from != "lock.dev" {
			continue
		}
		n++
		for _, m := range deployCheckModules {
			if strings.HasPrefix(to, m) {
				t.Errorf("lock.dev requires %s, a module of the checks (checks/go.mod)", to)
			}
		}
	}
	if n == 0 {
		t.Fatalf("go mod graph lists no requirement of lock.dev:\n%s", out)
	}
}
