package apitest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"lock.dev/api"
	"lock.dev/internal/railstub"
)

// fakeTB records what Track tells a test, and runs its cleanups on demand.
type fakeTB struct {
	errors   []string
	cleanups []func()
}

func (f *fakeTB) Helper()                   {}
func (f *fakeTB) Cleanup(fn func())         { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Errorf(s string, a ...any) { f.errors = append(f.errors, fmt.Sprintf(s, a...)) }
func (f *fakeTB) end() {
	for _, fn := range slices.Backward(f.cleanups) {
		fn()
	}
}

func stubHandler(t *testing.T) http.Handler {
	t.Helper()
	cfg := railstub.DefaultConfig()
	cfg.LogOutput = io.Discard
	s, err := railstub.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.Handler()
}

// teapot answers every request 418, a status no operation documents.
var teapot = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })

func get(t *testing.T, client *http.Client, url string) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}

// Each finding goes to the test that tracks the server of its exchange, when
// that test ends; a tracked round-tripper leaves servers nobody tracks alone.
func TestTrackReportsToTheOwningTest(t *testing.T) {
	c := MustNew(api.RailStub)
	bad, good, other := httptest.NewServer(teapot), httptest.NewServer(stubHandler(t)), httptest.NewServer(teapot)
	defer bad.Close()
	defer good.Close()
	defer other.Close()
	ta, tb := &fakeTB{}, &fakeTB{}
	c.Track(ta, bad.URL)
	c.Track(tb, good.URL)
	client := &http.Client{Transport: c.TrackedRoundTripper(nil)}
	get(t, client, bad.URL+"/rail/v1/admin/chaos")
	get(t, client, good.URL+"/rail/v1/admin/chaos")
	get(t, client, other.URL+"/rail/v1/admin/chaos") // nobody's: not checked
	if len(ta.errors)+len(tb.errors) != 0 {
		t.Fatalf("told before the tests ended: %v %v", ta.errors, tb.errors)
	}
	ta.end()
	tb.end()
	if len(ta.errors) != 1 || !strings.Contains(ta.errors[0], UndocumentedStatus) || !strings.Contains(ta.errors[0], "GET /rail/v1/admin/chaos 418") {
		t.Errorf("the owner of the bad server was told %v; want one undocumented-status finding", ta.errors)
	}
	if len(tb.errors) != 0 {
		t.Errorf("the owner of the good server was told %v", tb.errors)
	}
	get(t, client, bad.URL+"/rail/v1/admin/chaos") // its test has ended: no longer checked
	seen := c.Seen()
	if seen[Key{"GET", "/rail/v1/admin/chaos", 418}] != 1 || seen[Key{"GET", "/rail/v1/admin/chaos", 200}] != 1 || len(seen) != 2 {
		t.Errorf("seen %v; want one 418 and one 200", seen)
	}
	var out bytes.Buffer
	if code := c.finish(0, true, &out); code != 0 {
		t.Errorf("finish after every finding was told: %d\n%s", code, out.String())
	}
}

// A wrapped handler's findings go to the test tracking the server's URL.
func TestTrackHandler(t *testing.T) {
	c := MustNew(api.RailStub)
	srv := httptest.NewServer(c.Handler(teapot))
	defer srv.Close()
	tt := &fakeTB{}
	c.Track(tt, srv.URL)
	get(t, srv.Client(), srv.URL+"/rail/v1/health")
	tt.end()
	if len(tt.errors) != 1 || !strings.Contains(tt.errors[0], "GET /rail/v1/health 418") {
		t.Errorf("told %v; want the 418", tt.errors)
	}
}

// Finish fails the run on a finding no test was told of, on a documented answer
// never seen that no exemption names, and on an exemption that names nothing;
// a narrowed run does not judge coverage.
func TestFinish(t *testing.T) {
	c := MustNew(api.RailStub)
	srv := httptest.NewServer(c.Handler(stubHandler(t)))
	defer srv.Close()
	get(t, srv.Client(), srv.URL+"/rail/v1/admin/chaos")
	all := Exempt("", "", 0, "everything, for the test")
	var out bytes.Buffer
	if code := c.finish(0, false, &out); code != 1 || !strings.Contains(out.String(), "\tDELETE /rail/v1/calls 204") ||
		strings.Contains(out.String(), "GET /rail/v1/admin/chaos 200") {
		t.Errorf("finish with answers never seen = %d:\n%s", code, out.String())
	}
	out.Reset()
	if code := c.finish(0, false, &out, all); code != 0 {
		t.Errorf("finish with every answer exempt = %d:\n%s", code, out.String())
	}
	out.Reset()
	if code := c.finish(0, false, &out, all, Exempt("GET", "/no/such/path", 200, "a typo")); code != 1 || !strings.Contains(out.String(), "names no documented answer") {
		t.Errorf("finish with an exemption of nothing = %d:\n%s", code, out.String())
	}
	out.Reset()
	if code := c.finish(3, true, &out); code != 3 || out.Len() != 0 {
		t.Errorf("narrowed finish = %d:\n%s", code, out.String())
	}

	bad := httptest.NewServer(c.Handler(teapot)) // nobody tracks it
	defer bad.Close()
	get(t, bad.Client(), bad.URL+"/rail/v1/health")
	out.Reset()
	if code := c.finish(0, true, &out); code != 1 || !strings.Contains(out.String(), "GET /rail/v1/health 418") {
		t.Errorf("finish with a finding nobody was told of = %d:\n%s", code, out.String())
	}
}
