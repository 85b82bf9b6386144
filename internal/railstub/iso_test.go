package railstub

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/isomsg"
	"lock.dev/internal/testkit"
	"lock.dev/lockapi"
	"lock.dev/rail"
	"lock.dev/rail/iso20022"
)

// outsideDocument serves the JSON payment route, which a stub in ISO 20022 mode
// answers 404 (the document describes the stub in its default mode there), with
// raw; every other exchange goes through checked, the ISO 20022 routes
// included. Their XML documents are checked against ISO's official schemas
// (testkit.ValidateISO20022).
func outsideDocument(raw, checked http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/rail/v1/payments" {
			raw.ServeHTTP(w, r)
			return
		}
		checked.ServeHTTP(w, r)
	})
}

func startISOStub(t *testing.T, mutate func(*Config)) *testStub {
	t.Helper()
	return startStub(t, func(c *Config) {
		c.Protocol = ProtocolISO20022
		if mutate != nil {
			mutate(c)
		}
	})
}

func initiation(ref string) isomsg.Initiation {
	return isomsg.Initiation{MsgID: "MSG-" + ref, PmtInfID: "PMT-" + ref, EndToEndID: ref, DebtorAccount: "acct-7",
		CreditorAccount: "NL91ABNA0417164300", AmountMinor: 125000, Currency: "EUR", CreatedAt: time.Now().UTC()}
}

func pain001(t *testing.T, in isomsg.Initiation) []byte {
	t.Helper()
	doc, err := isomsg.WriteInitiation(in)
	if err != nil {
		t.Fatalf("WriteInitiation: %v", err)
	}
	return doc
}

func postPain001(t *testing.T, ts *testStub, doc []byte) (reply, error) {
	t.Helper()
	return send(t.Context(), &http.Client{Timeout: 10 * time.Second}, ts.URL, http.MethodPost, "/iso20022/pain.001", "application/xml", doc)
}

// statusReport reads a 200 pain.002 answer, valid against the official schema.
func statusReport(t *testing.T, r reply) isomsg.StatusReport {
	t.Helper()
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/xml" {
		t.Fatalf("answer %d %s %s, want 200 application/xml", r.status, r.header.Get("Content-Type"), r.body)
	}
	testkit.ValidateISO20022(t, r.body)
	rep, err := isomsg.ReadStatusReport(r.body)
	if err != nil {
		t.Fatalf("ReadStatusReport: %v", err)
	}
	return rep
}

// camt053 reads GET /iso20022/camt.053{query}: 200, valid against the official
// schema, every statement balanced.
func camt053(t *testing.T, ts *testStub, query string) []isomsg.Statement {
	t.Helper()
	r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/iso20022/camt.053"+query, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/xml" {
		t.Fatalf("camt.053%s: %d %s %s", query, r.status, r.header.Get("Content-Type"), r.body)
	}
	return readStatements(t, r.body)
}

func readStatements(t *testing.T, doc []byte) []isomsg.Statement {
	t.Helper()
	testkit.ValidateISO20022(t, doc)
	stmts, err := isomsg.ReadStatements(doc)
	if err != nil {
		t.Fatalf("ReadStatements: %v", err)
	}
	for _, st := range stmts {
		if err := st.Balanced(); err != nil {
			t.Fatalf("statement %s of %s: %v", st.ID, st.Account, err)
		}
	}
	return stmts
}

// An accepted pain.001 is answered ACSC with the rail reference, booked once in
// the call log (and its file) with the pain.001's fields; the JSON payment route
// is not served in ISO 20022 mode.
func TestISOPain001AcceptedIsBookedOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	ts := startISOStub(t, func(c *Config) { c.CallLogPath = path })
	in := initiation("p-1001")
	in.CreditorAccount = "beneficiary-9"
	r, err := postPain001(t, ts, pain001(t, in))
	if err != nil {
		t.Fatal(err)
	}
	rep := statusReport(t, r)
	cs := calls(t, ts)
	if len(cs) != 1 {
		t.Fatalf("booked %d calls, want 1", len(cs))
	}
	c := cs[0]
	if rep.Status != StatusAccepted || rep.AcctSvcrRef != c.RailReference || !strings.HasPrefix(c.RailReference, "RS-") ||
		rep.EndToEndID != "p-1001" || rep.OrgnlMsgID != in.MsgID || rep.ReasonCode != "" {
		t.Fatalf("pain.002 = %+v, want ACSC with AcctSvcrRef %s for p-1001", rep, c.RailReference)
	}
	if c.Reference != "p-1001" || c.AccountID != "acct-7" || c.Beneficiary != "beneficiary-9" || c.AmountMinor != 125000 ||
		c.Currency != "EUR" || c.Result != ResultAccepted || c.Reason != "" || c.Dropped {
		t.Fatalf("call = %+v", c)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n != 1 || !bytes.Contains(b, []byte(c.RailReference)) {
		t.Fatalf("call-log file holds %d lines, want the one call: %s", n, b)
	}
	if l := ts.logs.events(t, "rail_call"); len(l) != 1 || l[0]["reference"] != "p-1001" {
		t.Fatalf("rail_call logs = %v", l)
	}
	r, err = send(t.Context(), http.DefaultClient, ts.URL, http.MethodPost, "/rail/v1/payments", "application/json", mustJSON(t, payment("p-2")))
	if err != nil {
		t.Fatal(err)
	}
	problem(t, r, http.StatusNotFound, lockapi.CodeNotFound)
	if len(calls(t, ts)) != 1 {
		t.Fatal("the JSON payment route booked a call in ISO 20022 mode")
	}
	if r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/iso20022/health", "", nil); err != nil || r.status != http.StatusOK {
		t.Fatalf("GET /iso20022/health: %v %d", err, r.status)
	}
}

// A chaos decline is RJCT with reason MS03 and the stub's decline text; the call
// log records MS03, the reason the gate records from this answer. A declined
// call is not in the statement.
func TestISOChaosDeclineIsRJCTMS03(t *testing.T) {
	t.Parallel()
	ts := startISOStub(t, func(c *Config) { c.DeclineRate = 1 })
	r, err := postPain001(t, ts, pain001(t, initiation("p-7")))
	if err != nil {
		t.Fatal(err)
	}
	rep := statusReport(t, r)
	if rep.Status != StatusRejected || rep.ReasonCode != ISODeclineCode || rep.AdditionalInfo != DeclineReason ||
		rep.AcctSvcrRef != "" || rep.EndToEndID != "p-7" {
		t.Fatalf("pain.002 = %+v, want RJCT MS03 %q without AcctSvcrRef", rep, DeclineReason)
	}
	cs := calls(t, ts)
	if len(cs) != 1 || cs[0].Result != ResultDeclined || cs[0].Reason != ISODeclineCode || cs[0].RailReference != "" {
		t.Fatalf("calls = %+v, want one DECLINED with reason %s", cs, ISODeclineCode)
	}
	assertEmptyStatement(t, camt053(t, ts, ""))
}

func assertEmptyStatement(t *testing.T, stmts []isomsg.Statement) {
	t.Helper()
	if len(stmts) != 1 || stmts[0].Account != StatementAccount || stmts[0].OpeningMinor != 0 || stmts[0].ClosingMinor != 0 ||
		len(stmts[0].Entries) != 0 {
		t.Fatalf("statements = %+v, want the stub's own, balances 0, no entry", stmts)
	}
}

// Drop and latency behave as on the JSON route: a dropped pain.001 gets no
// answer and is booked ACCEPTED and dropped; a delayed one is answered after the
// latency, accept and decline alike.
func TestISODropAndLatency(t *testing.T) {
	t.Parallel()
	ts := startISOStub(t, func(c *Config) { c.DropRate = 1 })
	r, err := postPain001(t, ts, pain001(t, initiation("p-drop")))
	if !isDropped(err) {
		t.Fatalf("answer %d %s, err %v: want a dropped connection", r.status, r.body, err)
	}
	cs := calls(t, ts)
	if len(cs) != 1 || cs[0].Result != ResultAccepted || !cs[0].Dropped || cs[0].RailReference == "" {
		t.Fatalf("calls = %+v, want one ACCEPTED and dropped", cs)
	}
	// The dropped payment moved money: it is on the statement.
	if st := camt053(t, ts, ""); len(st) != 1 || len(st[0].Entries) != 1 || st[0].Entries[0].AcctSvcrRef != cs[0].RailReference {
		t.Fatalf("statement = %+v, want the dropped call's entry", st)
	}

	const latency = 50 * time.Millisecond
	for _, decline := range []float64{0, 1} {
		if _, err := ts.Client.SetChaos(t.Context(), int(latency/time.Millisecond), decline, 0, nil); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		r, err := postPain001(t, ts, pain001(t, initiation(fmt.Sprintf("p-late-%v", decline))))
		if err != nil {
			t.Fatal(err)
		}
		statusReport(t, r)
		if el := time.Since(start); el < latency {
			t.Fatalf("declineRate %v: answered after %v, want ≥ %v", decline, el, latency)
		}
	}
	for _, c := range calls(t, ts)[1:] {
		if c.LatencyMs != 50 {
			t.Fatalf("call %d latencyMs = %d, want 50", c.Seq, c.LatencyMs)
		}
	}
}

// A pain.001 that does not parse, holds other than one transaction, has an
// amount its currency's exponent cannot hold, or carries a field the JSON route
// refuses is 400 INVALID_REQUEST; another content type 415, over 64 KiB 413.
// None is booked.
func TestISOMalformedPain001IsRefusedAndNotBooked(t *testing.T) {
	t.Parallel()
	ts := startISOStub(t, nil)
	good := string(pain001(t, initiation("p-1")))
	txStart, txEnd := strings.Index(good, "<CdtTrfTxInf>"), strings.Index(good, "</CdtTrfTxInf>")+len("</CdtTrfTxInf>")
	if txStart < 0 || txEnd < txStart {
		t.Fatalf("no CdtTrfTxInf in %s", good)
	}
	tx := good[txStart:txEnd]
	jpy := initiation("p-1")
	jpy.Currency, jpy.AmountMinor = "JPY", 1395
	badRef := initiation("p 1")
	for _, tc := range []struct{ name, doc string }{
		{"not XML", "{}"},
		{"empty", ""},
		{"another message", strings.Replace(good, "pain.001.001.09", "pain.001.001.03", 1)},
		{"two transactions", strings.Replace(good, tx, tx+tx, 1)},
		{"no transaction", strings.Replace(good, tx, "", 1)},
		{"EUR with three decimals", strings.Replace(good, ">1250.00<", ">1250.001<", 2)},
		{"JPY with decimals", strings.Replace(string(pain001(t, jpy)), ">1395<", ">1395.5<", 2)},
		{"a negative amount", strings.Replace(good, ">1250.00<", ">-1250.00<", 2)},
		{"a reference the JSON route refuses", string(pain001(t, badRef))},
	} {
		r, err := postPain001(t, ts, []byte(tc.doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.status != http.StatusBadRequest {
			t.Fatalf("%s: %d %s, want 400", tc.name, r.status, r.body)
		}
		problem(t, r, http.StatusBadRequest, lockapi.CodeInvalidRequest)
	}
	r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodPost, "/iso20022/pain.001", "application/json", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	problem(t, r, http.StatusUnsupportedMediaType, lockapi.CodeInvalidRequest)
	r, err = postPain001(t, ts, append([]byte(good), bytes.Repeat([]byte(" "), 70<<10)...))
	if err != nil {
		t.Fatal(err)
	}
	problem(t, r, http.StatusRequestEntityTooLarge, lockapi.CodeInvalidRequest)
	if cs := calls(t, ts); len(cs) != 0 {
		t.Fatalf("a refused pain.001 was booked: %+v", cs)
	}
	if l := ts.logs.events(t, "rail_call"); len(l) != 0 {
		t.Fatalf("rail_call logged for a refused pain.001: %v", l)
	}
}

// camt.053 pages the accepted calls by seq: after and limit as for the call
// log, limit counting entries (declines between them do not shorten a page),
// one statement per account sorted, NtryRef the seq; declines never appear.
func TestISOCamt053PagesAcceptedCalls(t *testing.T) {
	t.Parallel()
	ts := startISOStub(t, nil)
	assertEmptyStatement(t, camt053(t, ts, ""))
	payAs := func(ref, account string) {
		in := initiation(ref)
		in.DebtorAccount = account
		r, err := postPain001(t, ts, pain001(t, in))
		if err != nil {
			t.Fatal(err)
		}
		statusReport(t, r)
	}
	setDecline := func(rate float64) {
		if _, err := ts.Client.SetChaos(t.Context(), 0, rate, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	// seq 1–3 accepted, 4–5 declined, 6–8 accepted; accounts b and a alternate.
	payAs("p-1", "acct-b")
	payAs("p-2", "acct-a")
	payAs("p-3", "acct-b")
	setDecline(1)
	payAs("p-4", "acct-a")
	payAs("p-5", "acct-c")
	setDecline(0)
	payAs("p-6", "acct-a")
	payAs("p-7", "acct-b")
	payAs("p-8", "acct-a")
	bySeq := map[string]Call{}
	for _, c := range calls(t, ts) {
		bySeq[fmt.Sprint(c.Seq)] = c
	}
	seqs := func(stmts []isomsg.Statement) (accounts []string, refs []string) {
		for _, st := range stmts {
			accounts = append(accounts, st.Account)
			var sum int64
			for _, e := range st.Entries {
				c := bySeq[e.Ref]
				if c.Result != ResultAccepted || e.AcctSvcrRef != c.RailReference || e.EndToEndID != c.Reference ||
					e.CreditorAccount != c.Beneficiary || e.AmountMinor != c.AmountMinor || e.Currency != c.Currency ||
					!e.Debit || e.Status != "BOOK" || !e.BookedAt.Equal(c.ReceivedAt) || c.AccountID != st.Account ||
					e.InstructedMinor == nil || *e.InstructedMinor != c.AmountMinor || e.InstructedCurrency != c.Currency {
					t.Fatalf("entry %+v is not call %+v", e, c)
				}
				sum += e.AmountMinor
				refs = append(refs, e.Ref)
			}
			if st.OpeningMinor != 0 || st.ClosingMinor != -sum || st.From == nil || st.To == nil ||
				!st.From.Equal(bySeq[st.Entries[0].Ref].ReceivedAt) || !st.To.Equal(bySeq[st.Entries[len(st.Entries)-1].Ref].ReceivedAt) {
				t.Fatalf("statement %+v: want opening 0, closing −%d, FrToDt its entries' bookings", st, sum)
			}
		}
		return accounts, refs
	}
	for _, tc := range []struct {
		query    string
		accounts string
		refs     string
	}{
		{"", "acct-a acct-b", "2 6 8 1 3 7"},
		{"?after=0&limit=10000", "acct-a acct-b", "2 6 8 1 3 7"},
		{"?after=2&limit=3", "acct-a acct-b", "6 3 7"},
		{"?after=3&limit=1", "acct-a", "6"},
		{"?after=7", "acct-a", "8"},
	} {
		accounts, refs := seqs(camt053(t, ts, tc.query))
		if strings.Join(accounts, " ") != tc.accounts || strings.Join(refs, " ") != tc.refs {
			t.Fatalf("camt.053%s: accounts %v entries %v, want %s / %s", tc.query, accounts, refs, tc.accounts, tc.refs)
		}
	}
	assertEmptyStatement(t, camt053(t, ts, "?after=8"))
	for _, q := range []string{"?after=-1", "?after=01", "?limit=0", "?limit=10001", "?after=1&after=2", "?limit=x"} {
		r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/iso20022/camt.053"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		problem(t, r, http.StatusBadRequest, lockapi.CodeInvalidRequest)
	}
}

// The stub in ISO 20022 mode and the project's ISO 20022 adapter understand
// each other: the adapter's pain.001 is booked, its reading of the answer is the
// call's fate (the rail reference of an accept, MS03 for a decline), and its
// reading of the statement is the accepted calls of the call log, field for
// field, in seq order.
func TestISOAdapterReadsTheStub(t *testing.T) {
	t.Parallel()
	ts := startISOStub(t, nil)
	a := iso20022.New()
	hc := &http.Client{Timeout: 10 * time.Second}
	do := func(req rail.Request) rail.Reply {
		t.Helper()
		var body []byte
		if req.ContentType != "" {
			body = req.Body
		}
		r, err := send(t.Context(), hc, ts.URL, req.Method, req.Path, req.ContentType, body)
		if err != nil {
			t.Fatalf("%s %s: %v", req.Method, req.Path, err)
		}
		return rail.Reply{Status: r.status, ContentType: r.header.Get("Content-Type"), Body: r.body}
	}
	payAs := func(id int64, payout, account string) rail.Answer {
		p := rail.Payment{SubmissionID: id, PayoutID: payout, AccountID: account, AmountMinor: 1395 * id,
			Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
		req, err := a.PaymentRequest(p)
		if err != nil {
			t.Fatal(err)
		}
		return a.ReadAnswer(p, do(req))
	}
	if ans := payAs(1, "p-1", "acct-b"); ans.Verdict != rail.Accepted || ans.RailReference != calls(t, ts)[0].RailReference {
		t.Fatalf("accept read as %+v", ans)
	}
	if _, err := ts.Client.SetChaos(t.Context(), 0, 1, 0, nil); err != nil {
		t.Fatal(err)
	}
	if ans := payAs(2, "p-2", "acct-a"); ans.Verdict != rail.Declined || ans.DeclineReason != ISODeclineCode {
		t.Fatalf("decline read as %+v", ans)
	}
	if _, err := ts.Client.SetChaos(t.Context(), 0, 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	payAs(3, "p-3", "acct-a")
	payAs(4, "p-4", "acct-b")
	if r := do(a.HealthRequest()); r.Status != http.StatusOK {
		t.Fatalf("health: %d", r.Status)
	}
	lines, err := a.ReadStatement(do(a.StatementRequest(0, 100)), 0, 100)
	if err != nil {
		t.Fatalf("ReadStatement: %v", err)
	}
	var want []Call
	for _, c := range calls(t, ts) {
		if c.Result == ResultAccepted {
			want = append(want, c)
		}
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want the %d accepted calls", len(lines), len(want))
	}
	for i, l := range lines {
		c := want[i]
		if l.Seq != c.Seq || l.Reference != c.Reference || l.AccountID != c.AccountID || l.AmountMinor != c.AmountMinor ||
			l.Currency != c.Currency || l.Beneficiary != c.Beneficiary || l.Result != ResultAccepted ||
			l.RailReference == nil || *l.RailReference != c.RailReference || !l.ReceivedAt.Equal(c.ReceivedAt) {
			t.Fatalf("line %d = %+v, want call %+v", i, l, c)
		}
	}
	lines, err = a.ReadStatement(do(a.StatementRequest(want[1].Seq, 1)), want[1].Seq, 1)
	if err != nil || len(lines) != 1 || lines[0].Seq != want[2].Seq {
		t.Fatalf("page after %d: %+v %v, want call %d", want[1].Seq, lines, err, want[2].Seq)
	}
}

// The stub's own failures answer a pain.001 as they answer a JSON payment, as
// problems (only a 200 carries a pain.002): a call-log line that cannot be synced
// is 500 with the call booked, after which the stub books nothing — 503, health
// DOWN on /iso20022/health too; after Close a pain.001 is 503, unbooked.
func TestISOCallLogFailures(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	ts := startISOStub(t, func(c *Config) { c.CallLogPath = path })
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	ts.calls.mu.Lock()
	logFile := ts.calls.file
	ts.calls.file = pw // takes writes, cannot fsync
	ts.calls.mu.Unlock()
	r, err := postPain001(t, ts, pain001(t, initiation("p-1")))
	if err != nil {
		t.Fatal(err)
	}
	problem(t, r, http.StatusInternalServerError, lockapi.CodeInternal)
	r, err = postPain001(t, ts, pain001(t, initiation("p-2")))
	if err != nil {
		t.Fatal(err)
	}
	problem(t, r, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	if cs := calls(t, ts); len(cs) != 1 || cs[0].Reference != "p-1" {
		t.Fatalf("calls = %+v, want p-1 booked (not synced) and p-2 not", cs)
	}
	if r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/iso20022/health", "", nil); err != nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("GET /iso20022/health with a failed call log: %d %v, want 503", r.status, err)
	}
	ts.calls.mu.Lock()
	ts.calls.file = logFile
	ts.calls.mu.Unlock()
	_ = pw.Close()

	closed := startISOStub(t, nil)
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	r, err = postPain001(t, closed, pain001(t, initiation("p-3")))
	if err != nil {
		t.Fatal(err)
	}
	problem(t, r, http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	if cs := calls(t, closed); len(cs) != 0 {
		t.Fatalf("booked after Close: %+v", cs)
	}
}
