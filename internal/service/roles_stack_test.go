package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"lock.dev/internal/lockdb"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/paydb"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/service"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
	"lock.dev/lockclient"
)

// The real services run on the logins migrate granted: lock-server,
// payment-resource, rail-proxy and the reconciler each connect as their own
// login (docs/contracts/database.md, least privilege), start (the schema,
// durability and replication checks) and serve a payout's whole way — created,
// leased, claimed, admitted at rail-proxy, posted, reconciled against the
// statement. A grant a service's statements need and the grants file lacks
// fails here with permission denied.
func TestTheServicesRunOnTheirOwnLogins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	payURL, lockURL := pgtest.EmptyURL(t), pgtest.EmptyURL(t)
	roles, as := service.MakeLogins(t, payURL, payURL, lockURL)
	for _, tree := range []struct {
		url  string
		spec service.Database
	}{
		{payURL, service.Database{Tree: paydb.Tree(), Roles: roles}},
		{lockURL, service.Database{Tree: lockdb.Tree(), Roles: roles}},
	} {
		d := tree.spec
		d.URL, d.MaxConns, d.ConnsBound, d.CheckTimeout, d.MigrateCommand = tree.url, 2, 10, 10*time.Second, "migrate"
		spec := service.Spec{Name: d.Tree.Database + "-migrate", LogLevel: "info", LogOutput: &logcapture.Buffer{},
			Validate: func() error { return nil }, DB: &d}
		if err := service.Migrate(ctx, spec); err != nil {
			t.Fatalf("migrate %s: %v", d.Tree.Database, err)
		}
	}
	// About the databases' logins, not identity
	// (docs/contracts/workload-identity.md): plaintext, tokens without grants.
	s, err := stack.Start(ctx, stack.Options{PaydbURL: payURL, LockdbURL: lockURL, UnsafeNoAuth: true, Env: map[string]map[string]string{
		"lock-server":      {"LOCKDB_URL": as(lockURL, "LOCKDB_ROLE_LOCK_SERVER")},
		"payment-resource": {"PAYDB_URL": as(payURL, "PAYDB_ROLE_PAYMENT")},
		"rail-proxy":       {"PAYDB_URL": as(payURL, "PAYDB_ROLE_RAIL_PROXY")},
		"reconciler":       {"PAYDB_URL": as(payURL, "PAYDB_ROLE_RECONCILER"), "RECONCILER_INTERVAL": "100ms", "RECONCILER_SETTLE_AFTER": "1s"},
	}})
	if err != nil {
		t.Fatalf("the services on their own logins: %v", err)
	}
	defer s.Close()

	const owner = "executor-1"
	req := lockapi.SubmissionRequest{PayoutID: "po-logins", AccountID: "acct-7", AmountMinor: 250, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
	pay := payment.NewClient(s.PaymentURL)
	if _, err := pay.Create(ctx, req); err != nil {
		t.Fatalf("create: %v", err)
	}
	lc, err := lockclient.New(s.LockServerURL)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := lc.Acquire(ctx, "account:"+req.AccountID, owner, 10*time.Second)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if _, err := pay.Claim(ctx, req.PayoutID, lease.Token(), owner); err != nil {
		t.Fatalf("claim: %v", err)
	}
	acked := submit(ctx, t, s.ProxyURL, req, lease.Token(), owner)
	post := lockapi.PostRequest{Outcome: "PAID", RailReference: &acked.RailReference}
	if _, err := pay.Post(ctx, req.PayoutID, lease.Token(), owner, post); err != nil {
		t.Fatalf("post: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	r, err := s.StartReconciler(ctx, nil)
	if err != nil {
		t.Fatalf("the reconciler on its own login: %v", err)
	}
	if _, err := s.FinalPass(ctx, r, time.Second); err != nil {
		t.Fatalf("the reconciler's pass: %v", err)
	}
}

// submit presents req at rail-proxy with token as owner and wants it ACKED.
func submit(ctx context.Context, t *testing.T, proxyURL string, req lockapi.SubmissionRequest, token int64, owner string) lockapi.SubmissionAccepted {
	t.Helper()
	body, _ := json.Marshal(req)
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, proxyURL+"/v1/rail/submissions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(lockapi.HeaderFencingToken, fmt.Sprint(token))
	r.Header.Set(lockapi.HeaderOwnerID, owner)
	r.Header.Set(lockapi.HeaderIdempotencyKey, fmt.Sprintf("%s:%d", req.PayoutID, token))
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(r)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a lockapi.SubmissionAccepted
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &a) != nil || a.Outcome != lockapi.OutcomeAcked {
		t.Fatalf("submit: %d %s, want 200 ACKED", resp.StatusCode, b)
	}
	return a
}
