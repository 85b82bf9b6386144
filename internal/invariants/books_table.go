package invariants

import (
	"slices"
	"strconv"
)

// booksRows adds the reconciliation section to the table: what the reconciler's
// final pass settled and recorded, and the money line that must now hold — booked
// in the ledger = accepted by the rail for our payouts. Nothing when no column
// was reconciled.
func booksRows(t *Table, cols []Column) {
	if !slices.ContainsFunc(cols, func(c Column) bool { return c.Report.Reconciliation != nil }) {
		return
	}
	rec := func(f func(Reconciliation) int) []string {
		out := make([]string, len(cols))
		for i, c := range cols {
			out[i] = "-"
			if r := c.Report.Reconciliation; r != nil {
				out[i] = strconv.Itoa(f(*r))
			}
		}
		return out
	}
	t.Gap()
	t.Row("reconciliation (the rail's statement, final pass)", make([]string, len(cols)))
	t.Row("  statement lines copied", rec(func(r Reconciliation) int { return r.StatementLines }))
	t.Row("  AMBIGUOUS settled as PAID (booked)", rec(func(r Reconciliation) int { return r.SettledPaid }))
	t.Row("  AMBIGUOUS settled as DECLINED", rec(func(r Reconciliation) int { return r.SettledDeclined }))
	t.Row("  AMBIGUOUS settled as NOT_PRESENTED", rec(func(r Reconciliation) int { return r.SettledNotPresented }))
	t.Row("  AMBIGUOUS left", rec(func(r Reconciliation) int { return r.AmbiguousLeft }))
	t.Row("  exceptions (each needs a person)", rec(func(r Reconciliation) int { return r.ExceptionTotal() }))
	for _, k := range exceptionKinds {
		t.Row("    "+k, rec(func(r Reconciliation) int { return r.Exceptions[k] }))
	}
	for _, cur := range currencies(cols) {
		money := func(f func(Money) int64) []string {
			out := make([]string, len(cols))
			for i, c := range cols {
				out[i] = "-"
				if c.Report.Reconciliation == nil {
					continue
				}
				out[i] = "0"
				for _, m := range c.Report.Money {
					if m.Currency == cur {
						out[i] = strconv.FormatInt(f(m), 10)
					}
				}
			}
			return out
		}
		t.Row("  "+cur+" accepted by the rail for our payouts", money(func(m Money) int64 { return m.AcceptedForPayouts }))
		t.Row("  "+cur+" booked in the ledger (must equal the above)", money(func(m Money) int64 { return m.Booked }))
	}
}
