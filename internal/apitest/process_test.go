package apitest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"lock.dev/api"
)

// A validator that dies fails every exchange it did not check, with a
// CheckFailed finding: the traffic is never taken as conforming unchecked.
func TestDeadValidatorIsAFinding(t *testing.T) {
	p, err := startProcess() // a process of its own: the shared one serves the other tests
	if err != nil {
		t.Fatal(err)
	}
	doc, err := api.Document(api.RailStub)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newChecker(api.RailStub, p, doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"UP"}`))
	})))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/livez")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	fs := c.Findings()
	if len(fs) != 1 || fs[0].Kind != CheckFailed || !strings.Contains(fs[0].Detail, "validator") {
		t.Fatalf("findings after the validator died: %v; want one %q", fs, CheckFailed)
	}
	if len(c.Seen()) != 0 {
		t.Fatalf("an unchecked exchange was recorded as seen: %v", c.Seen())
	}
}
