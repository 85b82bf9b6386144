package railproxy

import (
	"io"
	"net/http"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// A decline without a reason is recorded, and answered, as "unspecified" — never
// a NULL reason that reads like a lost one.
func TestDeclineWithoutReasonIsUnspecified(t *testing.T) {
	t.Parallel()
	hold := newHoldingRail(t)
	hold.reply = func(w http.ResponseWriter, _ string) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"status":"DECLINED"}`)
	}
	hold.release()
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, hold.URL))
	a := submit(t, p.URL, 1, newPayout("p-why", "acct-why"))
	if a.code() != lockapi.CodeRailRejected || a.str("declineReason") != DeclineUnspecified {
		t.Fatalf("answer: %+v", a)
	}
	if rs := rowsOf(t, db, "p-why"); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeRejected ||
		rs[0].DeclineReason == nil || *rs[0].DeclineReason != DeclineUnspecified {
		t.Fatalf("rows: %+v", rs)
	}
}
