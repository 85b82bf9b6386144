package railproxy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
)

// The fence runs before the intent insert in both modes. With fencing off the
// gate in front of the intent insert always passes, and a gate PostgreSQL can
// fold to true would let the insert run (and draw its submission_id) before the
// upsert has locked the account's mark row; then the admissions of one account
// would not be serialised by that row and submission_id order would not be
// admission order. The test holds the mark row locked, starts an admission, and
// looks at the identity sequence while the admission waits on that lock: had the
// intent insert run first, it would already have drawn an id. With the books
// check on (docs/contracts/books.md) the statement is another, whose intent gate
// reads the books verdict: the same holds, its payouts booked.
func TestFenceRunsBeforeIntentInBothModes(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	ctx := context.Background()
	store, err := OpenStore(ctx, dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)

	var seq string
	if err := db.QueryRow(ctx, `SELECT pg_get_serial_sequence('rail_submission', 'submission_id')`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	lastID := func(t *testing.T) int64 {
		var v *int64
		if err := db.QueryRow(ctx, `SELECT pg_sequence_last_value($1::regclass)`, seq).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v == nil {
			return 0
		}
		return *v
	}

	for _, books := range []bool{false, true} {
		t.Run(fmt.Sprintf("books=%v", books), func(t *testing.T) { fenceBeforeIntent(t, db, store, lastID, books) })
	}
}

func fenceBeforeIntent(t *testing.T, db dbq, store *Store, lastID func(*testing.T) int64, books bool) {
	ctx := context.Background()
	sfx := map[bool]string{false: "", true: "-books"}[books]
	// Every payout presented below is booked as presented (a no-op for the
	// statement without the books check).
	bookAs := func(id, account string, token int64) {
		if books {
			book(t, db, booked(payout{PayoutID: id, AccountID: account, AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}, token, "w"))
		}
	}
	for i, fencing := range []bool{false, true} {
		account := []string{"acct-order-off", "acct-order-on"}[i] + sfx
		// The account has a mark of 10; the admission below presents 11, which
		// passes in both modes.
		bookAs(account+"-p0", account, 10)
		bookAs(account+"-p1", account, 11)
		if _, err := store.Admit(ctx, Submission{PayoutID: account + "-p0", AccountID: account, Token: 10,
			OwnerID: "w", IdempotencyKey: "k0", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}, fencing, books, time.Minute); err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT FROM rail_high_water WHERE account_id = $1 FOR UPDATE`, account); err != nil {
			t.Fatal(err)
		}
		before := lastID(t)
		done := make(chan error, 1)
		var adm Admission
		go func() {
			var err error
			adm, err = store.Admit(ctx, Submission{PayoutID: account + "-p1", AccountID: account, Token: 11,
				OwnerID: "w", IdempotencyKey: "k1", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}, fencing, books, time.Minute)
			done <- err
		}()
		// Wait until the admission statement is blocked on a lock.
		eventually(t, 10*time.Second, fmt.Sprintf("fencing=%v: the admission to wait on the mark row", fencing), func() bool {
			var n int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%rail_high_water%'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1
		})
		if after := lastID(t); after != before {
			t.Errorf("fencing=%v: the intent insert drew submission_id %d before the fence took the mark row's lock", fencing, after)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if adm.Verdict != Admitted || !adm.PassedFence || adm.SubmissionID != before+1 {
			t.Fatalf("fencing=%v: %+v (last id before %d)", fencing, adm, before)
		}
	}
	// Fencing on still refuses an equal token; fencing off admits it.
	for _, fencing := range []bool{true, false} {
		id := "acct-order-on-p-eq-" + map[bool]string{true: "on", false: "off"}[fencing] + sfx
		bookAs(id, "acct-order-on"+sfx, 11)
		adm, err := store.Admit(ctx, Submission{PayoutID: id,
			AccountID: "acct-order-on" + sfx, Token: 11, OwnerID: "w", IdempotencyKey: "k", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}, fencing, books, time.Minute)
		var ce *CommitError
		if errors.As(err, &ce) || err != nil {
			t.Fatal(err)
		}
		want := map[bool]Verdict{true: Fenced, false: Admitted}[fencing]
		if adm.Verdict != want || adm.PassedFence {
			t.Fatalf("fencing=%v, equal token: %+v", fencing, adm)
		}
	}
}
