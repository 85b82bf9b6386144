package railproxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/railstub"
	"lock.dev/lockapi"
	"lock.dev/rail"
	"lock.dev/rail/stubjson"
)

// The gate and the adapter seam (docs/integrating-your-rail.md): whatever the
// adapter, the gate keeps its rules — a refused payment is refused before any
// row, only an accept with a storable reference or a decline with a storable
// reason resolves a row, pending is ambiguous with its own cause, and a
// statement page is checked on top of the adapter's reading.

// acme is a made-up rail's adapter: its own method, paths, content types and
// body, so that the test sees the gate send what the adapter built and hand it
// what the rail answered, nothing added, nothing lost.
type acme struct {
	mu     sync.Mutex
	seen   []rail.Reply   // the replies ReadAnswer was handed, copied
	paid   []rail.Payment // the payments ReadAnswer was asked about
	answer rail.Answer    // what ReadAnswer answers
	lines  []lockapi.StatementLine
	health string // HealthRequest's path
	panics bool   // ReadStatement panics
}

func (*acme) Protocol() string { return "acme" }

func (*acme) Refuse(rail.Payment) []lockapi.FieldError { return nil }

func (*acme) PaymentRequest(p rail.Payment) (rail.Request, error) {
	return rail.Request{Method: http.MethodPut, Path: "/acme/pay?msg=" + p.PayoutID, ContentType: "application/x-acme",
		Accept: "application/x-acme-answer", Body: []byte("PAY " + p.PayoutID + " " + p.AccountID)}, nil
}

func (a *acme) ReadAnswer(p rail.Payment, r rail.Reply) rail.Answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	r.Body = append([]byte(nil), r.Body...)
	a.seen = append(a.seen, r)
	a.paid = append(a.paid, p)
	if a.answer.Why == "panic" {
		panic("acme cannot read this")
	}
	return a.answer
}

func (a *acme) HealthRequest() rail.Request {
	return rail.Request{Method: http.MethodGet, Path: a.health}
}

func (*acme) StatementRequest(after int64, limit int) rail.Request {
	return rail.Request{Method: http.MethodGet, Path: "/acme/statement?from=" + strconv.FormatInt(after, 10) + "&n=" + strconv.Itoa(limit), Accept: "application/x-acme-statement"}
}

func (a *acme) ReadStatement(rail.Reply, int64, int) ([]lockapi.StatementLine, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.panics {
		panic("acme cannot read this page")
	}
	return append([]lockapi.StatementLine(nil), a.lines...), nil
}

// acmeRail records what it was sent and answers as told.
type acmeRail struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string // method, request URI, content type, accept, body
	status   int      // of every answer (health included)
}

func newAcmeRail(t *testing.T) *acmeRail {
	r := &acmeRail{status: http.StatusAccepted}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.requests = append(r.requests, strings.Join([]string{req.Method, req.URL.RequestURI(), req.Header.Get("Content-Type"),
			req.Header.Get("Accept"), string(body)}, " | "))
		status := r.status
		r.mu.Unlock()
		w.Header().Set("Content-Type", "text/x-acme")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "ANSWER to "+req.URL.Path)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *acmeRail) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.requests...)
}

// Pay sends exactly the request the adapter built, and hands the adapter the
// rail's reply as it came (status, content type, body) with the payment it is
// about; on top of the adapter's verdict it takes only an accept with a
// storable reference and a decline with a storable reason (none: unspecified),
// and makes pending ambiguous with its own cause.
func TestPayThroughTheAdapter(t *testing.T) {
	t.Parallel()
	r := newAcmeRail(t)
	p := rail.Payment{SubmissionID: 4711, PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 5, Currency: "EUR", Beneficiary: "b"}
	for _, c := range []struct {
		name   string
		answer rail.Answer
		result RailResult
		cause  string
		ref    string
		reason string
	}{
		{"accepted", rail.Answer{Verdict: rail.Accepted, RailReference: "AC-1"}, RailAccepted, "", "AC-1", ""},
		{"accepted, 35 characters", rail.Answer{Verdict: rail.Accepted, RailReference: strings.Repeat("R", 35)}, RailAccepted, "", strings.Repeat("R", 35), ""},
		{"accepted without a reference", rail.Answer{Verdict: rail.Accepted}, RailAmbiguous, CauseBadResponse, "", ""},
		{"accepted, NUL in the reference", rail.Answer{Verdict: rail.Accepted, RailReference: "AC-\x001"}, RailAmbiguous, CauseBadResponse, "", ""},
		{"accepted, newline in the reference", rail.Answer{Verdict: rail.Accepted, RailReference: "AC\n1"}, RailAmbiguous, CauseBadResponse, "", ""},
		{"accepted, 36 characters", rail.Answer{Verdict: rail.Accepted, RailReference: strings.Repeat("R", 36)}, RailAmbiguous, CauseBadResponse, "", ""},
		{"declined", rail.Answer{Verdict: rail.Declined, DeclineReason: "AM04"}, RailDeclined, "", "", "AM04"},
		{"declined without a reason", rail.Answer{Verdict: rail.Declined}, RailDeclined, "", "", DeclineUnspecified},
		{"declined, DEL in the reason", rail.Answer{Verdict: rail.Declined, DeclineReason: "AM\x7f4"}, RailAmbiguous, CauseBadResponse, "", ""},
		{"declined, 141 characters", rail.Answer{Verdict: rail.Declined, DeclineReason: strings.Repeat("r", 141)}, RailAmbiguous, CauseBadResponse, "", ""},
		{"pending", rail.Answer{Verdict: rail.Pending, Why: "status PDNG"}, RailAmbiguous, CausePending, "", ""},
		{"not understood", rail.Answer{Verdict: rail.NotUnderstood, Why: "no such payment"}, RailAmbiguous, CauseBadResponse, "", ""},
		{"not understood, no why", rail.Answer{}, RailAmbiguous, CauseBadResponse, "", ""},
		{"a verdict the gate does not know", rail.Answer{Verdict: rail.Verdict(99), RailReference: "AC-9"}, RailAmbiguous, CauseBadResponse, "", ""},
		{"the adapter panics reading", rail.Answer{Verdict: rail.Accepted, Why: "panic"}, RailAmbiguous, CauseBadResponse, "", ""},
	} {
		a := &acme{answer: c.answer}
		cfg := hopConfig(r.URL)
		cfg.Adapter = a
		cl := newRailClient(cfg)
		rc := cl.Pay(context.Background(), p)
		cl.close()
		if rc.Result != c.result || rc.Cause != c.cause || rc.RailReference != c.ref || deref(rc.DeclineReason) != c.reason {
			t.Errorf("%s: %+v (reason %q), want result %d cause %q reference %q reason %q", c.name, rc, deref(rc.DeclineReason), c.result, c.cause, c.ref, c.reason)
		}
		if rc.Result == RailAmbiguous && (rc.Err == nil || !strings.Contains(rc.Err.Error(), "202")) {
			t.Errorf("%s: error %v does not say what the rail answered", c.name, rc.Err)
		}
		if len(a.seen) != 1 || a.seen[0].Status != http.StatusAccepted || a.seen[0].ContentType != "text/x-acme" ||
			string(a.seen[0].Body) != "ANSWER to /acme/pay" || a.paid[0] != p {
			t.Errorf("%s: the adapter was handed %+v about %+v", c.name, a.seen, a.paid)
		}
	}
	want := "PUT | /acme/pay?msg=p-1 | application/x-acme | application/x-acme-answer | PAY p-1 acct-1"
	for i, s := range r.seen() {
		if s != want {
			t.Fatalf("call %d: the rail was sent %q, want %q", i, s, want)
		}
	}
}

// A payment the adapter refuses is 400 INVALID_REQUEST naming its field, in
// either admission mode: no row written, no mark moved, the rail not called. A
// payment it takes goes through the same proxy (the control).
func TestRefusedByTheAdapterWritesNothing(t *testing.T) {
	t.Parallel()
	for _, maxGroup := range []int{1, DefaultMaxGroup} {
		st := startStub(t, 0)
		dbURL := pgtest.PaydbURL(t)
		db := pgtest.Pool(t, dbURL)
		cfg := testConfig(dbURL, st.URL)
		cfg.MaxGroup = maxGroup
		cfg.Adapter = refusingStub{stubjson.New()}
		cfg.RailProtocol = ""
		p := startProxy(t, cfg)

		a := submit(t, p.URL, 7, newPayout("p-much-too-long", "acct-refused"))
		errs, _ := a.Body["errors"].([]any)
		first, _ := func() (map[string]any, bool) {
			if len(errs) == 0 {
				return nil, false
			}
			m, ok := errs[0].(map[string]any)
			return m, ok
		}()
		if a.Status != http.StatusBadRequest || a.code() != lockapi.CodeInvalidRequest || first["field"] != "payoutId" {
			t.Fatalf("max group %d: answer %d %+v, want 400 INVALID_REQUEST naming payoutId", maxGroup, a.Status, a.Body)
		}
		if n := countRows(t, db); n != 0 {
			t.Fatalf("max group %d: %d rows written for a refused payment", maxGroup, n)
		}
		if m := mark(t, db, "acct-refused"); m != 0 {
			t.Fatalf("max group %d: the mark moved to %d", maxGroup, m)
		}
		if n := len(st.calls(t)); n != 0 {
			t.Fatalf("max group %d: the rail was called %d times", maxGroup, n)
		}
		if a := submit(t, p.URL, 8, newPayout("p-short", "acct-refused")); a.Status != http.StatusOK {
			t.Fatalf("max group %d: the payment the adapter takes: %d %+v", maxGroup, a.Status, a.Body)
		}
		if n := st.callsFor(t, "p-short"); n != 1 || countRows(t, db) != 1 {
			t.Fatalf("max group %d: the payment the adapter takes reached the rail %d times", maxGroup, n)
		}
	}
}

// refusingStub is the stub adapter refusing payout ids over 8 characters.
type refusingStub struct{ rail.Adapter }

func (refusingStub) Protocol() string { return "refusing-stub" }

func (refusingStub) Refuse(p rail.Payment) []lockapi.FieldError {
	if len(p.PayoutID) > 8 {
		return []lockapi.FieldError{{Field: "payoutId", Problem: "must be at most 8 characters for this rail"}}
	}
	return nil
}

// pendingStub is the stub adapter reading every answer as pending.
type pendingStub struct{ rail.Adapter }

func (pendingStub) ReadAnswer(rail.Payment, rail.Reply) rail.Answer {
	return rail.Answer{Verdict: rail.Pending, Why: "status PDNG"}
}

// A pending answer through the running proxy: 409 RAIL_AMBIGUOUS, the row
// TIMEOUT, counted ambiguous, logged rail_ambiguous with cause pending at WARN
// (the other causes stay ERROR: TestRailTimeoutIsAmbiguous and the janitor's
// tests).
func TestPendingIsAmbiguous(t *testing.T) {
	t.Parallel()
	st := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, st.URL)
	cfg.Adapter = pendingStub{stubjson.New()}
	p := startProxy(t, cfg)
	a := submit(t, p.URL, 1, newPayout("p-pending", "acct-pending"))
	if a.Status != http.StatusConflict || a.code() != lockapi.CodeRailAmbiguous {
		t.Fatalf("answer %d %+v, want 409 RAIL_AMBIGUOUS", a.Status, a.Body)
	}
	if rs := rowsOf(t, db, "p-pending"); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeTimeout || rs[0].RailReference != nil {
		t.Fatalf("rows %+v, want one TIMEOUT without a reference", rs)
	}
	ev := p.Logs.events("rail_ambiguous")
	if len(ev) != 1 || ev[0]["cause"] != CausePending || ev[0]["level"] != "WARN" || ev[0]["submissionId"] == nil {
		t.Fatalf("rail_ambiguous: %v, want one at WARN with cause %s", ev, CausePending)
	}
	if v := metric(t, p, `rail_submission_total{outcome="ambiguous"}`); v != 1 {
		t.Errorf(`rail_submission_total{outcome="ambiguous"} = %v, want 1`, v)
	}
}

// The statement and the health probe go through the adapter: the rail is asked
// what the adapter builds, and on top of the adapter's reading the gate checks
// the page — seqs increasing from after, no more lines than asked, each line's
// result and fields — and the status. Readiness keeps its component name.
func TestStatementAndHealthThroughTheAdapter(t *testing.T) {
	t.Parallel()
	r := newAcmeRail(t)
	r.status = http.StatusOK
	a := &acme{health: "/acme/up"}
	cfg := testConfig(pgtest.PaydbURL(t), r.URL)
	cfg.Adapter = a
	cfg.RailProtocol = "acme"
	p := startProxy(t, cfg)

	ready := get(t, p.URL+"/readyz")
	comps, _ := ready.Body["components"].(map[string]any)
	if rs, _ := comps["railStub"].(map[string]any); ready.Status != http.StatusOK || rs["status"] != "UP" {
		t.Fatalf("readiness: %+v", ready)
	}
	if seen := r.seen(); len(seen) == 0 || seen[len(seen)-1] != "GET | /acme/up |  |  | " {
		t.Fatalf("the health probe sent %q", seen)
	}

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	ref := "AC-1"
	line := func(seq int64) lockapi.StatementLine {
		return lockapi.StatementLine{Seq: seq, ReceivedAt: at, Reference: "p-" + strconv.FormatInt(seq, 10), AccountID: "acct-1", AmountMinor: 5,
			Currency: "EUR", Beneficiary: "b", Result: lockapi.ResultAccepted, RailReference: &ref}
	}
	a.lines = []lockapi.StatementLine{line(8), line(10)}
	status, page, _ := getStatement(t, p, "?after=7&limit=2")
	if status != http.StatusOK || len(page.Lines) != 2 || page.Lines[1].Seq != 10 || page.Next == nil || *page.Next != 10 ||
		!page.Lines[0].ReceivedAt.Equal(at) || page.Lines[0].ReceivedAt.Location() != time.UTC {
		t.Fatalf("page: %d %+v", status, page)
	}
	if seen := r.seen(); seen[len(seen)-1] != "GET | /acme/statement?from=7&n=2 |  | application/x-acme-statement | " {
		t.Fatalf("the statement request sent %q", seen[len(seen)-1])
	}

	bad := map[string][]lockapi.StatementLine{
		"a seq not after after": {line(7)},
		"seqs not increasing":   {line(9), line(9)},
		"more lines than asked": {line(8), line(9), line(10)},
		"a line without its beneficiary": {line(8), func() lockapi.StatementLine {
			l := line(9)
			l.Beneficiary = ""
			return l
		}()},
		"a line neither accepted nor declined": {func() lockapi.StatementLine {
			l := line(8)
			l.Result = "PENDING"
			return l
		}()},
	}
	failed := 0
	for name, lines := range bad {
		a.mu.Lock()
		a.lines = lines
		a.mu.Unlock()
		if status, _, prob := getStatement(t, p, "?after=7&limit=2"); status != http.StatusServiceUnavailable || prob["code"] != lockapi.CodeRailUnavailable {
			t.Errorf("%s: %d %v, want 503 RAIL_UNAVAILABLE", name, status, prob)
		}
		failed++
	}
	// An adapter that panics reading the page.
	a.mu.Lock()
	a.panics = true
	a.mu.Unlock()
	if status, _, _ := getStatement(t, p, "?after=7&limit=2"); status != http.StatusServiceUnavailable {
		t.Errorf("an adapter that panics: %d, want 503", status)
	}
	failed++
	a.mu.Lock()
	a.panics = false
	a.mu.Unlock()
	// A page the adapter reads, under a status that is no success.
	a.mu.Lock()
	a.lines = []lockapi.StatementLine{line(8)}
	a.mu.Unlock()
	r.mu.Lock()
	r.status = http.StatusInternalServerError
	r.mu.Unlock()
	if status, _, _ := getStatement(t, p, "?after=7&limit=2"); status != http.StatusServiceUnavailable {
		t.Errorf("a page under status 500: %d, want 503", status)
	}
	failed++
	if v := metric(t, p, `rail_statement_read_total{result="error"}`); v != float64(failed) {
		t.Errorf(`rail_statement_read_total{result="error"} = %v, want %d`, v, failed)
	}
	ready = get(t, p.URL+"/readyz")
	if ready.Status != http.StatusServiceUnavailable {
		t.Errorf("readiness with the health probe answered 500: %d", ready.Status)
	}
}

// With RAIL_PROTOCOL=iso20022 a payoutId over 35 characters (ISO 20022's
// Max35Text, the EndToEndId it travels as) is 400 INVALID_REQUEST naming
// payoutId before any row; one of 35 is presented as pain.001 to rail-stub
// speaking ISO 20022, accepted, and read back from its camt.053 statement.
func TestISO20022RefusesBeforeAnyRow(t *testing.T) {
	t.Parallel()
	st := startStubSpeaking(t, 0, railstub.ProtocolISO20022)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL, st.URL)
	cfg.RailProtocol = ProtocolISO20022
	p := startProxy(t, cfg)

	long := strings.Repeat("p", 36)
	a := submit(t, p.URL, 1, newPayout(long, "acct-iso"))
	if a.Status != http.StatusBadRequest || a.code() != lockapi.CodeInvalidRequest || !strings.Contains(a.str("detail"), "payoutId") {
		t.Fatalf("a 36-character payoutId: %d %+v, want 400 INVALID_REQUEST naming payoutId", a.Status, a.Body)
	}
	if n := countRows(t, db); n != 0 || len(st.calls(t)) != 0 || mark(t, db, "acct-iso") != 0 {
		t.Fatalf("a refused payment left %d rows, %d calls, mark %d", n, len(st.calls(t)), mark(t, db, "acct-iso"))
	}

	ok := strings.Repeat("p", 35)
	if a := submit(t, p.URL, 2, newPayout(ok, "acct-iso")); a.Status != http.StatusOK || a.str("railReference") == "" {
		t.Fatalf("a 35-character payoutId: %d %+v, want 200 ACKED", a.Status, a.Body)
	}
	if rs := rowsOf(t, db, ok); len(rs) != 1 || outcomeOf(rs[0]) != lockapi.OutcomeAcked || st.callsFor(t, ok) != 1 {
		t.Fatalf("rows %+v", rs)
	}
	status, page, _ := getStatement(t, p, "")
	if status != http.StatusOK || len(page.Lines) != 1 || page.Lines[0].Reference != ok || page.Lines[0].AccountID != "acct-iso" ||
		page.Lines[0].AmountMinor != 125000 || page.Lines[0].Beneficiary != "NL91ABNA0417164300" || page.Lines[0].Result != lockapi.ResultAccepted {
		t.Fatalf("statement: %d %+v", status, page)
	}
}

// RAIL_PROTOCOL names a built-in adapter or, in a binary built around its own
// adapter, that adapter; anything else is refused naming the setting. The
// start-up log says which language the proxy speaks.
func TestRailProtocolSetting(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		protocol string
		ok       bool
	}{{"", true}, {"stub", true}, {"iso20022", true}, {"acme", false}, {"STUB", false}, {"iso20022 ", false}} {
		_, cfg, err := ParseConfig(nil, env("RAIL_PROTOCOL", c.protocol, "UNSAFE_NO_AUTH", "true"))
		if c.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "RAIL_PROTOCOL")) {
			t.Errorf("RAIL_PROTOCOL=%q: %v", c.protocol, err)
		}
		want := c.protocol
		if want == "" {
			want = ProtocolStub
		}
		if err == nil && cfg.adapter().Protocol() != want {
			t.Errorf("RAIL_PROTOCOL=%q speaks %q", c.protocol, cfg.adapter().Protocol())
		}
	}
	own := refusingStub{stubjson.New()}
	for _, c := range []struct {
		protocol string
		ok       bool
	}{{"", true}, {own.Protocol(), true}, {"stub", false}, {"iso20022", false}} {
		_, cfg, err := ParseConfigWith(own)(nil, env("RAIL_PROTOCOL", c.protocol, "UNSAFE_NO_AUTH", "true"))
		if c.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "RAIL_PROTOCOL")) {
			t.Errorf("built with %q, RAIL_PROTOCOL=%q: %v", own.Protocol(), c.protocol, err)
		}
		if err == nil && cfg.adapter() != rail.Adapter(own) {
			t.Errorf("built with %q, RAIL_PROTOCOL=%q: speaks %q", own.Protocol(), c.protocol, cfg.adapter().Protocol())
		}
	}

	cfg := testConfig(pgtest.PaydbURL(t), "http://127.0.0.1:1")
	cfg.RailProtocol = ProtocolISO20022
	p := startProxy(t, cfg)
	started := p.Logs.filter(func(e map[string]any) bool { return e["msg"] == "rail-proxy starting" })
	if len(started) != 1 || started[0]["railProtocol"] != ProtocolISO20022 {
		t.Fatalf("start-up log: %v", started)
	}
}

// brokenRequest is an adapter that cannot build a payment request: it fails,
// or panics.
type brokenRequest struct {
	rail.Adapter
	panics bool
}

func (b brokenRequest) PaymentRequest(rail.Payment) (rail.Request, error) {
	if b.panics {
		panic("no request today")
	}
	return rail.Request{}, io.ErrUnexpectedEOF
}

// An adapter that cannot build the request — an error, or a panic — makes
// the call UNSENT, and nothing reaches the rail.
func TestPaymentRequestFailureIsUnsent(t *testing.T) {
	t.Parallel()
	r := newAcmeRail(t)
	for _, panics := range []bool{false, true} {
		cfg := hopConfig(r.URL)
		cfg.Adapter = brokenRequest{Adapter: &acme{}, panics: panics}
		cl := newRailClient(cfg)
		rc := cl.Pay(context.Background(), rail.Payment{SubmissionID: 1, PayoutID: "p-1", AccountID: "a", AmountMinor: 1, Currency: "EUR", Beneficiary: "b"})
		cl.close()
		if rc.Result != RailUnsent || rc.Err == nil {
			t.Errorf("panics %v: %+v, want UNSENT with its error", panics, rc)
		}
	}
	if seen := r.seen(); len(seen) != 0 {
		t.Fatalf("the rail was sent %q", seen)
	}
}
