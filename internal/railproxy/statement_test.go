package railproxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
)

// getStatement reads GET /v1/rail/statement?query into a Statement (200) or a
// problem (anything else).
func getStatement(t testing.TB, p *proxy, query string) (int, lockapi.Statement, map[string]any) {
	t.Helper()
	resp, err := testHTTP.Get(p.URL + "/v1/rail/statement" + query)
	if err != nil {
		t.Fatalf("GET statement%s: %v", query, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var prob map[string]any
		if err := json.Unmarshal(b, &prob); err != nil || resp.Header.Get("Content-Type") != lockapi.ContentTypeProblem {
			t.Fatalf("statement%s: %d %q is not problem+json", query, resp.StatusCode, b)
		}
		return resp.StatusCode, lockapi.Statement{}, prob
	}
	var raw struct {
		Lines []map[string]any `json:"lines"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, l := range raw.Lines {
		keys := make([]string, 0, len(l))
		for k := range l {
			keys = append(keys, k)
		}
		for _, k := range []string{"latencyMs", "dropped", "reason"} {
			if _, ok := l[k]; ok {
				t.Fatalf("statement line carries %q, not a statement field: %s", k, b)
			}
		}
		if _, ok := l["beneficiary"].(string); !ok || len(l) != 10 {
			t.Fatalf("statement line has members %v, want the ten of docs/contracts/reconciliation.md, beneficiary a string", keys)
		}
	}
	var st lockapi.Statement
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"next":`) {
		t.Fatalf("statement lacks next: %s", b)
	}
	return resp.StatusCode, st, nil
}

// The statement is the rail's call log mapped field for field (reason becomes
// declineReason; the beneficiary is carried exactly as the rail was presented it;
// latencyMs and dropped are left out), in the rail's order; a full page names the
// seq to read after, a short one says null; each read of the rail is counted. The
// calls are made on the rail directly: the statement is what the rail was
// presented, whoever presented it.
func TestStatementIsTheRailsCallLog(t *testing.T) {
	t.Parallel()
	st := startStub(t, 0)
	p := startProxy(t, testConfig(pgtest.PaydbURL(t), st.URL))
	pay := func(ref, beneficiary string) {
		t.Helper()
		_, _ = st.Client.Pay(t.Context(), railstub.PaymentRequest{Reference: ref, AccountID: "acct-1", AmountMinor: 100,
			Currency: "EUR", Beneficiary: beneficiary}) // the call is booked whatever the reply (a dropped one has none)
	}
	pay("p-1", "NL91ABNA0417164300")
	st.chaos(t, 0, 1, 0)
	pay("p-2", "nl91 abna 0417 1643 00") // as written, spaces and case kept
	st.chaos(t, 0, 0, 1)
	pay("p-3", "DE89 3704 0044 0532 0130 00")
	calls := st.calls(t)
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3", len(calls))
	}

	status, all, _ := getStatement(t, p, "")
	if status != http.StatusOK || all.Next != nil || len(all.Lines) != 3 {
		t.Fatalf("whole statement: %d %+v", status, all)
	}
	for i, c := range calls {
		l := all.Lines[i]
		want := lockapi.StatementLine{Seq: c.Seq, ReceivedAt: c.ReceivedAt.UTC(), Reference: c.Reference, AccountID: c.AccountID,
			AmountMinor: c.AmountMinor, Currency: c.Currency, Beneficiary: c.Beneficiary, Result: c.Result}
		if c.RailReference != "" {
			want.RailReference = &c.RailReference
		}
		if c.Reason != "" {
			want.DeclineReason = &c.Reason
		}
		if !reflect.DeepEqual(l, want) {
			t.Fatalf("line %d = %+v, want %+v", i, l, want)
		}
	}
	if all.Lines[1].DeclineReason == nil || all.Lines[1].RailReference != nil || all.Lines[0].DeclineReason != nil {
		t.Fatalf("decline reason and rail reference not where they belong: %+v", all.Lines)
	}
	for i, b := range []string{"NL91ABNA0417164300", "nl91 abna 0417 1643 00", "DE89 3704 0044 0532 0130 00"} {
		if all.Lines[i].Beneficiary != b {
			t.Fatalf("line %d carries beneficiary %q, the rail was presented %q", i, all.Lines[i].Beneficiary, b)
		}
	}

	status, first, _ := getStatement(t, p, "?limit=2")
	if status != http.StatusOK || len(first.Lines) != 2 || first.Next == nil || *first.Next != calls[1].Seq {
		t.Fatalf("first page of 2: %d %+v", status, first)
	}
	status, rest, _ := getStatement(t, p, "?after=2&limit=2")
	if status != http.StatusOK || len(rest.Lines) != 1 || rest.Lines[0].Seq != 3 || rest.Next != nil {
		t.Fatalf("second page: %d %+v", status, rest)
	}
	status, none, _ := getStatement(t, p, "?after=3")
	if status != http.StatusOK || len(none.Lines) != 0 || none.Lines == nil || none.Next != nil {
		t.Fatalf("past the end: %d %+v", status, none)
	}
	if v := metric(t, p, `rail_statement_read_total{result="ok"}`); v != 4 {
		t.Fatalf(`rail_statement_read_total{result="ok"} = %v, want 4`, v)
	}
	if n := len(st.calls(t)); n != 3 {
		t.Fatalf("reading the statement changed the rail's log: %d calls", n)
	}
}

// Bad input: every malformed query is 400 INVALID_REQUEST naming
// the parameter, and the rail is not read (the counter stays at zero).
func TestStatementBadQueryReadsNothing(t *testing.T) {
	t.Parallel()
	st := startStub(t, 0)
	p := startProxy(t, testConfig(pgtest.PaydbURL(t), st.URL))
	for _, c := range []struct{ query, field string }{
		{"?limit=0", "limit"},
		{"?limit=1001", "limit"},
		{"?limit=-1", "limit"},
		{"?limit=+5", "limit"},
		{"?limit=05", "limit"},
		{"?limit=1.5", "limit"},
		{"?limit=", "limit"},
		{"?limit=1&limit=2", "limit"},
		{"?after=abc", "after"},
		{"?after=-1", "after"},
		{"?after=01", "after"},
		{"?after=1e3", "after"},
		{"?after=%201", "after"},
		{"?after=9223372036854775808", "after"},
		{"?after=1&after=1", "after"},
		{"?from=1", "from"},
		{"?after=1;limit=2", "query"},
	} {
		status, _, prob := getStatement(t, p, c.query)
		if status != http.StatusBadRequest || prob["code"] != lockapi.CodeInvalidRequest {
			t.Errorf("%s: %d %v, want 400 INVALID_REQUEST", c.query, status, prob)
			continue
		}
		errs, _ := prob["errors"].([]any)
		named := false
		for _, e := range errs {
			if m, _ := e.(map[string]any); m["field"] == c.field {
				named = true
			}
		}
		if !named {
			t.Errorf("%s: errors %v do not name %s", c.query, errs, c.field)
		}
	}
	for _, r := range []string{"ok", "error"} {
		if v := metric(t, p, `rail_statement_read_total{result="`+r+`"}`); v != 0 {
			t.Errorf(`rail_statement_read_total{result=%q} = %v after bad queries only, want 0`, r, v)
		}
	}
}

// A rail that refuses the connection, one that accepts it and never answers, one
// that answers with something that is not a well-formed page, and one whose page
// has a call without its beneficiary: 503
// RAIL_UNAVAILABLE, stage statement, within the read bound, counted as errors.
func TestStatementRailUnavailable(t *testing.T) {
	t.Parallel()
	paydb := pgtest.PaydbURL(t)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String()
	_ = closed.Close()

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 16)
	t.Cleanup(func() {
		_ = silent.Close()
		for {
			select {
			case c := <-held:
				_ = c.Close()
			default:
				return
			}
		}
	})
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held <- c // accepted, never read
		}
	}()

	garbled := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"calls":[{"seq":2,"result":"ACCEPTED","reference":"p","accountId":"a","currency":"EUR"},{"seq":2,"result":"ACCEPTED","reference":"p","accountId":"a","currency":"EUR"}]}`))
	}))
	t.Cleanup(garbled.Close)

	// A page well formed but for a call without its beneficiary: the statement
	// would not say whom the rail paid.
	noBeneficiary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"calls":[{"seq":1,"receivedAt":"2026-01-02T03:04:05Z","result":"ACCEPTED","reference":"p","accountId":"a","amountMinor":1,"currency":"EUR","beneficiary":"NL91ABNA0417164300","railReference":"RS-1","reason":null},` +
			`{"seq":2,"receivedAt":"2026-01-02T03:04:05Z","result":"ACCEPTED","reference":"q","accountId":"a","amountMinor":1,"currency":"EUR","railReference":"RS-2","reason":null}]}`))
	}))
	t.Cleanup(noBeneficiary.Close)

	for name, rail := range map[string]string{"refused": closedURL, "silent": "http://" + silent.Addr().String(), "garbled": garbled.URL,
		"no beneficiary": noBeneficiary.URL} {
		cfg := testConfig(paydb, rail)
		cfg.RailReadTimeout = 300 * time.Millisecond
		p := startProxy(t, cfg)
		start := time.Now()
		status, _, prob := getStatement(t, p, "")
		if status != http.StatusServiceUnavailable || prob["code"] != lockapi.CodeRailUnavailable || prob["stage"] != StageStatement {
			t.Errorf("%s rail: %d %v, want 503 RAIL_UNAVAILABLE stage statement", name, status, prob)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s rail: answered after %s, not bounded by the read timeout", name, d)
		}
		if v := metric(t, p, `rail_statement_read_total{result="error"}`); v != 1 {
			t.Errorf("%s rail: rail_statement_read_total{error} = %v, want 1", name, v)
		}
		if n := len(p.Logs.events("statement_read_failed")); n != 1 {
			t.Errorf("%s rail: %d statement_read_failed log lines, want 1", name, n)
		}
	}
}
