package payment_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"lock.dev/internal/pgcluster"
	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// A settle whose COMMIT came back with the cancelled-synchronous-replication
// warning (pg_cancel_backend) — or whose wait was ended by pg_terminate_backend —
// answers 503 UNAVAILABLE, as create, claim and post do
// (TestCommitNotDurableIsUnavailable): PostgreSQL called it a success, or closed
// the connection, but the standby may not have it, so it did not happen. Nothing
// is counted or logged as settled. The reconciler's retry once the standby is
// back answers 200 with the payout as the first settle left it, and one ledger
// entry exists.
func TestSettleCommitNotDurableIsUnavailable(t *testing.T) {
	p, e := onPair(t, withSettleToken, booksUnchecked) // about the commit's durability; no attempt, no statement copy
	e.ambiguous(t, "p-paid", 1500, 7)
	e.ambiguous(t, "p-absent", 30, 8)
	for _, c := range []struct {
		id, body, status string
		terminate        bool
	}{
		{"p-paid", `{"outcome":"PAID","railReference":"RS-ABC","statementSeq":11}`, lockapi.StatusPaid, false},
		{"p-absent", `{"outcome":"NOT_PRESENTED"}`, lockapi.StatusNotPresented, true},
	} {
		var (
			status int
			body   []byte
		)
		if err := heldCall(t, p, c.terminate, func() error {
			var err error
			status, body, err = e.trySettle(c.id, bearer, c.body)
			return err
		}); err != nil {
			t.Fatalf("settle %s (terminate %v): %v", c.id, c.terminate, err)
		}
		if pr := settleProblem(t, status, body); pr == nil || pr.Status != http.StatusServiceUnavailable || pr.Code != lockapi.CodeUnavailable {
			t.Fatalf("settle %s with a cancelled wait (terminate %v): %d %s, want 503 UNAVAILABLE", c.id, c.terminate, status, body)
		}
		if n := len(e.logs.events(t, "payout_settled")); n != 0 {
			t.Fatalf("%d payout_settled log lines after a settle whose commit was not durable", n)
		}
		if v := e.metric(t, fmt.Sprintf(`payout_settle_total{outcome=%q}`, strings.ToLower(c.status))); v != 0 {
			t.Fatalf("payout_settle_total{%s} = %v after a settle whose commit was not durable", strings.ToLower(c.status), v)
		}
	}
	if !strings.Contains(e.logs.String(), "commit not durable") {
		t.Errorf("the log does not say why:\n%s", e.logs.String())
	}

	// The standby released, the same settles answer 200.
	for _, c := range []struct{ id, body, status string }{
		{"p-paid", `{"outcome":"PAID","railReference":"RS-ABC","statementSeq":11}`, lockapi.StatusPaid},
		{"p-absent", `{"outcome":"NOT_PRESENTED"}`, lockapi.StatusNotPresented},
	} {
		status, pr, got := e.settle(t, c.id, bearer, c.body)
		if status != http.StatusOK || got.Status != c.status {
			t.Fatalf("settle %s again with the standby back: %d %+v %+v, want 200 %s", c.id, status, pr, got, c.status)
		}
	}
	if n := e.queryInt(t, `SELECT count(*) FROM ledger_entry WHERE payout_id = 'p-paid' AND amount_minor = -1500`); n != 1 {
		t.Fatalf("%d ledger entries for p-paid, want 1", n)
	}
}

// settleProblem reads a settle's answer as problem+json; nil when it is not one.
func settleProblem(t *testing.T, status int, body []byte) *lockapi.Problem {
	t.Helper()
	var pr lockapi.Problem
	if status == http.StatusOK || json.Unmarshal(body, &pr) != nil || pr.Status != status {
		return nil
	}
	return &pr
}

// PostgreSQL sends the cancelled-wait warning only when client_min_messages is
// warning or more verbose. Whatever the role, the database or the URL sets
// (pgtest.QuietPlaces), a create, claim, post or settle whose commit's wait was
// cancelled answers 503 UNAVAILABLE: every transaction raises the setting itself
// (docs/contracts/database.md).
func TestCommitNotDurableIsUnavailableWhateverClientMinMessages(t *testing.T) {
	p := pgtest.Pair(t, pgcluster.PairOptions{Sync: true})
	t.Cleanup(p.ReleaseStandby) // before Stop: a held standby would hold the drain's commits
	ctx := context.Background()
	for _, quiet := range pgtest.QuietPlaces {
		// About the commit's durability; no attempt, no statement copy: books unchecked.
		e := startOn(t, pgtest.Quiet(t, p, "paydb", quiet), withSettleToken, booksUnchecked)
		id := func(s string) string { return "p-" + quiet + "-" + s }
		req := lockapi.SubmissionRequest{PayoutID: id("create"), AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
		calls := []struct {
			name string
			call func() error
		}{
			{"create", func() error { _, err := e.client.Create(ctx, req); return err }},
			{"claim", func() error { _, err := e.client.Claim(ctx, id("claim"), 5, "exec-a"); return err }},
			{"post", func() error {
				_, err := e.client.Post(ctx, id("post"), 7, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")})
				return err
			}},
			{"settle", func() error {
				status, body, err := e.trySettle(id("settle"), bearer, `{"outcome":"NOT_PRESENTED"}`)
				if err != nil {
					return err
				}
				var pr lockapi.Problem
				if status == http.StatusOK || json.Unmarshal(body, &pr) != nil {
					return fmt.Errorf("settle answered %d %s", status, body)
				}
				return &pr
			}},
		}
		e.create(t, id("claim"), "acct-1", 100)
		e.create(t, id("post"), "acct-1", 100)
		e.claim(t, id("post"), 7, "exec-a")
		e.ambiguous(t, id("settle"), 30, 8)
		for _, c := range calls {
			if _, err := problemIs(heldCall(t, p, false, c.call), http.StatusServiceUnavailable, lockapi.CodeUnavailable); err != nil {
				t.Errorf("client_min_messages = error (%s): %s whose commit's wait was cancelled: %v", quiet, c.name, err)
			}
		}
	}
}
