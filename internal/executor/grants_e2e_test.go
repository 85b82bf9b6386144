package executor_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/identity"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

// The executor presents its lease's grant (docs/contracts/signed-grants.md) on
// claim, submit and post: with lock-server signing and both fence points verifying,
// every payout is PAID through the fences and not one grant is refused.
func TestExecutorPresentsItsLeasesGrant(t *testing.T) {
	t.Parallel()
	env, err := stack.GrantEnv(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := startStack(t, env)
	const n = 20
	createPayouts(t, st, "grant", n, 4)
	r := startExecutor(t, st, "exec-g", nil)
	rows := waitSettled(t, st, "grant", n, 2*time.Minute)
	for id, row := range rows {
		if row.status != lockapi.StatusPaid {
			t.Errorf("%s is %s, want PAID", id, row.status)
		}
	}
	if got := paidCount(t, r, "paid"); got != n {
		t.Errorf(`executor_payout_total{result="paid"} = %v, want %d`, got, n)
	}
	for _, name := range []string{identity.NameRailProxy, identity.NamePaymentResource} {
		for _, reason := range grant.Reasons {
			v, err := st.ReadMetric(context.Background(), name, `grant_rejected_total{reason="`+reason+`"}`)
			if err != nil || v != 0 {
				t.Errorf("%s grant_rejected_total{reason=%q} = %v (%v), want 0", name, reason, v, err)
			}
		}
	}
}
