package invariants

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
)

var reconciled = Options{FencingEnabled: true, RequireSettled: true, Reconciled: true}

// settled is the clean history after a reconciler's final pass: p3 (AMBIGUOUS, its
// reply dropped, the rail accepted RS-3) settled PAID with its ledger entry; p9
// (AMBIGUOUS, never reached the rail) settled NOT_PRESENTED; the statement copied
// line for line.
func settled() History {
	h := clean()
	p3 := payout(&h, "p3")
	p3.Status, p3.RailReference = "PAID", "RS-3"
	h.Ledger = append(h.Ledger, LedgerEntry{EntryID: 99, PayoutID: "p3", AccountID: "acct-A", AmountMinor: -3000, Currency: "EUR", PostedToken: 3})
	payout(&h, "p9").Status = "NOT_PRESENTED"
	h.Settlements = []Settlement{
		{PayoutID: "p3", Outcome: "PAID", RailReference: "RS-3", StatementSeq: call(&h, "p3").Seq},
		{PayoutID: "p9", Outcome: "NOT_PRESENTED"},
	}
	for _, c := range h.Calls {
		h.StatementLines = append(h.StatementLines, lineOf(c))
	}
	h.Cursor = &Cursor{LastSeq: h.Calls[len(h.Calls)-1].Seq, ReadAt: ptr(at(20))}
	return h
}

func lineOf(c railstub.Call) lockapi.StatementLine {
	return lockapi.StatementLine{Seq: c.Seq, ReceivedAt: c.ReceivedAt, Reference: c.Reference, AccountID: c.AccountID,
		AmountMinor: c.AmountMinor, Currency: c.Currency, Beneficiary: c.Beneficiary, Result: c.Result,
		RailReference: orNull(c.RailReference), DeclineReason: orNull(c.Reason)}
}

// After the final pass the books close: invariant 7 holds, the settles are
// counted, the money line holds, and the TIMEOUT rows of payouts settled from the
// statement are no longer notes.
func TestReconciledHistoryClosesTheBooks(t *testing.T) {
	t.Parallel()
	r := Evaluate(settled(), reconciled)
	if !r.OK() {
		t.Fatalf("violations after a clean reconciliation: %v", r.Violations)
	}
	if !slices.ContainsFunc(r.Invariants, func(v Verdict) bool { return v.Invariant == 7 && v.Held && v.Name == "The books close" }) {
		t.Fatalf("invariant 7 not judged and held: %+v", r.Invariants)
	}
	rec := r.Reconciliation
	if rec == nil || rec.SettledPaid != 1 || rec.SettledNotPresented != 1 || rec.SettledDeclined != 0 || rec.AmbiguousLeft != 0 ||
		rec.StatementLines != 6 || rec.ExceptionTotal() != 0 || len(rec.Exceptions) != 7 {
		t.Fatalf("reconciliation = %+v", rec)
	}
	if m := r.Money[0]; m.Booked != m.AcceptedForPayouts || m.Booked != 19000 || m.AcceptedAmbiguous != 0 {
		t.Fatalf("money = %+v: booked must equal accepted for our payouts", m)
	}
	if r.Payouts.NotPresented != 1 || r.Payouts.Ambiguous != 0 {
		t.Fatalf("payouts = %+v", r.Payouts)
	}
	if len(r.Notes) != 0 {
		t.Fatalf("notes = %v, want none once the ambiguous payouts are settled", r.Notes)
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"7 The books close", "AMBIGUOUS settled as PAID (booked)", "AMBIGUOUS settled as NOT_PRESENTED",
		"PRESENTED_TWICE", "EUR booked in the ledger (must equal the above)", "EUR accepted by the rail for our payouts", "PASS"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	// Without a reconciler there is no invariant 7 and no section.
	plain := Evaluate(clean(), fenced)
	if plain.Reconciliation != nil || slices.ContainsFunc(plain.Invariants, func(v Verdict) bool { return v.Invariant == 7 }) {
		t.Fatal("invariant 7 judged for a run without a reconciler")
	}
}

// Each way the books fail to close is caught, exactly by its checks.
func TestBooksViolationsDetected(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		break_ func(h *History)
		want   []CheckID
	}{
		{"an AMBIGUOUS payout left, its money unbooked", func(h *History) {
			payout(h, "p3").Status, payout(h, "p3").RailReference = "AMBIGUOUS", ""
			h.Ledger = h.Ledger[:len(h.Ledger)-1]
			h.Settlements = h.Settlements[1:]
		}, []CheckID{CheckAmbiguousLeft, CheckLedgerVsAccepted}},
		{"a recorded exception (an AMBIGUOUS payout with a mismatching line)", func(h *History) {
			h.Exceptions = []Exception{{ExceptionID: 1, Kind: "AMOUNT_MISMATCH", PayoutID: "p9", Seq: 77, Detail: "x"}}
		}, []CheckID{CheckExceptions}},
		{"the copy lacks a line and the cursor stopped short", func(h *History) {
			h.StatementLines = h.StatementLines[:len(h.StatementLines)-1]
			h.Cursor.LastSeq--
		}, []CheckID{CheckStatementCopy, CheckStatementCopy}},
		{"the copy has an amount the rail never booked", func(h *History) {
			h.StatementLines[0].AmountMinor++
		}, []CheckID{CheckStatementCopy}},
		{"the copy lacks a line's beneficiary", func(h *History) {
			h.StatementLines[0].Beneficiary = ""
		}, []CheckID{CheckStatementCopy}},
		{"a payment to another beneficiary nobody recorded", func(h *History) {
			c := call(h, "p6")
			c.Beneficiary = "GB33BUKB20201555555555"
			h.StatementLines[1] = lineOf(*c)
		}, []CheckID{CheckCallWithoutIntent, CheckUnrecorded}},
		{"a payment to another beneficiary, recorded", func(h *History) {
			c := call(h, "p6")
			c.Beneficiary = "GB33BUKB20201555555555"
			h.StatementLines[1] = lineOf(*c)
			h.Exceptions = []Exception{{ExceptionID: 1, Kind: "BENEFICIARY_MISMATCH", PayoutID: "p6", Seq: c.Seq, Detail: "x"}}
		}, []CheckID{CheckCallWithoutIntent, CheckExceptions}},
		{"the copy has a line the rail never booked", func(h *History) {
			h.StatementLines = append(h.StatementLines, lockapi.StatementLine{Seq: 99, Reference: "p1", Result: "ACCEPTED"})
		}, []CheckID{CheckStatementCopy}},
		{"no reconciler ever read the statement", func(h *History) {
			h.Cursor, h.StatementLines = nil, nil
		}, []CheckID{CheckStatementCopy}},
		{"a PAID payout the rail never accepted, unrecorded", func(h *History) {
			h.Calls = slices.DeleteFunc(h.Calls, func(c railstub.Call) bool { return c.Reference == "p6" })
			h.StatementLines = slices.DeleteFunc(h.StatementLines, func(l lockapi.StatementLine) bool { return l.Reference == "p6" })
		}, []CheckID{CheckAttemptRows, CheckPayoutVsRail, CheckLedgerVsAccepted, CheckBooks, CheckPaidAcceptedOnce}},
		{"a late call for a NOT_PRESENTED payout, recorded", func(h *History) {
			c := railstub.Call{Seq: 50, ReceivedAt: at(21), Reference: "p9", AccountID: "acct-B", AmountMinor: amountOf("p9"),
				Currency: "EUR", Beneficiary: "NL91ABNA0417164300", Result: railstub.ResultAccepted, RailReference: "RS-9"}
			h.Calls = append(h.Calls, c)
			h.StatementLines = append(h.StatementLines, lineOf(c))
			h.Cursor.LastSeq = 50
			h.Exceptions = []Exception{{ExceptionID: 1, Kind: "LINE_CONTRADICTS_PAYOUT", PayoutID: "p9", Seq: 50, Detail: "ACCEPTED line for a NOT_PRESENTED payout"}}
		}, []CheckID{CheckPayoutVsRail, CheckLedgerVsAccepted, CheckExceptions}},
		{"a double payment nobody recorded", func(h *History) {
			c := *call(h, "p1")
			c.Seq, c.ReceivedAt, c.RailReference = 100, at(9), "RS-1b"
			h.Calls = append(h.Calls, c)
			h.StatementLines = append(h.StatementLines, lineOf(c))
			h.Cursor.LastSeq = 100
		}, []CheckID{CheckDoublePresentation, CheckLedgerVsAccepted, CheckPaidAcceptedOnce, CheckUnrecorded}},
		{"a payment for no payout nobody recorded", func(h *History) {
			c := railstub.Call{Seq: 100, ReceivedAt: at(9), Reference: "nobody", AccountID: "acct-Z", AmountMinor: 1,
				Currency: "EUR", Result: railstub.ResultAccepted, RailReference: "RS-z"}
			h.Calls = append(h.Calls, c)
			h.StatementLines = append(h.StatementLines, lineOf(c))
			h.Cursor.LastSeq = 100
		}, []CheckID{CheckCallWithoutIntent, CheckAttemptRows, CheckPayoutVsRail, CheckUnrecorded}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := settled()
			c.break_(&h)
			r := Evaluate(h, reconciled)
			var got []CheckID
			for _, v := range r.Violations {
				got = append(got, v.Check)
			}
			slices.Sort(got)
			want := slices.Clone(c.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("violations %v, want checks %v", r.Violations, want)
			}
			for _, id := range c.want {
				for _, v := range r.Violations {
					if v.Check == id && r.Held(v.Invariant) {
						t.Errorf("invariant %d reported held with a violation of it", v.Invariant)
					}
				}
			}
		})
	}
}

// acceptedOnly is settled() as a reconciler reading a camt.053 statement leaves
// it: p9's call reached the rail and was declined, which no such statement
// lists, so p9 was settled NOT_PRESENTED; the copy holds the accepted calls
// alone, numbered in import order.
func acceptedOnly() History {
	h := settled()
	h.Calls = append(h.Calls, railstub.Call{Seq: 50, ReceivedAt: at(2).Add(700 * time.Millisecond), Reference: "p9", AccountID: "acct-B",
		AmountMinor: amountOf("p9"), Currency: "EUR", Beneficiary: "NL91ABNA0417164300", Result: railstub.ResultDeclined, Reason: "MS03"})
	h.StatementLines = nil
	for _, c := range h.Calls {
		if c.Result == railstub.ResultAccepted {
			l := lineOf(c)
			l.Seq = int64(len(h.StatementLines) + 1)
			h.StatementLines = append(h.StatementLines, l)
		}
	}
	h.Cursor.LastSeq = int64(len(h.StatementLines))
	return h
}

// With a statement of accepted calls only (Options.StatementAcceptedOnly), a
// payout whose call was declined settles NOT_PRESENTED and the books close; the
// copy is judged by account and rail reference. Read as a statement of every
// call, the same history breaks them. What the option must still catch, it does.
func TestStatementAcceptedOnly(t *testing.T) {
	t.Parallel()
	opts := reconciled
	opts.StatementAcceptedOnly = true
	if r := Evaluate(acceptedOnly(), opts); !r.OK() {
		t.Fatalf("violations with a statement of accepted calls only: %v", r.Violations)
	}
	if r := Evaluate(acceptedOnly(), reconciled); r.OK() || !slices.ContainsFunc(r.Violations, func(f Finding) bool { return f.Check == CheckPayoutVsRail }) {
		t.Fatalf("read as a statement of every call, violations %v, want the declined call of a NOT_PRESENTED payout", r.Violations)
	}
	for _, c := range []struct {
		name   string
		break_ func(h *History)
		want   []CheckID
	}{
		{"the copy lacks an accepted call", func(h *History) {
			h.StatementLines = h.StatementLines[1:]
		}, []CheckID{CheckStatementCopy}},
		{"the copy holds an accepted call twice", func(h *History) {
			l := h.StatementLines[0]
			l.Seq = 99
			h.StatementLines = append(h.StatementLines, l)
		}, []CheckID{CheckStatementCopy}},
		{"the copy has an amount the rail never accepted", func(h *History) {
			h.StatementLines[0].AmountMinor++
		}, []CheckID{CheckStatementCopy}},
		{"the copy has a declined call's line", func(h *History) {
			h.StatementLines = append(h.StatementLines, lineOf(*call(h, "p2")))
		}, []CheckID{CheckStatementCopy}},
		{"the rail accepted the NOT_PRESENTED payout, unrecorded", func(h *History) {
			c := &h.Calls[len(h.Calls)-1]
			c.Result, c.Reason, c.RailReference = railstub.ResultAccepted, "", "RS-9"
		}, []CheckID{CheckPayoutVsRail, CheckLedgerVsAccepted, CheckStatementCopy, CheckUnrecorded}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := acceptedOnly()
			c.break_(&h)
			var got []CheckID
			for _, v := range Evaluate(h, opts).Violations {
				got = append(got, v.Check)
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(c.want))
			if !slices.Equal(got, want) {
				t.Fatalf("violations %v, want checks %v", got, want)
			}
		})
	}
}

// A statement of accepted calls only is numbered by its reader: an exception a
// call calls for is found at the seq of the line the call was copied as, not at
// the rail's own seq of the call.
func TestStatementAcceptedOnlyExceptionAtTheCopysSeq(t *testing.T) {
	t.Parallel()
	opts := reconciled
	opts.StatementAcceptedOnly = true
	stranger := func(recordedAt func(call, line int64) int64) History {
		h := acceptedOnly()
		c := railstub.Call{Seq: 77, ReceivedAt: at(3), Reference: "nobody", AccountID: "acct-B", AmountMinor: 5,
			Currency: "EUR", Beneficiary: "NL91ABNA0417164300", Result: railstub.ResultAccepted, RailReference: "RS-nobody"}
		h.Calls = append(h.Calls, c)
		l := lineOf(c)
		l.Seq = int64(len(h.StatementLines) + 1)
		h.StatementLines = append(h.StatementLines, l)
		h.Cursor.LastSeq = l.Seq
		h.Exceptions = append(h.Exceptions, Exception{ExceptionID: 1, Kind: "UNKNOWN_REFERENCE", Seq: recordedAt(c.Seq, l.Seq)})
		return h
	}
	unrecorded := func(h History) bool {
		return slices.ContainsFunc(Evaluate(h, opts).Violations, func(f Finding) bool { return f.Check == CheckUnrecorded })
	}
	if unrecorded(stranger(func(_, line int64) int64 { return line })) {
		t.Fatal("an UNKNOWN_REFERENCE recorded at the copy's seq was judged unrecorded")
	}
	if !unrecorded(stranger(func(call, _ int64) int64 { return call })) {
		t.Fatal("an UNKNOWN_REFERENCE recorded at a seq no copied line has was judged recorded")
	}
}

// NotHeld names an invariant broken or never judged, and nothing else.
func TestNotHeldNamesBrokenAndUnjudged(t *testing.T) {
	t.Parallel()
	if got := Evaluate(settled(), reconciled).NotHeld(1, 7, 99); !slices.Equal(got, []int{99}) {
		t.Errorf("a clean history: NotHeld(1, 7, 99) = %v, want [99] (never judged)", got)
	}
	h := settled()
	h.StatementLines = h.StatementLines[1:]
	if got := Evaluate(h, reconciled).NotHeld(1, 7); !slices.Equal(got, []int{7}) {
		t.Errorf("a copy lacking a line: NotHeld(1, 7) = %v, want [7]", got)
	}
}
