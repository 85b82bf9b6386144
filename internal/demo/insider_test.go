package demo

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/invariants"
	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

func runInsiderColumn(t *testing.T, books bool) *InsiderResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := runInsider(ctx, DefaultConfig(), insiderSite{
		paydbURL: pgtest.PaydbURL(t), lockdbURL: pgtest.LockdbURL(t),
		keysDir: filepath.Join(t.TempDir(), "keys"), books: books, log: io.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func insiderTable(r *InsiderResult) string {
	var b bytes.Buffer
	writeInsider(&b, []*InsiderResult{r})
	return b.String()
}

// With the books checked every insider move is refused as docs/contracts/books.md
// says — an uncreated payout and a pending one NOT_IN_BOOKS, a claimed one
// presented to another beneficiary NOT_IN_BOOKS (beneficiary), made-up posts
// OUTCOME_NOT_RECORDED, a settle against the statement
// SETTLE_CONTRADICTS_STATEMENT — although every lease and grant was genuine: the
// rail pays nothing to the insider, the honest executor pays the pending victim
// to its booked beneficiary and the made-up payouts for real, the payout the
// insider claimed and presented to MALLORY waits for a person, and invariant 8
// holds.
func TestInsiderRefusedWithTheBooksChecked(t *testing.T) {
	t.Parallel()
	r := runInsiderColumn(t, true)
	if len(r.Attempts) != len(insiderMoves) {
		t.Fatalf("%d attempts, want %d", len(r.Attempts), len(insiderMoves))
	}
	for _, a := range r.Attempts {
		if !a.Refused() {
			t.Errorf("%s: %s, want 409 %s (%s)", a.Move, a, a.Want, a.WantDetail)
		}
	}
	if r.RailCalls != 0 {
		t.Errorf("the rail was presented %d calls to the insider's beneficiaries", r.RailCalls)
	}
	for _, p := range r.Payouts {
		if want := insiderEnd(p.PayoutID); p.State.Status != want {
			t.Errorf("%s is %s, want %s", p.PayoutID, p.State, want)
		}
	}
	if !r.Report.Held(8) || r.Report.Submissions.Unbooked != 3 {
		t.Errorf("invariant 8 held %t, %d UNBOOKED rows (want 3); violations: %v",
			r.Report.Held(8), r.Report.Submissions.Unbooked, r.Report.Violations)
	}
	if !r.OK {
		t.Error("the column's verdict is not OK")
	}
	t.Logf("\n%s", insiderTable(r))
}

// Without the books checks every insider move succeeds, and the checker sees each
// kind from paydb's records: invariant 8 is broken by an admission without a
// claim, one not as booked, a made-up PAID, a made-up DECLINED and a settle the
// statement contradicts. The honest executor never adopts the victim's first
// attempt, which paid MALLORY.
func TestInsiderSucceedsWithoutTheBooksChecked(t *testing.T) {
	t.Parallel()
	r := runInsiderColumn(t, false)
	for _, a := range r.Attempts {
		if a.Status != 200 {
			t.Errorf("%s: %s, want 200 without the books checks", a.Move, a)
		}
	}
	if r.RailCalls != 3 || r.AcceptedMinor != rogueAmount+victim1Amount+victim2Amount {
		t.Errorf("rail calls to the insider's beneficiaries %d (%d accepted), want 3", r.RailCalls, r.AcceptedMinor)
	}
	if r.Report.Held(8) {
		t.Error("invariant 8 held after the insider's moves")
	}
	for _, id := range insiderBreaks {
		if r.Report.Count(id) == 0 {
			t.Errorf("no %s finding", id)
		}
	}
	if v1 := r.Payouts[0]; v1.PayoutID != victim1 || v1.State.Status == lockapi.StatusPaid {
		t.Errorf("%s is %s: the honest executor adopted the first attempt, which paid MALLORY", victim1, v1.State)
	}
	if !r.OK {
		t.Error("the column does not show the hazard")
	}
	out := insiderTable(r)
	t.Logf("\n%s", out)
	for _, want := range []string{"200 ACKED (paid)", "200 PAID", "200 DECLINED", "200 NOT_PRESENTED", "BROKEN",
		string(invariants.CheckSettleContradicted), "the hazard, as shown"} {
		if !strings.Contains(out, want) {
			t.Errorf("the insider section lacks %q:\n%s", want, out)
		}
	}
}
