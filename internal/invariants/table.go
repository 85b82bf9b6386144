package invariants

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Column is one run in a table of reports.
type Column struct {
	Title  string
	Report Report
}

// Row is a line a caller adds at the top of the table (the run's settings, its
// duration …), one value per column.
type Row struct {
	Label  string
	Values []string
}

// MaxListed bounds the violations listed under the table per column; the JSON
// form carries them all.
const MaxListed = 12

// WriteTable writes one report as a table, titled by its fencing setting.
func (r Report) WriteTable(w io.Writer) error {
	return WriteTable(w, []Column{{Title: fencingTitle(r.FencingEnabled), Report: r}})
}

func fencingTitle(on bool) string {
	if on {
		return "fencing on"
	}
	return "fencing off"
}

// WriteTable writes reports side by side: counts, money, then every check under
// its invariant with the invariant's verdict, then the violations of each column.
// A failing check shows "FAIL n"; a check reported for information shows its count.
func WriteTable(w io.Writer, cols []Column, extra ...Row) error {
	var t table
	t.head = make([]string, len(cols))
	for i, c := range cols {
		t.head[i] = c.Title
	}
	each := func(f func(Report) string) []string {
		out := make([]string, len(cols))
		for i, c := range cols {
			out[i] = f(c.Report)
		}
		return out
	}
	num := func(f func(Report) int) []string {
		return each(func(r Report) string { return strconv.Itoa(f(r)) })
	}

	for _, x := range extra {
		t.row(x.Label, x.Values)
	}
	if len(extra) > 0 {
		t.gap()
	}
	t.row("payouts", num(func(r Report) int { return r.Payouts.Total }))
	t.row("  PAID", num(func(r Report) int { return r.Payouts.Paid }))
	t.row("  DECLINED", num(func(r Report) int { return r.Payouts.Declined }))
	t.row("  AMBIGUOUS (reconcile from the rail's records)", num(func(r Report) int { return r.Payouts.Ambiguous }))
	t.row("  NOT_PRESENTED (the rail never got them)", num(func(r Report) int { return r.Payouts.NotPresented }))
	t.row("  not settled (PENDING, CLAIMED)", num(func(r Report) int { return r.Payouts.Pending + r.Payouts.Claimed }))
	t.row("rail calls (what the rail was presented)", num(func(r Report) int { return r.RailCalls.Total }))
	t.row("  accepted (money moved)", num(func(r Report) int { return r.RailCalls.Accepted }))
	t.row("    of which the reply was dropped", num(func(r Report) int { return r.RailCalls.Dropped }))
	t.row("  declined", num(func(r Report) int { return r.RailCalls.Declined }))
	t.row("rail_submission rows (admission attempts)", num(func(r Report) int { return r.Submissions.Total }))
	t.row("  admitted (intent committed)", num(func(r Report) int { return r.Submissions.Admitted }))
	t.row("    ACKED", num(func(r Report) int { return r.Submissions.Acked }))
	t.row("    REJECTED", num(func(r Report) int { return r.Submissions.Rejected }))
	t.row("    TIMEOUT", num(func(r Report) int { return r.Submissions.Timeout }))
	t.row("    UNSENT", num(func(r Report) int { return r.Submissions.Unsent }))
	t.row("    unresolved", num(func(r Report) int { return r.Submissions.Unresolved }))
	t.row("  FENCED (refused at the gate, rail not called)", num(func(r Report) int { return r.Submissions.Fenced }))
	t.row("  DUPLICATE (payout already attempted)", num(func(r Report) int { return r.Submissions.Duplicate }))

	var currencies []string
	for _, c := range cols {
		for _, m := range c.Report.Money {
			if !slices.Contains(currencies, m.Currency) {
				currencies = append(currencies, m.Currency)
			}
		}
	}
	slices.Sort(currencies)
	for _, cur := range currencies {
		money := func(f func(Money) int64) []string {
			return each(func(r Report) string {
				for _, m := range r.Money {
					if m.Currency == cur {
						return strconv.FormatInt(f(m), 10)
					}
				}
				return "0"
			})
		}
		t.row("money, "+cur+" minor units: accepted by the rail", money(func(m Money) int64 { return m.RailAccepted }))
		t.row("  for PAID payouts", money(func(m Money) int64 { return m.AcceptedPaid }))
		t.row("  booked in the ledger (must equal the line above)", money(func(m Money) int64 { return m.Booked }))
		t.row("  for AMBIGUOUS payouts (moved, not booked)", money(func(m Money) int64 { return m.AcceptedAmbiguous }))
		t.row("  paid twice or more (double payments)", money(func(m Money) int64 { return m.DoublePaid }))
		t.row("  for other payouts", money(func(m Money) int64 { return m.AcceptedOther }))
	}

	booksRows(&t, cols) // books_table.go
	t.gap()
	for _, v := range orderedInvariants(cols) {
		label := fmt.Sprintf("%d %s", v, invariantName(v))
		if v == 0 {
			label = invariantName(v)
		}
		t.row(label, each(func(r Report) string {
			if r.Held(v) {
				return "held"
			}
			return "BROKEN"
		}))
		for _, ch := range checksOf(cols, v) {
			t.row("  "+ch.Title, each(func(r Report) string {
				for _, c := range r.Checks {
					if c.ID != ch.ID {
						continue
					}
					if c.Fails && c.Count > 0 {
						return "FAIL " + strconv.Itoa(c.Count)
					}
					return strconv.Itoa(c.Count)
				}
				return "-"
			}))
		}
	}
	t.gap()
	t.row("verdict", each(func(r Report) string {
		if r.OK() {
			return "PASS"
		}
		var b []string
		for _, n := range r.Broken() {
			if n == 0 {
				b = append(b, "cross-checks")
			} else {
				b = append(b, strconv.Itoa(n))
			}
		}
		return "FAIL (" + strings.Join(b, ", ") + ")"
	}))

	bw := bufio.NewWriter(w)
	t.write(bw)
	for _, c := range cols {
		vs := c.Report.Violations
		if len(vs) == 0 {
			continue
		}
		fmt.Fprintf(bw, "\nviolations, %s (%d):\n", c.Title, len(vs))
		for i, f := range vs {
			if i == MaxListed {
				fmt.Fprintf(bw, "  … and %d more (--json lists them all)\n", len(vs)-MaxListed)
				break
			}
			fmt.Fprintf(bw, "  %s\n", f)
		}
	}
	return bw.Flush()
}

// String is one line: the check, where, and what.
func (f Finding) String() string {
	var where []string
	if f.AccountID != "" {
		where = append(where, f.AccountID)
	}
	if f.PayoutID != "" {
		where = append(where, f.PayoutID)
	}
	if f.Seq != 0 {
		where = append(where, "call "+strconv.FormatInt(f.Seq, 10))
	}
	if f.SubmissionID != 0 {
		where = append(where, "submission "+strconv.FormatInt(f.SubmissionID, 10))
	}
	return fmt.Sprintf("%s [%s]: %s", f.Check, strings.Join(where, " "), f.Detail)
}

func orderedInvariants(cols []Column) []int {
	var out []int
	for _, c := range cols {
		for _, v := range c.Report.Invariants {
			if !slices.Contains(out, v.Invariant) {
				out = append(out, v.Invariant)
			}
		}
	}
	return out
}

// checksOf lists the checks of invariant n any column made, in report order.
func checksOf(cols []Column, n int) []Check {
	var out []Check
	for _, c := range cols {
		for _, ch := range c.Report.Checks {
			if ch.Invariant == n && !slices.ContainsFunc(out, func(o Check) bool { return o.ID == ch.ID }) {
				out = append(out, ch)
			}
		}
	}
	return out
}

type tableRow struct {
	label  string
	values []string
	gap    bool
}

type table struct {
	head []string
	rows []tableRow
}

func (t *table) row(label string, values []string) {
	t.rows = append(t.rows, tableRow{label: label, values: values})
}

func (t *table) gap() { t.rows = append(t.rows, tableRow{gap: true}) }

func (t *table) write(w io.Writer) {
	lw := 0
	cw := make([]int, len(t.head))
	for i, h := range t.head {
		cw[i] = max(len(h), 6)
	}
	for _, r := range t.rows {
		lw = max(lw, len(r.label))
		for i, v := range r.values {
			if i < len(cw) {
				cw[i] = max(cw[i], len(v))
			}
		}
	}
	line := func(label string, values []string) {
		var b strings.Builder
		b.WriteString(label)
		b.WriteString(strings.Repeat(" ", lw-len(label)))
		for i, width := range cw {
			v := ""
			if i < len(values) {
				v = values[i]
			}
			b.WriteString("   ")
			b.WriteString(strings.Repeat(" ", width-len(v)))
			b.WriteString(v)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line("", t.head)
	total := lw
	for _, width := range cw {
		total += 3 + width
	}
	fmt.Fprintln(w, strings.Repeat("-", total))
	for _, r := range t.rows {
		if r.gap {
			fmt.Fprintln(w)
			continue
		}
		line(r.label, r.values)
	}
}
