package reconcile

import (
	"context"
	"testing"

	"lock.dev/internal/pgtest"
)

// An intent is overdue when it is still unresolved 30 s past its interrupt_at
// (submitted_at + 60 s for a row older than interrupt_at), by paydb's clock:
// no janitor is sweeping paydb. Resolved rows, intents not yet due and intents
// within the grace are not counted.
func TestCountOverdueIntents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := openStore(ctx, pgtest.PaydbURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	if _, err := st.pool.Exec(ctx, `INSERT INTO rail_submission
	        (payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, currency, beneficiary,
	         submitted_at, interrupt_at, outcome, resolved_at)
	 VALUES ('p-overdue', 'a', 1, 'w', 'k', 1, 'EUR', 'b', now() - interval '2 minutes', now() - interval '1 minute', NULL, NULL),
	        ('p-old-row', 'a', 2, 'w', 'k', 1, 'EUR', 'b', now() - interval '3 minutes', NULL, NULL, NULL),
	        ('p-in-grace', 'a', 3, 'w', 'k', 1, 'EUR', 'b', now() - interval '1 minute', now() - interval '10 seconds', NULL, NULL),
	        ('p-not-due', 'a', 4, 'w', 'k', 1, 'EUR', 'b', now(), now() + interval '1 minute', NULL, NULL),
	        ('p-old-in-grace', 'a', 5, 'w', 'k', 1, 'EUR', 'b', now() - interval '70 seconds', NULL, NULL, NULL),
	        ('p-resolved', 'a', 6, 'w', 'k', 1, 'EUR', 'b', now() - interval '2 minutes', now() - interval '1 minute', 'TIMEOUT', now())`); err != nil {
		t.Fatal(err)
	}
	ss, ok, err := st.lockPass(ctx)
	if err != nil || !ok {
		t.Fatalf("lockPass: %v %v", ok, err)
	}
	defer ss.release()
	n, err := ss.countOverdue(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("overdue intents = %d, want 2 (p-overdue and p-old-row)", n)
	}
}
