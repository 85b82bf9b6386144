package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"lock.dev/api"
)

// The wire protocol end to end: a document loads and lists its keys, a
// conforming exchange matches its template with no finding, a broken one is
// answered with its finding, and a bad document or an unknown one is an error
// on that request alone.
func TestServe(t *testing.T) {
	doc, err := api.Document(api.RailStub)
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, r := range []request{
		{ID: 1, Op: "load", Document: doc},
		{ID: 2, Op: "check", exchange: exchange{Doc: 1, Method: "GET", URL: "http://rail.test/livez", Status: 200,
			RespHeader: http.Header{"Content-Type": {"application/json"}}, RespBody: []byte(`{"status":"UP"}`)}},
		{ID: 3, Op: "check", exchange: exchange{Doc: 1, Method: "GET", URL: "//rail.test/no/such/route", Status: 200,
			RespHeader: http.Header{"Content-Type": {"text/plain"}}, RespBody: []byte("hello")}},
		{ID: 4, Op: "load", Document: []byte(`{"openapi":"3.1.0","info":{"title":"x","version":"1"},"paths":{}}`)},
		{ID: 5, Op: "check", exchange: exchange{Doc: 9, Method: "GET", URL: "/", Status: 200}},
	} {
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := serve(&in, &out); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]answer{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var a answer
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("answer %q: %v", line, err)
		}
		got[a.ID] = a
	}
	if a := got[1]; a.Error != "" || len(a.Documented) == 0 {
		t.Errorf("load: %+v", a)
	}
	if a := got[2]; a.Error != "" || a.Key == nil || *a.Key != (key{"GET", "/livez", 200}) || len(a.Findings) != 0 {
		t.Errorf("conforming check: %+v", a)
	}
	if a := got[3]; a.Key == nil || a.Key.Path != noRoute || len(a.Findings) != 1 || a.Findings[0].Kind != unmatchedRoute {
		t.Errorf("unmatched check: %+v", a)
	}
	if a := got[4]; !strings.Contains(a.Error, "RouteNotFound") {
		t.Errorf("a document without RouteNotFound loaded: %+v", a)
	}
	if a := got[5]; !strings.Contains(a.Error, "no document loaded by request 9") {
		t.Errorf("a check of an unknown document: %+v", a)
	}
}
