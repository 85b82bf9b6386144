package fence_test

import (
	"os/exec"
	"strings"
	"testing"
)

// fence is what a team's own service imports: it brings the JOSE and SPIFFE
// libraries it verifies with and nothing of a database driver or of
// lock.dev's metrics — those are fencepg's and the project's own — read from the
// real import graph.
func TestFenceImportsNoDriverNorMetrics(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "lock.dev/fence").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list answered no package")
	}
	for _, p := range deps {
		for _, banned := range []string{"github.com/jackc/", "github.com/prometheus/", "lock.dev/internal/grant", "lock.dev/internal/identity"} {
			if strings.HasPrefix(p, banned) {
				t.Errorf("lock.dev/fence depends on %s", p)
			}
		}
	}
}
