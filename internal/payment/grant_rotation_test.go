package payment_test

import (
	"crypto/ed25519"
	"testing"

	"lock.dev/internal/grant"
	"lock.dev/internal/grant/granttest"
	"lock.dev/internal/payment"
	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// A key rotation at payment-resource (docs/contracts/signed-grants.md), as rail-proxy's
// TestGrantKeyRotation: PAYMENT_GRANT_KEYS_FILE is read at start-up, so a
// rotation is a restart with the new set. Given the old and the new key it takes
// grants signed by either, at claim and at post; restarted with the new key only,
// a grant signed by the old one is 401 GRANT_REJECTED reason unknown_key — even
// for the payout that grant's lease holds — and nothing is written, while grants
// by the new key go on landing.
func TestGrantKeyRotation(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.PaydbURL(t)
	oldKey, oldFile := granttest.Keys(t)
	newKey, newFile := granttest.Keys(t)
	bothFile := granttest.JoinedKeySetFile(t, newFile, oldFile)
	// About key rotation; its payouts never went to the rail: books unchecked.
	keys := func(file string) func(*payment.Config) {
		return func(c *payment.Config) { c.GrantKeysFile = file; c.BooksCheck = false }
	}
	paid := `{"outcome":"PAID","railReference":"RS-1"}`

	// Each phase is one payment-resource on the same paydb, stopped when its
	// subtest ends: the second is the first restarted with the old key dropped.
	t.Run("old and new keys", func(t *testing.T) {
		e := startOn(t, dbURL, keys(bothFile))
		e.create(t, "p-old", "acct-1", 100)
		e.create(t, "p-new", "acct-1", 200)
		e.create(t, "p-held", "acct-1", 300)
		for _, c := range []struct {
			id, call, body, by string
			key                ed25519.PrivateKey
			token              int64
		}{
			{"p-old", "claim", "", "old", oldKey, 1},
			{"p-old", "post", paid, "old", oldKey, 1},
			{"p-new", "claim", "", "new", newKey, 2},
			{"p-new", "post", paid, "new", newKey, 2},
			{"p-held", "claim", "", "old", oldKey, 3},
		} {
			st, body, _ := e.fenced(t, c.id, c.call, c.token, "w", []string{granttest.Sign(t, c.key, "acct-1", c.token, "w")}, c.body)
			if st != 200 {
				t.Fatalf("%s %s with a grant by the %s key, old and new keys set: %d %v, want 200", c.call, c.id, c.by, st, body)
			}
		}
		if got := e.metric(t, `grant_rejected_total{reason="unknown_key"}`); got != 0 {
			t.Fatalf(`grant_rejected_total{reason="unknown_key"} = %v, want 0`, got)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("new key only", func(t *testing.T) {
		e := startOn(t, dbURL, keys(newFile))
		e.create(t, "p-after", "acct-1", 400)
		before := e.snapshot(t)
		refused := []struct{ id, call, body string }{
			{"p-after", "claim", ""}, // a new claim by a lease the old key granted
			{"p-held", "post", paid}, // the post of a claim made while the old key was set
			{"p-held", "claim", ""},  // its claim, repeated
		}
		for _, c := range refused {
			st, body, hdr := e.fenced(t, c.id, c.call, 3, "w", []string{granttest.Sign(t, oldKey, "acct-1", 3, "w")}, c.body)
			if st != 401 || body["code"] != lockapi.CodeGrantRejected || body["reason"] != grant.ReasonUnknownKey ||
				hdr.Get("WWW-Authenticate") != `LockGrant realm="lock.dev"` {
				t.Errorf("%s %s with the dropped key's grant: %d %v, want 401 GRANT_REJECTED reason unknown_key", c.call, c.id, st, body)
			}
		}
		if after := e.snapshot(t); after != before {
			t.Errorf("refused calls changed paydb:\nbefore %s\nafter  %s", before, after)
		}
		if got := e.metric(t, `grant_rejected_total{reason="unknown_key"}`); got != float64(len(refused)) {
			t.Errorf(`grant_rejected_total{reason="unknown_key"} = %v, want %d`, got, len(refused))
		}
		if got := e.metric(t, `payout_transition_total{to="claimed"}`); got != 0 {
			t.Errorf(`payout_transition_total{to="claimed"} = %v after refusals only`, got)
		}
		// The new key's grants land: the held payout's next lease posts it.
		for _, c := range []struct{ id, call, body string }{{"p-after", "claim", ""}, {"p-held", "claim", ""}, {"p-held", "post", paid}} {
			st, body, _ := e.fenced(t, c.id, c.call, 4, "w", []string{granttest.Sign(t, newKey, "acct-1", 4, "w")}, c.body)
			if st != 200 {
				t.Errorf("%s %s with the new key's grant: %d %v, want 200", c.call, c.id, st, body)
			}
		}
	})
}
