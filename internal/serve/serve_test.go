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
	"sync/atomic"
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

// Redact hides passwords, and only passwords, in text bound for a log.
func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`rail health: Get "https://rail-user:s3cr3t@rail.example:443/rail/v1/health": EOF`: `rail health: Get "https://rail-user:xxxxx@rail.example:443/rail/v1/health": EOF`,
		"postgres://app:pa%40ss@db:5432/paydb?sslmode=require":                             "postgres://app:xxxxx@db:5432/paydb?sslmode=require",
		"host=db user=app password=s3cr3t dbname=paydb":                                    "host=db user=app password=xxxxx dbname=paydb",
		"host=db password='s3 cr\\'et' dbname=paydb":                                       "host=db password=xxxxx dbname=paydb",
		"failed to connect to `user=app database=paydb`: 10.0.0.7:5432: dial error":        "failed to connect to `user=app database=paydb`: 10.0.0.7:5432: dial error",
		"http://rail.example:8084/rail/v1/health":                                          "http://rail.example:8084/rail/v1/health",
		"http://only-user@rail.example/":                                                   "http://only-user@rail.example/",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// Readiness says DOWN without the check's error (it names hosts,
// users, databases); the reason goes to the log, redacted, once per change.
func TestReadinessDetailsGoToTheLog(t *testing.T) {
	t.Parallel()
	var logs logcapture.Buffer
	logger, err := NewLogger(&logs, "test", "info")
	if err != nil {
		t.Fatal(err)
	}
	h := NewHealth()
	h.SetLogger(logger)
	var fail atomic.Bool
	fail.Store(true)
	h.Add("db", func(context.Context) error {
		if fail.Load() {
			return errors.New("failed to connect to `user=app database=paydb`: postgres://app:s3cr3t@10.0.0.7:5432/paydb: refused")
		}
		return nil
	})
	for range 3 {
		up, comps := h.Ready(context.Background())
		if up || comps["db"].Status != "DOWN" || comps["db"].Detail != downDetail {
			t.Fatalf("readiness: %v %+v", up, comps)
		}
	}
	down := logs.Events("readiness_down")
	if len(down) != 1 || down[0]["component"] != "db" {
		t.Fatalf("readiness_down: %v", down)
	}
	if e, _ := down[0]["error"].(string); !strings.Contains(e, "10.0.0.7") || strings.Contains(e, "s3cr3t") {
		t.Fatalf("logged reason %q: want the details, without the password", e)
	}
	fail.Store(false)
	if up, comps := h.Ready(context.Background()); !up || comps["db"].Detail != "ok" {
		t.Fatalf("readiness after recovery: %v %+v", up, comps)
	}
	if ev := logs.Events("readiness_up"); len(ev) != 1 {
		t.Fatalf("readiness_up: %v", ev)
	}
}
