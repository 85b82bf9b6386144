package reconcile_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/logcapture"
	"lock.dev/internal/stack"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// A CLAIMED payout whose own holder — its fence token, its owner — presented it
// with fields the books refused is listed once as ATTEMPT_MISMATCH, counted
// (reconciler_exception_total{kind="attempt_mismatch"}) and logged once with the
// beneficiaries masked, and nothing moves it: it stays CLAIMED for a person.
// Refusals that are not its holder's own fields are not listed: another owner
// presenting under its token, an attempt with its own fields refused before the
// claim, and a payout presented as booked since (no longer CLAIMED).
func TestAttemptMismatchListedOnce(t *testing.T) {
	t.Parallel()
	logs := &logcapture.Buffer{}
	// Without identities: the refusal not listed below — another owner
	// presenting under the holder's token — is refused earlier with them (its
	// grant names another owner), so the books never see it. About the books'
	// listing, not identity (docs/contracts/workload-identity.md).
	e := newEnv(t, stack.Options{Log: logs, UnsafeNoAuth: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const owner = "test-driver"

	// Listed: its holder presented another beneficiary.
	att := payoutReq("p-att", "acct-1", 100)
	redirected := att
	redirected.Beneficiary = mallory
	e.refusedAttempt(t, att, redirected, lockapi.MismatchBeneficiary)

	// Not listed: someone else presented it under the holder's token.
	other := payoutReq("p-other", "acct-2", 200)
	if _, err := e.creator.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	lease, err := e.locks.Acquire(ctx, lockapi.AccountLockName(other.AccountID), owner, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.payments.ClaimWithGrant(ctx, other.PayoutID, lease.Token(), lease.Grant(), owner); err != nil {
		t.Fatal(err)
	}
	bad := other
	bad.Beneficiary = mallory
	if status, body := e.submit(t, e.st.ProxyURL, bad, lease, "intruder"); status != http.StatusConflict || body["mismatch"] != lockapi.MismatchOwner {
		t.Fatalf("p-other presented by another owner: %d %v, want 409 owner", status, body)
	}
	_ = lease.Release(ctx)

	// Not listed: presented as booked before the claim (not_claimed), then claimed
	// under that token by that owner.
	early := payoutReq("p-early", "acct-3", 300)
	if _, err := e.creator.Create(ctx, early); err != nil {
		t.Fatal(err)
	}
	lease, err = e.locks.Acquire(ctx, lockapi.AccountLockName(early.AccountID), owner, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := e.submit(t, e.st.ProxyURL, early, lease, owner); status != http.StatusConflict || body["mismatch"] != lockapi.MismatchNotClaimed {
		t.Fatalf("p-early presented before its claim: %d %v, want 409 not_claimed", status, body)
	}
	if _, err := e.payments.ClaimWithGrant(ctx, early.PayoutID, lease.Token(), lease.Grant(), owner); err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctx)

	// Not listed: refused with another amount, then presented as booked by the
	// same holder and posted PAID.
	fixed := payoutReq("p-fixed", "acct-4", 400)
	if _, err := e.creator.Create(ctx, fixed); err != nil {
		t.Fatal(err)
	}
	lease, err = e.locks.Acquire(ctx, lockapi.AccountLockName(fixed.AccountID), owner, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.payments.ClaimWithGrant(ctx, fixed.PayoutID, lease.Token(), lease.Grant(), owner); err != nil {
		t.Fatal(err)
	}
	more := fixed
	more.AmountMinor = 401
	if status, body := e.submit(t, e.st.ProxyURL, more, lease, owner); status != http.StatusConflict || body["mismatch"] != lockapi.MismatchAmount {
		t.Fatalf("p-fixed with another amount: %d %v, want 409 amount", status, body)
	}
	status, body := e.submit(t, e.st.ProxyURL, fixed, lease, owner)
	if status != http.StatusOK {
		t.Fatalf("p-fixed as booked: %d %v", status, body)
	}
	ref, _ := body["railReference"].(string)
	if _, err := e.payments.PostWithGrant(ctx, fixed.PayoutID, lease.Token(), lease.Grant(), owner, lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: &ref}); err != nil {
		t.Fatalf("post p-fixed PAID: %v", err)
	}
	_ = lease.Release(ctx)

	rec, err := e.st.StartReconciler(ctx, map[string]string{"RECONCILER_INTERVAL": "100ms", "RECONCILER_SETTLE_AFTER": "1h"})
	if err != nil {
		t.Fatal(err)
	}
	// Every pass began after everything above was written; several more, so
	// that a second record would have had its chance.
	deadline, _ := ctx.Deadline()
	before := metric(t, rec, `reconciler_pass_total{result="completed"}`)
	testkit.Eventually(t, time.Until(deadline), "four more completed passes", func() bool {
		return metric(t, rec, `reconciler_pass_total{result="completed"}`) >= before+4
	})

	if got := e.exceptions(t); !slices.Equal(got, []string{"ATTEMPT_MISMATCH p-att -"}) {
		t.Fatalf("exceptions = %v, want [ATTEMPT_MISMATCH p-att -]", got)
	}
	if v := metric(t, rec, `reconciler_exception_total{kind="attempt_mismatch"}`); v != 1 {
		t.Errorf(`reconciler_exception_total{kind="attempt_mismatch"} = %v, want 1`, v)
	}
	var logged []map[string]any
	for _, l := range logs.Events("reconciliation_exception") {
		if l["service"] == "reconciler" {
			logged = append(logged, l)
		}
	}
	if len(logged) != 1 || logged[0]["kind"] != "ATTEMPT_MISMATCH" || logged[0]["payoutId"] != "p-att" {
		t.Fatalf("reconciliation_exception log lines %v, want one ATTEMPT_MISMATCH p-att", logged)
	}
	detail, _ := logged[0]["detail"].(string)
	if !strings.Contains(detail, "****6819") || !strings.Contains(detail, "****4300") || strings.Contains(detail, mallory) || strings.Contains(detail, alice) {
		t.Errorf("detail %q does not name both beneficiaries masked", detail)
	}
	for id, want := range map[string]string{"p-att": lockapi.StatusClaimed, "p-other": lockapi.StatusClaimed,
		"p-early": lockapi.StatusClaimed, "p-fixed": lockapi.StatusPaid} {
		if s := e.status(t, id); s != want {
			t.Errorf("%s is %s, want %s", id, s, want)
		}
	}
}
