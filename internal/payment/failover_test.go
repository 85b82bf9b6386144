package payment_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
)

// onPair runs payment-resource on the paydb of a primary with a synchronous
// standby, through the pair's multi-host URL.
func onPair(t *testing.T, opts ...func(*payment.Config)) (*pgcluster.Pair, *env) {
	t.Helper()
	p := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	t.Cleanup(p.ReleaseStandby) // before Stop: a held standby would hold the drain's commits
	return p, startOn(t, p.URL("paydb"), opts...)
}

// heldCall runs call while the standby is held, waits until its COMMIT waits for
// the standby, then cancels (or terminates) that wait and returns call's error.
func heldCall(t *testing.T, p *pgcluster.Pair, terminate bool, call func() error) error {
	t.Helper()
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	defer p.ReleaseStandby()
	done := make(chan error, 1)
	go func() { done <- call() }()
	return testkit.CancelSyncWait(t, p, terminate, done)
}

// A create, claim or post whose COMMIT came back with the cancelled-synchronous-
// replication warning answers 503 UNAVAILABLE: PostgreSQL called it a success,
// but the standby may not have it, so it did not happen.
func TestCommitNotDurableIsUnavailable(t *testing.T) {
	p, e := onPair(t, booksUnchecked) // about the commit's durability; its payouts never went to the rail
	ctx := context.Background()
	req := func(id string) lockapi.SubmissionRequest {
		return lockapi.SubmissionRequest{PayoutID: id, AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
	}
	err := heldCall(t, p, false, func() error { _, err := e.client.Create(ctx, req("p-create")); return err })
	asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)

	e.create(t, "p-1", "acct-1", 100)
	err = heldCall(t, p, false, func() error { _, err := e.client.Claim(ctx, "p-1", 5, "exec-a"); return err })
	asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	err = heldCall(t, p, true, func() error { _, err := e.client.Claim(ctx, "p-1", 6, "exec-a"); return err })
	asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)

	e.claim(t, "p-1", 7, "exec-a")
	err = heldCall(t, p, false, func() error {
		_, err := e.client.Post(ctx, "p-1", 7, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")})
		return err
	})
	asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	if !strings.Contains(e.logs.String(), "commit not durable") {
		t.Errorf("the log does not say why:\n%s", e.logs.String())
	}
}

// A request whose bound runs out while its COMMIT waits for the standby answers
// 503, never 200: its statement_timeout (the same bound) does not cut the wait
// short into a "success" the standby lacks — PostgreSQL disarms it before
// committing (dbconn's TestStatementTimeoutDoesNotCancelTheSyncWait) — and the
// request gives up first. pgx then closes the connection with a cancel request,
// which ends the wait with the warning: the claim is committed on the primary
// only, which is what the 503 ("may or may not have taken effect") allows.
func TestCommitOutlivingTheBoundIsUnavailable(t *testing.T) {
	p, e := onPair(t, func(c *payment.Config) { c.DBTimeout = 300 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.create(t, "p-1", "acct-1", 100)
	if err := p.HoldStandby(); err != nil {
		t.Fatal(err)
	}
	defer p.ReleaseStandby()
	_, err := e.client.Claim(ctx, "p-1", 5, "exec-a")
	asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
}

// kill -9 of paydb's primary and a promotion: payment-resource keeps serving
// without a restart, answering 503 UNAVAILABLE while no server accepts writes;
// what was committed before the kill is on the new primary.
func TestServesAcrossFailover(t *testing.T) {
	p, e := onPair(t, booksUnchecked) // about failover; its payout never went to the rail
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.create(t, "p-1", "acct-1", 100)
	e.claim(t, "p-1", 3, "exec-a")
	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, err := e.client.Create(ctx, lockapi.SubmissionRequest{PayoutID: "p-2", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
		asProblem(t, err, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	}
	if code, _ := e.readyz(t); code != http.StatusServiceUnavailable {
		t.Errorf("readiness with the primary dead: %d", code)
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	e.create(t, "p-2", "acct-1", 100)
	if _, err := e.client.Claim(ctx, "p-1", 3, "exec-b"); err == nil {
		t.Fatal("token 3 claimed p-1 again: the claim before the failover was lost")
	} else {
		asProblem(t, err, http.StatusConflict, lockapi.CodeFencedOut)
	}
	if _, err := e.client.Post(ctx, "p-1", 3, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}); err != nil {
		t.Fatalf("post after the failover: %v", err)
	}
	if code, _ := e.readyz(t); code != http.StatusOK {
		t.Errorf("readiness after the promotion: %d", code)
	}
}

// A paydb whose fsync is off is refused unless UNSAFE_NON_DURABLE_DB is set
// (docs/contracts/configuration.md); with it, payment-resource serves, says so at
// ERROR and shows the gauge.
func TestRefusesPaydbWithFsyncOff(t *testing.T) {
	p := pgtest.Pair(t, pgcluster.PairOptions{}) // a throwaway server: fsync off
	cfg := payment.DefaultConfig()
	cfg.PaydbURL = p.URL("paydb")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener, cfg.LogOutput = ln, io.Discard
	cfg.Identity.UnsafeNoAuth = true // about paydb's durability, not identity (docs/contracts/workload-identity.md)
	err = payment.Run(context.Background(), cfg)
	if !errors.Is(err, dbconn.ErrNonDurable) || !strings.Contains(err.Error(), "UNSAFE_NON_DURABLE_DB") {
		t.Fatalf("Run on a paydb with fsync off: %v; want a refusal naming UNSAFE_NON_DURABLE_DB", err)
	}
	e := startOn(t, p.URL("paydb")) // the test helper sets UNSAFE_NON_DURABLE_DB
	if v := e.metric(t, "db_unsafe_non_durable"); v != 1 {
		t.Errorf("db_unsafe_non_durable = %v, want 1", v)
	}
	if got := e.logs.events(t, "unsafe_non_durable_db"); len(got) != 1 || got[0]["level"] != "ERROR" {
		t.Errorf("unsafe_non_durable_db log lines: %v", got)
	}
}
