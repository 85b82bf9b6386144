package invariants

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
)

// Options says what the run was set up to do.
type Options struct {
	// FencingEnabled is the run's RAIL_PROXY_FENCING_ENABLED. With fencing off the
	// gate must never refuse a token (a FENCED row is a violation): the switch must
	// really bypass the check. Stale admissions are violations either way — with
	// fencing off they are the hazard the run demonstrates.
	FencingEnabled bool
	// RequireSettled makes a payout that is not PAID, DECLINED, AMBIGUOUS or
	// NOT_PRESENTED a violation: the run waited for every payout to settle.
	RequireSettled bool
	// Reconciled says a reconciler made its final pass after the settle window
	// (docs/contracts/reconciliation.md): invariant 7 is judged.
	Reconciled bool
	// IssuedRecorded says History.Issued holds every token lock-server handed
	// out: invariant 6 then judges lockdb's tokens too.
	IssuedRecorded bool
	// BooksBound says History.Moves holds payout_history, the record of every
	// move payment-resource made (docs/contracts/books.md): invariant 8, only the
	// books move money, is judged.
	BooksBound bool
	// StatementAcceptedOnly says the reconciler read a statement that lists only
	// what moved money — a camt.053, through rail-proxy's ISO 20022 route or
	// from statement files (docs/contracts/iso20022.md): a declined call is on
	// no statement, so the copy holds the accepted calls alone (matched to them
	// by account and rail reference: files are numbered in import order, not by
	// the rail), a payout whose only calls were declined is rightly settled
	// NOT_PRESENTED (no money moved), and a declined call calls for no exception.
	StatementAcceptedOnly bool
}

// evaluation holds the history, ordered and indexed, and the findings so far.
type evaluation struct {
	opts  Options
	defs  map[CheckID]checkDef
	found map[CheckID][]Finding

	calls    []railstub.Call // by seq
	subs     []Submission    // by submission_id
	payouts  []Payout        // by payout_id
	payout   map[string]Payout
	fwd      map[string][]Submission    // payout_id → forwardable rows, by submission_id
	byRef    map[string][]railstub.Call // reference → calls, by seq
	ledger   map[string][]LedgerEntry   // payout_id → entries
	grants   map[string][]Grant         // lock name → grants, by token
	earliest map[string][]time.Time     // lock name → earliest acquired_at among grants[i:]
	h        History

	settlement map[string]Settlement // payout_id → how a settle moved it (books.go)
}

// Evaluate judges a history. It is a pure function of its arguments.
func Evaluate(h History, opts Options) Report {
	e := newEvaluation(h, opts)
	e.staleAdmissions()
	e.overtakes()
	e.superseded()
	e.doublePresentations()
	e.extraForwardable()
	e.callsWithoutIntent()
	e.attemptRows()
	e.ambiguity()
	e.marks()
	e.issuedTokens()
	e.ledgerEntries()
	e.payoutsVsRail()
	e.unsettled()
	e.fencingSwitch()
	r := Report{FencingEnabled: opts.FencingEnabled}
	e.count(&r)
	r.Money = e.money()
	// what the stale admissions put in front of the rail: risk.go
	r.MoneyAtRisk = e.moneyAtRisk()
	e.books(&r)    // invariant 7, books.go
	e.booksBound() // invariant 8, booksbound.go
	for _, m := range r.Money {
		if m.Booked != m.AcceptedPaid {
			e.add(CheckBooks, Finding{Detail: fmt.Sprintf(
				"%s: the ledger books %d but the rail accepted %d for PAID payouts", m.Currency, m.Booked, m.AcceptedPaid)})
		}
	}
	e.fill(&r)
	return r
}

func newEvaluation(h History, opts Options) *evaluation {
	e := &evaluation{
		opts: opts, defs: map[CheckID]checkDef{}, found: map[CheckID][]Finding{}, h: h,
		payout: map[string]Payout{}, fwd: map[string][]Submission{}, byRef: map[string][]railstub.Call{},
		ledger: map[string][]LedgerEntry{}, grants: map[string][]Grant{}, earliest: map[string][]time.Time{},
	}
	for _, d := range checkDefs(opts) {
		e.defs[d.id] = d
	}
	e.calls = slices.Clone(h.Calls)
	slices.SortStableFunc(e.calls, func(a, b railstub.Call) int { return cmp.Compare(a.Seq, b.Seq) })
	e.subs = slices.Clone(h.Submissions)
	slices.SortStableFunc(e.subs, func(a, b Submission) int { return cmp.Compare(a.SubmissionID, b.SubmissionID) })
	e.payouts = slices.Clone(h.Payouts)
	slices.SortStableFunc(e.payouts, func(a, b Payout) int { return cmp.Compare(a.PayoutID, b.PayoutID) })
	for _, p := range e.payouts {
		e.payout[p.PayoutID] = p
	}
	for _, s := range e.subs {
		if s.Forwardable() {
			e.fwd[s.PayoutID] = append(e.fwd[s.PayoutID], s)
		}
	}
	for _, c := range e.calls {
		e.byRef[c.Reference] = append(e.byRef[c.Reference], c)
	}
	for _, l := range h.Ledger {
		e.ledger[l.PayoutID] = append(e.ledger[l.PayoutID], l)
	}
	for _, g := range h.Grants {
		e.grants[g.LockName] = append(e.grants[g.LockName], g)
	}
	e.settlement = map[string]Settlement{}
	for _, st := range h.Settlements {
		e.settlement[st.PayoutID] = st
	}
	for name, gs := range e.grants {
		slices.SortFunc(gs, func(a, b Grant) int { return cmp.Compare(a.Token, b.Token) })
		// Grants of one lock are serialised on its lock_lease row, so acquired_at
		// should grow with the token; the suffix minimum does not rely on it.
		first := make([]time.Time, len(gs))
		for i := len(gs) - 1; i >= 0; i-- {
			first[i] = gs[i].AcquiredAt
			if i+1 < len(gs) && first[i+1].Before(first[i]) {
				first[i] = first[i+1]
			}
		}
		e.earliest[name] = first
	}
	return e
}

func (e *evaluation) add(id CheckID, f Finding) {
	f.Check = id
	f.Invariant = e.defs[id].invariant
	e.found[id] = append(e.found[id], f)
}

// intentOf is the call's forwardable row, when exactly one exists: the row whose
// presented token the call carried.
func (e *evaluation) intentOf(c railstub.Call) (Submission, bool) {
	rows := e.fwd[c.Reference]
	if len(rows) != 1 {
		return Submission{}, false
	}
	return rows[0], true
}

// staleAdmissions walks each account's admitted attempts in submission_id order —
// admission order, because the fence upsert serialises an account's admissions on
// its rail_high_water row and the intent row gets its id after that lock — and
// flags a token not strictly greater than every token admitted before it.
func (e *evaluation) staleAdmissions() {
	type best struct{ token, id int64 }
	top := map[string]best{}
	for _, s := range e.subs {
		if !s.Admitted() {
			continue
		}
		b, seen := top[s.AccountID]
		if seen && s.PresentedToken <= b.token {
			e.add(CheckStaleAdmission, Finding{AccountID: s.AccountID, PayoutID: s.PayoutID, SubmissionID: s.SubmissionID,
				Detail: fmt.Sprintf("token %d (%s) admitted after token %d (submission %d)",
					s.PresentedToken, outcomeName(s.Outcome), b.token, b.id)})
		}
		if !seen || s.PresentedToken > b.token {
			top[s.AccountID] = best{s.PresentedToken, s.SubmissionID}
		}
	}
}

// overtakes flags, per account, a call that reached the rail after a call carrying
// a larger token. Two admitted submissions in flight at once may arrive in either
// order; no gate in front of a memoryless rail can prevent it.
func (e *evaluation) overtakes() {
	type best struct{ token, seq int64 }
	top := map[string]best{}
	for _, c := range e.calls {
		s, ok := e.intentOf(c)
		if !ok {
			continue // reported by the intent and audit checks
		}
		b, seen := top[c.AccountID]
		if seen && s.PresentedToken < b.token {
			e.add(CheckRailOvertake, Finding{AccountID: c.AccountID, PayoutID: c.Reference, Seq: c.Seq, SubmissionID: s.SubmissionID,
				Detail: fmt.Sprintf("token %d reached the rail after token %d (call %d)", s.PresentedToken, b.token, b.seq)})
		}
		if !seen || s.PresentedToken > b.token {
			top[c.AccountID] = best{s.PresentedToken, c.Seq}
		}
	}
}

// superseded flags a call whose token had already been superseded by a newer grant
// of the account's lock when the rail received it. A gate can only fence a token
// once the newer one has reached it, so this is reported, not failed. The two
// times come from two clocks — receivedAt from the rail-stub's process, acquired_at
// from lockdb's clock_timestamp() — which lockdemo runs on one host, one clock.
func (e *evaluation) superseded() {
	for _, c := range e.calls {
		s, ok := e.intentOf(c)
		if !ok {
			continue
		}
		name := lockapi.AccountLockName(c.AccountID)
		gs := e.grants[name]
		i := sort.Search(len(gs), func(i int) bool { return gs[i].Token > s.PresentedToken })
		if i == len(gs) {
			continue
		}
		first := e.earliest[name][i]
		if !first.Before(c.ReceivedAt) {
			continue
		}
		var newer Grant
		for _, g := range gs[i:] {
			if g.AcquiredAt.Equal(first) {
				newer = g
				break
			}
		}
		e.add(CheckSupersededPresentation, Finding{AccountID: c.AccountID, PayoutID: c.Reference, Seq: c.Seq, SubmissionID: s.SubmissionID,
			Detail: fmt.Sprintf("token %d reached the rail %s after token %d was granted to %s",
				s.PresentedToken, c.ReceivedAt.Sub(first).Round(time.Millisecond), newer.Token, newer.OwnerID)})
	}
}

// doublePresentations flags a reference the rail saw more than once: each call can
// move money, so that is a double payment (or, had one been declined, a second
// attempt the system promised never to make).
func (e *evaluation) doublePresentations() {
	for _, ref := range e.refsInOrder() {
		cs := e.byRef[ref]
		if len(cs) < 2 {
			continue
		}
		seqs := make([]string, len(cs))
		accepted := 0
		for i, c := range cs {
			seqs[i] = fmt.Sprint(c.Seq)
			if c.Result == railstub.ResultAccepted {
				accepted++
			}
		}
		e.add(CheckDoublePresentation, Finding{AccountID: cs[0].AccountID, PayoutID: ref, Seq: cs[1].Seq,
			Detail: fmt.Sprintf("presented %d times (calls %s), accepted %d times", len(cs), strings.Join(seqs, ", "), accepted)})
	}
}

// refsInOrder lists the references the rail saw, by their first call.
func (e *evaluation) refsInOrder() []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range e.calls {
		if !seen[c.Reference] {
			seen[c.Reference] = true
			out = append(out, c.Reference)
		}
	}
	return out
}

func (e *evaluation) extraForwardable() {
	for _, p := range e.payoutIDs() {
		rows := e.fwd[p]
		if len(rows) < 2 {
			continue
		}
		ids := make([]string, len(rows))
		for i, s := range rows {
			ids[i] = fmt.Sprint(s.SubmissionID)
		}
		e.add(CheckExtraForwardable, Finding{AccountID: rows[0].AccountID, PayoutID: p, SubmissionID: rows[1].SubmissionID,
			Detail: fmt.Sprintf("%d forwardable rows (submissions %s)", len(rows), strings.Join(ids, ", "))})
	}
}

// payoutIDs lists every payout id that has a payout row or a forwardable row, sorted.
func (e *evaluation) payoutIDs() []string {
	set := map[string]bool{}
	for _, p := range e.payouts {
		set[p.PayoutID] = true
	}
	for id := range e.fwd {
		set[id] = true
	}
	out := make([]string, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// callsWithoutIntent flags a call with no forwardable row for its reference, one
// whose row was written after the call arrived, or one that does not match its
// row (the proxy forwards what it recorded). submitted_at is when the row was
// inserted, before its commit: the commit itself leaves no time in the table, so
// "committed before the socket" is checked as "inserted before the rail saw it".
func (e *evaluation) callsWithoutIntent() {
	for _, c := range e.calls {
		rows := e.fwd[c.Reference]
		f := Finding{AccountID: c.AccountID, PayoutID: c.Reference, Seq: c.Seq}
		switch {
		case len(rows) == 0:
			f.Detail = "the rail was presented a payout with no forwardable rail_submission row"
		case rows[0].SubmittedAt.After(c.ReceivedAt):
			f.SubmissionID = rows[0].SubmissionID
			f.Detail = fmt.Sprintf("its row was written %s after the rail received the call",
				rows[0].SubmittedAt.Sub(c.ReceivedAt).Round(time.Microsecond))
		case rows[0].AccountID != c.AccountID || rows[0].AmountMinor != c.AmountMinor ||
			rows[0].Currency != c.Currency || rows[0].Beneficiary != c.Beneficiary:
			f.SubmissionID = rows[0].SubmissionID
			f.Detail = fmt.Sprintf("the call (%s, %d %s) differs from its row (%s, %d %s, or the beneficiary)",
				c.AccountID, c.AmountMinor, c.Currency, rows[0].AccountID, rows[0].AmountMinor, rows[0].Currency)
		default:
			continue
		}
		e.add(CheckCallWithoutIntent, f)
	}
}

// attemptRows checks that each rail call maps to exactly one forwardable row, and
// that every row saying the rail answered (ACKED, REJECTED) has that answer in the
// rail's log. A call with no row at all breaks invariants 3 and 4 both, and is
// counted by both checks.
func (e *evaluation) attemptRows() {
	for _, c := range e.calls {
		if n := len(e.fwd[c.Reference]); n != 1 {
			e.add(CheckAttemptRows, Finding{AccountID: c.AccountID, PayoutID: c.Reference, Seq: c.Seq,
				Detail: fmt.Sprintf("the call maps to %d forwardable rows, not exactly one", n)})
		}
	}
	for _, s := range e.subs {
		var ok bool
		switch s.Outcome {
		case "ACKED":
			ok = slices.ContainsFunc(e.byRef[s.PayoutID], func(c railstub.Call) bool {
				return c.Result == railstub.ResultAccepted && c.RailReference == s.RailReference
			})
		case "REJECTED":
			ok = slices.ContainsFunc(e.byRef[s.PayoutID], func(c railstub.Call) bool { return c.Result == railstub.ResultDeclined })
		default:
			continue
		}
		if !ok {
			e.add(CheckAttemptRows, Finding{AccountID: s.AccountID, PayoutID: s.PayoutID, SubmissionID: s.SubmissionID,
				Detail: fmt.Sprintf("the row says %s but the rail's log has no such answer", s.Outcome)})
		}
	}
}

// ambiguity: every AMBIGUOUS payout rests on a TIMEOUT row; after a TIMEOUT row no
// new attempt of that payout is admitted. A TIMEOUT row whose payout is not
// AMBIGUOUS, and was not settled from the statement either, is reported: the
// ambiguity was not surfaced on the payout, e.g. it was still CLAIMED when the run
// ended.
func (e *evaluation) ambiguity() {
	timeout := map[string]Submission{}
	for _, s := range e.subs {
		if t, seen := timeout[s.PayoutID]; seen && s.Admitted() {
			e.add(CheckAmbiguityRetried, Finding{AccountID: s.AccountID, PayoutID: s.PayoutID, SubmissionID: s.SubmissionID,
				Detail: fmt.Sprintf("attempt with token %d admitted (%s) after submission %d ended TIMEOUT",
					s.PresentedToken, outcomeName(s.Outcome), t.SubmissionID)})
		}
		if s.Outcome == "TIMEOUT" {
			if _, seen := timeout[s.PayoutID]; !seen {
				timeout[s.PayoutID] = s
			}
			if p, ok := e.payout[s.PayoutID]; (!ok || p.Status != "AMBIGUOUS") && !e.settledFromStatement(s.PayoutID) {
				status := "no payout row"
				if ok {
					status = "payout is " + p.Status
				}
				e.add(CheckTimeoutNotAmbiguous, Finding{AccountID: s.AccountID, PayoutID: s.PayoutID, SubmissionID: s.SubmissionID,
					Detail: "TIMEOUT row, but " + status})
			}
		}
	}
	for _, p := range e.payouts {
		if p.Status != "AMBIGUOUS" {
			continue
		}
		if _, ok := timeout[p.PayoutID]; !ok {
			e.add(CheckAmbiguousWithoutTimeout, Finding{AccountID: p.AccountID, PayoutID: p.PayoutID,
				Detail: "payout is AMBIGUOUS but no rail_submission row of it is TIMEOUT"})
		}
	}
}

// marks: an account's final mark equals the largest token that passed its fence
// (admitted or DUPLICATE: both advanced it) and is not below any token it refused
// (a FENCED token was at most the mark when refused; the mark never goes down).
// Only the final state is ground truth; a mark lowered and raised again between
// two reads would show up as a stale admission instead.
func (e *evaluation) marks() {
	type acct struct{ passed, fenced int64 }
	accts := map[string]*acct{}
	get := func(id string) *acct {
		if accts[id] == nil {
			accts[id] = &acct{}
		}
		return accts[id]
	}
	for _, s := range e.subs {
		a := get(s.AccountID)
		switch {
		case s.PassedFence():
			a.passed = max(a.passed, s.PresentedToken)
		case s.Outcome == "FENCED":
			a.fenced = max(a.fenced, s.PresentedToken)
		}
	}
	for id := range e.h.HighWater {
		get(id)
	}
	ids := make([]string, 0, len(accts))
	for id := range accts {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		a := accts[id]
		mark, has := e.h.HighWater[id]
		var detail string
		switch {
		case !has && (a.passed > 0 || a.fenced > 0):
			detail = fmt.Sprintf("no rail_high_water row, yet tokens up to %d were presented", max(a.passed, a.fenced))
		case has && a.passed == 0:
			detail = fmt.Sprintf("mark %d, but no token ever passed the fence", mark)
		case has && mark != a.passed:
			detail = fmt.Sprintf("mark %d, but the largest token that passed the fence is %d", mark, a.passed)
		case has && a.fenced > mark:
			detail = fmt.Sprintf("token %d was fenced, yet the mark is now %d: the mark went down", a.fenced, mark)
		default:
			continue
		}
		e.add(CheckMark, Finding{AccountID: id, Detail: detail})
	}
}

// issuedTokens: lockdb's tokens survive everything too (invariant 6). Every token
// handed out is in lock_grant, with the owner it was handed to; and no token of a
// lock was handed out twice. A grant a failover forgot breaks one or both: the
// new primary's counter is behind, so it hands the forgotten token out again (to
// the same owner or another), or nobody asks again and lock_grant simply lacks
// it. Tokens of one lock are unique in lock_grant (its primary key) and each
// grant takes the lock's counter + 1, so together the two checks say the tokens
// handed out kept strictly increasing per lock.
func (e *evaluation) issuedTokens() {
	if !e.opts.IssuedRecorded {
		return
	}
	type key struct {
		lock  string
		token int64
	}
	granted := map[key]Grant{}
	for _, g := range e.h.Grants {
		granted[key{g.LockName, g.Token}] = g
	}
	issued := slices.Clone(e.h.Issued)
	slices.SortStableFunc(issued, func(a, b IssuedToken) int { return cmp.Compare(a.Seq, b.Seq) })
	first := map[key]IssuedToken{}
	for _, it := range issued {
		k := key{it.LockName, it.Token}
		f := Finding{AccountID: accountOf(it.LockName)}
		if prev, seen := first[k]; seen {
			f.Detail = fmt.Sprintf("%s token %d handed out to %s, and again to %s (%s later)",
				it.LockName, it.Token, prev.OwnerID, it.OwnerID, it.At.Sub(prev.At).Round(time.Millisecond))
			e.add(CheckTokenIssuedTwice, f)
		} else {
			first[k] = it
		}
		g, ok := granted[k]
		switch {
		case !ok:
			f.Detail = fmt.Sprintf("%s token %d handed out to %s, but lock_grant has no such grant", it.LockName, it.Token, it.OwnerID)
		case g.OwnerID != it.OwnerID:
			f.Detail = fmt.Sprintf("%s token %d handed out to %s, but lock_grant gives it to %s", it.LockName, it.Token, it.OwnerID, g.OwnerID)
		default:
			continue
		}
		e.add(CheckTokenWithoutGrant, f)
	}
}

// accountOf is the account of an account lock's name, or "".
func accountOf(lockName string) string {
	a, _ := strings.CutPrefix(lockName, "account:")
	if a == lockName {
		return ""
	}
	return a
}

// ledgerEntries: a PAID payout has exactly one ledger entry, debiting its amount in
// its currency for its account; no other payout has one.
func (e *evaluation) ledgerEntries() {
	for _, p := range e.payouts {
		es := e.ledger[p.PayoutID]
		f := Finding{AccountID: p.AccountID, PayoutID: p.PayoutID}
		switch {
		case p.Status == "PAID" && len(es) != 1:
			f.Detail = fmt.Sprintf("PAID with %d ledger entries", len(es))
		case p.Status != "PAID" && len(es) > 0:
			f.Detail = fmt.Sprintf("%s, yet it has %d ledger entries", p.Status, len(es))
		case len(es) == 1 && (es[0].AmountMinor != -p.AmountMinor || es[0].Currency != p.Currency || es[0].AccountID != p.AccountID):
			f.Detail = fmt.Sprintf("ledger entry %d %s on %s; payout %d %s on %s",
				es[0].AmountMinor, es[0].Currency, es[0].AccountID, p.AmountMinor, p.Currency, p.AccountID)
		default:
			continue
		}
		e.add(CheckLedger, f)
	}
	for _, l := range e.h.Ledger {
		if _, ok := e.payout[l.PayoutID]; !ok {
			e.add(CheckLedger, Finding{AccountID: l.AccountID, PayoutID: l.PayoutID, Detail: "ledger entry for an unknown payout"})
		}
	}
}

// payoutsVsRail: a PAID payout rests on an ACKED row (or, settled from the
// statement, on a TIMEOUT row and that settle) and an accepted call carrying its
// rail reference; a DECLINED one on a REJECTED row or a DECLINED settle, and the
// rail never accepted it; a NOT_PRESENTED one on its settle, and the rail was
// never presented it. A call for a payout the system does not know is money moved for
// nobody. AMBIGUOUS payouts the rail accepted are reported: money moved, not
// booked, for reconciliation from the rail's records.
func (e *evaluation) payoutsVsRail() {
	for _, p := range e.payouts {
		calls := e.byRef[p.PayoutID]
		accepted := slices.ContainsFunc(calls, func(c railstub.Call) bool { return c.Result == railstub.ResultAccepted })
		hasRow := func(outcome string, ref *string) bool {
			return slices.ContainsFunc(e.fwd[p.PayoutID], func(s Submission) bool {
				return s.Outcome == outcome && (ref == nil || s.RailReference == *ref)
			})
		}
		f := Finding{AccountID: p.AccountID, PayoutID: p.PayoutID}
		switch p.Status {
		case "PAID":
			settled, byStatement := e.settlement[p.PayoutID]
			switch {
			case byStatement && (settled.Outcome != "PAID" || settled.RailReference != p.RailReference || !hasRow("TIMEOUT", nil)):
				f.Detail = fmt.Sprintf("PAID with rail reference %q, but its settle says %s %q, or no TIMEOUT row made it AMBIGUOUS",
					p.RailReference, settled.Outcome, settled.RailReference)
			case !byStatement && !hasRow("ACKED", &p.RailReference):
				f.Detail = fmt.Sprintf("PAID with rail reference %q, but no ACKED row carries it", p.RailReference)
			case !slices.ContainsFunc(calls, func(c railstub.Call) bool {
				return c.Result == railstub.ResultAccepted && c.RailReference == p.RailReference && c.AmountMinor == p.AmountMinor && c.Currency == p.Currency
			}):
				f.Detail = fmt.Sprintf("PAID with rail reference %q, but the rail accepted no such payment of %d %s",
					p.RailReference, p.AmountMinor, p.Currency)
			default:
				continue
			}
		case "DECLINED":
			switch {
			case !hasRow("REJECTED", nil) && !e.settledAs(p.PayoutID, "DECLINED"):
				f.Detail = "DECLINED, but no REJECTED row and no settle from the statement"
			case accepted:
				f.Detail = "DECLINED, but the rail accepted it: money moved"
			default:
				continue
			}
		case "NOT_PRESENTED":
			switch {
			case !e.settledAs(p.PayoutID, "NOT_PRESENTED"):
				f.Detail = "NOT_PRESENTED, but no settle from the statement made it so"
			case e.opts.StatementAcceptedOnly && accepted:
				f.Detail = "NOT_PRESENTED, but the rail accepted it: money moved"
			case !e.opts.StatementAcceptedOnly && len(calls) > 0:
				f.Detail = fmt.Sprintf("NOT_PRESENTED, but the rail was presented it (call %d, %s)", calls[0].Seq, calls[0].Result)
				f.Seq = calls[0].Seq
			default:
				continue
			}
		case "AMBIGUOUS":
			for _, c := range calls {
				if c.Result == railstub.ResultAccepted {
					e.add(CheckAmbiguousAccepted, Finding{AccountID: p.AccountID, PayoutID: p.PayoutID, Seq: c.Seq,
						Detail: fmt.Sprintf("the rail accepted %d %s (%s, reply dropped: %t): reconcile", c.AmountMinor, c.Currency, c.RailReference, c.Dropped)})
					break
				}
			}
			continue
		default:
			continue
		}
		e.add(CheckPayoutVsRail, f)
	}
	for _, ref := range e.refsInOrder() {
		if _, ok := e.payout[ref]; !ok {
			c := e.byRef[ref][0]
			e.add(CheckPayoutVsRail, Finding{AccountID: c.AccountID, PayoutID: ref, Seq: c.Seq,
				Detail: "the rail was presented a payout payment-resource does not know"})
		}
	}
}

func (e *evaluation) unsettled() {
	for _, p := range e.payouts {
		if !p.Final() {
			e.add(CheckUnsettled, Finding{AccountID: p.AccountID, PayoutID: p.PayoutID, Detail: "payout is " + p.Status})
		}
	}
}

// fencingSwitch: with fencing off the gate must admit every token (docs/contracts/rail-proxy.md
// fencing switch); a FENCED row means the switch did not bypass the check.
func (e *evaluation) fencingSwitch() {
	if e.opts.FencingEnabled {
		return
	}
	for _, s := range e.subs {
		if s.Outcome == "FENCED" {
			e.add(CheckFencingSwitch, Finding{AccountID: s.AccountID, PayoutID: s.PayoutID, SubmissionID: s.SubmissionID,
				Detail: fmt.Sprintf("token %d was FENCED although fencing was off", s.PresentedToken)})
		}
	}
}

func (e *evaluation) count(r *Report) {
	for _, p := range e.payouts {
		r.Payouts.Total++
		switch p.Status {
		case "PENDING":
			r.Payouts.Pending++
		case "CLAIMED":
			r.Payouts.Claimed++
		case "PAID":
			r.Payouts.Paid++
		case "DECLINED":
			r.Payouts.Declined++
		case "AMBIGUOUS":
			r.Payouts.Ambiguous++
		case "NOT_PRESENTED":
			r.Payouts.NotPresented++
		}
	}
	for _, c := range e.calls {
		r.RailCalls.Total++
		switch {
		case c.Result == railstub.ResultAccepted:
			r.RailCalls.Accepted++
			if c.Dropped {
				r.RailCalls.Dropped++
			}
		case c.Result == railstub.ResultDeclined:
			r.RailCalls.Declined++
		}
	}
	r.RailCalls.References = len(e.byRef)
	for _, s := range e.subs {
		r.Submissions.Total++
		if s.Admitted() {
			r.Submissions.Admitted++
		}
		switch s.Outcome {
		case "FENCED":
			r.Submissions.Fenced++
		case "UNBOOKED":
			r.Submissions.Unbooked++
		case "DUPLICATE":
			r.Submissions.Duplicate++
		case "ACKED":
			r.Submissions.Acked++
		case "REJECTED":
			r.Submissions.Rejected++
		case "TIMEOUT":
			r.Submissions.Timeout++
		case "UNSENT":
			r.Submissions.Unsent++
		case Unresolved:
			r.Submissions.Unresolved++
		}
	}
}

// money sums the books per currency; see Money for the split.
func (e *evaluation) money() []Money {
	by := map[string]*Money{}
	get := func(cur string) *Money {
		if by[cur] == nil {
			by[cur] = &Money{Currency: cur}
		}
		return by[cur]
	}
	acceptedBefore := map[string]bool{}
	for _, c := range e.calls {
		if c.Result != railstub.ResultAccepted {
			continue
		}
		m := get(c.Currency)
		amount := c.AmountMinor
		m.RailAccepted += amount
		if _, ours := e.payout[c.Reference]; ours {
			m.AcceptedForPayouts += amount
		}
		if acceptedBefore[c.Reference] {
			m.DoublePaid += amount
			continue
		}
		acceptedBefore[c.Reference] = true
		switch e.payout[c.Reference].Status {
		case "PAID":
			m.AcceptedPaid += amount
		case "AMBIGUOUS":
			m.AcceptedAmbiguous += amount
		default:
			m.AcceptedOther += amount
		}
	}
	for _, l := range e.h.Ledger {
		get(l.Currency).Booked -= l.AmountMinor
	}
	out := make([]Money, 0, len(by))
	for _, m := range by {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Money) int { return cmp.Compare(a.Currency, b.Currency) })
	return out
}

// fill turns the findings into the report's checks, verdicts and lists.
func (e *evaluation) fill(r *Report) {
	broken := map[int]int{}
	for _, d := range checkDefs(e.opts) {
		fs := e.found[d.id]
		r.Checks = append(r.Checks, Check{ID: d.id, Invariant: d.invariant, Title: d.title, Count: len(fs), Fails: d.fails})
		if d.fails {
			r.Violations = append(r.Violations, fs...)
			broken[d.invariant] += len(fs)
		} else {
			r.Notes = append(r.Notes, fs...)
		}
	}
	for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 8, 0} {
		if (n == 7 && !e.opts.Reconciled) || (n == 8 && !e.opts.BooksBound) {
			continue
		}
		r.Invariants = append(r.Invariants, Verdict{Invariant: n, Name: invariantName(n), Held: broken[n] == 0, Violations: broken[n]})
	}
	if r.Violations == nil {
		r.Violations = []Finding{}
	}
	if r.Notes == nil {
		r.Notes = []Finding{}
	}
}

func outcomeName(o string) string {
	if o == Unresolved {
		return "unresolved"
	}
	return o
}
