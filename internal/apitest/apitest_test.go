package apitest_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/apitest"
	"lock.dev/internal/railstub"
)

// railStub is a real rail-stub handler: it needs no database, so this package's
// tests check real answers against a real document.
func railStub(t *testing.T) http.Handler {
	t.Helper()
	cfg := railstub.DefaultConfig()
	cfg.LogOutput = io.Discard
	seed := int64(7)
	cfg.Seed = &seed
	s, err := railstub.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.Handler()
}

func checker(t *testing.T) *apitest.Checker {
	t.Helper()
	c, err := apitest.New(api.RailStub)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type call struct {
	method, path, contentType, body string
	want                            int
}

func do(t *testing.T, client *http.Client, base string, c call) {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, base+c.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != c.want {
		t.Fatalf("%s %s: status %d, want %d", c.method, c.path, resp.StatusCode, c.want)
	}
}

const payment = `{"reference":"p-1","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`

// Traffic that keeps to the document — success, refusals, a decline in the
// rail's own format, an unknown route, a wrong method — leaves no finding, and
// every answer is recorded under its path template.
func TestConformingTrafficHasNoFindings(t *testing.T) {
	c := checker(t)
	srv := httptest.NewServer(c.Handler(railStub(t)))
	defer srv.Close()
	for _, x := range []call{
		{"POST", "/rail/v1/payments", "application/json", payment, 200},
		{"POST", "/rail/v1/payments", "application/json", `{"reference":"p-2"}`, 400},
		{"POST", "/rail/v1/payments", "text/plain", payment, 415},
		{"POST", "/rail/v1/payments", "application/json", strings.Repeat(" ", 70<<10), 413},
		{"PUT", "/rail/v1/admin/chaos", "application/json", `{"declineRate":1}`, 200},
		{"POST", "/rail/v1/payments", "application/json", payment, 422},
		{"GET", "/rail/v1/admin/chaos", "", "", 200},
		{"PUT", "/rail/v1/admin/chaos", "application/json", `{"declineRate":2}`, 400},
		{"GET", "/rail/v1/health", "", "", 200},
		{"GET", "/livez", "", "", 200},
		{"GET", "/readyz", "", "", 200},
		{"GET", "/metrics", "", "", 200},
		{"GET", "/openapi.json", "", "", 200},
		{"GET", "/no/such/route", "", "", 404},
		{"PATCH", "/rail/v1/admin/chaos", "", "", 405},
	} {
		do(t, srv.Client(), srv.URL, x)
	}
	c.Report(t)
	seen := c.Seen()
	for _, k := range []apitest.Key{
		{Method: "POST", Path: "/rail/v1/payments", Status: 200},
		{Method: "POST", Path: "/rail/v1/payments", Status: 422},
		{Method: "POST", Path: "/rail/v1/payments", Status: 413},
		{Method: "GET", Path: apitest.NoRoute, Status: 404},
		{Method: "PATCH", Path: apitest.NoRoute, Status: 405},
	} {
		if seen[k] != 1 {
			t.Errorf("%s seen %d times, want 1 (seen: %v)", k, seen[k], seen)
		}
	}
	missing := c.Missing()
	if !slices.Contains(missing, apitest.Key{Method: "DELETE", Path: "/rail/v1/calls", Status: 204}) {
		t.Errorf("Missing() = %v, lacks the never-exercised DELETE /rail/v1/calls 204", missing)
	}
	if slices.Contains(missing, apitest.Key{Method: "POST", Path: "/rail/v1/payments", Status: 200}) {
		t.Errorf("Missing() = %v lists an exercised answer", missing)
	}
	if len(c.Missing(missing...)) != 0 {
		t.Errorf("Missing(exempt...) does not leave out the exempt answers")
	}
}

// tamper rewrites one answer of the real rail-stub, the way a handler change
// that forgot the document would.
func tamper(next http.Handler, path string, rewrite func(status int, body []byte) (int, []byte)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		status, body := rewrite(rec.Code, rec.Body.Bytes())
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = w.Write(body)
	})
}

func findingsOf(t *testing.T, c *apitest.Checker, h http.Handler, x call) []apitest.Finding {
	t.Helper()
	srv := httptest.NewServer(c.Handler(h))
	defer srv.Close()
	do(t, srv.Client(), srv.URL, x)
	return c.Findings()
}

func wantFinding(t *testing.T, fs []apitest.Finding, kind, detail string) {
	t.Helper()
	for _, f := range fs {
		if f.Kind == kind && strings.Contains(f.Detail+f.Key.String(), detail) {
			return
		}
	}
	t.Fatalf("no %q finding mentioning %q among %v", kind, detail, fs)
}

// An answer with a status the operation does not document is a finding.
func TestUndocumentedStatusIsAFinding(t *testing.T) {
	h := tamper(railStub(t), "/rail/v1/admin/chaos", func(_ int, b []byte) (int, []byte) { return http.StatusTeapot, b })
	fs := findingsOf(t, checker(t), h, call{"GET", "/rail/v1/admin/chaos", "", "", http.StatusTeapot})
	wantFinding(t, fs, apitest.UndocumentedStatus, "GET /rail/v1/admin/chaos 418")
}

// A member the schema does not list is a finding: the documents pin their
// members, so a handler that grows one must grow the document too.
func TestUndocumentedMemberIsAFinding(t *testing.T) {
	h := tamper(railStub(t), "/rail/v1/admin/chaos", func(s int, b []byte) (int, []byte) {
		return s, bytes.Replace(b, []byte(`{`), []byte(`{"burstMs":5,`), 1)
	})
	fs := findingsOf(t, checker(t), h, call{"GET", "/rail/v1/admin/chaos", "", "", 200})
	wantFinding(t, fs, apitest.InvalidResponse, "burstMs")
}

// So is a missing required member, and a problem whose code is not one the
// answer documents.
func TestMissingMemberAndWrongCodeAreFindings(t *testing.T) {
	h := tamper(railStub(t), "/rail/v1/payments", func(s int, b []byte) (int, []byte) {
		if s == http.StatusOK {
			return s, []byte(`{"status":"ACCEPTED"}`)
		}
		return s, bytes.Replace(b, []byte(`"INVALID_REQUEST"`), []byte(`"FENCED_OUT"`), 1)
	})
	c := checker(t)
	fs := findingsOf(t, c, h, call{"POST", "/rail/v1/payments", "application/json", payment, 200})
	wantFinding(t, fs, apitest.InvalidResponse, "railReference")
	fs = findingsOf(t, c, h, call{"POST", "/rail/v1/payments", "application/json", "{}", 400})
	wantFinding(t, fs, apitest.InvalidResponse, "POST /rail/v1/payments 400")
}

// A problem's status member must be the HTTP status.
func TestProblemStatusMismatchIsAFinding(t *testing.T) {
	h := tamper(railStub(t), "/rail/v1/payments", func(s int, b []byte) (int, []byte) {
		return http.StatusBadRequest, b // a 415 problem sent as 400
	})
	fs := findingsOf(t, checker(t), h, call{"POST", "/rail/v1/payments", "text/plain", payment, 400})
	wantFinding(t, fs, apitest.ProblemStatusMismatch, `"status":415`)
}

// A server that accepts what the document forbids is a finding.
func TestAcceptingAForbiddenRequestIsAFinding(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ACCEPTED","railReference":"RS-AAAAAAAAAAAAAAAAAAAAAAAAAA"}`))
	})
	fs := findingsOf(t, checker(t), h, call{"POST", "/rail/v1/payments", "application/json", `{"reference":"p-1","amountMinor":-5}`, 200})
	wantFinding(t, fs, apitest.AcceptedInvalid, "POST /rail/v1/payments 200")
}

// An undocumented route must be the document's 404, an undocumented method its
// 405 with Allow.
func TestUnmatchedRouteMustBeTheDocumented404And405(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPatch {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = w.Write([]byte(`{"type":"https://lock.dev/problems/method-not-allowed","title":"Method not allowed","status":405,"detail":"no","code":"METHOD_NOT_ALLOWED"}`))
			return
		}
		_, _ = w.Write([]byte("hello"))
	})
	c := checker(t)
	fs := findingsOf(t, c, h, call{"GET", "/hello", "", "", 200})
	wantFinding(t, fs, apitest.UnmatchedRoute, "want 404")
	fs = findingsOf(t, c, h, call{"PATCH", "/rail/v1/calls", "", "", 405})
	wantFinding(t, fs, apitest.UnmatchedRoute, "405 without an Allow header")
}

// The round-tripper checks what a client sees; a body on an answer documented
// without one is a finding.
func TestRoundTripper(t *testing.T) {
	c := checker(t)
	srv := httptest.NewServer(railStub(t))
	defer srv.Close()
	client := &http.Client{Transport: c.RoundTripper(nil)}
	do(t, client, srv.URL, call{"POST", "/rail/v1/payments", "application/json", payment, 200})
	do(t, client, srv.URL, call{"DELETE", "/rail/v1/calls", "", "", 204})
	c.Report(t)
	if n := c.Seen()[apitest.Key{Method: "DELETE", Path: "/rail/v1/calls", Status: 204}]; n != 1 {
		t.Fatalf("DELETE /rail/v1/calls 204 seen %d times through the round-tripper", n)
	}

	canned := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 204, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("surprise")), Request: r}, nil
	})
	c2 := checker(t)
	do(t, &http.Client{Transport: c2.RoundTripper(canned)}, "http://rail.test", call{"DELETE", "/rail/v1/calls", "", "", 204})
	wantFinding(t, c2.Findings(), apitest.UnexpectedBody, "surprise")
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A dropped connection (rail-stub's chaos hijacks it) has no answer to check:
// no finding, no panic, and the caller still sees the drop.
func TestDroppedConnectionIsNotChecked(t *testing.T) {
	c := checker(t)
	srv := httptest.NewServer(c.Handler(railStub(t)))
	defer srv.Close()
	do(t, srv.Client(), srv.URL, call{"PUT", "/rail/v1/admin/chaos", "application/json", `{"dropRate":1}`, 200})
	req, _ := http.NewRequest("POST", srv.URL+"/rail/v1/payments", strings.NewReader(payment))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := srv.Client().Do(req); err == nil {
		_ = resp.Body.Close()
		t.Fatalf("a dropped payment answered %d", resp.StatusCode)
	}
	c.Report(t)
	if n := len(c.Seen()); n != 1 {
		t.Fatalf("seen %v; want only the chaos PUT", c.Seen())
	}
}

func TestServesDocument(t *testing.T) {
	apitest.ServesDocument(t, railStub(t), api.RailStub)
	rec := &recordingTB{}
	apitest.ServesDocument(rec, railStub(t), api.LockServer)
	if len(rec.errors) != 1 {
		t.Fatalf("rail-stub passed for lock-server's document: %v", rec.errors)
	}
}

type recordingTB struct{ errors []string }

func (r *recordingTB) Helper() {}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, format)
}
