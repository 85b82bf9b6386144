package payment_test

import (
	"context"
	"fmt"
	"testing"

	"lock.dev/lockapi"
)

// BenchmarkPayoutLifecycle measures one payout's whole life at payment-resource
// over real HTTP and PostgreSQL: create, claim, PAID post with its ledger entry.
// go test -run XXX -bench PayoutLifecycle ./internal/payment
func BenchmarkPayoutLifecycle(b *testing.B) {
	e := start(b, booksUnchecked) // the bench posts PAID with no attempt at the rail: it measures the post, not the books
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("p-%d", i)
		if _, err := e.client.Create(ctx, lockapi.SubmissionRequest{PayoutID: id, AccountID: "acct-1", AmountMinor: 10, Currency: "EUR", Beneficiary: "B-1"}); err != nil {
			b.Fatal(err)
		}
		if _, err := e.client.Claim(ctx, id, 1, "exec-a"); err != nil {
			b.Fatal(err)
		}
		if _, err := e.client.Post(ctx, id, 1, "exec-a", lockapi.PostRequest{Outcome: lockapi.StatusPaid, RailReference: ptr("RS-1")}); err != nil {
			b.Fatal(err)
		}
	}
}
