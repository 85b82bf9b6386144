package demo

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

func runAttackColumn(t *testing.T, verified bool) *AttackResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := runAttack(ctx, DefaultConfig(), attackSite{
		paydbURL: pgtest.PaydbURL(t), lockdbURL: pgtest.LockdbURL(t),
		keysDir: filepath.Join(t.TempDir(), "keys"), verified: verified, log: io.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// With grants verified every rogue attempt is refused with the reason of
// docs/contracts/signed-grants.md, at both fence points; the rail sees nothing of
// the rogue, the mark does not move, and the honest executor still pays the
// account.
func TestAttackRefusedWithGrantsVerified(t *testing.T) {
	t.Parallel()
	r := runAttackColumn(t, true)
	if len(r.Attempts) != 10 {
		t.Fatalf("%d attempts, want 5 variants at 2 fence points", len(r.Attempts))
	}
	for _, a := range r.Attempts {
		if !a.Refused() {
			t.Errorf("%s, %s: %s, want 401 %s", a.Service, a.Variant, a, a.Want)
		}
	}
	if r.RogueRailCalls != 0 || r.MarkAfter != r.MarkBefore || r.MarkBefore == 0 {
		t.Errorf("rogue rail calls %d, mark %d → %d", r.RogueRailCalls, r.MarkBefore, r.MarkAfter)
	}
	if r.Target.Status != lockapi.StatusPaid || r.Honest.Status != lockapi.StatusPaid {
		t.Errorf("after the attack the honest executor left %s %v and %s %v, want both PAID", attackTarget, r.Target, attackHonest2, r.Honest)
	}
	if !r.OK {
		t.Error("the column's verdict is not OK")
	}
}

// Without verification the same attack succeeds, as the hazard says: the huge
// token is admitted, the rail pays the rogue, the mark jumps to the top and the
// honest holder's next submission is fenced out.
func TestAttackSucceedsWithoutVerification(t *testing.T) {
	t.Parallel()
	r := runAttackColumn(t, false)
	for _, a := range r.Attempts {
		if a.Status != 200 {
			t.Errorf("%s, %s: %s, want 200 without verification", a.Service, a.Variant, a)
		}
	}
	if r.RogueRailCalls != 5 || r.RogueAcceptedMinor != 5*rogueAmount || r.MarkAfter != lockapi.MaxInt64 {
		t.Errorf("rogue rail calls %d (%d accepted), mark after %d", r.RogueRailCalls, r.RogueAcceptedMinor, r.MarkAfter)
	}
	if r.Target.ClaimedBy != rogueOwner || r.Honest.Status == lockapi.StatusPaid {
		t.Errorf("target %v, honest payout %v: want the rogue's claim standing and the honest payout unpaid", r.Target, r.Honest)
	}
	if !r.OK {
		t.Error("the column does not show the hazard")
	}
	var b bytes.Buffer
	writeAttack(&b, []*AttackResult{runAttackColumn(t, true), r})
	for _, want := range []string{"401 missing", "401 unknown_key", "401 lock_mismatch", "401 bad_signature", "401 token_mismatch", "200 ACKED", "9223372036854775807"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the attack section lacks %q:\n%s", want, b.String())
		}
	}
}
