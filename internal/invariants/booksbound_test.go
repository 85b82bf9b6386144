package invariants

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
)

// booked is a history in which only the books moved money, written into a real,
// migrated paydb as payment-resource, rail-proxy and the reconciler write it:
//
//	q1  claimed with token 1 by exec-1, re-claimed with token 2 by exec-2; the
//	    superseded holder's ACKED row (token 1) is backed by its own claim; the
//	    newer holder's DUPLICATE, then posted PAID RS-1;
//	q2  token 3 REJECTED "closed", posted DECLINED "closed";
//	q3  token 4 TIMEOUT, posted AMBIGUOUS, settled PAID RS-3 from an ACCEPTED line
//	    whose beneficiary is written as people write IBANs (spaces, lower case);
//	q4  token 5 TIMEOUT, AMBIGUOUS, settled NOT_PRESENTED: no line;
//	q5  token 6 TIMEOUT, AMBIGUOUS, settled DECLINED from a DECLINED line;
//	q6  PENDING, nothing presented;
//	and a payout nobody created, presented and refused by the books (UNBOOKED).
var booked = []string{
	`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by, rail_reference, decline_reason) VALUES
		('q1', 'acct-A', 1000, 'EUR', 'NL91ABNA0417164300', 'PAID', 2, 'exec-2', 'RS-1', NULL),
		('q2', 'acct-A', 2000, 'EUR', 'NL91ABNA0417164300', 'DECLINED', 3, 'exec-1', NULL, 'closed'),
		('q3', 'acct-A', 3000, 'EUR', 'NL91ABNA0417164300', 'PAID', 4, 'exec-1', 'RS-3', NULL),
		('q4', 'acct-A', 4000, 'EUR', 'NL91ABNA0417164300', 'NOT_PRESENTED', 5, 'exec-1', NULL, NULL),
		('q5', 'acct-A', 5000, 'EUR', 'NL91ABNA0417164300', 'DECLINED', 6, 'exec-1', NULL, 'closed'),
		('q6', 'acct-A', 6000, 'EUR', 'NL91ABNA0417164300', 'PENDING', 0, NULL, NULL, NULL)`,
	`INSERT INTO payout_history (payout_id, status, fence_token, owner_id, rail_reference, decline_reason) VALUES
		('q1', 'PENDING', 0, NULL, NULL, NULL), ('q2', 'PENDING', 0, NULL, NULL, NULL), ('q3', 'PENDING', 0, NULL, NULL, NULL),
		('q4', 'PENDING', 0, NULL, NULL, NULL), ('q5', 'PENDING', 0, NULL, NULL, NULL), ('q6', 'PENDING', 0, NULL, NULL, NULL),
		('q1', 'CLAIMED', 1, 'exec-1', NULL, NULL), ('q1', 'CLAIMED', 2, 'exec-2', NULL, NULL), ('q1', 'PAID', 2, 'exec-2', 'RS-1', NULL),
		('q2', 'CLAIMED', 3, 'exec-1', NULL, NULL), ('q2', 'DECLINED', 3, 'exec-1', NULL, 'closed'),
		('q3', 'CLAIMED', 4, 'exec-1', NULL, NULL), ('q3', 'AMBIGUOUS', 4, 'exec-1', NULL, NULL), ('q3', 'PAID', 4, NULL, 'RS-3', NULL),
		('q4', 'CLAIMED', 5, 'exec-1', NULL, NULL), ('q4', 'AMBIGUOUS', 5, 'exec-1', NULL, NULL), ('q4', 'NOT_PRESENTED', 5, NULL, NULL, NULL),
		('q5', 'CLAIMED', 6, 'exec-1', NULL, NULL), ('q5', 'AMBIGUOUS', 6, 'exec-1', NULL, NULL), ('q5', 'DECLINED', 6, NULL, NULL, 'closed')`,
	`INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency,
			beneficiary, outcome, rail_reference, decline_reason, resolved_at) VALUES
		('q1', 'acct-A', 1, 'exec-1', 'q1:1', 1000, 'EUR', 'NL91ABNA0417164300', 'ACKED', 'RS-1', NULL, now()),
		('q1', 'acct-A', 2, 'exec-2', 'q1:2', 1000, 'EUR', 'NL91ABNA0417164300', 'DUPLICATE', NULL, NULL, now()),
		('q2', 'acct-A', 3, 'exec-1', 'q2:3', 2000, 'EUR', 'NL91ABNA0417164300', 'REJECTED', NULL, 'closed', now()),
		('q3', 'acct-A', 4, 'exec-1', 'q3:4', 3000, 'EUR', 'NL91ABNA0417164300', 'TIMEOUT', NULL, NULL, now()),
		('q4', 'acct-A', 5, 'exec-1', 'q4:5', 4000, 'EUR', 'NL91ABNA0417164300', 'TIMEOUT', NULL, NULL, now()),
		('q5', 'acct-A', 6, 'exec-1', 'q5:6', 5000, 'EUR', 'NL91ABNA0417164300', 'TIMEOUT', NULL, NULL, now()),
		('evil', 'acct-A', 7, 'insider', 'evil:7', 99999999, 'EUR', 'EVIL-IBAN', 'UNBOOKED', NULL, NULL, now())`,
	`INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, beneficiary, result, rail_reference, decline_reason) VALUES
		(1, now(), 'q1', 'acct-A', 1000, 'EUR', 'NL91ABNA0417164300', 'ACCEPTED', 'RS-1', NULL),
		(2, now(), 'q2', 'acct-A', 2000, 'EUR', 'NL91ABNA0417164300', 'DECLINED', NULL, 'closed'),
		(3, now(), 'q3', 'acct-A', 3000, 'EUR', 'nl91 abna 0417 1643 00', 'ACCEPTED', 'RS-3', NULL),
		(4, now(), 'q5', 'acct-A', 5000, 'EUR', 'NL91ABNA0417164300', 'DECLINED', NULL, 'closed')`,
	`INSERT INTO payout_settlement (payout_id, outcome, rail_reference, decline_reason, statement_seq) VALUES
		('q3', 'PAID', 'RS-3', NULL, 3), ('q4', 'NOT_PRESENTED', NULL, NULL, NULL), ('q5', 'DECLINED', NULL, 'closed', 4)`,
}

// loadBooked writes booked and then the case's statements into a fresh paydb and
// loads the history back.
func loadBooked(t *testing.T, extra ...string) History {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	paydb := pgtest.Pool(t, pgtest.PaydbURL(t))
	lockdb := pgtest.Pool(t, pgtest.LockdbURL(t))
	for _, sql := range append(slices.Clone(booked), extra...) {
		if _, err := paydb.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	h, err := Load(ctx, paydb, lockdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

var booksBound = Options{FencingEnabled: true, BooksBound: true}

// of8 is the report's invariant-8 findings' checks, sorted.
func of8(r Report) []CheckID {
	var out []CheckID
	for _, v := range r.Violations {
		if v.Invariant == 8 {
			out = append(out, v.Check)
		}
	}
	slices.Sort(out)
	return out
}

// When only the books moved money invariant 8 holds: the payout history, the
// payouts' beneficiaries and the lines' beneficiaries load, a superseded holder's
// row is backed by its own earlier claim, and a line's beneficiary written with
// spaces and in lower case is the payout's.
func TestBooksBoundHistoryHoldsInvariant8(t *testing.T) {
	t.Parallel()
	h := loadBooked(t)
	if len(h.Moves) != 20 {
		t.Fatalf("loaded %d moves, want 20", len(h.Moves))
	}
	m := h.Moves[7]
	if m.PayoutID != "q1" || m.Status != "CLAIMED" || m.FenceToken != 2 || m.OwnerID != "exec-2" || m.RecordedAt.IsZero() ||
		h.Moves[0].OwnerID != "" || h.Moves[8].RailReference != "RS-1" || h.Moves[10].DeclineReason != "closed" {
		t.Fatalf("moves: %+v", h.Moves[:11])
	}
	if h.Payouts[0].Beneficiary != "NL91ABNA0417164300" || h.StatementLines[2].Beneficiary != "nl91 abna 0417 1643 00" {
		t.Fatalf("beneficiaries: payout %q, line %q", h.Payouts[0].Beneficiary, h.StatementLines[2].Beneficiary)
	}
	r := Evaluate(h, booksBound)
	if got := of8(r); len(got) != 0 || !r.Held(8) {
		t.Fatalf("invariant 8 findings in a booked history: %v", r.Violations)
	}
	if r.Submissions.Unbooked != 1 || r.Submissions.Admitted != 5 {
		t.Errorf("submissions %+v, want the UNBOOKED row counted and not admitted", r.Submissions)
	}
	if !slices.ContainsFunc(r.Invariants, func(v Verdict) bool { return v.Invariant == 8 && v.Name == "Only the books move money" }) {
		t.Fatalf("invariant 8 not judged: %+v", r.Invariants)
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"8 Only the books move money", "UNBOOKED (refused by the books, rail not called)", "ACKED/TIMEOUT rows no claim by their token and owner backs",
		"payouts settled PAID without a matching ACCEPTED line"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	// A line copied before lines carried beneficiaries has none: its
	// beneficiary is not compared.
	old := loadBooked(t)
	old.StatementLines[2].Beneficiary = ""
	if r := Evaluate(old, booksBound); len(of8(r)) != 0 {
		t.Errorf("a settle from a line without a beneficiary judged: %v", r.Violations)
	}
	// Without the history there is no invariant 8.
	if r := Evaluate(h, Options{FencingEnabled: true}); slices.ContainsFunc(r.Invariants, func(v Verdict) bool { return v.Invariant == 8 }) {
		t.Fatal("invariant 8 judged without Options.BooksBound")
	}
}

// Each way money moves outside the books, seeded with SQL as a rogue or a switch
// left off would leave it, is caught by exactly its check.
func TestBooksBoundViolationsDetected(t *testing.T) {
	t.Parallel()
	row := func(payout, owner, token, amount, beneficiary, outcome, ref string) string {
		return `INSERT INTO rail_submission (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency,
			beneficiary, outcome, rail_reference, resolved_at) VALUES ('` + payout + `', 'acct-A', ` + token + `, '` + owner + `', '` +
			payout + `:` + token + `', ` + amount + `, 'EUR', '` + beneficiary + `', '` + outcome + `', ` + ref + `, now())`
	}
	claim := func(payout, owner, token string) string {
		return `INSERT INTO payout_history (payout_id, status, fence_token, owner_id) VALUES ('` + payout + `', 'CLAIMED', ` + token + `, '` + owner + `')`
	}
	const claimQ6 = `UPDATE payout SET status = 'CLAIMED', fence_token = 9, claimed_by = 'insider' WHERE payout_id = 'q6'`
	cases := []struct {
		name  string
		sql   []string
		want  []CheckID
		shows string // in the finding's detail
	}{
		{"a payout nobody created, presented and paid", []string{
			row("evil", "insider", "9", "99999999", "EVIL-IBAN", "ACKED", "'RS-E'"),
		}, []CheckID{CheckAdmittedWithoutClaim}, "no payout evil is in the books"},
		{"a payout created before the history existed, presented to another beneficiary", []string{
			`INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary, status, fence_token, claimed_by) VALUES
				('q0', 'acct-A', 500, 'EUR', 'NL91ABNA0417164300', 'CLAIMED', 8, 'exec-1')`,
			row("q0", "exec-1", "8", "500", "GB33BUKB20201555555555", "ACKED", "'RS-0'"),
		}, []CheckID{CheckAdmittedNotAsBooked}, "the books hold acct-A 500 EUR"},
		{"a pending payout presented by a token that never claimed it", []string{
			row("q6", "insider", "9", "6000", "NL91ABNA0417164300", "TIMEOUT", "NULL"),
		}, []CheckID{CheckAdmittedWithoutClaim}, "never claimed"},
		{"a payout presented by another owner with the claim's token", []string{
			claim("q6", "exec-1", "9"), row("q6", "insider", "9", "6000", "NL91ABNA0417164300", "ACKED", "'RS-6'"),
		}, []CheckID{CheckAdmittedWithoutClaim}, "claimed only with token 9 by exec-1"},
		{"a claimed payout presented to another beneficiary", []string{
			claimQ6, claim("q6", "insider", "9"), row("q6", "insider", "9", "6000", "GB33BUKB20201555555555", "ACKED", "'RS-6'"),
		}, []CheckID{CheckAdmittedNotAsBooked}, "to ****5555; the books hold acct-A 6000 EUR to ****4300"},
		{"a claimed payout presented with another amount", []string{
			claimQ6, claim("q6", "insider", "9"), row("q6", "insider", "9", "6001", "NL91ABNA0417164300", "TIMEOUT", "NULL"),
		}, []CheckID{CheckAdmittedNotAsBooked}, "acct-A 6001 EUR"},
		{"PAID posted with a made-up rail reference, the rail never called", []string{
			claim("q6", "insider", "9"),
			`UPDATE payout SET status = 'PAID', fence_token = 9, claimed_by = 'insider', rail_reference = 'MADE-UP' WHERE payout_id = 'q6'`,
		}, []CheckID{CheckPaidPostNotRecorded}, `posted PAID with rail reference "MADE-UP"; the audit trail records no forwardable attempt`},
		{"PAID posted with another reference than the ACKED row's", []string{
			`UPDATE payout SET rail_reference = 'RS-1x' WHERE payout_id = 'q1'`,
		}, []CheckID{CheckPaidPostNotRecorded}, `submission 1 ACKED "RS-1"`},
		{"DECLINED posted with a made-up reason", []string{
			claim("q6", "insider", "9"),
			`UPDATE payout SET status = 'DECLINED', fence_token = 9, claimed_by = 'insider', decline_reason = 'made up' WHERE payout_id = 'q6'`,
		}, []CheckID{CheckPostNotRecorded}, `posted DECLINED ("made up")`},
		{"AMBIGUOUS posted although the rail's answer, ACKED, is on record", []string{
			claimQ6, claim("q6", "insider", "9"), row("q6", "insider", "9", "6000", "NL91ABNA0417164300", "ACKED", "'RS-6'"),
			`UPDATE payout SET status = 'AMBIGUOUS' WHERE payout_id = 'q6'`,
		}, []CheckID{CheckPostNotRecorded}, "posted AMBIGUOUS"},
		{"settled PAID from a line paying another beneficiary", []string{
			`UPDATE rail_statement_line SET beneficiary = 'GB33BUKB20201555555555' WHERE seq = 3`,
		}, []CheckID{CheckPaidSettleWithoutLine}, "line 3 ACCEPTED acct-A 3000 EUR to ****5555"},
		{"settled PAID with no line at all", []string{
			`DELETE FROM rail_statement_line WHERE seq = 3`,
		}, []CheckID{CheckPaidSettleWithoutLine}, "no line of it"},
		{"settled NOT_PRESENTED a payout the rail accepted", []string{
			`INSERT INTO rail_statement_line (seq, received_at, reference, account_id, amount_minor, currency, beneficiary, result, rail_reference)
				VALUES (5, now(), 'q4', 'acct-A', 4000, 'EUR', 'NL91ABNA0417164300', 'ACCEPTED', 'RS-4')`,
		}, []CheckID{CheckSettleContradicted}, "settled NOT_PRESENTED; the statement copy has line 5 ACCEPTED"},
		{"settled DECLINED a payout the rail accepted", []string{
			`UPDATE rail_statement_line SET result = 'ACCEPTED', rail_reference = 'RS-5', decline_reason = NULL WHERE seq = 4`,
		}, []CheckID{CheckSettleContradicted}, "settled DECLINED"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := Evaluate(loadBooked(t, c.sql...), booksBound)
			if got := of8(r); !slices.Equal(got, c.want) {
				t.Fatalf("invariant 8 findings %v, want exactly %v; violations: %v", got, c.want, r.Violations)
			}
			if r.Held(8) {
				t.Error("invariant 8 reported held with a violation of it")
			}
			i := slices.IndexFunc(r.Violations, func(v Finding) bool { return v.Check == c.want[0] })
			if f := r.Violations[i]; !strings.Contains(f.Detail, c.shows) {
				t.Errorf("finding %q does not say %q", f, c.shows)
			}
		})
	}
}
