package fence_test

import (
	"os/exec"
	"strings"
	"testing"
)

// fence is what a team's own service imports: it brings the JOSE and SPIFFE
// libraries it verifies with, lockapi's header parsing and problem answers, and
// nothing else — no database driver (that is fencepg's), no metrics or logging
// of lock.dev's own (internal/grant's) — read from the real import graph.
func TestFenceImportsOnlyWhatItVerifiesWith(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "lock.dev/fence").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list answered no package")
	}
	allowed := []string{
		"github.com/go-jose/go-jose/v4", "github.com/spiffe/go-spiffe/v2",
		"lock.dev/fence", "lock.dev/lockapi", "lock.dev/internal/jsonbody", "lock.dev/internal/iso4217",
	}
next:
	for _, p := range deps {
		for _, a := range allowed {
			if p == a || strings.HasPrefix(p, a+"/") {
				continue next
			}
		}
		t.Errorf("lock.dev/fence depends on %s", p)
	}
}
