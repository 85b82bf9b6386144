package lockapi

import (
	"strings"
	"testing"
)

// The rail's words are storable text or refused, character class by character
// class and at the bounds (docs/contracts/rail-proxy.md, "Storable text").
func TestStorableText(t *testing.T) {
	t.Parallel()
	ref35 := strings.Repeat("R", 34) + "é" // 35 characters, 36 bytes
	reason140 := strings.Repeat("ü", 140)
	for _, tc := range []struct {
		name    string
		s       string
		max     int
		problem string
	}{
		{"plain reference", "RS-2CCQAUJQXZN5A6IISEYBTDL6OO", MaxRailReferenceLen, ""},
		{"exactly 35 characters", ref35, MaxRailReferenceLen, ""},
		{"36 characters", ref35 + "x", MaxRailReferenceLen, "must be at most 35 characters"},
		{"exactly 140 characters", reason140, MaxDeclineReasonLen, ""},
		{"141 characters", reason140 + "x", MaxDeclineReasonLen, "must be at most 140 characters"},
		{"empty", "", MaxRailReferenceLen, ""},
		{"space and printable non-ASCII", "Rs 1 ✓ 支付 😀", MaxRailReferenceLen, ""},
		{"NUL", "RS-\x001", MaxRailReferenceLen, "must not contain NUL characters"},
		{"SOH", "RS-\x011", MaxRailReferenceLen, "must not contain control characters"},
		{"tab", "RS\t1", MaxRailReferenceLen, "must not contain control characters"},
		{"newline", "limit\nexceeded", MaxDeclineReasonLen, "must not contain control characters"},
		{"DEL", "RS-\x7f", MaxRailReferenceLen, "must not contain control characters"},
		{"C1 NEL U+0085", "RS-\u0085", MaxRailReferenceLen, "must not contain control characters"},
		{"C1 U+009F", "RS-\u009f", MaxRailReferenceLen, "must not contain control characters"},
		{"U+00A0 is no control", "RS-\u00a0", MaxRailReferenceLen, ""},
		{"invalid UTF-8", "RS-\xff", MaxRailReferenceLen, "must be valid UTF-8"},
		{"truncated UTF-8", "RS-\xc3", MaxRailReferenceLen, "must be valid UTF-8"},
		{"encoded surrogate", "RS-\xed\xa0\x80", MaxRailReferenceLen, "must be valid UTF-8"},
		{"U+FFFD", "RS-\ufffd", MaxRailReferenceLen, "must not contain U+FFFD (the mark of bytes that were not text)"},
	} {
		if got := StorableTextProblem(tc.s, tc.max); got != tc.problem {
			t.Errorf("%s: StorableTextProblem(%q, %d) = %q, want %q", tc.name, tc.s, tc.max, got, tc.problem)
		}
	}
	if err := ValidateRailReference(""); err == nil {
		t.Error("an empty rail reference was accepted")
	}
	if err := ValidateRailReference(ref35); err != nil {
		t.Errorf("35 characters: %v", err)
	}
	if err := ValidateDeclineReason(""); err != nil {
		t.Errorf("an empty decline reason: %v", err)
	}
	if err := ValidateDeclineReason("x\x00"); err == nil {
		t.Error("a decline reason with NUL was accepted")
	}
}

// Judging storable text allocates nothing.
func TestStorableTextAllocatesNothing(t *testing.T) {
	s := "RS-2CCQAUJQXZN5A6IISEYBTDL6OO-✓"
	if n := testing.AllocsPerRun(100, func() { _ = StorableTextProblem(s, MaxRailReferenceLen) }); n != 0 {
		t.Fatalf("%v allocations per call", n)
	}
}
