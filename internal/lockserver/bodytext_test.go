package lockserver

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// lock-server's one body, {"ttlMs": n}, is read by the same strict reader as
// every service's: text that is not Unicode is refused as such, naming the
// member, and nothing is granted.
func TestLeaseBodyTextIsRefusedNotRepaired(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.LockdbURL(t)
	pool := pgtest.Pool(t, dbURL)
	s := startServer(t, testConfig(dbURL))
	for name, body := range map[string]string{
		"raw 0xff":            "{\"ttlMs\":\"1\xff\"}",
		"lone high surrogate": `{"ttlMs":"\ud800"}`,
		"lone low surrogate":  `{"ttlMs":"\udc00"}`,
	} {
		a, err := send(http.MethodPost, lockURL(s.URL, "acct", "/acquire"), leaseHeaders("o1", 0), []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		p := a.problem()
		var errs []lockapi.FieldError
		if p != nil {
			_, _ = p.Member("errors", &errs)
		}
		if a.Status != 400 || p == nil || p.Code != lockapi.CodeInvalidRequest || len(errs) != 1 ||
			errs[0].Field != "ttlMs" || !strings.Contains(errs[0].Problem, "must be valid UTF-8 text") {
			t.Errorf("%s: %s, want 400 INVALID_REQUEST with one fault on ttlMs: not UTF-8 text", name, a)
		}
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM lock_lease`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d leases (%v) after refused acquires, want none", n, err)
	}
}
