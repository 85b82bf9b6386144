package deploytest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// root is the repository's root, lock.dev's module: two levels above this file.
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

// Ports of docs/contracts/configuration.md and docs/contracts/reconciliation.md.
var ports = map[string]int{
	"lock-server":      8081,
	"payment-resource": 8082,
	"rail-proxy":       8083,
	"rail-stub":        8084,
	"executor":         8085,
	"reconciler":       8086,
}
