package reconcile_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/stack"
	"lock.dev/lockapi"
)

// A statement line whose text paydb cannot store and show as it is — here a NUL
// in an ACCEPTED line's rail reference, a C1 control in a DECLINED line's
// reason, a tab in an ACCEPTED line's beneficiary — is recorded as an
// UNSTORABLE_LINE exception and not copied; the
// import goes on past it (the lines after it are copied, the cursor passes it,
// the pass completes), and the payout it names stays AMBIGUOUS: never booked
// from words nobody can read, never NOT_PRESENTED for want of a line
// (docs/contracts/reconciliation.md). The statement is read through a real
// rail-proxy, which relays the page whole.
func TestUnstorableLineIsAnException(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stack.Options{})
	e.cfg.SettleAfter = time.Second
	// Two AMBIGUOUS payouts whose calls never reached the real rail.
	blackhole := e.blackholeProxy(t)
	for _, p := range []lockapi.SubmissionRequest{payoutReq("p-nul", "acct-1", 100), payoutReq("p-later", "acct-2", 200),
		payoutReq("p-tab", "acct-3", 300)} {
		if got := e.drive(t, blackhole, p); got != lockapi.StatusAmbiguous {
			t.Fatalf("%s posted %s", p.PayoutID, got)
		}
	}
	at := time.Now().UTC()
	const b = "NL91ABNA0417164300"
	calls := []map[string]any{
		{"seq": 1, "receivedAt": at, "reference": "p-nul", "accountId": "acct-1", "amountMinor": 100, "currency": "EUR",
			"beneficiary": b, "result": "ACCEPTED", "railReference": "RS-\x00-1", "reason": nil},
		{"seq": 2, "receivedAt": at, "reference": "p-later", "accountId": "acct-2", "amountMinor": 200, "currency": "EUR",
			"beneficiary": b, "result": "ACCEPTED", "railReference": "RS-2", "reason": nil},
		{"seq": 3, "receivedAt": at, "reference": "nobody-3", "accountId": "acct-9", "amountMinor": 300, "currency": "EUR",
			"beneficiary": b, "result": "DECLINED", "railReference": nil, "reason": "closed\u0085"},
		{"seq": 4, "receivedAt": at, "reference": "p-tab", "accountId": "acct-3", "amountMinor": 300, "currency": "EUR",
			"beneficiary": "NL91ABNA\t0417164300", "result": "ACCEPTED", "railReference": "RS-4", "reason": nil},
	}
	proxy := e.statementProxy(t, calls)
	e.cfg.RailProxyURL = proxy

	// rail-proxy relays the page whole, the unstorable text as the rail gave it.
	resp, err := e.st.HTTPClient(identity.NameReconciler, identity.NameRailProxy).Get(proxy + "/v1/rail/statement")
	if err != nil {
		t.Fatal(err)
	}
	var page lockapi.Statement
	err = json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(page.Lines) != 4 || page.Lines[0].RailReference == nil ||
		*page.Lines[0].RailReference != "RS-\x00-1" || page.Lines[3].Beneficiary != "NL91ABNA\t0417164300" {
		t.Fatalf("statement through rail-proxy: %d %+v %v", resp.StatusCode, page, err)
	}

	rep := e.pass(t)
	if rep.Imported != 1 || rep.LastSeq != 4 {
		t.Fatalf("first pass imported %d lines up to seq %d, want 1 line (seq 2) and the cursor at 4", rep.Imported, rep.LastSeq)
	}
	if rep.Settled["p-later"] != lockapi.StatusPaid {
		t.Fatalf("first pass settled %v, want p-later PAID from the line after the unstorable one", rep.Settled)
	}
	e.waitWindow(t)
	for range 2 {
		if rep := e.pass(t); len(rep.Settled) != 0 || rep.Imported != 0 {
			t.Fatalf("a later pass settled %v and imported %d", rep.Settled, rep.Imported)
		}
	}
	want := []string{"UNSTORABLE_LINE - 3", "UNSTORABLE_LINE p-nul 1", "UNSTORABLE_LINE p-tab 4"}
	got := e.exceptions(t)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("exceptions = %v, want %v", got, want)
	}
	if n := len(e.logs.Events("reconciliation_exception")); n != 3 {
		t.Errorf("%d reconciliation_exception log lines, want 3", n)
	}
	for _, id := range []string{"p-nul", "p-tab"} {
		if s := e.status(t, id); s != lockapi.StatusAmbiguous {
			t.Errorf("%s is %s, want AMBIGUOUS: its only line could not be read", id, s)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM rail_statement_line`); n != 1 {
		t.Errorf("%d statement lines copied, want 1", n)
	}
	var detail string
	if err := e.st.Paydb.QueryRow(t.Context(), `SELECT detail FROM reconciliation_exception WHERE seq = 1`).Scan(&detail); err != nil {
		t.Fatal(err)
	}
	if want := `rail reference "RS-\x00-1"`; !strings.Contains(detail, want) {
		t.Errorf("detail %q does not show the reference escaped (%s)", detail, want)
	}
	if err := e.st.Paydb.QueryRow(t.Context(), `SELECT detail FROM reconciliation_exception WHERE seq = 4`).Scan(&detail); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail, "its beneficiary must not contain control characters") || !strings.Contains(detail, `"****4300"`) ||
		strings.Contains(detail, "NL91") {
		t.Errorf("detail %q does not name the beneficiary's problem with the beneficiary masked", detail)
	}
}

// statementProxy runs a rail-proxy on paydb whose rail serves calls as its call
// log (GET /rail/v1/calls), paged by after and limit.
func (e *env) statementProxy(t *testing.T, calls []map[string]any) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rail/v1/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /rail/v1/calls", func(w http.ResponseWriter, r *http.Request) {
		after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		page := []map[string]any{}
		for _, c := range calls {
			if seq := int64(c["seq"].(int)); seq > after && len(page) < limit {
				page = append(page, c)
			}
		}
		lockapi.WriteJSON(w, http.StatusOK, map[string]any{"calls": page})
	})
	rail := e.serveRail(t, mux)
	return e.runProxy(t, "statement rail-proxy", map[string]string{"RAIL_BASE_URL": rail}, nil)
}
