package lockapi

import (
	"encoding/json"
	"testing"
	"time"
)

// A rail call is written with its members in the order docs/contracts/rail-stub.md
// lists them, and becomes a statement line field for field: reason is the line's
// declineReason, the beneficiary is carried as the rail gave it, and latencyMs and
// dropped are not statement fields.
func TestRailCallWireFormAndLine(t *testing.T) {
	reason := "closed account"
	at := time.Date(2026, 11, 29, 21, 51, 11, 885371047, time.FixedZone("CET", 3600))
	c := RailCall{Seq: 3, ReceivedAt: at, Reference: "p-1", AccountID: "a-1", AmountMinor: 100, Currency: "EUR",
		Beneficiary: "NL91ABNA0417164300", Result: ResultDeclined, Reason: &reason, LatencyMs: 7}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"seq":3,"receivedAt":"2026-11-29T21:51:11.885371047+01:00","reference":"p-1","accountId":"a-1",` +
		`"amountMinor":100,"currency":"EUR","beneficiary":"NL91ABNA0417164300","result":"DECLINED",` +
		`"railReference":null,"reason":"closed account","latencyMs":7,"dropped":false}`
	if string(b) != want {
		t.Fatalf("rail call on the wire:\n%s\nwant\n%s", b, want)
	}
	l, err := json.Marshal(c.Line())
	if err != nil {
		t.Fatal(err)
	}
	const wantLine = `{"seq":3,"receivedAt":"2026-11-29T20:51:11.885371047Z","reference":"p-1","accountId":"a-1",` +
		`"amountMinor":100,"currency":"EUR","beneficiary":"NL91ABNA0417164300","result":"DECLINED","railReference":null,"declineReason":"closed account"}`
	if string(l) != wantLine {
		t.Fatalf("statement line:\n%s\nwant\n%s", l, wantLine)
	}
	var back StatementLine
	if err := json.Unmarshal(l, &back); err != nil || back.Beneficiary != c.Beneficiary {
		t.Fatalf("statement line read back: %+v %v", back, err)
	}
}

// Beneficiaries compare as IBANs do: spaces ignored, ASCII letters in either case;
// anything else — another character, a non-ASCII letter in another case, another
// kind of space — is a different beneficiary.
func TestSameBeneficiary(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"NL91ABNA0417164300", "NL91ABNA0417164300", true},
		{"NL91ABNA0417164300", "NL91 ABNA 0417 1643 00", true},
		{"NL91ABNA0417164300", "nl91abna0417164300", true},
		{"NL91ABNA0417164300", " nl91 AbNa 0417 1643 00 ", true},
		{"NL91ABNA0417164300", "NL91ABNA0417164301", false},
		{"NL91ABNA0417164300", "NL91ABNA041716430", false},
		{"NL91ABNA0417164300", "NL91-ABNA-0417-1643-00", false},
		{"NL91ABNA0417164300", "NL91\u00a0ABNA0417164300", false}, // a no-break space is not a space here
		{"ÉCOLE", "école", false},                                 // only ASCII letters fold
		{"", "   ", true},
	} {
		if got := SameBeneficiary(c.a, c.b); got != c.same {
			t.Errorf("SameBeneficiary(%q, %q) = %v, want %v", c.a, c.b, got, c.same)
		}
		if got := SameBeneficiary(c.b, c.a); got != c.same {
			t.Errorf("SameBeneficiary(%q, %q) = %v, want %v", c.b, c.a, got, c.same)
		}
	}
	if got := BeneficiaryKey("nl91 abna 0417 1643 00"); got != "NL91ABNA0417164300" {
		t.Errorf("BeneficiaryKey = %q", got)
	}
}
