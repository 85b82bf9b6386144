package invariants

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
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
	t := Table{Head: make([]string, len(cols))}
	for i, c := range cols {
		t.Head[i] = c.Title
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
		t.Row(x.Label, x.Values)
	}
	if len(extra) > 0 {
		t.Gap()
	}
	t.Row("payouts", num(func(r Report) int { return r.Payouts.Total }))
	t.Row("  PAID", num(func(r Report) int { return r.Payouts.Paid }))
	t.Row("  DECLINED", num(func(r Report) int { return r.Payouts.Declined }))
	t.Row("  AMBIGUOUS (reconcile from the rail's records)", num(func(r Report) int { return r.Payouts.Ambiguous }))
	t.Row("  NOT_PRESENTED (the rail never got them)", num(func(r Report) int { return r.Payouts.NotPresented }))
	t.Row("  not settled (PENDING, CLAIMED)", num(func(r Report) int { return r.Payouts.Pending + r.Payouts.Claimed }))
	t.Row("rail calls (what the rail was presented)", num(func(r Report) int { return r.RailCalls.Total }))
	t.Row("  accepted (money moved)", num(func(r Report) int { return r.RailCalls.Accepted }))
	t.Row("    of which the reply was dropped", num(func(r Report) int { return r.RailCalls.Dropped }))
	t.Row("  declined", num(func(r Report) int { return r.RailCalls.Declined }))
	t.Row("rail_submission rows (admission attempts)", num(func(r Report) int { return r.Submissions.Total }))
	t.Row("  admitted (intent committed)", num(func(r Report) int { return r.Submissions.Admitted }))
	t.Row("    ACKED", num(func(r Report) int { return r.Submissions.Acked }))
	t.Row("    REJECTED", num(func(r Report) int { return r.Submissions.Rejected }))
	t.Row("    TIMEOUT", num(func(r Report) int { return r.Submissions.Timeout }))
	t.Row("    UNSENT", num(func(r Report) int { return r.Submissions.Unsent }))
	t.Row("    unresolved", num(func(r Report) int { return r.Submissions.Unresolved }))
	t.Row("  FENCED (refused at the gate, rail not called)", num(func(r Report) int { return r.Submissions.Fenced }))
	t.Row("  UNBOOKED (refused by the books, rail not called)", num(func(r Report) int { return r.Submissions.Unbooked }))
	t.Row("  DUPLICATE (payout already attempted)", num(func(r Report) int { return r.Submissions.Duplicate }))

	for _, cur := range currencies(cols) {
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
		t.Row("money, "+cur+" minor units: accepted by the rail", money(func(m Money) int64 { return m.RailAccepted }))
		t.Row("  for PAID payouts", money(func(m Money) int64 { return m.AcceptedPaid }))
		t.Row("  booked in the ledger (must equal the line above)", money(func(m Money) int64 { return m.Booked }))
		t.Row("  for AMBIGUOUS payouts (moved, not booked)", money(func(m Money) int64 { return m.AcceptedAmbiguous }))
		t.Row("  paid twice or more (double payments)", money(func(m Money) int64 { return m.DoublePaid }))
		t.Row("  for other payouts", money(func(m Money) int64 { return m.AcceptedOther }))
	}

	// What the stale admissions cost (risk.go): the payments presented on a
	// superseded lease, by currency in major units.
	curs := currencies(cols)
	t.Row("money at risk from stale admissions (presented on a superseded lease)",
		each(func(r Report) string { return r.MoneyAtRisk.Cell(curs) }))
	t.Row("  of which the rail accepted (money moved)", num(func(r Report) int { return r.MoneyAtRisk.Accepted }))
	t.Row("  of which not as the payout reads now (a superseded instruction)", num(func(r Report) int { return r.MoneyAtRisk.Superseded }))

	booksRows(&t, cols) // books_table.go
	t.Gap()
	for _, v := range orderedInvariants(cols) {
		t.Row(InvariantLabel(v), each(func(r Report) string { return r.HeldCell(v) }))
		for _, ch := range checksOf(cols, v) {
			t.Row("  "+ch.Title, each(func(r Report) string { return r.CheckCell(ch.ID) }))
		}
	}
	t.Gap()
	t.Row("verdict", each(func(r Report) string {
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
	if err := t.Write(bw); err != nil {
		return err
	}
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

// currencies are the currencies of any column's money, sorted.
func currencies(cols []Column) []string {
	var out []string
	for _, c := range cols {
		for _, m := range c.Report.Money {
			if !slices.Contains(out, m.Currency) {
				out = append(out, m.Currency)
			}
		}
	}
	slices.Sort(out)
	return out
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

// Table is a table of labelled rows with one column of values per run (a
// report, a system), as the demo's reports print them: the head, a rule as
// wide as the table, then the rows, a gap a blank line. text/tabwriter lines
// the columns up, over the whole table, gaps included.
type Table struct {
	Head []string   // one title per column of values
	rows [][]string // label then values; nil for a gap
}

// Row adds a line: its label, then one value per column (missing values are
// blank, values past the last column dropped).
func (t *Table) Row(label string, values []string) {
	row := make([]string, len(t.Head)+1)
	row[0] = label
	copy(row[1:], values)
	t.rows = append(t.rows, row)
}

// Gap adds a blank line.
func (t *Table) Gap() { t.rows = append(t.rows, nil) }

// Write writes the table to w.
func (t *Table) Write(w io.Writer) error {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, minColumn, 0, columnGap, ' ', 0)
	// Every cell ends in a tab, so that the last column is lined up too. The
	// writes go to a bytes.Buffer, on Flush: they cannot fail before it.
	cells := func(row []string) { _, _ = io.WriteString(tw, strings.Join(row, "\t")+"\t\n") }
	cells(append([]string{""}, t.Head...))
	blank := make([]string, len(t.Head)+1) // a gap keeps the columns' cells
	for _, r := range t.rows {
		if r == nil {
			r = blank
		}
		cells(r)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("table: %w", err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	width := 0
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
		width = max(width, utf8.RuneCountInString(lines[i]))
	}
	var out strings.Builder
	out.WriteString(lines[0] + "\n" + strings.Repeat("-", width) + "\n")
	for _, l := range lines[1:] {
		out.WriteString(l + "\n")
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// The table's look: a value column is at least minColumn wide, and columnGap
// spaces part two columns.
const (
	minColumn = 6
	columnGap = 3
)
