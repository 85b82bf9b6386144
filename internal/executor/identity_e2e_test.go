package executor_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
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
	if !r.logs.contains(`"event":"acquire_failed"`, identity.DefaultID(identity.NamePaymentResource)) {
		t.Errorf("acquire_failed does not name the ID the server presented:\n%s", r.logs.String())
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

// A grant is bound to the workload that took the lease: when the fence point
// sees another workload present it — here a TLS-terminating front before
// payment-resource (as a mesh sidecar would be) that presents
// payment-resource's SVID to the executor but calls payment-resource with its
// own (ops, given the worker role) — the claim is refused 401 GRANT_REJECTED,
// reason workload_mismatch. The executor treats it as the answer it is: the
// cycle ends, the claim is never sent again under that lease, the reason is
// logged, and nothing is claimed.
func TestWorkloadMismatchIsARefusalNotRetried(t *testing.T) {
	t.Parallel()
	st, _ := startStack(t, map[string]map[string]string{
		"payment-resource": {"PAYMENT_WORKERS": identity.DefaultIDs(identity.NameExecutor, identity.NameOps)},
	})
	ps := createPayouts(t, st, "wmis", 1, 1)
	src, err := st.Source(identity.NamePaymentResource)
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(st.PaymentURL)
	if err != nil {
		t.Fatal(err)
	}
	var claims atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = st.HTTPClient(identity.NameOps, identity.NamePaymentResource).Transport
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/claim") {
			claims.Add(1)
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = front.Serve(tls.NewListener(ln, src.ServerConfig())) }()
	t.Cleanup(func() { _ = front.Close() })

	r := startExecutor(t, st, "exec-mis", func(c *executor.Config) {
		c.PaymentResourceURL = "https://" + ln.Addr().String()
		c.Workers = 1
	})
	testkit.EventuallyState(t, 30*time.Second, "claims refused and logged", func() (bool, string) {
		return r.logs.eventCount("claim_failed") >= 3, fmt.Sprint(r.logs.eventCount("claim_failed"))
	})
	r.stop(t)
	if !r.logs.contains(`"event":"claim_failed"`, `"reason":"workload_mismatch"`, lockapi.CodeGrantRejected) {
		t.Fatalf("no claim_failed naming GRANT_REJECTED workload_mismatch:\n%s", r.logs.String())
	}
	var leases int64
	if err := st.Lockdb.QueryRow(context.Background(), `SELECT count(*) FROM lock_grant WHERE lock_name = $1`,
		lockapi.AccountLockName(ps[0].AccountID)).Scan(&leases); err != nil {
		t.Fatal(err)
	}
	// The stop may cut short a claim in flight, whose failure is then not
	// logged (the executor was told to stop): at most one.
	if n, logged := claims.Load(), int64(r.logs.eventCount("claim_failed")); n > leases || n-logged > 1 {
		t.Errorf("%d claims sent under %d leases, %d logged claim_failed: want at most one claim per lease, each logged",
			n, leases, logged)
	}
	if row := payout(t, st, ps[0].PayoutID); row.status != lockapi.StatusPending {
		t.Errorf("the payout is %s, want PENDING", row.status)
	}
	v, err := st.ReadMetric(context.Background(), identity.NamePaymentResource, `grant_rejected_total{reason="workload_mismatch"}`)
	if err != nil || v < 3 {
		t.Errorf(`payment-resource's grant_rejected_total{reason="workload_mismatch"} = %v (%v), want the refusals counted`, v, err)
	}
}
