package invariants

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/railstub"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func ptr[T any](v T) *T { return &v }

// builder makes hand-made histories. Each account's lock grants token k at t0+k s
// (acct-B's at t0+k s + 0.5 s); an attempt with token k is inserted 100 ms after its
// grant, and its rail call arrives 200 ms after the grant.
type builder struct {
	h   History
	seq int64
	sub int64
}

func (b *builder) grant(account string, token int64) {
	g := at(float64(token))
	if account == "acct-B" {
		g = g.Add(500 * time.Millisecond)
	}
	b.h.Grants = append(b.h.Grants, Grant{LockName: "account:" + account, Token: token, OwnerID: fmt.Sprintf("exec-%d", token),
		AcquiredAt: g, TTLMs: 1000, ExpiresAt: g.Add(time.Second)})
}

func (b *builder) grantAt(account string, token int64) time.Time {
	for _, g := range b.h.Grants {
		if g.LockName == "account:"+account && g.Token == token {
			return g.AcquiredAt
		}
	}
	panic("no grant")
}

// attempt adds a rail_submission row (ids spaced by 10, so tests can slot rows in).
func (b *builder) attempt(payout, account string, token int64, outcome, railRef string) *Submission {
	b.sub += 10
	g := b.grantAt(account, token)
	s := Submission{SubmissionID: b.sub, PayoutID: payout, AccountID: account, PresentedToken: token,
		OwnerID: fmt.Sprintf("exec-%d", token), IdempotencyKey: fmt.Sprintf("%s:%d", payout, token),
		AmountMinor: amountOf(payout), Currency: "EUR", Beneficiary: "NL91ABNA0417164300",
		Outcome: outcome, RailReference: railRef, SubmittedAt: g.Add(100 * time.Millisecond)}
	if outcome != Unresolved {
		s.ResolvedAt = ptr(g.Add(300 * time.Millisecond))
	}
	b.h.Submissions = append(b.h.Submissions, s)
	return &b.h.Submissions[len(b.h.Submissions)-1]
}

func (b *builder) call(payout, account string, token int64, result, railRef string, dropped bool) {
	b.seq++
	b.h.Calls = append(b.h.Calls, railstub.Call{Seq: b.seq, ReceivedAt: b.grantAt(account, token).Add(200 * time.Millisecond),
		Reference: payout, AccountID: account, AmountMinor: amountOf(payout), Currency: "EUR",
		Beneficiary: "NL91ABNA0417164300", Result: result, RailReference: railRef, Dropped: dropped})
}

func (b *builder) payout(id, account, status string, token int64, railRef string) {
	b.h.Payouts = append(b.h.Payouts, Payout{PayoutID: id, AccountID: account, AmountMinor: amountOf(id), Currency: "EUR",
		Beneficiary: "NL91ABNA0417164300", Status: status, FenceToken: token, RailReference: railRef, CreatedAt: t0, UpdatedAt: t0})
	if status == "PAID" {
		b.h.Ledger = append(b.h.Ledger, LedgerEntry{EntryID: int64(len(b.h.Ledger) + 1), PayoutID: id, AccountID: account,
			AmountMinor: -amountOf(id), Currency: "EUR", PostedToken: token, CreatedAt: t0})
	}
}

// amountOf gives each payout a distinct amount, so the money sums say which payouts they hold.
func amountOf(payout string) int64 {
	var n int64
	fmt.Sscanf(payout, "p%d", &n)
	return 1000 * n
}

// clean is a history in which every invariant holds, with every outcome in it:
//
//	acct-A  p1 token 1 ACKED → PAID; p2 token 2 REJECTED → DECLINED;
//	        p3 token 3 accepted, reply dropped, TIMEOUT → AMBIGUOUS;
//	        p4 token 2 FENCED (presented late), then token 4 ACKED → PAID;
//	        p1 again with token 5 → DUPLICATE; p5 token 6 UNSENT, then token 7 ACKED → PAID.
//	acct-B  p6 token 1 ACKED → PAID; p9 token 2 TIMEOUT without a call (an intent
//	        interrupted by a proxy crash before its socket) → AMBIGUOUS.
//
// Marks: acct-A 7, acct-B 2.
func clean() History {
	b := &builder{h: History{HighWater: map[string]int64{"acct-A": 7, "acct-B": 2}}}
	for k := int64(1); k <= 7; k++ {
		b.grant("acct-A", k)
	}
	b.grant("acct-B", 1)
	b.grant("acct-B", 2)

	b.attempt("p1", "acct-A", 1, "ACKED", "RS-1")
	b.call("p1", "acct-A", 1, railstub.ResultAccepted, "RS-1", false)
	b.attempt("p6", "acct-B", 1, "ACKED", "RS-6")
	b.call("p6", "acct-B", 1, railstub.ResultAccepted, "RS-6", false)
	b.attempt("p2", "acct-A", 2, "REJECTED", "")
	b.call("p2", "acct-A", 2, railstub.ResultDeclined, "", false)
	b.attempt("p9", "acct-B", 2, "TIMEOUT", "")
	b.attempt("p3", "acct-A", 3, "TIMEOUT", "")
	b.call("p3", "acct-A", 3, railstub.ResultAccepted, "RS-3", true)
	b.attempt("p4", "acct-A", 2, "FENCED", "").SubmittedAt = at(3.5) // the paused holder of token 2
	b.attempt("p4", "acct-A", 4, "ACKED", "RS-4")
	b.call("p4", "acct-A", 4, railstub.ResultAccepted, "RS-4", false)
	b.attempt("p1", "acct-A", 5, "DUPLICATE", "")
	b.attempt("p5", "acct-A", 6, "UNSENT", "")
	b.attempt("p5", "acct-A", 7, "ACKED", "RS-5")
	b.call("p5", "acct-A", 7, railstub.ResultAccepted, "RS-5", false)

	b.payout("p1", "acct-A", "PAID", 1, "RS-1")
	b.payout("p2", "acct-A", "DECLINED", 2, "")
	b.payout("p3", "acct-A", "AMBIGUOUS", 3, "")
	b.payout("p4", "acct-A", "PAID", 4, "RS-4")
	b.payout("p5", "acct-A", "PAID", 7, "RS-5")
	b.payout("p6", "acct-B", "PAID", 1, "RS-6")
	b.payout("p9", "acct-B", "AMBIGUOUS", 2, "")
	return b.h
}

func sub(h *History, payout string, token int64) *Submission {
	for i := range h.Submissions {
		if h.Submissions[i].PayoutID == payout && h.Submissions[i].PresentedToken == token {
			return &h.Submissions[i]
		}
	}
	panic("no such submission")
}

func call(h *History, payout string) *railstub.Call {
	for i := range h.Calls {
		if h.Calls[i].Reference == payout {
			return &h.Calls[i]
		}
	}
	panic("no such call")
}

func payout(h *History, id string) *Payout {
	for i := range h.Payouts {
		if h.Payouts[i].PayoutID == id {
			return &h.Payouts[i]
		}
	}
	panic("no such payout")
}

var fenced = Options{FencingEnabled: true, RequireSettled: true}

func TestCleanHistoryHoldsEveryInvariant(t *testing.T) {
	t.Parallel()
	r := Evaluate(clean(), fenced)
	if !r.OK() {
		t.Fatalf("violations in a clean history: %v", r.Violations)
	}
	for _, v := range r.Invariants {
		if !v.Held {
			t.Errorf("invariant %d not held", v.Invariant)
		}
	}
	want := PayoutCounts{Total: 7, Paid: 4, Declined: 1, Ambiguous: 2}
	if r.Payouts != want {
		t.Errorf("payouts = %+v, want %+v", r.Payouts, want)
	}
	if want := (CallCounts{Total: 6, Accepted: 5, Dropped: 1, Declined: 1, References: 6}); r.RailCalls != want {
		t.Errorf("rail calls = %+v, want %+v", r.RailCalls, want)
	}
	wantSubs := SubmissionCounts{Total: 10, Admitted: 8, Fenced: 1, Duplicate: 1, Acked: 4, Rejected: 1, Timeout: 2, Unsent: 1}
	if r.Submissions != wantSubs {
		t.Errorf("submissions = %+v, want %+v", r.Submissions, wantSubs)
	}
	// Accepted: p1 1000, p6 6000, p3 3000 (AMBIGUOUS), p4 4000, p5 5000.
	wantMoney := []Money{{Currency: "EUR", RailAccepted: 19000, AcceptedPaid: 16000, AcceptedAmbiguous: 3000, Booked: 16000, AcceptedForPayouts: 19000}}
	if !slices.Equal(r.Money, wantMoney) {
		t.Errorf("money = %+v, want %+v", r.Money, wantMoney)
	}
	// The dropped-but-accepted AMBIGUOUS payout is the one note: money moved, to reconcile.
	if len(r.Notes) != 1 || r.Notes[0].Check != CheckAmbiguousAccepted || r.Notes[0].PayoutID != "p3" {
		t.Errorf("notes = %v, want only p3's accepted ambiguous payment", r.Notes)
	}
}

// TestEachViolationDetected breaks the clean history once per case and expects
// exactly the named checks to fail, each once.
func TestEachViolationDetected(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		opts   Options
		break_ func(h *History)
		want   []CheckID
	}{
		{"stale admission: the late token-2 holder admitted after token 3", fenced, func(h *History) {
			s := sub(h, "p4", 2)
			s.Outcome = "UNSENT"
		}, []CheckID{CheckStaleAdmission}},
		{"stale admission: an equal token admitted twice", fenced, func(h *History) {
			s := sub(h, "p5", 6)
			s.PresentedToken = 4 // equal to p4's admitted token: a replay, not a new holder
		}, []CheckID{CheckStaleAdmission}},
		{"double payment: a reference presented twice", fenced, func(h *History) {
			c := *call(h, "p1")
			c.Seq, c.ReceivedAt, c.RailReference = 100, at(9), "RS-1b"
			h.Calls = append(h.Calls, c)
		}, []CheckID{CheckDoublePresentation}},
		{"two forwardable rows for one payout", fenced, func(h *History) {
			// p9 gets an unresolved attempt with token 2 before its TIMEOUT row, which moves to token 3.
			h.Grants = append(h.Grants, Grant{LockName: "account:acct-B", Token: 3, OwnerID: "exec-3", AcquiredAt: at(3.5), ExpiresAt: at(4.5), TTLMs: 1000})
			s := sub(h, "p9", 2)
			extra := *s
			extra.SubmissionID--
			extra.Outcome, extra.ResolvedAt = Unresolved, nil
			s.PresentedToken, s.SubmittedAt = 3, at(3.6)
			h.Submissions = append(h.Submissions, extra)
			h.HighWater["acct-B"] = 3
		}, []CheckID{CheckExtraForwardable}},
		{"intent after socket: the row was written after the call arrived", fenced, func(h *History) {
			sub(h, "p6", 1).SubmittedAt = call(h, "p6").ReceivedAt.Add(time.Millisecond)
		}, []CheckID{CheckCallWithoutIntent}},
		{"a call that differs from its intent", fenced, func(h *History) {
			call(h, "p2").Beneficiary = "DE89370400440532013000"
		}, []CheckID{CheckCallWithoutIntent}},
		{"a row claims an answer the rail never gave", Options{FencingEnabled: true}, func(h *History) {
			h.Grants = append(h.Grants, Grant{LockName: "account:acct-B", Token: 3, OwnerID: "exec-3", AcquiredAt: at(3.5), ExpiresAt: at(4.5), TTLMs: 1000})
			h.Submissions = append(h.Submissions, Submission{SubmissionID: 1000, PayoutID: "p10", AccountID: "acct-B", PresentedToken: 3,
				OwnerID: "exec-3", IdempotencyKey: "p10:3", AmountMinor: 10000, Currency: "EUR", Beneficiary: "NL91ABNA0417164300",
				Outcome: "ACKED", RailReference: "RS-10", SubmittedAt: at(3.6), ResolvedAt: ptr(at(3.7))})
			h.Payouts = append(h.Payouts, Payout{PayoutID: "p10", AccountID: "acct-B", AmountMinor: 10000, Currency: "EUR", Status: "CLAIMED", FenceToken: 3})
			h.HighWater["acct-B"] = 3
		}, []CheckID{CheckAttemptRows}},
		{"an AMBIGUOUS payout without a TIMEOUT row", fenced, func(h *History) {
			s := sub(h, "p3", 3)
			s.Outcome, s.RailReference = "ACKED", "RS-3"
		}, []CheckID{CheckAmbiguousWithoutTimeout}},
		{"ambiguity retried: an attempt admitted after TIMEOUT", fenced, func(h *History) {
			h.Grants = append(h.Grants, Grant{LockName: "account:acct-A", Token: 8, OwnerID: "exec-8", AcquiredAt: at(8), ExpiresAt: at(9), TTLMs: 1000})
			h.Submissions = append(h.Submissions, Submission{SubmissionID: 1000, PayoutID: "p3", AccountID: "acct-A", PresentedToken: 8,
				OwnerID: "exec-8", IdempotencyKey: "p3:8", AmountMinor: 3000, Currency: "EUR", Beneficiary: "NL91ABNA0417164300",
				Outcome: "UNSENT", SubmittedAt: at(8.1), ResolvedAt: ptr(at(8.2))})
			h.HighWater["acct-A"] = 8
		}, []CheckID{CheckAmbiguityRetried}},
		{"mark below an admitted token", fenced, func(h *History) { h.HighWater["acct-A"] = 6 }, []CheckID{CheckMark}},
		{"mark above every token that passed the fence", fenced, func(h *History) { h.HighWater["acct-B"] = 9 }, []CheckID{CheckMark}},
		{"mark missing", fenced, func(h *History) { delete(h.HighWater, "acct-B") }, []CheckID{CheckMark}},
		{"mark for an account never presented", fenced, func(h *History) { h.HighWater["acct-Z"] = 1 }, []CheckID{CheckMark}},
		{"ledger entry on the wrong account", fenced, func(h *History) { h.Ledger[0].AccountID = "acct-B" }, []CheckID{CheckLedger}},
		{"PAID without a ledger entry (the books follow)", fenced, func(h *History) {
			h.Ledger = h.Ledger[1:]
		}, []CheckID{CheckLedger, CheckBooks}},
		{"ledger entry for a DECLINED payout (the books follow)", fenced, func(h *History) {
			h.Ledger = append(h.Ledger, LedgerEntry{EntryID: 99, PayoutID: "p2", AccountID: "acct-A", AmountMinor: -2000, Currency: "EUR"})
		}, []CheckID{CheckLedger, CheckBooks}},
		{"PAID with a rail reference no ACKED row carries", fenced, func(h *History) {
			payout(h, "p6").RailReference = "RS-elsewhere"
		}, []CheckID{CheckPayoutVsRail}},
		{"DECLINED although the rail accepted", fenced, func(h *History) {
			payout(h, "p1").Status = "DECLINED"
			sub(h, "p1", 1).Outcome = "REJECTED"
			sub(h, "p1", 1).RailReference = ""
			h.Ledger = h.Ledger[1:]
			// The rail's log still says ACCEPTED: the row lies too, and the money moved for a DECLINED payout.
		}, []CheckID{CheckAttemptRows, CheckPayoutVsRail}},
		{"a payout left PENDING when the run promised to settle all", fenced, func(h *History) {
			h.Payouts = append(h.Payouts, Payout{PayoutID: "p11", AccountID: "acct-B", AmountMinor: 11000, Currency: "EUR", Status: "PENDING"})
		}, []CheckID{CheckUnsettled}},
		{"fencing off, yet the gate fenced", Options{FencingEnabled: false, RequireSettled: true}, func(h *History) {}, []CheckID{CheckFencingSwitch}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := clean()
			c.break_(&h)
			r := Evaluate(h, c.opts)
			if r.OK() {
				t.Fatal("OK() is true for a broken history")
			}
			var got []CheckID
			for _, v := range r.Violations {
				got = append(got, v.Check)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("violations %v, want exactly one of each of %v", r.Violations, c.want)
			}
			for _, id := range c.want {
				if r.Count(id) != 1 {
					t.Errorf("Count(%s) = %d, want 1", id, r.Count(id))
				}
				for _, v := range r.Violations {
					if v.Check == id && r.Held(v.Invariant) {
						t.Errorf("invariant %d reported held with a violation of it", v.Invariant)
					}
				}
			}
		})
	}
}

// A rail call for which no rail_submission row exists at all: the rail was
// presented something nobody recorded. It breaks intent-before-socket (3) and the
// audit (4); the payout-vs-rail check also sees money moved for an unknown payout.
func TestCallWithoutAnyRow(t *testing.T) {
	t.Parallel()
	h := clean()
	h.Calls = append(h.Calls, railstub.Call{Seq: 50, ReceivedAt: at(9), Reference: "p-ghost", AccountID: "acct-A",
		AmountMinor: 500, Currency: "EUR", Beneficiary: "x", Result: railstub.ResultAccepted, RailReference: "RS-g"})
	r := Evaluate(h, fenced)
	for _, id := range []CheckID{CheckCallWithoutIntent, CheckAttemptRows, CheckPayoutVsRail} {
		if r.Count(id) != 1 {
			t.Errorf("Count(%s) = %d, want 1 (violations %v)", id, r.Count(id), r.Violations)
		}
	}
	if r.Held(3) || r.Held(4) {
		t.Error("invariants 3 and 4 should be broken")
	}
	if m := r.Money[0]; m.AcceptedOther != 500 || m.RailAccepted != 19500 {
		t.Errorf("money = %+v: the ghost payment belongs to 'other'", m)
	}
}

// Reported, not failed: rail overtakes, presentations by superseded holders, a
// TIMEOUT row whose payout is not AMBIGUOUS.
func TestReportedNotFailed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		break_ func(h *History)
		want   CheckID
	}{
		{"rail overtake: token 1's call reaches the rail after token 2's", func(h *History) {
			a, b := call(h, "p1"), call(h, "p2")
			a.Seq, b.Seq = b.Seq, a.Seq
		}, CheckRailOvertake},
		{"superseded holder: token 4 reaches the rail after token 5 was granted", func(h *History) {
			call(h, "p4").ReceivedAt = at(5.2)
		}, CheckSupersededPresentation},
		{"TIMEOUT row, payout still CLAIMED", func(h *History) {
			payout(h, "p9").Status = "CLAIMED"
		}, CheckTimeoutNotAmbiguous},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := clean()
			c.break_(&h)
			r := Evaluate(h, Options{FencingEnabled: true})
			if !r.OK() {
				t.Fatalf("violations %v; this is reported, not failed", r.Violations)
			}
			if r.Count(c.want) != 1 {
				t.Fatalf("Count(%s) = %d, want 1; notes %v", c.want, r.Count(c.want), r.Notes)
			}
			if !slices.ContainsFunc(r.Notes, func(f Finding) bool { return f.Check == c.want }) {
				t.Fatalf("notes %v lack %s", r.Notes, c.want)
			}
		})
	}
}

// The stale-admission count is what lockdemo's fencing-off column shows: with the
// switch off the late holder of token 2 is admitted, and the report says so
// without blaming the switch.
func TestFencingOffStaleAdmission(t *testing.T) {
	t.Parallel()
	h := clean()
	s := sub(&h, "p4", 2)
	s.Outcome = "ACKED"
	s.RailReference = "RS-4old"
	// The stale holder's call reaches the rail; p4's later token-4 attempt is a DUPLICATE.
	sub(&h, "p4", 4).Outcome = "DUPLICATE"
	sub(&h, "p4", 4).RailReference = ""
	c := call(&h, "p4")
	c.RailReference, c.ReceivedAt = "RS-4old", at(3.6)
	payout(&h, "p4").RailReference = "RS-4old"
	r := Evaluate(h, Options{FencingEnabled: false, RequireSettled: true})
	if r.Count(CheckStaleAdmission) != 1 || len(r.Violations) != 1 {
		t.Fatalf("violations %v, want the one stale admission", r.Violations)
	}
	if r.Held(1) || !r.Held(0) {
		t.Error("invariant 1 should be broken, the fencing switch check should hold")
	}
	if r.Count(CheckSupersededPresentation) != 1 || r.Count(CheckRailOvertake) != 1 {
		t.Errorf("the stale call (token 2 after token 3) is also an overtake and a superseded presentation; notes %v", r.Notes)
	}
}

func TestEvaluateDoesNotTrustInputOrder(t *testing.T) {
	t.Parallel()
	h := clean()
	slices.Reverse(h.Calls)
	slices.Reverse(h.Submissions)
	slices.Reverse(h.Grants)
	slices.Reverse(h.Payouts)
	a, b := Evaluate(clean(), fenced), Evaluate(h, fenced)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatalf("report depends on input order:\n%s\n%s", ja, jb)
	}
}

func TestEmptyHistory(t *testing.T) {
	t.Parallel()
	r := Evaluate(History{}, fenced)
	if !r.OK() || r.Payouts.Total != 0 || len(r.Money) != 0 {
		t.Fatalf("empty history: %+v", r)
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	h := clean()
	sub(&h, "p4", 2).Outcome = "UNSENT"
	b, err := json.Marshal(Evaluate(h, fenced))
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		FencingEnabled bool
		Payouts        PayoutCounts
		Invariants     []Verdict
		Checks         []Check
		Violations     []Finding
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.FencingEnabled || back.Payouts.Total != 7 || len(back.Violations) != 1 ||
		back.Violations[0].Check != CheckStaleAdmission || back.Violations[0].SubmissionID == 0 {
		t.Fatalf("round trip lost facts: %s", b)
	}
	if back.Invariants[0].Invariant != 1 || back.Invariants[0].Held {
		t.Errorf("invariant 1 verdict: %+v", back.Invariants[0])
	}
	if !strings.Contains(string(b), `"id":"stale_admission"`) || !strings.Contains(string(b), `"notes":[`) {
		t.Errorf("JSON lacks check ids or notes: %s", b)
	}
}

func TestTable(t *testing.T) {
	t.Parallel()
	off := clean()
	sub(&off, "p5", 6).PresentedToken = 4
	var buf bytes.Buffer
	err := WriteTable(&buf, []Column{
		{Title: "fencing on", Report: Evaluate(clean(), fenced)},
		{Title: "fencing off", Report: Evaluate(off, Options{RequireSettled: true})},
	}, Row{Label: "seed", Values: []string{"7", "7"}})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"fencing on", "fencing off", "seed",
		"1 No stale admission", "stale admissions", "FAIL 1", "BROKEN",
		"rail overtakes (reported)", "presentations by superseded holders (reported)",
		"booked in the ledger", "verdict", "PASS", "FAIL (1, cross-checks)",
		"violations, fencing off (2):", "stale_admission [acct-A p5 submission",
		"fenced_with_fencing_off",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "violations, fencing on") {
		t.Errorf("a clean column lists violations:\n%s", out)
	}
	// Columns line up: every non-empty row of the table part is the same width or shorter than the rule.
	lines := strings.Split(out, "\n")
	rule := len(lines[1])
	for _, l := range lines[2:] {
		if l == "" {
			break
		}
		if len(l) > rule {
			t.Errorf("row wider than the rule: %q", l)
		}
	}
	t.Log("\n" + out)
}
