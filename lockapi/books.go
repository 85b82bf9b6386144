package lockapi

// Why the books refused a submission: the mismatch member of a NOT_IN_BOOKS
// answer (docs/contracts/books.md).
const (
	MismatchNotFound    = "not_found"   // no payout with this payoutId
	MismatchNotClaimed  = "not_claimed" // the payout is not CLAIMED
	MismatchToken       = "token"       // claimed under another fence token
	MismatchOwner       = "owner"       // claimed by another owner
	MismatchAccount     = "account"     // the body's accountId is not the payout's
	MismatchAmount      = "amount"      // nor its amountMinor
	MismatchCurrency    = "currency"    // nor its currency
	MismatchBeneficiary = "beneficiary" // nor its beneficiary
)

// BooksMismatchOrder is the order in which the books are checked: a refusal
// names the first check that fails. rail-proxy's one-by-one statement and
// paydb's group admission function both follow it, and their tests check them
// against it, so the two can never name different mismatches for one
// submission. The slice is new on every call.
func BooksMismatchOrder() []string {
	return []string{
		MismatchNotFound, MismatchNotClaimed, MismatchToken, MismatchOwner,
		MismatchAccount, MismatchAmount, MismatchCurrency, MismatchBeneficiary,
	}
}

// LeaseMismatch reports whether a mismatch means that another claim owns the
// payout (not claimed, another token, another owner): the holder of the lease
// it presented with is superseded, as with FENCED_OUT. Any other mismatch is the
// payout's own fields refused.
func LeaseMismatch(m string) bool {
	return m == MismatchNotClaimed || m == MismatchToken || m == MismatchOwner
}
