package invariants

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"lock.dev/internal/iso4217"
	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
)

// MoneyAtRisk is what the stale admissions (invariant 1) put in front of the
// rail: each is a payment presented on the authority of a lease that a newer
// holder of the account's lock had already used — an older instruction let
// through after a newer one (docs/lockdemo.md, "What a stale admission
// costs"). It is zero whenever invariant 1 held.
type MoneyAtRisk struct {
	// Presentations counts the stale admissions that reached or may have
	// reached the rail: every stale admitted row but UNSENT (provably never
	// sent).
	Presentations int `json:"presentations"`
	// Amounts sums their amounts per currency, by code.
	Amounts []Amount `json:"amounts"`
	// Accepted counts those the rail accepted: money moved on a superseded
	// lease (an accepted call of the payout, whose one forwardable row is the
	// stale one).
	Accepted int `json:"accepted"`
	// Superseded counts those that presented the payout otherwise than its row
	// reads now — another account, amount, currency or beneficiary (compared
	// as the books compare them), or a payout the books do not hold: a
	// superseded instruction paid instead of the current one.
	Superseded int `json:"superseded"`
}

// Amount is a sum of minor units in one currency.
type Amount struct {
	Currency    string `json:"currency"`
	AmountMinor int64  `json:"amountMinor"`
}

// moneyAtRisk sums the stale admissions staleAdmissions found.
func (e *evaluation) moneyAtRisk() MoneyAtRisk {
	byID := map[int64]Submission{}
	for _, s := range e.subs {
		byID[s.SubmissionID] = s
	}
	r := MoneyAtRisk{Amounts: []Amount{}}
	sums := map[string]int64{}
	for _, f := range e.found[CheckStaleAdmission] {
		s, ok := byID[f.SubmissionID]
		if !ok || s.Outcome == "UNSENT" {
			continue
		}
		r.Presentations++
		sums[s.Currency] += s.AmountMinor
		if e.acceptedFor(s) {
			r.Accepted++
		}
		if p, ok := e.payout[s.PayoutID]; !ok || p.AccountID != s.AccountID || p.AmountMinor != s.AmountMinor ||
			p.Currency != s.Currency || !lockapi.SameBeneficiary(p.Beneficiary, s.Beneficiary) {
			r.Superseded++
		}
	}
	for cur, n := range sums {
		r.Amounts = append(r.Amounts, Amount{Currency: cur, AmountMinor: n})
	}
	slices.SortFunc(r.Amounts, func(a, b Amount) int { return strings.Compare(a.Currency, b.Currency) })
	return r
}

// acceptedFor reports whether the rail accepted a call that s made: s is its
// payout's one forwardable row (so the payout's calls carried its token), and
// one of those calls was accepted.
func (e *evaluation) acceptedFor(s Submission) bool {
	rows := e.fwd[s.PayoutID]
	if len(rows) != 1 || rows[0].SubmissionID != s.SubmissionID {
		return false
	}
	return slices.ContainsFunc(e.byRef[s.PayoutID], func(c railstub.Call) bool { return c.Result == railstub.ResultAccepted })
}

// Cell is the figure as a report table shows it: "N presentations, X CUR"
// with X in major units, one sum per currency of currencies (a currency the
// run had but no stale admission presented shows 0).
func (m MoneyAtRisk) Cell(currencies []string) string {
	word := "presentations"
	if m.Presentations == 1 {
		word = "presentation"
	}
	parts := []string{strconv.Itoa(m.Presentations) + " " + word}
	cur := slices.Clone(currencies)
	for _, a := range m.Amounts {
		if !slices.Contains(cur, a.Currency) {
			cur = append(cur, a.Currency)
		}
	}
	slices.Sort(cur)
	for _, c := range cur {
		var n int64
		for _, a := range m.Amounts {
			if a.Currency == c {
				n = a.AmountMinor
			}
		}
		parts = append(parts, MajorUnits(n, c)+" "+c)
	}
	return strings.Join(parts, ", ")
}

// MajorUnits writes minor units in the currency's major units (1234 EUR →
// "12.34"); a currency without an ISO 4217 minor unit is written as it is.
func MajorUnits(minor int64, currency string) string {
	exp, ok := iso4217.Exponent(currency)
	if !ok || exp == 0 {
		return strconv.FormatInt(minor, 10)
	}
	sign := ""
	u := uint64(minor)
	if minor < 0 {
		sign, u = "-", uint64(-minor)
	}
	digits := strconv.FormatUint(u, 10)
	if len(digits) <= exp {
		digits = strings.Repeat("0", exp-len(digits)+1) + digits
	}
	return sign + digits[:len(digits)-exp] + "." + digits[len(digits)-exp:]
}

// MoneyAtRiskLine is the figure in a sentence, for the words under a report's
// table: how many presentations, how much per currency of the run, and of
// them how many the rail accepted and how many were not as the payout reads now.
func (r Report) MoneyAtRiskLine() string {
	var cur []string
	for _, m := range r.Money {
		cur = append(cur, m.Currency)
	}
	m := r.MoneyAtRisk
	return fmt.Sprintf("Money at risk: %s, presented on a superseded lease. The rail accepted\n"+
		"%d of them (money moved); %d presented the payout otherwise than it reads now (a superseded\n"+
		"instruction paid).", m.Cell(cur), m.Accepted, m.Superseded)
}
