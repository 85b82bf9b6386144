package lockserver

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

type badCall struct {
	what   string
	method string
	path   string // after /v1/locks/
	header http.Header
	body   []byte
	status int
	fields []string // errors[].field, in any order
}

// hdr builds a header; a key given twice is sent twice.
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h[kv[i]] = append(h[kv[i]], kv[i+1])
	}
	return h
}

const (
	ct    = "Content-Type"
	owner = lockapi.HeaderOwnerID
	tok   = lockapi.HeaderFencingToken
	json_ = "application/json"
)

// badCalls is the malformed-input catalogue: names, owners, tokens, TTLs, JSON,
// query parameters, and the precedence of docs/contracts/lock-service.md 415 → 413
// → 400. The lock "held" is held by o1 with token 1; "fresh" was never granted.
func badCalls() []badCall {
	ok := []byte(`{"ttlMs":1000}`)
	big := append([]byte(`{"ttlMs":1000,"x":"`), bytes.Repeat([]byte("a"), 70<<10)...)
	big = append(big, `"}`...)
	long := strings.Repeat("a", 129)
	acq := func(what string, h http.Header, body []byte, status int, fields ...string) badCall {
		return badCall{what, http.MethodPost, "fresh/acquire", h, body, status, fields}
	}
	named := func(what, name string) badCall {
		return badCall{what, http.MethodPost, name + "/acquire", hdr(ct, json_, owner, "o2"), ok, 400, []string{"name"}}
	}
	ttl := func(body string) badCall {
		return acq("ttlMs "+body, hdr(ct, json_, owner, "o2"), []byte(`{"ttlMs":`+body+`}`), 400, "ttlMs")
	}
	body := func(what, b string, fields ...string) badCall {
		return acq(what, hdr(ct, json_, owner, "o2"), []byte(b), 400, fields...)
	}
	renew := func(what string, h http.Header, b []byte, status int, fields ...string) badCall {
		return badCall{"renew: " + what, http.MethodPost, "held/renew", h, b, status, fields}
	}
	release := func(what string, h http.Header, status int, fields ...string) badCall {
		return badCall{"release: " + what, http.MethodPost, "held/release", h, nil, status, fields}
	}
	get := func(what, path string, fields ...string) badCall {
		return badCall{"GET: " + what, http.MethodGet, path, nil, nil, 400, fields}
	}
	calls := []badCall{
		acq("no content type", hdr(owner, "o2"), ok, 415, ct),
		acq("text/plain", hdr(ct, "text/plain", owner, "o2"), ok, 415, ct),
		acq("two content types", hdr(ct, json_, ct, json_, owner, "o2"), ok, 415, ct),
		acq("content type before size and headers", hdr(owner, ""), big, 415, ct),
		acq("size before headers", hdr(ct, json_), big, 413, "body"),
		acq("JSON with parameters, bad owner", hdr(ct, "Application/JSON; charset=utf-8", owner, "a b"), ok, 400, owner),
		acq("owner missing", hdr(ct, json_), ok, 400, owner),
		acq("owner empty", hdr(ct, json_, owner, ""), ok, 400, owner),
		acq("owner twice", hdr(ct, json_, owner, "o2", owner, "o3"), ok, 400, owner),
		acq("owner with a space", hdr(ct, json_, owner, "a b"), ok, 400, owner),
		acq("owner with *", hdr(ct, json_, owner, "a*b"), ok, 400, owner),
		acq("owner non-ASCII", hdr(ct, json_, owner, "ä"), ok, 400, owner),
		acq("owner of 129 characters", hdr(ct, json_, owner, long), ok, 400, owner),
		named("name of 129 characters", long),
		named("name with a space", "a%20b"),
		named("name with an escaped slash", "a%2Fb"),
		named("name with *", "a*b"),
		named("name with @", "a@b"),
		named("name non-ASCII", "%C3%A4"),
		ttl("999"), ttl("300001"), ttl("0"), ttl("-1"), ttl("1000.0"), ttl("1e3"), ttl(`"1000"`),
		ttl("null"), ttl("true"), ttl("9223372036854775808"), ttl("{}"),
		body("ttlMs missing", `{}`, "ttlMs"),
		body("malformed JSON", `{`, "body"),
		body("trailing data", `{"ttlMs":1000} {}`, "body"),
		body("unknown member", `{"ttlMs":1000,"ttl":1}`, "ttl"),
		body("duplicate member", `{"ttlMs":1000,"ttlMs":2000}`, "ttlMs"),
		body("an array", `[1000]`, "body"),
		body("null", `null`, "body"),
		body("empty body", ``, "body"),
		{"every fault at once", http.MethodPost, "a*b/acquire", hdr(ct, json_, owner, "a b"), []byte(`{"ttlMs":1}`), 400,
			[]string{"name", owner, "ttlMs"}},

		renew("token missing", hdr(ct, json_, owner, "o1"), ok, 400, tok),
		renew("no content type", hdr(owner, "o1", tok, "1"), ok, 415, ct),
		renew("owner missing", hdr(ct, json_, tok, "1"), ok, 400, owner),
		renew("ttlMs too small", hdr(ct, json_, owner, "o1", tok, "1"), []byte(`{"ttlMs":999}`), 400, "ttlMs"),
		renew("malformed JSON", hdr(ct, json_, owner, "o1", tok, "1"), []byte(`{"ttlMs":`), 400, "body"),
		renew("token twice", hdr(ct, json_, owner, "o1", tok, "1", tok, "1"), ok, 400, tok),
		release("owner missing", hdr(tok, "1"), 400, owner),
		release("token twice", hdr(owner, "o1", tok, "1", tok, "2"), 400, tok),
		release("owner and token bad", hdr(owner, "", tok, "x"), 400, owner, tok),

		get("limit 0", "held/grants?limit=0", "limit"),
		get("limit -1", "held/grants?limit=-1", "limit"),
		get("limit 1001", "held/grants?limit=1001", "limit"),
		get("limit 01", "held/grants?limit=01", "limit"),
		get("limit 1.5", "held/grants?limit=1.5", "limit"),
		get("limit abc", "held/grants?limit=abc", "limit"),
		get("limit empty", "held/grants?limit=", "limit"),
		get("limit twice", "held/grants?limit=1&limit=2", "limit"),
		get("unknown parameter", "held/grants?lmit=5", "lmit"),
		get("lock with a parameter", "held?x=1", "x"),
		get("bad name", "a*b", "name"),
	}
	for _, v := range []string{"", "0", "01", "+1", "-1", "1 2", "abc", "1.0", "0x1", "9223372036854775808", "99999999999999999999"} {
		calls = append(calls,
			renew("token "+v, hdr(ct, json_, owner, "o1", tok, v), ok, 400, tok),
			release("token "+v, hdr(owner, "o1", tok, v), 400, tok))
	}
	return calls
}

// Every malformed call is INVALID_REQUEST with every fault named,
// and writes nothing: neither table changes and no decision is counted.
func TestMalformedRequestsWriteNothing(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.LockdbURL(t)
	pool := pgtest.Pool(t, dbURL)
	s := startServer(t, testConfig(dbURL))
	mustAcquire(t, s.URL, "held", "o1", 300000)

	snapshot := func() string {
		var lease, grants string
		err := pool.QueryRow(context.Background(), `
			SELECT (SELECT coalesce(json_agg(l ORDER BY lock_name), '[]')::text FROM lock_lease l),
			       (SELECT coalesce(json_agg(g ORDER BY lock_name, token), '[]')::text FROM lock_grant g)`).Scan(&lease, &grants)
		if err != nil {
			t.Fatal(err)
		}
		return lease + grants + countersText(t, s.URL)
	}
	before := snapshot()

	for _, c := range badCalls() {
		a, err := send(c.method, s.URL+"/v1/locks/"+c.path, c.header, c.body)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		p := a.problem()
		if a.Status != c.status || p == nil || p.Code != lockapi.CodeInvalidRequest || p.Status != c.status {
			t.Errorf("%s: got %v, want %d INVALID_REQUEST", c.what, a, c.status)
			continue
		}
		var errs []lockapi.FieldError
		if ok, err := p.Member("errors", &errs); !ok || err != nil {
			t.Errorf("%s: no errors member (%v)", c.what, err)
			continue
		}
		var fields []string
		for _, e := range errs {
			if e.Problem == "" {
				t.Errorf("%s: fault on %s without a problem text", c.what, e.Field)
			}
			fields = append(fields, e.Field)
		}
		slices.Sort(fields)
		want := slices.Clone(c.fields)
		slices.Sort(want)
		if !slices.Equal(fields, want) {
			t.Errorf("%s: faults on %v, want %v (%s)", c.what, fields, want, a.Body)
		}
	}
	if after := snapshot(); after != before {
		t.Errorf("malformed calls changed state:\nbefore %s\nafter  %s", before, after)
	}
}

// countersText is the lock_* counter lines of /metrics.
func countersText(t *testing.T, base string) string {
	t.Helper()
	a, err := send(http.MethodGet, base+"/metrics", nil, nil)
	if err != nil || a.Status != http.StatusOK {
		t.Fatalf("metrics: %v %v", a, err)
	}
	var out []string
	for _, line := range strings.Split(string(a.Body), "\n") {
		if strings.HasPrefix(line, "lock_") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// FuzzBindTTL: whatever the body, the binder never panics, and what it accepts
// is exactly {"ttlMs": n} with n within the bounds.
func FuzzBindTTL(f *testing.F) {
	for _, c := range badCalls() {
		if c.body != nil && len(c.body) < 1024 {
			f.Add(c.body)
		}
	}
	f.Add([]byte(`{"ttlMs":1000}`))
	f.Add([]byte(` {"ttlMs" : 300000 } `))
	h := &handler{minTTLMs: 1000, maxTTLMs: 300000}
	f.Fuzz(func(t *testing.T, body []byte) {
		ttl, errs := h.bindTTL(body, nil)
		if len(errs) > 0 {
			return
		}
		if ttl < 1000 || ttl > 300000 {
			t.Fatalf("accepted ttlMs %d out of bounds from %q", ttl, body)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil || len(m) != 1 {
			t.Fatalf("accepted %q, which is not a one-member object (%v)", body, err)
		}
		var n int64
		if err := json.Unmarshal(m["ttlMs"], &n); err != nil || n != ttl {
			t.Fatalf("accepted %q as %d", body, ttl)
		}
	})
}
