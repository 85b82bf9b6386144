package railproxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// An accept whose reference, or a decline whose reason, is not text paydb can
// store and show as it is, is no well-formed accept or decline: ambiguous
// (bad_response), never an answer the audit row would then contradict
// (docs/contracts/rail-proxy.md, "Storable text"). Exactly at the bounds the
// answer stands.
func TestRailWordsMustBeStorableText(t *testing.T) {
	t.Parallel()
	accept := func(refJSON string) (int, string) {
		return http.StatusOK, `{"status":"ACCEPTED","railReference":` + refJSON + `}`
	}
	decline := func(reasonJSON string) (int, string) {
		return http.StatusUnprocessableEntity, `{"status":"DECLINED","reason":` + reasonJSON + `}`
	}
	ref35 := `"` + strings.Repeat("R", 34) + `é"`
	reason140 := `"` + strings.Repeat("ü", 140) + `"`
	for _, tc := range []struct {
		name   string
		reply  func(string) (int, string)
		value  string
		result RailResult
	}{
		{"accept, plain", accept, `"RS-1"`, RailAccepted},
		{"accept, exactly 35 characters", accept, ref35, RailAccepted},
		{"accept, 36 characters", accept, ref35[:len(ref35)-1] + `x"`, RailAmbiguous},
		{"accept, NUL", accept, `"RS-\u00001"`, RailAmbiguous},
		{"accept, SOH", accept, `"RS-\u0001"`, RailAmbiguous},
		{"accept, tab", accept, `"RS\t1"`, RailAmbiguous},
		{"accept, DEL", accept, "\"RS-\x7f\"", RailAmbiguous},
		{"accept, C1 U+0085", accept, `"RS-\u0085"`, RailAmbiguous},
		{"accept, invalid UTF-8", accept, "\"RS-\xff\"", RailAmbiguous},
		{"accept, lone surrogate", accept, `"RS-\ud800"`, RailAmbiguous},
		{"accept, U+FFFD", accept, `"RS-\ufffd"`, RailAmbiguous},
		{"decline, plain", decline, `"insufficient funds"`, RailDeclined},
		{"decline, exactly 140 characters", decline, reason140, RailDeclined},
		{"decline, 141 characters", decline, reason140[:len(reason140)-1] + `x"`, RailAmbiguous},
		{"decline, NUL", decline, `"limit\u0000"`, RailAmbiguous},
		{"decline, newline", decline, `"limit\nexceeded"`, RailAmbiguous},
		{"decline, C1 U+0085", decline, `"limit\u0085"`, RailAmbiguous},
		{"decline, invalid UTF-8", decline, "\"limit\xc3\"", RailAmbiguous},
	} {
		status, body := tc.reply(tc.value)
		rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		c := newRailClient(hopConfig(rail.URL))
		rc := c.Pay(context.Background(), railPayment{Reference: "p-1", AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"}.payment())
		c.close()
		rail.Close()
		if rc.Result != tc.result {
			t.Errorf("%s: %d %s → result %d (%+v), want %d", tc.name, status, body, rc.Result, rc, tc.result)
			continue
		}
		if tc.result == RailAmbiguous && rc.Cause != CauseBadResponse {
			t.Errorf("%s: cause %q, want %q", tc.name, rc.Cause, CauseBadResponse)
		}
	}
}

// Through the running proxy and paydb: a rail that accepts with a NUL in its
// reference gets the caller 409 RAIL_AMBIGUOUS, the row resolved TIMEOUT by the
// submission itself (not left for the janitor), counted ambiguous once.
func TestAcceptWithUnstorableReferenceIsAmbiguous(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rail/v1/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST /rail/v1/payments", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ACCEPTED","railReference":"RS-\u0000-1"}`)
	})
	rail := httptest.NewServer(mux)
	t.Cleanup(rail.Close)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, rail.URL))

	a := submit(t, p.URL, 1, newPayout("p-nul", "acct-nul"))
	if a.Status != http.StatusConflict || a.code() != lockapi.CodeRailAmbiguous {
		t.Fatalf("answer %d %+v, want 409 %s", a.Status, a.Body, lockapi.CodeRailAmbiguous)
	}
	// The row is resolved when the answer leaves: no janitor sweep came between.
	rs := rowsOf(t, db, "p-nul")
	if len(rs) != 1 || outcomeOf(rs[0]) != "TIMEOUT" || rs[0].RailReference != nil {
		t.Fatalf("rows when the answer arrived: %+v, want one TIMEOUT without a reference", rs)
	}
	if int64(a.int("submissionId")) != rs[0].ID {
		t.Fatalf("answer names submission %d, the row is %d", a.int("submissionId"), rs[0].ID)
	}
	amb := p.Logs.events("rail_ambiguous")
	if len(amb) != 1 || amb[0]["cause"] != CauseBadResponse {
		t.Fatalf("rail_ambiguous events: %v, want one with cause %s", amb, CauseBadResponse)
	}
	if v := metric(t, p, `rail_submission_total{outcome="ambiguous"}`); v != 1 {
		t.Errorf(`rail_submission_total{outcome="ambiguous"} = %v, want 1`, v)
	}
	if v := metric(t, p, `rail_submission_total{outcome="acked"}`); v != 0 {
		t.Errorf(`rail_submission_total{outcome="acked"} = %v, want 0`, v)
	}
}
