package lockclient_test

import (
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"lock.dev/lockclient"
)

// lockclient is what other teams import: it brings nothing but the standard
// library and lock.dev/lockapi (and the standard-library-only leasepause),
// read from the real import graph.
func TestImportsOnlyStandardLibraryAndLockapi(t *testing.T) {
	t.Parallel()
	nonStd := func(pkg string) map[string]bool {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		set := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			set[p] = true
		}
		return set
	}
	lockapi := nonStd("lock.dev/lockapi")
	got := nonStd("lock.dev/lockclient")
	if !got["lock.dev/lockapi"] || !got["lock.dev/lockclient"] {
		t.Fatalf("the import graph looks wrong: %v", got)
	}
	for p := range got {
		switch {
		case !strings.HasPrefix(p, "lock.dev/"):
			t.Errorf("lockclient depends on %s, outside the standard library and this module", p)
		case lockapi[p], p == "lock.dev/lockclient", p == "lock.dev/internal/leasepause":
		default:
			t.Errorf("lockclient depends on %s, which lockapi does not", p)
		}
	}
	if pause := nonStd("lock.dev/internal/leasepause"); len(pause) != 1 {
		t.Errorf("leasepause depends on more than the standard library: %v", pause)
	}
	for p := range lockapi {
		if !strings.HasPrefix(p, "lock.dev/") {
			t.Errorf("lockapi depends on %s, outside the standard library and this module", p)
		}
	}
}

// Freezing a lease is for this module's tests and demonstrations: the public
// API has no Freeze or Thaw, in the method set or in go doc.
func TestNoFreezeInThePublicAPI(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"Freeze", "Thaw"} {
		if _, ok := reflect.TypeFor[*lockclient.Lease]().MethodByName(m); ok {
			t.Errorf("*Lease has a method %s", m)
		}
		if _, ok := reflect.TypeFor[*lockclient.Client]().MethodByName(m); ok {
			t.Errorf("*Client has a method %s", m)
		}
	}
	out, err := exec.Command("go", "doc", "-all", "lock.dev/lockclient").Output()
	if err != nil {
		t.Fatalf("go doc: %v", err)
	}
	if m := regexp.MustCompile(`(?m)^func .*\b(Freeze|Thaw)\b.*$`).Find(out); m != nil {
		t.Errorf("go doc lockclient shows %s", m)
	}
}
