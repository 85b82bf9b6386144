package payment_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/payment"
	"lock.dev/lockapi"
)

const settleToken = "reconciler-test-token-0123456789"

func withSettleToken(c *payment.Config) { c.SettleToken = settleToken }

// settle posts a settle body with the given Authorization value ("" sends none).
func (e *env) settle(t testing.TB, id, auth, body string) (int, *lockapi.Problem, lockapi.Payout) {
	t.Helper()
	h := map[string][]string{"Content-Type": {"application/json"}}
	if auth != "" {
		h["Authorization"] = []string{auth}
	}
	status, b := e.raw(t, http.MethodPost, "/v1/payouts/"+id+"/settle", h, body)
	var p lockapi.Payout
	if status == http.StatusOK {
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatalf("settle %s: 200 with %s: %v", id, b, err)
		}
		return status, nil, p
	}
	var pr lockapi.Problem
	if err := json.Unmarshal(b, &pr); err != nil || pr.Status != status || pr.Code == "" {
		t.Fatalf("settle %s: %d with %s, want problem+json", id, status, b)
	}
	return status, &pr, p
}

// ambiguous creates a payout, claims it with token and posts it AMBIGUOUS.
func (e *env) ambiguous(t testing.TB, id string, amount, token int64) {
	t.Helper()
	e.create(t, id, "acct-1", amount)
	e.claim(t, id, token, "exec-a")
	if _, err := e.client.Post(context.Background(), id, token, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}); err != nil {
		t.Fatalf("post %s AMBIGUOUS: %v", id, err)
	}
}

var bearer = "Bearer " + settleToken

// Each outcome moves an AMBIGUOUS payout once: PAID books its ledger entry in the
// same transaction, posted with the payout's fence token; DECLINED and
// NOT_PRESENTED book nothing. An identical repeat answers 200 and changes and
// counts nothing; any other settle of a settled payout is 409 PAYOUT_FINAL. Every
// outcome is final for executors afterwards.
func TestSettleMovesAmbiguousOnce(t *testing.T) {
	t.Parallel()
	e := start(t, withSettleToken, booksUnchecked) // about settle's moves and repeats; no attempt, no statement copy
	e.ambiguous(t, "p-paid", 1500, 7)
	e.ambiguous(t, "p-declined", 20, 3)
	e.ambiguous(t, "p-absent", 30, 4)

	cases := []struct {
		id, body, status string
		ref, reason      *string
	}{
		{"p-paid", `{"outcome":"PAID","railReference":"RS-ABC","statementSeq":11}`, "PAID", ptr("RS-ABC"), nil},
		{"p-declined", `{"outcome":"DECLINED","declineReason":"closed account","statementSeq":12,"railReference":null}`, "DECLINED", nil, ptr("closed account")},
		{"p-absent", `{"outcome":"NOT_PRESENTED","statementSeq":null}`, "NOT_PRESENTED", nil, nil},
	}
	for _, c := range cases {
		status, pr, p := e.settle(t, c.id, bearer, c.body)
		if status != http.StatusOK {
			t.Fatalf("settle %s: %d %+v", c.id, status, pr)
		}
		if p.Status != c.status || !eq(p.RailReference, c.ref) || !eq(p.DeclineReason, c.reason) {
			t.Fatalf("settle %s answered %+v", c.id, p)
		}
	}
	if n := e.queryInt(t, `SELECT count(*) FROM ledger_entry`); n != 1 {
		t.Fatalf("%d ledger entries, want 1 (the PAID settle's)", n)
	}
	if n := e.queryInt(t, `SELECT count(*) FROM ledger_entry WHERE payout_id='p-paid' AND amount_minor=-1500 AND posted_token=7 AND account_id='acct-1' AND currency='EUR'`); n != 1 {
		t.Fatal("the PAID settle's ledger entry is not -1500 EUR on acct-1 posted with the fence token 7")
	}
	for _, o := range []string{"paid", "declined", "not_presented"} {
		if v := e.metric(t, fmt.Sprintf(`payout_settle_total{outcome=%q}`, o)); v != 1 {
			t.Errorf("payout_settle_total{outcome=%s} = %v, want 1", o, v)
		}
	}
	if v := e.metric(t, `payout_transition_total{to="not_presented"}`); v != 1 {
		t.Errorf(`payout_transition_total{to="not_presented"} = %v, want 1`, v)
	}
	settled := e.logs.events(t, "payout_settled")
	if len(settled) != 3 || settled[0]["statementSeq"] != float64(11) || settled[0]["outcome"] != "PAID" {
		t.Fatalf("payout_settled log lines = %v", settled)
	}

	// The identical repeat: 200, the payout as it is, nothing written or counted.
	before := e.snapshot(t)
	for _, c := range cases {
		status, pr, p := e.settle(t, c.id, bearer, c.body)
		if status != http.StatusOK || p.Status != c.status {
			t.Fatalf("identical repeat of %s: %d %+v %+v", c.id, status, pr, p)
		}
	}
	if e.snapshot(t) != before {
		t.Fatal("an identical repeat changed the tables")
	}
	if v := e.metric(t, `payout_settle_total{outcome="paid"}`); v != 1 {
		t.Fatalf("an identical repeat was counted: payout_settle_total{paid} = %v", v)
	}

	// Anything else on a settled payout: 409 PAYOUT_FINAL with its status.
	for _, c := range []struct{ id, body, status string }{
		{"p-paid", `{"outcome":"PAID","railReference":"RS-ABC","statementSeq":99}`, "PAID"},
		{"p-paid", `{"outcome":"PAID","railReference":"RS-OTHER","statementSeq":11}`, "PAID"},
		{"p-paid", `{"outcome":"NOT_PRESENTED"}`, "PAID"},
		{"p-declined", `{"outcome":"DECLINED","statementSeq":12}`, "DECLINED"},
		{"p-absent", `{"outcome":"PAID","railReference":"RS-LATE","statementSeq":13}`, "NOT_PRESENTED"},
	} {
		status, pr, _ := e.settle(t, c.id, bearer, c.body)
		if status != http.StatusConflict || pr.Code != lockapi.CodePayoutFinal || member[string](t, pr, "payoutStatus") != c.status {
			t.Errorf("settle %s %s: %d %+v, want 409 PAYOUT_FINAL payoutStatus %s", c.id, c.body, status, pr, c.status)
		}
	}
	if e.snapshot(t) != before {
		t.Fatal("a refused settle changed the tables")
	}

	// NOT_PRESENTED is final for executors too.
	_, err := e.client.Claim(context.Background(), "p-absent", 100, "exec-b")
	if p := asProblem(t, err, http.StatusConflict, lockapi.CodePayoutFinal); member[string](t, p, "payoutStatus") != "NOT_PRESENTED" {
		t.Fatalf("claim of a NOT_PRESENTED payout: %+v", p)
	}
	if strings.Contains(e.logs.String(), settleToken) {
		t.Fatal("the settle token appears in the log")
	}
}

// A payout an executor owns (PENDING, CLAIMED) is 409 PAYOUT_CONFLICT; one an
// executor made final is 409 PAYOUT_FINAL, even with the very words it was posted
// with; an unknown payout is 404. None of them is written.
func TestSettleRefusesWhatIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	e := start(t, withSettleToken, booksUnchecked) // about settle's status rules; no attempt, no statement copy
	e.create(t, "p-pending", "acct-1", 10)
	e.create(t, "p-claimed", "acct-1", 10)
	e.claim(t, "p-claimed", 2, "exec-a")
	e.create(t, "p-paid", "acct-1", 10)
	e.claim(t, "p-paid", 2, "exec-a")
	if _, err := e.client.Post(context.Background(), "p-paid", 2, "exec-a", lockapi.PostRequest{Outcome: "PAID", RailReference: ptr("RS-1")}); err != nil {
		t.Fatal(err)
	}
	before := e.snapshot(t)
	paid := `{"outcome":"PAID","railReference":"RS-1","statementSeq":1}`
	for _, c := range []struct {
		id, code, payoutStatus string
		status                 int
	}{
		{"p-pending", lockapi.CodePayoutConflict, "PENDING", 409},
		{"p-claimed", lockapi.CodePayoutConflict, "CLAIMED", 409},
		{"p-paid", lockapi.CodePayoutFinal, "PAID", 409},
		{"p-none", lockapi.CodeNotFound, "", 404},
	} {
		status, pr, _ := e.settle(t, c.id, bearer, paid)
		if status != c.status || pr.Code != c.code {
			t.Errorf("settle %s: %d %+v, want %d %s", c.id, status, pr, c.status, c.code)
			continue
		}
		if c.payoutStatus != "" && member[string](t, pr, "payoutStatus") != c.payoutStatus {
			t.Errorf("settle %s: payoutStatus %v, want %s", c.id, pr, c.payoutStatus)
		}
	}
	if e.snapshot(t) != before {
		t.Fatal("a refused settle changed the tables")
	}
	if n := e.queryInt(t, `SELECT count(*) FROM payout_settlement`); n != 0 {
		t.Fatalf("%d settlement rows after refusals only", n)
	}
}

// Bad input: a missing or wrong bearer token is 401 UNAUTHORIZED
// before any other rule (even with a body that breaks them all); then 415, 413 and
// 400 as for every endpoint. Nothing is written and nothing counted.
func TestSettleBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	e := start(t, withSettleToken, booksUnchecked) // about settle's validation; no attempt, no statement copy
	e.ambiguous(t, "p-1", 10, 1)
	before := e.settleSnapshot(t)
	good := `{"outcome":"PAID","railReference":"RS-1","statementSeq":1}`
	jsonOnly := map[string][]string{"Content-Type": {"application/json"}}
	with := func(auth ...string) map[string][]string {
		return map[string][]string{"Content-Type": {"application/json"}, "Authorization": auth}
	}
	for _, c := range []struct {
		name   string
		path   string
		header map[string][]string
		body   string
		status int
		field  string
	}{
		{"no Authorization", "p-1", jsonOnly, good, 401, ""},
		{"wrong token", "p-1", with("Bearer " + strings.ToUpper(settleToken)), good, 401, ""},
		{"token with a suffix", "p-1", with(bearer + "x"), good, 401, ""},
		{"token prefix", "p-1", with(bearer[:len(bearer)-1]), good, 401, ""},
		{"Basic scheme", "p-1", with("Basic " + settleToken), good, 401, ""},
		{"no scheme", "p-1", with(settleToken), good, 401, ""},
		{"two Authorization headers", "p-1", with(bearer, bearer), good, 401, ""},
		{"wrong token and every other fault", "no such id!", map[string][]string{"Content-Type": {"text/plain"}, "Authorization": {"Bearer nope"}}, "{", 401, ""},
		{"content type", "p-1", map[string][]string{"Content-Type": {"text/plain"}, "Authorization": {bearer}}, good, 415, ""},
		{"too large", "p-1", with(bearer), `{"outcome":"PAID","railReference":"` + strings.Repeat("R", 70<<10) + `","statementSeq":1}`, 413, ""},
		{"not JSON", "p-1", with(bearer), `{`, 400, "body"},
		{"trailing data", "p-1", with(bearer), good + `{}`, 400, "body"},
		{"unknown outcome", "p-1", with(bearer), `{"outcome":"AMBIGUOUS","statementSeq":1}`, 400, "outcome"},
		{"missing outcome", "p-1", with(bearer), `{"railReference":"RS-1","statementSeq":1}`, 400, "outcome"},
		{"PAID without railReference", "p-1", with(bearer), `{"outcome":"PAID","statementSeq":1}`, 400, "railReference"},
		{"PAID with empty railReference", "p-1", with(bearer), `{"outcome":"PAID","railReference":"","statementSeq":1}`, 400, "railReference"},
		{"PAID without statementSeq", "p-1", with(bearer), `{"outcome":"PAID","railReference":"RS-1"}`, 400, "statementSeq"},
		{"PAID with declineReason", "p-1", with(bearer), `{"outcome":"PAID","railReference":"RS-1","statementSeq":1,"declineReason":"x"}`, 400, "declineReason"},
		{"DECLINED without statementSeq", "p-1", with(bearer), `{"outcome":"DECLINED","declineReason":"x"}`, 400, "statementSeq"},
		{"DECLINED with railReference", "p-1", with(bearer), `{"outcome":"DECLINED","railReference":"RS-1","statementSeq":1}`, 400, "railReference"},
		{"NOT_PRESENTED with statementSeq", "p-1", with(bearer), `{"outcome":"NOT_PRESENTED","statementSeq":1}`, 400, "statementSeq"},
		{"statementSeq zero", "p-1", with(bearer), `{"outcome":"PAID","railReference":"RS-1","statementSeq":0}`, 400, "statementSeq"},
		{"statementSeq a string", "p-1", with(bearer), `{"outcome":"PAID","railReference":"RS-1","statementSeq":"1"}`, 400, "statementSeq"},
		{"statementSeq a fraction", "p-1", with(bearer), `{"outcome":"PAID","railReference":"RS-1","statementSeq":1.5}`, 400, "statementSeq"},
		{"unknown member", "p-1", with(bearer), `{"outcome":"NOT_PRESENTED","fenceToken":1}`, 400, "fenceToken"},
		{"bad payout id", "p%20x", with(bearer), good, 400, "payoutId"},
	} {
		status, b := e.raw(t, http.MethodPost, "/v1/payouts/"+c.path+"/settle", c.header, c.body)
		var pr lockapi.Problem
		if err := json.Unmarshal(b, &pr); err != nil || status != c.status || pr.Status != c.status {
			t.Errorf("%s: %d %s, want %d problem+json", c.name, status, b, c.status)
			continue
		}
		wantCode := lockapi.CodeInvalidRequest
		if c.status == 401 {
			wantCode = lockapi.CodeUnauthorized
		}
		if pr.Code != wantCode {
			t.Errorf("%s: code %s, want %s", c.name, pr.Code, wantCode)
		}
		if c.field != "" {
			var errs []lockapi.FieldError
			if ok, _ := pr.Member("errors", &errs); !ok || !hasField(errs, c.field) {
				t.Errorf("%s: errors %v do not name %s", c.name, errs, c.field)
			}
		}
	}
	if e.settleSnapshot(t) != before {
		t.Fatal("a refused settle changed the tables")
	}
	for _, o := range []string{"paid", "declined", "not_presented"} {
		if v := e.metric(t, fmt.Sprintf(`payout_settle_total{outcome=%q}`, o)); v != 0 {
			t.Errorf("payout_settle_total{%s} = %v after refusals only", o, v)
		}
	}
	if n := len(e.logs.events(t, "settle_unauthorized")); n != 8 {
		t.Errorf("%d settle_unauthorized log lines, want 8", n)
	}
	if strings.Contains(e.logs.String(), settleToken) || strings.Contains(e.logs.String(), "Bearer nope") {
		t.Fatal("a presented or the configured token appears in the log")
	}
}

// Without PAYMENT_SETTLE_TOKEN the endpoint does not exist: 404, even with a
// bearer token and a good body, and nothing moves.
func TestSettleDisabledWithoutToken(t *testing.T) {
	t.Parallel()
	e := start(t, booksUnchecked) // about the route's absence; its AMBIGUOUS payout never went to the rail
	e.ambiguous(t, "p-1", 10, 1)
	for _, auth := range []string{"", "Bearer ", bearer} {
		status, pr, _ := e.settle(t, "p-1", auth, `{"outcome":"NOT_PRESENTED"}`)
		if status != http.StatusNotFound || pr.Code != lockapi.CodeNotFound {
			t.Fatalf("settle with auth %q: %d %+v, want 404 NOT_FOUND", auth, status, pr)
		}
	}
	p, err := e.client.Get(context.Background(), "p-1")
	if err != nil || p.Status != lockapi.StatusAmbiguous {
		t.Fatalf("payout after refused settles: %+v %v", p, err)
	}
}

// Many identical settles at once: each answers 200, the payout moves once, one
// ledger entry, counted once. The requests run on their own goroutines, which
// only send what they got; every check is made here, on the test's goroutine.
func TestConcurrentSettlesBookOnce(t *testing.T) {
	t.Parallel()
	e := start(t, withSettleToken, booksUnchecked) // about concurrent settles; no attempt, no statement copy
	e.ambiguous(t, "p-1", 10, 5)
	const n = 8
	type result struct {
		status int
		body   []byte
		err    error
	}
	var wg sync.WaitGroup
	results := make(chan result, n)
	for range n {
		wg.Go(func() {
			status, body, err := e.trySettle("p-1", bearer, `{"outcome":"PAID","railReference":"RS-9","statementSeq":4}`)
			results <- result{status, body, err}
		})
	}
	wg.Wait()
	close(results)
	for r := range results {
		switch {
		case r.err != nil:
			t.Errorf("a concurrent identical settle failed: %v", r.err)
		case r.status != http.StatusOK:
			t.Errorf("a concurrent identical settle answered %d %s, want 200", r.status, r.body)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if c := e.queryInt(t, `SELECT count(*) FROM ledger_entry WHERE payout_id = 'p-1'`); c != 1 {
		t.Fatalf("%d ledger entries, want 1", c)
	}
	if c := e.queryInt(t, `SELECT count(*) FROM payout_settlement WHERE payout_id = 'p-1'`); c != 1 {
		t.Fatalf("%d settlement rows, want 1", c)
	}
	if v := e.metric(t, `payout_settle_total{outcome="paid"}`); v != 1 {
		t.Fatalf("payout_settle_total{paid} = %v, want 1", v)
	}
	if v := e.metric(t, `payout_transition_total{to="paid"}`); v != 1 {
		t.Fatalf("payout_transition_total{paid} = %v, want 1", v)
	}
}

// trySettle posts one settle body and returns the status and body, or the error
// that kept it from an answer. It never fails a test, so any goroutine may call it.
func (e *env) trySettle(id, auth, body string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/v1/payouts/"+id+"/settle", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("settle %s: %w", id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, b, fmt.Errorf("settle %s: reading the answer: %w", id, err)
	}
	return resp.StatusCode, b, nil
}

// settleSnapshot is snapshot with payout_settlement: every table a settle writes.
func (e *env) settleSnapshot(t testing.TB) string {
	t.Helper()
	var s string
	err := e.db.QueryRow(context.Background(), `SELECT
	  coalesce((SELECT string_agg(row_to_json(s)::text, E'\n' ORDER BY payout_id) FROM payout_settlement s), '')`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return e.snapshot(t) + "\n--\n" + s
}

func eq(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func hasField(errs []lockapi.FieldError, field string) bool {
	for _, e := range errs {
		if e.Field == field {
			return true
		}
	}
	return false
}
