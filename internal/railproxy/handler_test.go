package railproxy

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// malformed is one request of the malformed-input catalogue. Header fields hold
// the header's values joined by "\n" ("" = header absent), so the same rows can
// seed the fuzz target.
type malformed struct {
	name        string
	contentType string
	token       string
	owner       string
	key         string
	body        string
	status      int
	field       string // errors[0].field
}

const goodBody = `{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`

func withBody(b string) malformed {
	return malformed{contentType: "application/json", token: "42", owner: "w1", key: "k1", body: b, status: 400}
}

func malformedCatalogue() []malformed {
	big := `{"payoutId":"` + strings.Repeat("x", 70_000) + `"}`
	c := []malformed{}
	add := func(name string, m malformed, status int, field string) {
		m.name, m.status, m.field = name, status, field
		c = append(c, m)
	}
	ok := withBody(goodBody)
	mod := func(f func(*malformed)) malformed { m := ok; f(&m); return m }

	add("no content type", mod(func(m *malformed) { m.contentType = "" }), 415, "Content-Type")
	add("text/plain", mod(func(m *malformed) { m.contentType = "text/plain" }), 415, "Content-Type")
	add("application/jsonx", mod(func(m *malformed) { m.contentType = "application/jsonx" }), 415, "Content-Type")
	add("two content types", mod(func(m *malformed) { m.contentType = "application/json\napplication/json" }), 415, "Content-Type")
	add("body over 64 KiB", mod(func(m *malformed) { m.body = big }), 413, "body")
	add("415 before 413", mod(func(m *malformed) { m.body = big; m.contentType = "text/plain" }), 415, "Content-Type")
	add("413 before headers", mod(func(m *malformed) { m.body = big; m.token = "" }), 413, "body")
	add("token missing", mod(func(m *malformed) { m.token = "" }), 400, "X-Fencing-Token")
	add("token zero", mod(func(m *malformed) { m.token = "0" }), 400, "X-Fencing-Token")
	add("token negative", mod(func(m *malformed) { m.token = "-5" }), 400, "X-Fencing-Token")
	add("token plus sign", mod(func(m *malformed) { m.token = "+5" }), 400, "X-Fencing-Token")
	add("token leading zero", mod(func(m *malformed) { m.token = "007" }), 400, "X-Fencing-Token")
	add("token inner space", mod(func(m *malformed) { m.token = "1 2" }), 400, "X-Fencing-Token")
	add("token above int64", mod(func(m *malformed) { m.token = "9223372036854775808" }), 400, "X-Fencing-Token")
	add("token 20 digits", mod(func(m *malformed) { m.token = "12345678901234567890" }), 400, "X-Fencing-Token")
	add("token not a number", mod(func(m *malformed) { m.token = "abc" }), 400, "X-Fencing-Token")
	add("token fraction", mod(func(m *malformed) { m.token = "1.0" }), 400, "X-Fencing-Token")
	add("token repeated", mod(func(m *malformed) { m.token = "5\n6" }), 400, "X-Fencing-Token")
	add("owner missing", mod(func(m *malformed) { m.owner = "" }), 400, "X-Owner-Id")
	add("owner with space", mod(func(m *malformed) { m.owner = "a b" }), 400, "X-Owner-Id")
	add("owner 129 characters", mod(func(m *malformed) { m.owner = strings.Repeat("o", 129) }), 400, "X-Owner-Id")
	add("owner repeated", mod(func(m *malformed) { m.owner = "a\nb" }), 400, "X-Owner-Id")
	add("key missing", mod(func(m *malformed) { m.key = "" }), 400, "X-Idempotency-Key")
	add("key 256 characters", mod(func(m *malformed) { m.key = strings.Repeat("k", 256) }), 400, "X-Idempotency-Key")
	add("key not visible ASCII", mod(func(m *malformed) { m.key = "k\u00e9y" }), 400, "X-Idempotency-Key")
	add("headers before body", mod(func(m *malformed) { m.token = "x"; m.body = "{" }), 400, "X-Fencing-Token")
	add("empty body", withBody(""), 400, "body")
	add("not JSON", withBody("{"), 400, "body")
	add("not an object", withBody(`[1,2]`), 400, "body")
	add("trailing data", withBody(goodBody+`{}`), 400, "body")
	add("unknown member", withBody(strings.Replace(goodBody, `{`, `{"extra":1,`, 1)), 400, "extra")
	add("duplicate member", withBody(strings.Replace(goodBody, `{`, `{"payoutId":"p-2",`, 1)), 400, "payoutId")
	add("payoutId missing", withBody(`{"accountId":"a","amountMinor":1,"currency":"EUR","beneficiary":"b"}`), 400, "payoutId")
	add("payoutId 65 characters", withBody(strings.Replace(goodBody, `p-1001`, strings.Repeat("p", 65), 1)), 400, "payoutId")
	add("payoutId with slash", withBody(strings.Replace(goodBody, `p-1001`, `p/1001`, 1)), 400, "payoutId")
	add("accountId null", withBody(strings.Replace(goodBody, `"acct-7"`, `null`, 1)), 400, "accountId")
	add("amountMinor fraction", withBody(strings.Replace(goodBody, `125000`, `1.5`, 1)), 400, "amountMinor")
	add("amountMinor exponent", withBody(strings.Replace(goodBody, `125000`, `1e3`, 1)), 400, "amountMinor")
	add("amountMinor zero", withBody(strings.Replace(goodBody, `125000`, `0`, 1)), 400, "amountMinor")
	add("amountMinor above 10^15", withBody(strings.Replace(goodBody, `125000`, `1000000000000001`, 1)), 400, "amountMinor")
	add("amountMinor string", withBody(strings.Replace(goodBody, `125000`, `"125000"`, 1)), 400, "amountMinor")
	add("currency lower case", withBody(strings.Replace(goodBody, `EUR`, `eur`, 1)), 400, "currency")
	add("beneficiary empty", withBody(strings.Replace(goodBody, `NL91ABNA0417164300`, ``, 1)), 400, "beneficiary")
	add("beneficiary control character", withBody(strings.Replace(goodBody, `NL91ABNA0417164300`, `NL91\u0007`, 1)), 400, "beneficiary")
	return c
}

func (m malformed) request(url string) *http.Request {
	var r *http.Request
	if strings.HasPrefix(url, "http") {
		r, _ = http.NewRequest(http.MethodPost, url, strings.NewReader(m.body)) // a client request
	} else {
		r = httptest.NewRequest(http.MethodPost, url, strings.NewReader(m.body)) // a server-side one
	}
	set := func(name, v string) {
		r.Header.Del(name)
		if v == "" {
			return
		}
		for _, x := range strings.Split(v, "\n") {
			r.Header.Add(name, x)
		}
	}
	set("Content-Type", m.contentType)
	set(lockapi.HeaderFencingToken, m.token)
	set(lockapi.HeaderOwnerID, m.owner)
	set(lockapi.HeaderIdempotencyKey, m.key)
	return r
}

// Each malformed request is INVALID_REQUEST as problem+json with the status and
// first field the precedence of docs/contracts/rail-proxy.md gives it, and writes
// no row and calls no rail.
func TestMalformedRequestsWriteNothingCallNothing(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	db := pgtest.Pool(t, dbURL)
	p := startProxy(t, testConfig(dbURL, rail.URL))
	cat := malformedCatalogue()
	if len(cat) < 20 {
		t.Fatalf("catalogue has %d entries", len(cat))
	}
	for _, m := range cat {
		resp, err := testHTTP.Do(m.request(p.URL + "/v1/rail/submissions"))
		if err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		a, err := decode(resp)
		if err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		errs, _ := a.Body["errors"].([]any)
		if a.Status != m.status || a.code() != lockapi.CodeInvalidRequest || a.int("status") != int64(m.status) ||
			!strings.HasPrefix(a.Header.Get("Content-Type"), lockapi.ContentTypeProblem) || len(errs) == 0 {
			t.Errorf("%s: %d %v", m.name, a.Status, a.Body)
			continue
		}
		if f := errs[0].(map[string]any); f["field"] != m.field || f["problem"] == "" {
			t.Errorf("%s: first error %v, want field %s", m.name, f, m.field)
		}
	}
	if n := countRows(t, db); n != 0 {
		t.Fatalf("%d rows written by malformed requests", n)
	}
	if c := rail.calls(t); len(c) != 0 {
		t.Fatalf("%d rail calls made by malformed requests", len(c))
	}
	// Every fault is listed: a request wrong in a header and two members says so three times.
	m := withBody(`{"payoutId":"p 1","accountId":"a","amountMinor":0,"currency":"EUR","beneficiary":"b"}`)
	m.owner = ""
	resp, err := testHTTP.Do(m.request(p.URL + "/v1/rail/submissions"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := decode(resp)
	if errs, _ := a.Body["errors"].([]any); len(errs) != 3 {
		t.Fatalf("every fault: %v", a.Body)
	}
	// The well-formed request the catalogue varies is admitted.
	resp, err = testHTTP.Do(withBody(goodBody).request(p.URL + "/v1/rail/submissions"))
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := decode(resp); a.Status != http.StatusOK {
		t.Fatalf("the catalogue's base request: %+v", a)
	}
}

// validHeaderValue is what a field value can hold on the wire (no control
// characters but tab; obs-text allowed).
var validHeaderValue = regexp.MustCompile(`^[^\x00-\x08\x0a-\x1f\x7f]*$`)

// FuzzBindSubmission fuzzes header and body binding. Its seed corpus is the
// malformed catalogue plus the well-formed base request. Invariants: never a
// panic; a fault always has a status of 400, 413 or 415 and at least one error;
// a request that binds carries values every validator accepts, and the token is
// the header's own canonical decimal.
func FuzzBindSubmission(f *testing.F) {
	f.Add("application/json", "42", "w1", "k1", []byte(goodBody))
	for _, m := range malformedCatalogue() {
		f.Add(m.contentType, m.token, m.owner, m.key, []byte(m.body))
	}
	f.Fuzz(func(t *testing.T, contentType, token, owner, key string, body []byte) {
		for _, v := range []string{contentType, token, owner, key} {
			for _, x := range strings.Split(v, "\n") {
				if !validHeaderValue.MatchString(x) {
					t.Skip("not a header value HTTP can carry")
				}
			}
		}
		m := malformed{contentType: contentType, token: token, owner: owner, key: key, body: string(body)}
		r := m.request("/v1/rail/submissions")
		sub, status, errs := BindSubmission(r)
		switch status {
		case 0:
			if len(errs) != 0 {
				t.Fatalf("bound with errors %v", errs)
			}
		case 400, 413, 415:
			if len(errs) == 0 {
				t.Fatalf("status %d without errors", status)
			}
			return
		default:
			t.Fatalf("status %d", status)
		}
		if strconv.FormatInt(sub.Token, 10) != token || sub.Token <= 0 {
			t.Fatalf("token %d from header %q", sub.Token, token)
		}
		if lockapi.ValidateOwnerID(sub.OwnerID) != nil || sub.OwnerID != owner ||
			lockapi.ValidateIdempotencyKey(sub.IdempotencyKey) != nil || sub.IdempotencyKey != key ||
			lockapi.ValidateIdentifier(sub.PayoutID) != nil || lockapi.ValidateIdentifier(sub.AccountID) != nil ||
			lockapi.ValidateAmountMinor(sub.AmountMinor) != nil || lockapi.ValidateCurrency(sub.Currency) != nil ||
			lockapi.ValidateBeneficiary(sub.Beneficiary) != nil {
			t.Fatalf("bound an invalid submission %+v", sub)
		}
		if len(body) > lockapi.MaxBodyBytes {
			t.Fatalf("bound a body it should not have: %d bytes", len(body))
		}
	})
}

// /metrics and /actuator/prometheus expose every family (docs/contracts/observability.md) with
// every closed label value at 0 from start-up, and after traffic no label value
// is an identifier.
func TestMetricsPinnedAndZeroInitialised(t *testing.T) {
	t.Parallel()
	rail := startStub(t, 0)
	dbURL := pgtest.PaydbURL(t)
	p := startProxy(t, testConfig(dbURL, rail.URL))
	want := []string{
		`rail_duplicate_attempted_total 0`,
		`lock_fenced_out_total{resource="rail"} 0`,
		`rail_call_duration_seconds_count 0`,
		`rail_submission_inflight 0`,
		`rail_proxy_fencing_enabled 1`,
	}
	for _, o := range metricOutcomes {
		want = append(want, `rail_submission_total{outcome="`+o+`"} 0`, `rail_submission_duration_seconds_count{outcome="`+o+`"} 0`)
	}
	for _, r := range statementResults {
		want = append(want, `rail_statement_read_total{result="`+r+`"} 0`)
	}
	for _, w := range workerNames {
		want = append(want, `rail_proxy_worker_panic_total{worker="`+w+`"} 0`)
	}
	want = append(want, `rail_resolution_not_durable_total 0`)
	for _, path := range []string{"/metrics", "/actuator/prometheus"} {
		body := scrape(t, p.URL+path)
		for _, w := range want {
			if !strings.Contains(body, "\n"+w+"\n") {
				t.Errorf("%s lacks %q at start-up", path, w)
			}
		}
		if !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_resident_memory_bytes") {
			t.Errorf("%s lacks the Go and process collectors", path)
		}
	}
	submit(t, p.URL, 5, newPayout("p-met", "acct-met"))
	submit(t, p.URL, 4, newPayout("p-met2", "acct-met"))
	submit(t, p.URL, 6, newPayout("p-met", "acct-met"))
	allowed := map[string]bool{"rail": true}
	for _, o := range metricOutcomes {
		allowed[o] = true
	}
	for _, r := range statementResults {
		allowed[r] = true
	}
	for _, w := range workerNames {
		allowed[w] = true
	}
	label := regexp.MustCompile(`(\w+)="([^"]*)"`)
	for _, line := range strings.Split(scrape(t, p.URL+"/metrics"), "\n") {
		if !strings.HasPrefix(line, "rail_") && !strings.HasPrefix(line, "lock_") {
			continue
		}
		for _, m := range label.FindAllStringSubmatch(line, -1) {
			if m[1] == "le" {
				continue
			}
			if !allowed[m[2]] || strings.Contains(m[2], "p-met") || strings.Contains(m[2], "acct") {
				t.Errorf("label %s=%q outside the closed sets: %s", m[1], m[2], line)
			}
		}
	}
	for series, v := range map[string]float64{
		`rail_submission_total{outcome="acked"}`:     1,
		`rail_submission_total{outcome="fenced"}`:    1,
		`rail_submission_total{outcome="duplicate"}`: 1,
		`rail_call_duration_seconds_count`:           1,
		`rail_duplicate_attempted_total`:             1,
	} {
		if got := metric(t, p, series); got != v {
			t.Errorf("%s = %v, want %v", series, got, v)
		}
	}
}
