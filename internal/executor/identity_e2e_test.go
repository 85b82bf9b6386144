package executor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/executor"
	"lock.dev/internal/identity"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// With identities on (every hop mutual TLS, every grant naming its workload:
// docs/contracts/workload-identity.md) the executor pays payouts end to end,
// and the audit trail names it by its verified SPIFFE ID, not by its owner
// name: every rail_submission row's submitter, and the claim's and the post's
// rows of the payout's history.
func TestExecutorPaysOverMutualTLS(t *testing.T) {
	t.Parallel()
	st, _ := startStack(t, nil)
	if !st.Secure() {
		t.Fatal("the stack runs without identities")
	}
	const n = 8
	createPayouts(t, st, "mtls", n, 3)
	r := startExecutor(t, st, "exec-mtls", nil)
	rows := waitSettled(t, st, "mtls", n, 2*time.Minute)
	for id, row := range rows {
		if row.status != lockapi.StatusPaid {
			t.Errorf("%s is %s, want PAID", id, row.status)
		}
	}
	testkit.EventuallyState(t, 10*time.Second, "every payout counted paid", func() (bool, string) {
		v := paidCount(t, r, "paid")
		return v == n, fmt.Sprint(v)
	})
	want := identity.DefaultID(identity.NameExecutor)
	ctx := context.Background()

	var subs, named int
	if err := st.Paydb.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE submitter_identity = $1)
		FROM rail_submission WHERE payout_id LIKE 'mtls-%'`, want).Scan(&subs, &named); err != nil {
		t.Fatal(err)
	}
	if subs != n || named != n {
		t.Errorf("%d of %d rail_submission rows name the submitter %s, want all %d", named, subs, want, n)
	}
	// The claim (CLAIMED) and the post (PAID) of each payout, with its owner
	// name beside the workload's ID.
	rs, err := st.Paydb.Query(ctx, `SELECT payout_id, status, coalesce(owner_id, ''), coalesce(actor, '')
		FROM payout_history WHERE payout_id LIKE 'mtls-%' AND status IN ('CLAIMED', 'PAID') ORDER BY history_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	moves := 0
	for rs.Next() {
		var id, status, owner, actor string
		if err := rs.Scan(&id, &status, &owner, &actor); err != nil {
			t.Fatal(err)
		}
		moves++
		if actor != want || owner != "exec-mtls" {
			t.Errorf("%s's %s row: actor %q, owner %q; want %s and exec-mtls", id, status, actor, owner, want)
		}
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	if moves != 2*n {
		t.Errorf("%d CLAIMED and PAID history rows, want %d", moves, 2*n)
	}
}

// A server that does not present the SPIFFE ID the executor expects of it —
// LOCK_SERVER_URL pointed at payment-resource, a workload of the same bundle
// — fails the TLS handshake: the executor never acquires a lease, so nothing
// is claimed, and it says why.
func TestExecutorRefusesAServerWithAnotherID(t *testing.T) {
	t.Parallel()
	st, _ := startStack(t, nil)
	ps := createPayouts(t, st, "wrongid", 2, 2)
	r := startExecutor(t, st, "exec-wrong", func(c *executor.Config) {
		c.LockServerURL = st.PaymentURL
		c.Workers = 1
	})
	testkit.EventuallyState(t, 30*time.Second, "the executor to fail acquiring a lease", func() (bool, string) {
		return r.logs.eventCount("acquire_failed") >= 3, fmt.Sprint(r.logs.eventCount("acquire_failed"))
	})
	if !r.logs.contains(`"event":"acquire_failed"`, "tls:", identity.DefaultID(identity.NamePaymentResource)) {
		t.Errorf("acquire_failed does not name the TLS failure and the ID presented:\n%s", r.logs.String())
	}
	for _, p := range ps {
		if row := payout(t, st, p.PayoutID); row.status != lockapi.StatusPending || row.claimedBy != nil {
			t.Errorf("%s is %s by %s, want PENDING, claimed by no one", p.PayoutID, row.status, claimant(row))
		}
	}
	var grants int
	if err := st.Lockdb.QueryRow(context.Background(), `SELECT count(*) FROM lock_grant`).Scan(&grants); err != nil {
		t.Fatal(err)
	}
	if grants != 0 {
		t.Errorf("lock-server granted %d leases, want none", grants)
	}
	if strings.Contains(r.logs.String(), `"event":"claim_failed"`) {
		t.Errorf("the executor tried to claim without a lease")
	}
}
