package invariants

import (
	"slices"
	"testing"
	"time"
)

// issuedClean is clean() with every grant handed out once, to its owner, in
// token order.
func issuedClean() History {
	h := clean()
	for i, g := range h.Grants {
		h.Issued = append(h.Issued, IssuedToken{LockName: g.LockName, Token: g.Token, OwnerID: g.OwnerID,
			Seq: int64(i + 1), At: g.AcquiredAt.Add(time.Millisecond)})
	}
	return h
}

var withIssued = Options{FencingEnabled: true, RequireSettled: true, IssuedRecorded: true}

// A failover that forgets a grant shows in the tokens handed out: the forgotten
// token handed out again (to another owner, or to the same one), or a token
// lock_grant does not hold at all. Each breaks invariant 6; a clean history
// breaks nothing, and without IssuedRecorded the checks are not made.
func TestIssuedTokens(t *testing.T) {
	t.Parallel()
	if r := Evaluate(issuedClean(), withIssued); !r.OK() || !r.Held(6) {
		t.Fatalf("clean history with its tokens: %v", r.Violations)
	}
	cases := []struct {
		name    string
		breakIt func(h *History)
		want    map[CheckID]int
	}{
		{"forgotten grant handed out again to another owner", func(h *History) {
			// lockdb lost acct-A's token 7 of exec-7; the new primary granted 7 to exec-99.
			for i := range h.Grants {
				if h.Grants[i].LockName == "account:acct-A" && h.Grants[i].Token == 7 {
					h.Grants[i].OwnerID = "exec-99"
				}
			}
			h.Issued = append(h.Issued, IssuedToken{LockName: "account:acct-A", Token: 7, OwnerID: "exec-99", Seq: 100, At: at(20)})
		}, map[CheckID]int{CheckTokenIssuedTwice: 1, CheckTokenWithoutGrant: 1}},
		{"forgotten grant handed out again to the same owner", func(h *History) {
			h.Issued = append(h.Issued, IssuedToken{LockName: "account:acct-B", Token: 2, OwnerID: "exec-2", Seq: 100, At: at(20)})
		}, map[CheckID]int{CheckTokenIssuedTwice: 1}},
		{"forgotten grant never asked for again", func(h *History) {
			h.Grants = slices.DeleteFunc(h.Grants, func(g Grant) bool { return g.LockName == "account:acct-B" && g.Token == 2 })
		}, map[CheckID]int{CheckTokenWithoutGrant: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := issuedClean()
			c.breakIt(&h)
			r := Evaluate(h, withIssued)
			got := map[CheckID]int{}
			for _, v := range r.Violations {
				got[v.Check]++
				if v.Invariant != 6 {
					t.Errorf("%s counted under invariant %d", v.Check, v.Invariant)
				}
			}
			for id, n := range c.want {
				if got[id] != n {
					t.Errorf("%s: %d findings, want %d (all: %v)", id, got[id], n, r.Violations)
				}
			}
			if len(r.Violations) != sum(c.want) || r.Held(6) {
				t.Errorf("violations %v, want exactly %v and invariant 6 broken", r.Violations, c.want)
			}
			if r := Evaluate(h, fenced); slices.ContainsFunc(r.Checks, func(c Check) bool { return c.ID == CheckTokenIssuedTwice }) {
				t.Error("the token checks are made without IssuedRecorded")
			}
		})
	}
}

func sum(m map[CheckID]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
