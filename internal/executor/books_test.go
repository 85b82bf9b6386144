package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockapi"
)

// What the executor makes of the books' answers (docs/contracts/books.md):
// NOT_IN_BOOKS for another claim is FENCED_OUT's twin; for the payout's own
// fields it is `unbooked`, nothing posted. A first or recorded attempt is
// adopted only when it presented the payout's own account, amount, currency
// and beneficiary; an answer or row that does not say is a mismatch.
func TestVerdictOnTheBooks(t *testing.T) {
	t.Parallel()
	const token = 7
	notInBooks := func(m string) http.HandlerFunc {
		return problemAnswer(409, lockapi.CodeNotInBooks, map[string]any{"submissionId": 3, "presentedToken": token, "mismatch": m})
	}
	dupe := func(first, ref any, change map[string]any) http.HandlerFunc {
		return problemAnswer(409, lockapi.CodeDuplicateSubmission, dupeMembers(first, ref, change))
	}
	other := func(r lockapi.Submission, f func(*lockapi.Submission)) lockapi.Submission { f(&r); return r }
	mallory := func(s *lockapi.Submission) { s.Beneficiary = "NL66MALL0000000001" }
	cases := []struct {
		name   string
		proxy  scriptedProxy
		result string
		post   string
	}{
		{"NOT_IN_BOOKS token → nothing, fenced", scriptedProxy{submit: notInBooks(lockapi.MismatchToken)}, resultFenced, ""},
		{"NOT_IN_BOOKS owner → nothing, fenced", scriptedProxy{submit: notInBooks(lockapi.MismatchOwner)}, resultFenced, ""},
		{"NOT_IN_BOOKS not_claimed → nothing, fenced", scriptedProxy{submit: notInBooks(lockapi.MismatchNotClaimed)}, resultFenced, ""},
		{"NOT_IN_BOOKS not_found → nothing, unbooked", scriptedProxy{submit: notInBooks(lockapi.MismatchNotFound)}, resultUnbooked, ""},
		{"NOT_IN_BOOKS account → nothing, unbooked", scriptedProxy{submit: notInBooks(lockapi.MismatchAccount)}, resultUnbooked, ""},
		{"NOT_IN_BOOKS amount → nothing, unbooked", scriptedProxy{submit: notInBooks(lockapi.MismatchAmount)}, resultUnbooked, ""},
		{"NOT_IN_BOOKS currency → nothing, unbooked", scriptedProxy{submit: notInBooks(lockapi.MismatchCurrency)}, resultUnbooked, ""},
		{"NOT_IN_BOOKS beneficiary → nothing, unbooked", scriptedProxy{submit: notInBooks(lockapi.MismatchBeneficiary)}, resultUnbooked, ""},
		{"NOT_IN_BOOKS with a mismatch unknown here → nothing, unbooked", scriptedProxy{submit: notInBooks("iban_checksum")}, resultUnbooked, ""},
		{"DUPLICATE first ACKED, the payout's own fields → PAID", scriptedProxy{submit: dupe("ACKED", "RS-first", nil)}, resultDuplicate, "PAID"},
		{"DUPLICATE first ACKED, another beneficiary → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", "RS-first",
			map[string]any{"firstBeneficiary": "NL66MALL0000000001"})}, resultMismatch, ""},
		{"DUPLICATE first ACKED, the beneficiary in another case → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", "RS-first",
			map[string]any{"firstBeneficiary": strings.ToLower(testPayout.Beneficiary)})}, resultMismatch, ""},
		{"DUPLICATE first ACKED, another account → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", "RS-first",
			map[string]any{"firstAccountId": "acct-2"})}, resultMismatch, ""},
		{"DUPLICATE first ACKED, another amount → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", "RS-first",
			map[string]any{"firstAmountMinor": 101})}, resultMismatch, ""},
		{"DUPLICATE first ACKED, another currency → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", "RS-first",
			map[string]any{"firstCurrency": "USD"})}, resultMismatch, ""},
		{"DUPLICATE first TIMEOUT, another beneficiary → nothing, mismatch", scriptedProxy{submit: dupe("TIMEOUT", nil,
			map[string]any{"firstBeneficiary": "NL66MALL0000000001"})}, resultMismatch, ""},
		{"DUPLICATE first unresolved, another beneficiary → nothing, mismatch", scriptedProxy{submit: dupe(nil, nil,
			map[string]any{"firstBeneficiary": "NL66MALL0000000001"})}, resultMismatch, ""},
		{"DUPLICATE from an older rail-proxy (first fields unreported) → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", "RS-first",
			map[string]any{"firstAccountId": nil, "firstAmountMinor": nil, "firstCurrency": nil, "firstBeneficiary": nil})}, resultMismatch, ""},
		{"DUPLICATE first ACKED, only the beneficiary unreported → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", "RS-first",
			map[string]any{"firstBeneficiary": nil})}, resultMismatch, ""},
		{"DUPLICATE first REJECTED, the trail's row of another beneficiary → nothing, mismatch", scriptedProxy{submit: dupe("REJECTED", nil, nil),
			trail: []lockapi.Submission{other(row(2, 5, "REJECTED", "", "limit"), mallory)}}, resultMismatch, ""},
		{"DUPLICATE first ACKED without reference, the trail's row of another beneficiary → nothing, mismatch", scriptedProxy{submit: dupe("ACKED", nil, nil),
			trail: []lockapi.Submission{other(row(2, 5, "ACKED", "RS-2", ""), mallory)}}, resultMismatch, ""},
		{"no answer, trail ACKED for another beneficiary → nothing, mismatch", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{other(row(1, token, "ACKED", "RS-9", ""), mallory)}}, resultMismatch, ""},
		{"no answer, trail REJECTED for another amount → nothing, mismatch", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{other(row(1, token, "REJECTED", "", "no"), func(s *lockapi.Submission) { s.AmountMinor = 99 })}}, resultMismatch, ""},
		{"no answer, trail unresolved for another beneficiary → nothing, mismatch", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{other(row(1, token, "", "", ""), mallory)}}, resultMismatch, ""},
		{"no answer, an older rail-proxy's trail row (fields unreported) → nothing, mismatch", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{other(row(1, token, "ACKED", "RS-9", ""), func(s *lockapi.Submission) {
				s.AmountMinor, s.Currency, s.Beneficiary = 0, "", ""
			})}}, resultMismatch, ""},
		{"no answer, only an UNBOOKED row of another beneficiary → nothing, unavailable", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{other(row(1, token, "UNBOOKED", "", ""), mallory)}}, resultUnavailable, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := verdictAgainst(t, tc.proxy, token)
			if v.result != tc.result {
				t.Errorf("counted as %q, want %q (%s)", v.result, tc.result, v.why)
			}
			if got := postOutcome(v.post); tc.post == "" && got != "none" || tc.post != "" && got != tc.post {
				t.Fatalf("posts %s, want %q (%s)", got, tc.post, v.why)
			}
		})
	}
}

// The refusals are logged as docs/contracts/books.md names them, at ERROR,
// with the beneficiaries masked.
func TestBooksRefusalsAreLoggedMasked(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, event string
		submit      http.HandlerFunc
	}{
		{"unbooked", "unbooked_own_payout", problemAnswer(409, lockapi.CodeNotInBooks, map[string]any{"submissionId": 3, "presentedToken": 7, "mismatch": "amount"})},
		{"mismatch", "duplicate_mismatch", problemAnswer(409, lockapi.CodeDuplicateSubmission,
			dupeMembers("ACKED", "RS-1", map[string]any{"firstBeneficiary": "NL66MALL0000000001"}))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			srv := httptest.NewServer(scriptedProxy{submit: tc.submit})
			defer srv.Close()
			e := newTestExecutor(t, srv.URL)
			e.log = slog.New(slog.NewJSONHandler(&buf, nil))
			ctx := context.Background()
			a := e.proxy.submit(ctx, lockapi.SubmissionRequest{PayoutID: testPayout.PayoutID, AccountID: testPayout.AccountID,
				AmountMinor: testPayout.AmountMinor, Currency: testPayout.Currency, Beneficiary: testPayout.Beneficiary}, 7, "exec-a")
			e.verdict(ctx, testPayout, 7, a)
			var found map[string]any
			for line := range strings.Lines(buf.String()) {
				var m map[string]any
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				if m["event"] == tc.event {
					found = m
				}
			}
			if found == nil || found["level"] != "ERROR" || found["payoutId"] != "p-1" || found["token"] != float64(7) {
				t.Fatalf("no %s at ERROR with payoutId and token in:\n%s", tc.event, buf.String())
			}
			if strings.Contains(buf.String(), testPayout.Beneficiary) || strings.Contains(buf.String(), "NL66MALL0000000001") {
				t.Fatalf("a beneficiary was logged in full:\n%s", buf.String())
			}
			if found["beneficiary"] != lockapi.MaskBeneficiary(testPayout.Beneficiary) {
				t.Errorf("beneficiary logged as %v, want %s", found["beneficiary"], lockapi.MaskBeneficiary(testPayout.Beneficiary))
			}
		})
	}
}

// When a stale CLAIMED payout waits for a person (docs/contracts/executor.md):
// its forwardable attempt presented other fields, or its current claim's own
// attempt was refused by the books. A refusal of another claim, or an attempt
// that presented the payout's own fields, does not hold it.
func TestNeedsPerson(t *testing.T) {
	t.Parallel()
	owner := "exec-a"
	p := testPayout
	p.Status, p.FenceToken, p.ClaimedBy = lockapi.StatusClaimed, 7, &owner
	sub := func(id, token int64, by, outcome string, f func(*lockapi.Submission)) lockapi.Submission {
		s := row(id, token, outcome, "", "")
		s.OwnerID = by
		if outcome == "ACKED" {
			ref := "RS-1"
			s.RailReference = &ref
		}
		if f != nil {
			f(&s)
		}
		return s
	}
	mallory := func(s *lockapi.Submission) { s.Beneficiary = "NL66MALL0000000001" }
	cases := []struct {
		name string
		subs []lockapi.Submission
		want string
	}{
		{"nothing on record", nil, ""},
		{"the forwardable attempt is the payout's own", []lockapi.Submission{sub(1, 5, "b", "ACKED", nil)}, ""},
		{"the forwardable attempt presented another beneficiary", []lockapi.Submission{sub(1, 5, "b", "ACKED", mallory)}, personMismatch},
		{"the forwardable attempt, unresolved, presented another currency", []lockapi.Submission{sub(1, 5, "b", "",
			func(s *lockapi.Submission) { s.Currency = "USD" })}, personMismatch},
		{"the current claim's attempt is UNBOOKED", []lockapi.Submission{sub(1, 7, owner, "UNBOOKED", mallory)}, personUnbooked},
		{"the current claim's attempt is UNBOOKED with the payout's fields (refused before the claim)", []lockapi.Submission{sub(1, 7, owner, "UNBOOKED", nil)}, ""},
		{"an earlier claim's attempt is UNBOOKED", []lockapi.Submission{sub(1, 6, owner, "UNBOOKED", mallory)}, ""},
		{"another owner's attempt with this token is UNBOOKED", []lockapi.Submission{sub(1, 7, "intruder", "UNBOOKED", mallory)}, ""},
		{"another claim's UNBOOKED, then the payout's own attempt", []lockapi.Submission{sub(1, 6, "x", "UNBOOKED", mallory), sub(2, 7, owner, "TIMEOUT", nil)}, ""},
		{"a FENCED attempt of other fields is not forwardable", []lockapi.Submission{sub(1, 7, owner, "FENCED", mallory)}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got, _ := needsPerson(p, tc.subs); got != tc.want {
				t.Fatalf("needsPerson = %q, want %q", got, tc.want)
			}
		})
	}
}

// OUTCOME_NOT_RECORDED is an answer: the post is not tried again, nothing is
// counted as settled, and it is logged — at WARN while the row is unresolved
// (it resolves by itself), at ERROR otherwise.
func TestPostNotRecordedIsNotRetried(t *testing.T) {
	t.Parallel()
	for recorded, level := range map[string]string{"UNRESOLVED": "WARN", "REJECTED": "ERROR", "": "ERROR"} {
		t.Run("recorded "+recorded, func(t *testing.T) {
			t.Parallel()
			var posts atomic.Int32
			members := map[string]any{"recorded": nil}
			if recorded != "" {
				members["recorded"] = recorded
			}
			pr := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				posts.Add(1)
				lockapi.WriteProblem(w, lockapi.NewProblem(409, lockapi.CodeOutcomeNotRecorded, "not recorded", members))
			}))
			defer pr.Close()
			var buf bytes.Buffer
			e := newTestExecutor(t, "http://127.0.0.1:1")
			e.payouts.BaseURL = pr.URL
			e.log = slog.New(slog.NewJSONHandler(&buf, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if e.post(ctx, testPayout, 7, "", *ambiguous()) {
				t.Fatal("a refused post reported as landed")
			}
			if n := posts.Load(); n != 1 {
				t.Fatalf("posted %d times, want once", n)
			}
			want := `"level":"` + level + `"`
			if !strings.Contains(buf.String(), `"event":"post_not_recorded"`) || !strings.Contains(buf.String(), want) {
				t.Fatalf("want post_not_recorded at %s, logged:\n%s", level, buf.String())
			}
		})
	}
}

// The reconcile pass's memory of payouts left for a person: a payout the trail
// showed waiting is passed over while listed with the same claim; a cycle's note
// alone does not pass it over (the trail decides) but keeps the pass from
// reporting it again; a whole listing that no longer bears a hold out drops
// it, except a cycle's note on a payout not yet stale.
func TestPersonHolds(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, "http://127.0.0.1:1")
	stale := func(id string, token int64) lockapi.Payout { return lockapi.Payout{PayoutID: id, FenceToken: token} }
	before := time.Now()

	if e.hold("p-trail", 7, true) {
		t.Fatal("a first hold reported as known")
	}
	if !e.awaitsPerson(stale("p-trail", 7)) {
		t.Fatal("a payout the trail showed waiting is not passed over")
	}
	if e.awaitsPerson(stale("p-trail", 8)) {
		t.Fatal("a payout re-claimed since is passed over")
	}

	e.hold("p-cycle", 3, false)
	if e.awaitsPerson(stale("p-cycle", 3)) {
		t.Fatal("a cycle's note alone passes the payout over; the trail must decide")
	}
	if !e.hold("p-cycle", 3, true) {
		t.Fatal("the pass would report again what the cycle reported")
	}
	if !e.awaitsPerson(stale("p-cycle", 3)) {
		t.Fatal("confirmed by the trail, yet not passed over")
	}

	e.hold("p-young", 5, false) // noted after before: not stale yet
	e.forgetHolds([]lockapi.Payout{stale("p-trail", 7)}, before)
	if !e.awaitsPerson(stale("p-trail", 7)) {
		t.Fatal("a hold still listed was dropped")
	}
	if e.awaitsPerson(stale("p-cycle", 3)) || e.hold("p-cycle", 3, true) {
		t.Fatal("a hold gone from the whole listing was kept")
	}
	if !e.hold("p-young", 5, false) {
		t.Fatal("a cycle's note on a payout not yet stale was dropped")
	}
	e.forgetHolds(nil, time.Now().Add(time.Second))
	if n := e.holds(); n != 0 {
		t.Fatalf("%d holds left after a listing with none of them, all stale", n)
	}
}
