package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/payment"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// --keep leaves the servers running and prints requests to try. With identities
// on every request needs a client certificate of the bundle (and the route's
// role), so the commands name the files of the stack's throwaway certificate
// set; the submission needs a real lease's grant and a payout claimed under it,
// which seedKeep makes (docs/contracts/workload-identity.md).

const (
	keepPayout  = "p-keep-1"
	keepAccount = "acct-keep"
	keepOwner   = "curl"
	keepTTL     = time.Minute // renewed in the background while the servers run
)

// keepSeed is what the printed submission presents.
type keepSeed struct {
	body  lockapi.SubmissionRequest
	token int64
	grant string // "" without grants
}

// seedKeep calms the rail, creates keepPayout as ops, takes a lease of its account as the
// executor workload (kept, renewed, until the Result is closed) and claims the
// payout under it.
func seedKeep(ctx context.Context, r *Result) (*keepSeed, error) {
	st := r.stack
	if st == nil {
		return nil, fmt.Errorf("the servers of the fencing-%s run are not running", onOff(r.Fencing))
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	// The run's chaos (dropped replies, declines, slow windows) ends here: the
	// printed submission gets the rail's answer.
	if _, err := st.Stub.SetChaos(cctx, baseLatencyMs, 0, 0, nil); err != nil {
		return nil, fmt.Errorf("calm the rail: %w", err)
	}
	s := &keepSeed{body: lockapi.SubmissionRequest{PayoutID: keepPayout, AccountID: keepAccount, AmountMinor: 12_345,
		Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}}
	ops := payment.NewTLSClient(st.PaymentURL, st.ClientTLS(identity.NameOps, identity.NamePaymentResource))
	if _, err := ops.Create(cctx, s.body); err != nil {
		return nil, fmt.Errorf("create %s: %w", keepPayout, err)
	}
	lc, err := lockclient.New(st.LockServerURL, lockclient.WithTLSConfig(st.ClientTLS(identity.NameExecutor, identity.NameLockServer)))
	if err != nil {
		return nil, err
	}
	// The lease outlives cctx (only its values are kept): it renews itself until
	// Result.Close releases it.
	l, err := lc.Acquire(context.WithoutCancel(cctx), lockapi.AccountLockName(keepAccount), keepOwner, keepTTL)
	if err != nil {
		return nil, fmt.Errorf("a lease of %s: %w", keepAccount, err)
	}
	r.keepLease = l
	s.token, s.grant = l.Token(), l.Grant()
	exec := payment.NewTLSClient(st.PaymentURL, st.ClientTLS(identity.NameExecutor, identity.NamePaymentResource))
	if _, err := exec.ClaimWithGrant(cctx, keepPayout, s.token, s.grant, keepOwner); err != nil {
		return nil, fmt.Errorf("claim %s: %w", keepPayout, err)
	}
	return s, nil
}

// writeKeepRun prints one kept run's servers and commands.
func writeKeepRun(w io.Writer, r *Result, seed *keepSeed) {
	u := r.URLs
	certs := u["certs"]
	fmt.Fprintf(w, "\nservers of the fencing-%s run, running until Ctrl-C:\n", onOff(r.Fencing))
	for _, k := range []string{"lock-server", "payment-resource", "rail-proxy", "rail-stub", "reconciler", "paydb", "lockdb", "certs"} {
		if u[k] != "" {
			fmt.Fprintf(w, "  %-17s %s\n", k, u[k])
		}
	}
	as := func(string) string { return "curl -s" }
	if certs != "" {
		fmt.Fprintf(w, "identities are on: every request presents a workload's certificate (docs/contracts/workload-identity.md).\n"+
			"try, from the certificates' directory:\n  cd '%s'\n", certs)
		as = func(name string) string {
			return fmt.Sprintf("curl -s --cacert ca.pem --cert %s.pem --key %s.key", name, name)
		}
	} else {
		fmt.Fprintf(w, "identities are OFF (--unsafe-no-auth): plaintext, any caller believed.\ntry:\n")
	}
	ops := as(identity.NameOps)
	fmt.Fprintf(w, "  %s '%s/v1/payouts?status=AMBIGUOUS&limit=3'\n", ops, u["payment-resource"])
	fmt.Fprintf(w, "  %s '%s/v1/rail/submissions?payoutId=p-00001'\n", ops, u["rail-proxy"])
	fmt.Fprintf(w, "  %s '%s/rail/v1/calls?limit=3'\n", ops, u["rail-stub"])
	fmt.Fprintf(w, "  %s '%s/v1/locks/account:acct-01/grants?limit=3'\n", ops, u["lock-server"])
	fmt.Fprintf(w, "  %s '%s/metrics' | grep -E '^(rail_submission_total|lock_fenced_out_total|rail_proxy_fencing_enabled|rail_proxy_books_check_enabled|auth_enabled)'\n", ops, u["rail-proxy"])
	fmt.Fprintf(w, "  psql '%s' -c 'SELECT outcome, count(*) FROM rail_submission GROUP BY 1'\n", u["paydb"])
	fmt.Fprintf(w, "  %s '%s/v1/rail/statement?limit=3'\n", ops, u["rail-proxy"])
	fmt.Fprintf(w, "  %s '%s/metrics' | grep -E '^reconciler_(settled|exception)_total'\n", ops, u["reconciler"])
	fmt.Fprintf(w, "  psql '%s' -c 'SELECT kind, payout_id, seq, detail FROM reconciliation_exception'\n", u["paydb"])
	fmt.Fprintf(w, "  psql '%s' -c \"SELECT status, fence_token, owner_id, actor, recorded_at FROM payout_history WHERE payout_id = 'p-00001' ORDER BY history_id\"\n", u["paydb"])
	if seed == nil {
		return
	}
	body, _ := json.Marshal(seed.body)
	headers := fmt.Sprintf("-H 'Content-Type: application/json' -H '%s: %d' -H '%s: %s' -H '%s: %s:%d'",
		lockapi.HeaderFencingToken, seed.token, lockapi.HeaderOwnerID, keepOwner, lockapi.HeaderIdempotencyKey, keepPayout, seed.token)
	if seed.grant != "" {
		headers += fmt.Sprintf(" -H '%s: %s'", lockapi.HeaderFencingGrant, seed.grant)
	}
	fmt.Fprintf(w, "%s is claimed under a live lease of account:%s (owner %s, token %s, renewed until Ctrl-C);\n"+
		"present it to the rail as the executor (the submitter), then as ops:\n", keepPayout, keepAccount, keepOwner, strconv.FormatInt(seed.token, 10))
	fmt.Fprintf(w, "  %s %s -d '%s' '%s/v1/rail/submissions'\n", as(identity.NameExecutor), headers, body, u["rail-proxy"])
	if certs != "" {
		fmt.Fprintf(w, "  %s %s -d '%s' '%s/v1/rail/submissions'    # 403 FORBIDDEN: ops may not submit\n", ops, headers, body, u["rail-proxy"])
		fmt.Fprintf(w, "  %s -H 'Content-Type: application/json' -H '%s: ops-1' -d '{\"ttlMs\":5000}' '%s/v1/locks/account:acct-01/acquire'    # 403 FORBIDDEN: ops holds no leases\n",
			ops, lockapi.HeaderOwnerID, u["lock-server"])
	}
}
