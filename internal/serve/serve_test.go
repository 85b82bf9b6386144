package serve

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/logcapture"
	"lock.dev/lockapi"
)

func TestSettingsFlagWinsOverEnv(t *testing.T) {
	env := map[string]string{"RAIL_READ_TIMEOUT": "3s", "PAYDB_MAX_CONNS": "7"}
	s := NewSettings("x", func(k string) string { return env[k] })
	var d time.Duration
	var n int
	s.Duration(&d, "RAIL_READ_TIMEOUT", 2*time.Second, "read bound")
	s.Int(&n, "PAYDB_MAX_CONNS", 20, "pool size")
	if _, err := s.Parse([]string{"--rail-read-timeout=150ms"}); err != nil {
		t.Fatal(err)
	}
	if d != 150*time.Millisecond || n != 7 {
		t.Fatalf("got %v %d; want flag 150ms and env 7", d, n)
	}
}

func TestSettingsBadEnvNamesVariable(t *testing.T) {
	s := NewSettings("x", func(k string) string { return map[string]string{"RAIL_READ_TIMEOUT": "2 seconds"}[k] })
	var d time.Duration
	s.Duration(&d, "RAIL_READ_TIMEOUT", 2*time.Second, "read bound")
	_, err := s.Parse(nil)
	var ue *UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "RAIL_READ_TIMEOUT") {
		t.Fatalf("want a UsageError naming RAIL_READ_TIMEOUT, got %v", err)
	}
	if code := ExitCode(err, io.Discard); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	_, err = NewSettings("x", func(string) string { return "" }).Parse([]string{"--help"})
	if !errors.Is(err, ErrHelp) || ExitCode(err, io.Discard) != 0 {
		t.Fatalf("--help: %v", err)
	}
}

func TestHandlerProblemForUnknownRouteAndMethod(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/things", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("GET /boom", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	srv := httptest.NewServer(Handler(mux, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	cases := []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/nope", 404, lockapi.CodeNotFound},
		{"GET", "/v1/things", 405, lockapi.CodeMethodNotAllowed},
		{"GET", "/boom", 500, lockapi.CodeInternal},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Status int    `json:"status"`
			Code   string `json:"code"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != c.status || p.Code != c.code || p.Status != c.status ||
			resp.Header.Get("Content-Type") != lockapi.ContentTypeProblem {
			t.Errorf("%s %s: %d %+v %q", c.method, c.path, resp.StatusCode, p, resp.Header.Get("Content-Type"))
		}
		if c.status == 405 && resp.Header.Get("Allow") != "POST" {
			t.Errorf("Allow = %q", resp.Header.Get("Allow"))
		}
	}
}

func TestReadinessDownWhileDraining(t *testing.T) {
	h := NewHealth()
	h.Add("db", func(ctx context.Context) error { return nil })
	if up, _ := h.Ready(t.Context()); !up {
		t.Fatal("want UP")
	}
	h.Drain()
	if up, comps := h.Ready(t.Context()); up || comps["lifecycle"].Status != "DOWN" {
		t.Fatalf("draining: up=%v %v", up, comps)
	}
}

// A malformed request is said in the log: which fields broke which rule, never the
// values sent.
func TestHandlerLogsMalformedRequests(t *testing.T) {
	var logs logcapture.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/things", func(w http.ResponseWriter, r *http.Request) {
		lockapi.WriteInvalid(w, http.StatusBadRequest, []lockapi.FieldError{{Field: "beneficiary", Problem: "must be 1–128 characters"}})
	})
	srv := httptest.NewServer(Handler(mux, logger))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/things", "application/json", strings.NewReader(`{"beneficiary":"SECRET-IBAN-1234"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ev := logs.Events("request_refused")
	if len(ev) != 1 || ev[0]["code"] != lockapi.CodeInvalidRequest || ev[0]["route"] != "POST /v1/things" {
		t.Fatalf("request_refused lines: %v", ev)
	}
	if !strings.Contains(logs.String(), `"field":"beneficiary"`) || strings.Contains(logs.String(), "SECRET-IBAN") {
		t.Fatalf("log must name the field and not the value: %s", logs.String())
	}
}
