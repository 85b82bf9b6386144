package demo

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"lock.dev/internal/invariants"
	"lock.dev/lockapi"
)

// AttackAttempt is one rogue request and what it got.
type AttackAttempt struct {
	Service string `json:"service"` // rail-proxy or payment-resource
	Variant string `json:"variant"`
	Token   int64  `json:"token"`
	Status  int    `json:"status"`
	Code    string `json:"code,omitempty"`   // the problem code; empty on success
	Reason  string `json:"reason,omitempty"` // GRANT_REJECTED's reason
	Want    string `json:"expectedReason"`   // the refusal reason this variant must get
}

// Refused says the attempt was refused for its grant with the expected reason.
func (a AttackAttempt) Refused() bool {
	return a.Status == http.StatusUnauthorized && a.Code == lockapi.CodeGrantRejected && a.Reason == a.Want
}

func (a AttackAttempt) String() string {
	switch {
	case a.Code == lockapi.CodeGrantRejected:
		return fmt.Sprintf("%d %s", a.Status, a.Reason)
	case a.Code != "":
		return fmt.Sprintf("%d %s", a.Status, a.Code)
	case a.Service == "rail-proxy":
		return fmt.Sprintf("%d ACKED (paid)", a.Status)
	default:
		return fmt.Sprintf("%d CLAIMED", a.Status)
	}
}

// PayoutState is a payout as payment-resource holds it.
type PayoutState struct {
	Status     string `json:"status"`
	ClaimedBy  string `json:"claimedBy,omitempty"`
	FenceToken int64  `json:"fenceToken"`
	// Outcomes are its rail_submission rows' outcomes, oldest first.
	Outcomes []string `json:"submissionOutcomes"`
}

func (p PayoutState) String() string {
	s := p.Status
	if p.Status == lockapi.StatusClaimed && p.ClaimedBy != "" {
		s += " by " + p.ClaimedBy
	}
	if len(p.Outcomes) > 0 {
		s += " (" + strings.Join(p.Outcomes, ", ") + ")"
	}
	return s
}

// AttackResult is one column of the attack.
type AttackResult struct {
	GrantsVerified bool `json:"grantsVerified"`
	// BooksChecked: rail-proxy and payment-resource checked the moves against
	// the books; only where grants are verified (see runAttack).
	BooksChecked bool            `json:"booksChecked"`
	Account      string          `json:"account"`
	Attempts     []AttackAttempt `json:"attempts"`
	// RogueRailCalls are the calls the rail received for the rogue's made-up
	// payouts, and RogueAcceptedMinor what it accepted of them.
	RogueRailCalls     int   `json:"rogueRailCalls"`
	RogueAcceptedMinor int64 `json:"rogueAcceptedMinor"`
	MarkBefore         int64 `json:"markBefore"`
	MarkAfter          int64 `json:"markAfter"`
	// Target is the victim's payout the rogue tried to claim, right after the
	// attack and at the end; Honest is the payout created after the attack, at
	// the end, once an honest executor has worked the account again.
	TargetAfterAttack PayoutState `json:"targetAfterAttack"`
	Target            PayoutState `json:"target"`
	Honest            PayoutState `json:"honest"`
	// OK: with grants verified, every attempt was refused for its grant with the
	// reason of docs/contracts/signed-grants.md, the rail saw nothing of the rogue,
	// the mark did not move and the honest executor paid both payouts. Without
	// verification, OK says the hazard showed as described (the huge token
	// admitted, the honest holder fenced out), which is what the column exists to
	// show.
	OK        bool  `json:"ok"`
	ElapsedMs int64 `json:"elapsedMs"`
}

// judge is the column's verdict (see AttackResult.OK).
func (r *AttackResult) judge() bool {
	if r.GrantsVerified {
		for _, a := range r.Attempts {
			if !a.Refused() {
				return false
			}
		}
		return r.RogueRailCalls == 0 && r.MarkAfter == r.MarkBefore &&
			r.TargetAfterAttack.Status == lockapi.StatusPending &&
			r.Target.Status == lockapi.StatusPaid && r.Honest.Status == lockapi.StatusPaid
	}
	fenced := false
	for _, o := range r.Honest.Outcomes {
		fenced = fenced || o == lockapi.OutcomeFenced
	}
	return r.RogueRailCalls > 0 && r.MarkAfter == lockapi.MaxInt64 && fenced && r.Honest.Status != lockapi.StatusPaid
}

// writeAttack is the report's attack section.
func writeAttack(w io.Writer, cols []*AttackResult) {
	if len(cols) == 0 {
		return
	}
	fmt.Fprintf(w, "\nattack — a rogue client with no lease (with identities on, a process holding the executor's\n"+
		"certificate and roles) presents a huge token for %s, one higher each try\n"+
		"(%d … %d): to rail-proxy a payout nobody created, %d EUR\n"+
		"minor units to %s; to payment-resource a claim of %s's pending payout %s. Each column is\n"+
		"a system of its own, fencing on, after an honest executor paid one payout per account; they\n"+
		"differ in whether rail-proxy and payment-resource verify lock-server's grants (docs/contracts/signed-grants.md);\n"+
		"the column without verification checks nothing against the books either, to show what grants alone prevent:\n\n",
		attackVictim, lockapi.MaxInt64-4, lockapi.MaxInt64, rogueAmount, rogueBenef, attackVictim, attackTarget)
	head := []string{}
	for _, c := range cols {
		if c.GrantsVerified {
			head = append(head, "grants verified")
		} else {
			head = append(head, "grants not verified")
		}
	}
	t := invariants.Table{Head: head}
	books := make([]string, len(cols))
	for i, c := range cols {
		books[i] = yesNo(c.BooksChecked)
	}
	t.Row("the books checked (RAIL_PROXY_BOOKS_CHECK, PAYMENT_BOOKS_CHECK)", books)
	for _, service := range []string{"rail-proxy", "payment-resource"} {
		t.Row(map[string]string{"rail-proxy": "rail-proxy, submission with", "payment-resource": "payment-resource, claim with"}[service], nil)
		for i, a := range cols[0].Attempts {
			if a.Service != service {
				continue
			}
			row := []string{}
			for _, c := range cols {
				row = append(row, c.Attempts[i].String())
			}
			t.Row("  "+a.Variant, row)
		}
	}
	t.Gap()
	each := func(f func(*AttackResult) string) []string {
		out := make([]string, len(cols))
		for i, c := range cols {
			out[i] = f(c)
		}
		return out
	}
	t.Row("rail calls from the rogue (money to "+rogueBenef+")", each(func(c *AttackResult) string {
		if c.RogueRailCalls == 0 {
			return "0"
		}
		return fmt.Sprintf("%d, %d accepted", c.RogueRailCalls, c.RogueAcceptedMinor)
	}))
	t.Row(attackVictim+"'s mark before → after", each(func(c *AttackResult) string {
		return fmt.Sprintf("%d → %d", c.MarkBefore, c.MarkAfter)
	}))
	t.Row(attackTarget+" right after the attack", each(func(c *AttackResult) string { return c.TargetAfterAttack.String() }))
	t.Row("then an honest executor works "+attackVictim+":", nil)
	t.Row("  "+attackTarget, each(func(c *AttackResult) string { return c.Target.String() }))
	t.Row("  "+attackHonest2+" (a new payout)", each(func(c *AttackResult) string { return c.Honest.String() }))
	t.Row("verdict", each(func(c *AttackResult) string { return demonstrationVerdict(c.GrantsVerified, c.OK) }))
	_ = t.Write(w)
	for _, c := range cols {
		if !c.GrantsVerified && c.OK {
			fmt.Fprintf(w, "\nWithout verification the made-up token was admitted, the rail paid the rogue, and %s's\n"+
				"mark is now %d: every honest token for %s is below it, so its holders are\n"+
				"fenced out for ever (the mark never goes down), and %s can never be claimed back.\n",
				attackVictim, c.MarkAfter, attackVictim, attackTarget)
		}
	}
}

// demonstrationVerdict is the verdict cell of a column of the attack or the
// insider section. A guarded column (grants verified, books checked) passes
// when every attempt was refused; an unguarded one is the demonstration, and
// is as expected when the hazard showed.
func demonstrationVerdict(guarded, ok bool) string {
	switch {
	case guarded && ok:
		return "PASS"
	case guarded:
		return "FAIL"
	case ok:
		return "the hazard, as shown"
	default:
		return "hazard NOT shown"
	}
}
