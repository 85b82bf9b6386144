package payment_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/payment"
	"lock.dev/lockapi"
)

// The books check (docs/contracts/books.md): a post agrees with the payout's
// forwardable rail_submission row, a settle with the statement copy. The rows of
// rail-proxy's and the reconciler's tables are the fixture, seeded in SQL as
// those services write them.

// payee is the beneficiary env.create books every payout with.
const payee = "NL91ABNA0417164300"

// presented overrides what an attempt or a statement line carries; a nil field
// is the payout's own.
type presented struct {
	account     *string
	amount      *int64
	currency    *string
	beneficiary *string
}

// attempt seeds the payout's attempt at the rail as rail-proxy records it:
// outcome "" is unresolved (in flight), and the row was submitted ago before now.
func (e *env) attempt(t testing.TB, id, outcome string, ref, reason *string, ago time.Duration, as presented) {
	t.Helper()
	var o any
	if outcome != "" {
		o = outcome
	}
	e.exec(t, `INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor,
	        currency, beneficiary, outcome, rail_reference, decline_reason, submitted_at, resolved_at)
	SELECT p.payout_id, coalesce($2::text, p.account_id), greatest(p.fence_token, 1), coalesce(p.claimed_by, 'exec-a'),
	       'k-' || p.payout_id, coalesce($3::bigint, p.amount_minor), coalesce($4::text, p.currency),
	       coalesce($5::text, p.beneficiary), $6::text, $7::text, $8::text,
	       clock_timestamp() - $9::bigint * interval '1 microsecond',
	       CASE WHEN $6::text IS NULL THEN NULL ELSE clock_timestamp() END
	  FROM payout p WHERE p.payout_id = $1`,
		id, as.account, as.amount, as.currency, as.beneficiary, o, ref, reason, ago.Microseconds())
}

// line seeds a statement line of the payout as the reconciler copies it.
func (e *env) line(t testing.TB, seq int64, id, result string, ref, reason *string, as presented) {
	t.Helper()
	e.exec(t, `INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, beneficiary,
	        result, rail_reference, decline_reason)
	SELECT $1, now(), p.payout_id, coalesce($3::text, p.account_id), coalesce($4::bigint, p.amount_minor),
	       coalesce($5::text, p.currency), coalesce($6::text, p.beneficiary), $7, $8::text, $9::text
	  FROM payout p WHERE p.payout_id = $2`,
		seq, id, as.account, as.amount, as.currency, as.beneficiary, result, ref, reason)
}

// oldLine seeds an ACCEPTED line copied before the statement carried
// beneficiaries: its beneficiary is NULL, which only lines older than the
// column's CHECK may be (the CHECK is NOT VALID, so it is dropped and added back
// around the insert, as the migration left such a line).
func (e *env) oldLine(t testing.TB, seq int64, id, ref string) {
	t.Helper()
	e.exec(t, `ALTER TABLE rail_statement_line DROP CONSTRAINT rail_statement_line_beneficiary_present`)
	e.exec(t, `INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, result, rail_reference)
	SELECT $1, now(), p.payout_id, p.account_id, p.amount_minor, p.currency, 'ACCEPTED', $3 FROM payout p WHERE p.payout_id = $2`,
		seq, id, ref)
	e.exec(t, `ALTER TABLE rail_statement_line
	ADD CONSTRAINT rail_statement_line_beneficiary_present CHECK (beneficiary IS NOT NULL) NOT VALID`)
}

// statementRead sets the reconciler's cursor: the statement was last read in full
// at paydb's now() minus ago.
func (e *env) statementRead(t testing.TB, ago time.Duration) {
	t.Helper()
	e.exec(t, `INSERT INTO reconciler_cursor (id, last_seq, read_at) VALUES (true, 0, now() - $1::bigint * interval '1 microsecond')
	ON CONFLICT (id) DO UPDATE SET read_at = excluded.read_at`, ago.Microseconds())
}

// claimed creates a payout and claims it with token 5 for exec-a.
func (e *env) claimed(t testing.TB, id string) {
	t.Helper()
	e.create(t, id, "acct-1", 1000)
	e.claim(t, id, 5, "exec-a")
}

// ambiguousAfterTimeout makes a payout AMBIGUOUS the way the books allow: its
// attempt, submitted ago, was TIMEOUT, and its claimant posts AMBIGUOUS.
func (e *env) ambiguousAfterTimeout(t testing.TB, id string, ago time.Duration) {
	t.Helper()
	e.claimed(t, id)
	e.attempt(t, id, "TIMEOUT", nil, nil, ago, presented{})
	if _, err := e.client.Post(context.Background(), id, 5, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}); err != nil {
		t.Fatalf("post %s AMBIGUOUS after its TIMEOUT attempt: %v", id, err)
	}
}

// booksSnapshot renders every table a post or a settle writes: payout,
// ledger_entry, payout_settlement and payout_history.
func (e *env) booksSnapshot(t testing.TB) string {
	t.Helper()
	var s string
	err := e.db.QueryRow(context.Background(), `SELECT
	  coalesce((SELECT string_agg(row_to_json(h)::text, E'\n' ORDER BY history_id) FROM payout_history h), '')`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return e.settleSnapshot(t) + "\n--\n" + s
}

// history renders a payout's history rows, oldest first, as
// "status token owner railReference declineReason actor", "-" for NULL.
func (e *env) history(t testing.TB, id string) []string {
	t.Helper()
	return e.texts(t, `SELECT status || ' ' || fence_token || ' ' || coalesce(owner_id, '-') || ' ' ||
	       coalesce(rail_reference, '-') || ' ' || coalesce(decline_reason, '-') || ' ' || coalesce(actor, '-')
	  FROM payout_history WHERE payout_id = $1 ORDER BY history_id`, id)
}

// texts runs a query of one text column and returns its rows.
func (e *env) texts(t testing.TB, sql string, args ...any) []string {
	t.Helper()
	rows, err := e.db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func wantHistory(t testing.TB, e *env, id string, want ...string) {
	t.Helper()
	if got := e.history(t, id); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("history of %s:\n%s\nwant:\n%s", id, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A post the audit trail does not bear out is 409 OUTCOME_NOT_RECORDED with
// recorded = the forwardable row's outcome, "UNRESOLVED" while it has none, null
// without one; nothing is written (payout, ledger, history), and the refusal is
// logged with the presented beneficiary masked.
func TestPostRefusedUnlessRecorded(t *testing.T) {
	t.Parallel()
	e := start(t)
	const other = "GB29NWBK60161331926819"
	type seed struct {
		outcome     string
		ref, reason *string
		as          presented
	}
	paid := func(ref string) lockapi.PostRequest {
		return lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr(ref)}
	}
	declined := func(reason *string) lockapi.PostRequest {
		return lockapi.PostRequest{Outcome: lockapi.StatusDeclined, DeclineReason: reason}
	}
	ambiguous := lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}
	acked := &seed{outcome: "ACKED", ref: ptr("RS-1")}
	rejected := &seed{outcome: "REJECTED", reason: ptr("closed account")}
	cases := []struct {
		name     string
		attempts []seed // none: the payout never went to the rail
		post     lockapi.PostRequest
		recorded *string
		mismatch string
	}{
		{"PAID with no attempt", nil, paid("RS-1"), nil, ""},
		{"DECLINED with no attempt", nil, declined(ptr("closed account")), nil, ""},
		{"AMBIGUOUS with no attempt", nil, ambiguous, nil, ""},
		{"PAID with only unforwardable attempts", []seed{{outcome: "FENCED"}, {outcome: "DUPLICATE"}, {outcome: "UNSENT"}, {outcome: "UNBOOKED"}}, paid("RS-1"), nil, ""},
		{"PAID while unresolved", []seed{{}}, paid("RS-1"), ptr("UNRESOLVED"), ""},
		{"DECLINED while unresolved", []seed{{}}, declined(nil), ptr("UNRESOLVED"), ""},
		{"AMBIGUOUS while unresolved", []seed{{}}, ambiguous, ptr("UNRESOLVED"), ""},
		{"PAID with another railReference", []seed{*acked}, paid("RS-2"), ptr("ACKED"), ""},
		{"DECLINED when ACKED", []seed{*acked}, declined(nil), ptr("ACKED"), ""},
		{"AMBIGUOUS when ACKED", []seed{*acked}, ambiguous, ptr("ACKED"), ""},
		{"PAID when REJECTED", []seed{*rejected}, paid("RS-1"), ptr("REJECTED"), ""},
		{"DECLINED with another declineReason", []seed{*rejected}, declined(ptr("insufficient funds")), ptr("REJECTED"), ""},
		{"DECLINED with a made-up railReference", []seed{*rejected},
			lockapi.PostRequest{Outcome: lockapi.StatusDeclined, RailReference: ptr("RS-9")}, ptr("REJECTED"), ""},
		{"AMBIGUOUS when REJECTED", []seed{*rejected}, ambiguous, ptr("REJECTED"), ""},
		{"PAID when TIMEOUT", []seed{{outcome: "TIMEOUT"}}, paid("RS-1"), ptr("TIMEOUT"), ""},
		{"DECLINED when TIMEOUT", []seed{{outcome: "TIMEOUT"}}, declined(nil), ptr("TIMEOUT"), ""},
		{"AMBIGUOUS with a made-up railReference", []seed{{outcome: "TIMEOUT"}},
			lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous, RailReference: ptr("RS-9")}, ptr("TIMEOUT"), ""},
		{"PAID when ACKED to another beneficiary", []seed{{outcome: "ACKED", ref: ptr("RS-1"), as: presented{beneficiary: ptr(other)}}},
			paid("RS-1"), ptr("ACKED"), lockapi.MismatchBeneficiary},
		{"PAID when ACKED for another amount", []seed{{outcome: "ACKED", ref: ptr("RS-1"), as: presented{amount: ptr(int64(999))}}},
			paid("RS-1"), ptr("ACKED"), lockapi.MismatchAmount},
		{"PAID when ACKED on another account", []seed{{outcome: "ACKED", ref: ptr("RS-1"), as: presented{account: ptr("acct-9")}}},
			paid("RS-1"), ptr("ACKED"), lockapi.MismatchAccount},
		{"PAID when ACKED in another currency", []seed{{outcome: "ACKED", ref: ptr("RS-1"), as: presented{currency: ptr("USD")}}},
			paid("RS-1"), ptr("ACKED"), lockapi.MismatchCurrency},
		{"DECLINED when REJECTED for another beneficiary", []seed{{outcome: "REJECTED", reason: ptr("closed account"), as: presented{beneficiary: ptr(other)}}},
			declined(nil), ptr("REJECTED"), lockapi.MismatchBeneficiary},
	}
	for i, c := range cases {
		id := fmt.Sprintf("p-%d", i)
		e.claimed(t, id)
		for _, s := range c.attempts {
			e.attempt(t, id, s.outcome, s.ref, s.reason, 0, s.as)
		}
	}
	before := e.booksSnapshot(t)
	for i, c := range cases {
		id := fmt.Sprintf("p-%d", i)
		_, err := e.client.Post(context.Background(), id, 5, "exec-a", c.post)
		p, perr := problemIs(err, http.StatusConflict, lockapi.CodeOutcomeNotRecorded)
		if perr != nil {
			t.Errorf("%s: %v", c.name, perr)
			continue
		}
		var recorded *string
		if ok, err := p.Member("recorded", &recorded); !ok || err != nil {
			t.Errorf("%s: member recorded missing (%v)", c.name, err)
		} else if !eq(recorded, c.recorded) {
			t.Errorf("%s: recorded = %v, want %v", c.name, deref(recorded), deref(c.recorded))
		}
	}
	if e.booksSnapshot(t) != before {
		t.Fatal("a refused post wrote to payout, ledger_entry or payout_history")
	}
	logged := e.logs.events(t, "outcome_not_recorded")
	if len(logged) != len(cases) {
		t.Fatalf("%d outcome_not_recorded log lines, want %d", len(logged), len(cases))
	}
	for i, l := range logged {
		c := cases[i]
		if l["level"] != "WARN" || l["payoutId"] != fmt.Sprintf("p-%d", i) || l["reason"] == "" || l["mismatch"] != c.mismatch {
			t.Errorf("%s: log line %v", c.name, l)
		}
	}
	if strings.Contains(e.logs.String(), other) || strings.Contains(e.logs.String(), payee) {
		t.Fatal("a beneficiary appears unmasked in the log")
	}
}

// The refusal comes after 404, PAYOUT_FINAL and FENCED_OUT: a post the books
// would refuse is answered those first, and writes nothing either.
func TestPostRefusalPrecedence(t *testing.T) {
	t.Parallel()
	e := start(t)
	e.claimed(t, "p-1") // no attempt: the books would refuse any post
	e.ambiguousAfterTimeout(t, "p-final", 0)
	before := e.booksSnapshot(t)
	ctx := context.Background()
	paid := lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}
	_, err := e.client.Post(ctx, "p-none", 5, "exec-a", paid)
	asProblem(t, err, http.StatusNotFound, lockapi.CodeNotFound)
	_, err = e.client.Post(ctx, "p-final", 5, "exec-a", paid)
	asProblem(t, err, http.StatusConflict, lockapi.CodePayoutFinal)
	_, err = e.client.Post(ctx, "p-1", 4, "exec-a", paid)
	asProblem(t, err, http.StatusConflict, lockapi.CodeFencedOut)
	_, err = e.client.Post(ctx, "p-1", 5, "exec-b", paid)
	asProblem(t, err, http.StatusConflict, lockapi.CodeFencedOut)
	_, err = e.client.Post(ctx, "p-1", 5, "exec-a", paid)
	asProblem(t, err, http.StatusConflict, lockapi.CodeOutcomeNotRecorded)
	if e.booksSnapshot(t) != before {
		t.Fatal("a refused post wrote something")
	}
}

// Each post the audit trail bears out is taken: PAID as ACKED with its reference
// (and its ledger entry), DECLINED as REJECTED with the row's reason when the
// post gives none, AMBIGUOUS after TIMEOUT or after an attempt that presented
// other fields than the payout's (resolved or not).
func TestPostAsRecorded(t *testing.T) {
	t.Parallel()
	e := start(t)
	const other = "GB29NWBK60161331926819"
	cases := []struct {
		id          string
		outcome     string
		ref, reason *string
		as          presented
		post        lockapi.PostRequest
		wantReason  *string
	}{
		{"p-paid", "ACKED", ptr("RS-1"), nil, presented{}, lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}, nil},
		{"p-declined-taken", "REJECTED", nil, ptr("closed account"), presented{}, lockapi.PostRequest{Outcome: lockapi.StatusDeclined}, ptr("closed account")},
		{"p-declined-given", "REJECTED", nil, ptr("closed account"), presented{},
			lockapi.PostRequest{Outcome: lockapi.StatusDeclined, DeclineReason: ptr("closed account")}, ptr("closed account")},
		{"p-declined-no-reason", "REJECTED", nil, nil, presented{}, lockapi.PostRequest{Outcome: lockapi.StatusDeclined}, nil},
		{"p-timeout", "TIMEOUT", nil, nil, presented{}, lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}, nil},
		{"p-redirected", "ACKED", ptr("RS-2"), nil, presented{beneficiary: ptr(other)}, lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}, nil},
		{"p-inflight-other-amount", "", nil, nil, presented{amount: ptr(int64(1))}, lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}, nil},
	}
	for _, c := range cases {
		e.claimed(t, c.id)
		e.attempt(t, c.id, c.outcome, c.ref, c.reason, 0, c.as)
	}
	for _, c := range cases {
		p, err := e.client.Post(context.Background(), c.id, 5, "exec-a", c.post)
		if err != nil {
			t.Errorf("%s: %v", c.id, err)
			continue
		}
		if p.Status != c.post.Outcome || !eq(p.RailReference, c.post.RailReference) || !eq(p.DeclineReason, c.wantReason) {
			t.Errorf("%s: answered %s ref %v reason %v", c.id, p.Status, deref(p.RailReference), deref(p.DeclineReason))
		}
		wantHistory(t, e, c.id, "PENDING 0 - - - -", "CLAIMED 5 exec-a - - -",
			fmt.Sprintf("%s 5 exec-a %s %s -", c.post.Outcome, orDash(c.post.RailReference), orDash(c.wantReason)))
	}
	if n := e.queryInt(t, `SELECT count(*) FROM ledger_entry WHERE payout_id = 'p-paid' AND amount_minor = -1000 AND posted_token = 5`); n != 1 {
		t.Fatalf("the PAID post's ledger entry: %d rows", n)
	}
	if n := e.queryInt(t, `SELECT count(*) FROM ledger_entry`); n != 1 {
		t.Fatalf("%d ledger entries, want the PAID post's only", n)
	}
	if n := len(e.logs.events(t, "outcome_not_recorded")); n != 0 {
		t.Fatalf("%d outcome_not_recorded log lines after posts the books bear out", n)
	}
}

// A settle the statement copy does not bear out is 409
// SETTLE_CONTRADICTS_STATEMENT; nothing is written (payout, ledger, settlement,
// history), and the refusal is logged with the line's beneficiary masked.
func TestSettleRefusedUnlessTheStatementSaysSo(t *testing.T) {
	t.Parallel()
	e := start(t, withSettleToken)
	const other = "GB29NWBK60161331926819"
	window := payment.DefaultSettleAfter
	ids := []string{"p-no-line", "p-other-amount", "p-other-beneficiary", "p-other-ref", "p-other-seq", "p-only-declined",
		"p-declined-accepted", "p-declined-no-line", "p-declined-other-reason", "p-declined-other-seq",
		"p-np-line", "p-np-early", "p-np-unstorable"}
	for _, id := range ids {
		ago := time.Duration(0)
		if id == "p-np-line" || id == "p-np-unstorable" {
			ago = 2 * window // the window has passed: only the line refuses
		}
		e.ambiguousAfterTimeout(t, id, ago)
	}
	e.line(t, 1, "p-other-amount", "ACCEPTED", ptr("RS-1"), nil, presented{amount: ptr(int64(1001))})
	e.line(t, 2, "p-other-beneficiary", "ACCEPTED", ptr("RS-2"), nil, presented{beneficiary: ptr(other)})
	e.line(t, 3, "p-other-ref", "ACCEPTED", ptr("RS-3"), nil, presented{})
	e.line(t, 4, "p-other-seq", "ACCEPTED", ptr("RS-4"), nil, presented{})
	e.line(t, 5, "p-only-declined", "DECLINED", nil, ptr("closed account"), presented{})
	e.line(t, 6, "p-declined-accepted", "DECLINED", nil, ptr("closed account"), presented{})
	e.line(t, 7, "p-declined-accepted", "ACCEPTED", ptr("RS-7"), nil, presented{})
	e.line(t, 8, "p-declined-other-reason", "DECLINED", nil, ptr("closed account"), presented{})
	e.line(t, 9, "p-declined-other-seq", "DECLINED", nil, ptr("closed account"), presented{})
	e.line(t, 10, "p-np-line", "DECLINED", nil, nil, presented{})
	e.exec(t, `INSERT INTO reconciliation_exception (kind, payout_id, seq, detail) VALUES ('UNSTORABLE_LINE', 'p-np-unstorable', 11, 'not text')`)
	e.statementRead(t, 0)

	cases := []struct{ id, body string }{
		{"p-no-line", `{"outcome":"PAID","railReference":"RS-0","statementSeq":1}`},
		{"p-other-amount", `{"outcome":"PAID","railReference":"RS-1","statementSeq":1}`},
		{"p-other-beneficiary", `{"outcome":"PAID","railReference":"RS-2","statementSeq":2}`},
		{"p-other-ref", `{"outcome":"PAID","railReference":"RS-MADE-UP","statementSeq":3}`},
		{"p-other-seq", `{"outcome":"PAID","railReference":"RS-4","statementSeq":3}`},
		{"p-only-declined", `{"outcome":"PAID","railReference":"RS-5","statementSeq":5}`},
		{"p-declined-accepted", `{"outcome":"DECLINED","declineReason":"closed account","statementSeq":6}`},
		{"p-declined-no-line", `{"outcome":"DECLINED","declineReason":"closed account","statementSeq":1}`},
		{"p-declined-other-reason", `{"outcome":"DECLINED","declineReason":"made up","statementSeq":8}`},
		{"p-declined-other-seq", `{"outcome":"DECLINED","declineReason":"closed account","statementSeq":8}`},
		{"p-np-line", `{"outcome":"NOT_PRESENTED"}`},
		{"p-np-early", `{"outcome":"NOT_PRESENTED"}`},
		{"p-np-unstorable", `{"outcome":"NOT_PRESENTED"}`},
	}
	before := e.booksSnapshot(t)
	for _, c := range cases {
		status, pr, _ := e.settle(t, c.id, bearer, c.body)
		if status != http.StatusConflict || pr.Code != lockapi.CodeSettleContradictsStatement {
			t.Errorf("settle %s %s: %d %+v, want 409 SETTLE_CONTRADICTS_STATEMENT", c.id, c.body, status, pr)
		}
	}
	if e.booksSnapshot(t) != before {
		t.Fatal("a refused settle wrote something")
	}
	logged := e.logs.events(t, "settle_contradicts_statement")
	if len(logged) != len(cases) {
		t.Fatalf("%d settle_contradicts_statement log lines, want %d", len(logged), len(cases))
	}
	for i, l := range logged {
		if l["level"] != "WARN" || l["payoutId"] != cases[i].id || l["reason"] == "" {
			t.Errorf("log line %v", l)
		}
	}
	if l := logged[2]; l["lineBeneficiary"] != lockapi.MaskBeneficiary(other) {
		t.Errorf("the other beneficiary's line is logged %v, want it masked", l["lineBeneficiary"])
	}
	if strings.Contains(e.logs.String(), other) || strings.Contains(e.logs.String(), settleToken) {
		t.Fatal("a beneficiary unmasked or the settle token appears in the log")
	}
	if v := e.metric(t, `payout_settle_total{outcome="paid"}`) + e.metric(t, `payout_settle_total{outcome="declined"}`) +
		e.metric(t, `payout_settle_total{outcome="not_presented"}`); v != 0 {
		t.Fatalf("refused settles were counted: %v", v)
	}
}

// Each settle the statement copy bears out is taken, and recorded in the
// payout's history with no owner: PAID from the first matching ACCEPTED line
// (a second ACCEPTED line does not refuse it; a line older than the beneficiary
// column is not compared on it; beneficiaries compare as IBANs do), DECLINED
// from a DECLINED line, NOT_PRESENTED once the statement was read past the
// attempt plus PAYMENT_SETTLE_AFTER. An identical repeat writes nothing.
func TestSettleAsTheStatementSays(t *testing.T) {
	t.Parallel()
	e := start(t, withSettleToken)
	window := payment.DefaultSettleAfter
	for _, id := range []string{"p-paid", "p-twice", "p-old-line", "p-spaced", "p-second-matches", "p-declined"} {
		e.ambiguousAfterTimeout(t, id, 0)
	}
	e.ambiguousAfterTimeout(t, "p-absent", window+time.Minute)
	e.line(t, 1, "p-paid", "ACCEPTED", ptr("RS-1"), nil, presented{})
	e.line(t, 2, "p-twice", "ACCEPTED", ptr("RS-2"), nil, presented{})
	e.line(t, 3, "p-twice", "ACCEPTED", ptr("RS-3"), nil, presented{})
	e.oldLine(t, 4, "p-old-line", "RS-4")
	e.line(t, 5, "p-spaced", "ACCEPTED", ptr("RS-5"), nil, presented{beneficiary: ptr("nl91 abna 0417 1643 00")})
	e.line(t, 6, "p-second-matches", "ACCEPTED", ptr("RS-6"), nil, presented{beneficiary: ptr("GB29NWBK60161331926819")})
	e.line(t, 7, "p-second-matches", "ACCEPTED", ptr("RS-7"), nil, presented{})
	e.line(t, 8, "p-declined", "DECLINED", nil, ptr("closed account"), presented{})
	e.statementRead(t, 0)

	cases := []struct{ id, body, status, ref, reason string }{
		{"p-paid", `{"outcome":"PAID","railReference":"RS-1","statementSeq":1}`, "PAID", "RS-1", "-"},
		{"p-twice", `{"outcome":"PAID","railReference":"RS-2","statementSeq":2}`, "PAID", "RS-2", "-"},
		{"p-old-line", `{"outcome":"PAID","railReference":"RS-4","statementSeq":4}`, "PAID", "RS-4", "-"},
		{"p-spaced", `{"outcome":"PAID","railReference":"RS-5","statementSeq":5}`, "PAID", "RS-5", "-"},
		{"p-second-matches", `{"outcome":"PAID","railReference":"RS-7","statementSeq":7}`, "PAID", "RS-7", "-"},
		{"p-declined", `{"outcome":"DECLINED","declineReason":"closed account","statementSeq":8}`, "DECLINED", "-", "closed account"},
		{"p-absent", `{"outcome":"NOT_PRESENTED"}`, "NOT_PRESENTED", "-", "-"},
	}
	for _, c := range cases {
		status, pr, p := e.settle(t, c.id, bearer, c.body)
		if status != http.StatusOK || p.Status != c.status {
			t.Errorf("settle %s %s: %d %+v %+v", c.id, c.body, status, pr, p)
			continue
		}
		wantHistory(t, e, c.id, "PENDING 0 - - - -", "CLAIMED 5 exec-a - - -", "AMBIGUOUS 5 exec-a - - -",
			fmt.Sprintf("%s 5 - %s %s -", c.status, c.ref, c.reason))
	}
	if n := e.queryInt(t, `SELECT count(*) FROM ledger_entry`); n != 5 {
		t.Fatalf("%d ledger entries, want the five PAID settles'", n)
	}
	before := e.booksSnapshot(t)
	for _, c := range cases {
		if status, pr, _ := e.settle(t, c.id, bearer, c.body); status != http.StatusOK {
			t.Errorf("identical repeat of %s: %d %+v", c.id, status, pr)
		}
	}
	if e.booksSnapshot(t) != before {
		t.Fatal("an identical repeat wrote something")
	}
}

// NOT_PRESENTED waits for the statement read past the attempt's submitted_at
// plus PAYMENT_SETTLE_AFTER; with no forwardable attempt (a payout posted
// AMBIGUOUS while the check was off), past the payout's updated_at plus it. The
// read is paydb's clock, as the reconciler's.
func TestNotPresentedWaitsForTheWindow(t *testing.T) {
	t.Parallel()
	on := start(t, withSettleToken, func(c *payment.Config) { c.SettleAfter = time.Hour })
	on.ambiguousAfterTimeout(t, "p-attempt", 90*time.Minute)
	// The payout with no attempt was posted AMBIGUOUS by a payment-resource whose
	// books were not checked, on the same paydb.
	off := startOn(t, on.dbURL, booksUnchecked)
	off.claimed(t, "p-none")
	if _, err := off.client.Post(context.Background(), "p-none", 5, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}); err != nil {
		t.Fatal(err)
	}
	np := `{"outcome":"NOT_PRESENTED"}`
	refused := func(id, when string) {
		t.Helper()
		if status, pr, _ := on.settle(t, id, bearer, np); status != http.StatusConflict || pr.Code != lockapi.CodeSettleContradictsStatement {
			t.Fatalf("NOT_PRESENTED of %s %s: %d %+v, want 409 SETTLE_CONTRADICTS_STATEMENT", id, when, status, pr)
		}
	}
	refused("p-attempt", "before any complete read")
	// Read 31 minutes after the attempt: within the hour.
	on.statementRead(t, 59*time.Minute)
	refused("p-attempt", "read 31 minutes after the attempt")
	// Read 80 minutes after the attempt: the window runs from the attempt's
	// submitted_at, not from when the payout went AMBIGUOUS (moments ago).
	on.statementRead(t, 10*time.Minute)
	settled := func(id string) {
		t.Helper()
		if status, pr, p := on.settle(t, id, bearer, np); status != http.StatusOK || p.Status != lockapi.StatusNotPresented {
			t.Fatalf("NOT_PRESENTED of %s past the window: %d %+v", id, status, pr)
		}
	}
	settled("p-attempt")
	// p-none has no attempt: its window runs from its updated_at.
	on.exec(t, `UPDATE reconciler_cursor SET read_at = (SELECT updated_at FROM payout WHERE payout_id = 'p-none') + interval '59 minutes'`)
	refused("p-none", "read 59 minutes after it went AMBIGUOUS")
	on.exec(t, `UPDATE reconciler_cursor SET read_at = (SELECT updated_at FROM payout WHERE payout_id = 'p-none') + interval '61 minutes'`)
	settled("p-none")
}

// The history holds one row per move, in the transaction that made it: the
// creation (PENDING, token 0, no owner), each claim (its token and owner), the
// post (its status, token, owner and words); actor stays NULL. A repeated
// create, a refused claim or post write none.
func TestHistoryRecordsEveryMove(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	e.create(t, "p-1", "acct-1", 1000)
	e.create(t, "p-1", "acct-1", 1000) // the same create again: 200, no move
	e.claim(t, "p-1", 5, "exec-a")
	e.claim(t, "p-1", 7, "exec-b")
	if _, err := e.client.Claim(ctx, "p-1", 6, "exec-a"); err == nil {
		t.Fatal("a stale claim succeeded")
	}
	if _, err := e.client.Post(ctx, "p-1", 5, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusAmbiguous}); err == nil {
		t.Fatal("a superseded holder's post succeeded")
	}
	e.attempt(t, "p-1", "ACKED", ptr("RS-1"), nil, 0, presented{})
	if _, err := e.client.Post(ctx, "p-1", 7, "exec-b", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Post(ctx, "p-1", 7, "exec-b", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}); err == nil {
		t.Fatal("a repeated post succeeded")
	}
	wantHistory(t, e, "p-1", "PENDING 0 - - - -", "CLAIMED 5 exec-a - - -", "CLAIMED 7 exec-b - - -", "PAID 7 exec-b RS-1 - -")
	if n := e.queryInt(t, `SELECT count(*) FROM payout_history WHERE recorded_at IS NULL OR actor IS NOT NULL`); n != 0 {
		t.Fatalf("%d history rows without a time or with an actor", n)
	}
}

// PAYMENT_BOOKS_CHECK=false: posts and settles are taken as before the check —
// a PAID post with no attempt, a NOT_PRESENTED settle the statement contradicts —
// start-up says so at WARN (books_not_checked), and payment_books_check_enabled
// is 0; on (the default), it is 1 and nothing is said.
func TestBooksCheckOff(t *testing.T) {
	t.Parallel()
	off := start(t, withSettleToken, booksUnchecked)
	off.claimed(t, "p-paid")
	if _, err := off.client.Post(context.Background(), "p-paid", 5, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-MADE-UP")}); err != nil {
		t.Fatalf("PAID post with no attempt, books unchecked: %v", err)
	}
	off.ambiguousAfterTimeout(t, "p-accepted", 0)
	off.line(t, 1, "p-accepted", "ACCEPTED", ptr("RS-1"), nil, presented{})
	if status, pr, p := off.settle(t, "p-accepted", bearer, `{"outcome":"NOT_PRESENTED"}`); status != http.StatusOK || p.Status != lockapi.StatusNotPresented {
		t.Fatalf("NOT_PRESENTED settle against an ACCEPTED line, books unchecked: %d %+v", status, pr)
	}
	wantHistory(t, off, "p-paid", "PENDING 0 - - - -", "CLAIMED 5 exec-a - - -", "PAID 5 exec-a RS-MADE-UP - -")
	if v := off.metric(t, "payment_books_check_enabled"); v != 0 {
		t.Errorf("payment_books_check_enabled = %v with the check off", v)
	}
	if l := off.logs.events(t, "books_not_checked"); len(l) != 1 || l[0]["level"] != "WARN" || l[0]["setting"] != "PAYMENT_BOOKS_CHECK" {
		t.Errorf("books_not_checked log lines: %v", l)
	}

	on := start(t)
	if v := on.metric(t, "payment_books_check_enabled"); v != 1 {
		t.Errorf("payment_books_check_enabled = %v with the check on", v)
	}
	if l := on.logs.events(t, "books_not_checked"); len(l) != 0 {
		t.Errorf("books_not_checked logged with the check on: %v", l)
	}
}

func orDash(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// Concurrent identical posts the audit trail bears out: the check reads the
// payout under the lock its UPDATE would take, so one post wins and the others
// find the payout final (PAYOUT_FINAL), with one ledger entry and one history
// row for the move.
func TestConcurrentBookedPostsMoveOnce(t *testing.T) {
	t.Parallel()
	e := start(t, func(c *payment.Config) { c.DBTimeout = 20 * time.Second })
	e.claimed(t, "p-1")
	e.attempt(t, "p-1", "ACKED", ptr("RS-1"), nil, 0, presented{})
	const posters = 16
	errs := make(chan error, posters)
	var wg sync.WaitGroup
	for range posters {
		wg.Go(func() {
			_, err := e.client.Post(context.Background(), "p-1", 5, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	won := 0
	for err := range errs {
		if err == nil {
			won++
			continue
		}
		if _, perr := problemIs(err, http.StatusConflict, lockapi.CodePayoutFinal); perr != nil {
			t.Error(perr)
		}
	}
	if won != 1 {
		t.Fatalf("%d posts succeeded, want 1", won)
	}
	if n := e.queryInt(t, `SELECT count(*) FROM ledger_entry WHERE payout_id = 'p-1'`); n != 1 {
		t.Fatalf("%d ledger entries, want 1", n)
	}
	wantHistory(t, e, "p-1", "PENDING 0 - - - -", "CLAIMED 5 exec-a - - -", "PAID 5 exec-a RS-1 - -")
}
