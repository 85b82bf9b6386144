package grant_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/grant"
	"lock.dev/internal/logcapture"
	"lock.dev/lockapi"
)

func newGate(t *testing.T, keys *grant.KeySet) (*grant.Gate, *prometheus.Registry, *logcapture.Buffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &logcapture.Buffer{}
	g, err := grant.NewGate(keys, 0, reg, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return g, reg, logs
}

func check(g *grant.Gate, grants ...string) (*httptest.ResponseRecorder, bool) {
	r := httptest.NewRequest(http.MethodPost, "/v1/rail/submissions", nil)
	for _, s := range grants {
		r.Header.Add(lockapi.HeaderFencingGrant, s)
	}
	w := httptest.NewRecorder()
	ok := g.Check(w, r, grant.Fenced{AccountID: "acct-1", PayoutID: "p-1", Token: 42, OwnerID: "executor-1"})
	return w, ok
}

// A refusal is 401 GRANT_REJECTED with the challenge and the reason, counted
// under its reason and logged at WARN without the grant.
func TestGateRefusal(t *testing.T) {
	k := newKeyPair(t)
	g, reg, logs := newGate(t, k.Set)
	real := k.Sign(t, "account:acct-1", 41, "executor-1") // one below X-Fencing-Token

	w, ok := check(g, real)
	if ok {
		t.Fatal("a grant of another token passed the gate")
	}
	if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") != `LockGrant realm="lock.dev"` ||
		!strings.HasPrefix(w.Header().Get("Content-Type"), lockapi.ContentTypeProblem) {
		t.Errorf("answer %d, WWW-Authenticate %q, Content-Type %q", w.Code, w.Header().Get("WWW-Authenticate"), w.Header().Get("Content-Type"))
	}
	var body map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body["code"] != "GRANT_REJECTED" || body["reason"] != "token_mismatch" || body["status"] != 401.0 {
		t.Errorf("problem %v", body)
	}
	if v := rejected(t, reg)["token_mismatch"]; v != 1 {
		t.Errorf("grant_rejected_total{reason=token_mismatch} = %v, want 1", v)
	}
	ev := logs.Events("grant_rejected")
	if len(ev) != 1 || ev[0]["level"] != "WARN" || ev[0]["reason"] != "token_mismatch" || ev[0]["accountId"] != "acct-1" ||
		ev[0]["ownerId"] != "executor-1" || ev[0]["presentedToken"] != 42.0 {
		t.Errorf("grant_rejected log: %v", ev)
	}
	for _, part := range strings.Split(real, ".") {
		if strings.Contains(logs.String(), part) || strings.Contains(w.Body.String(), part) {
			t.Errorf("a part of the grant was logged or answered")
		}
	}
}

// rejected reads grant_rejected_total by reason from reg.
func rejected(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "grant_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return out
}

// The header absent, empty or given twice.
func TestGateHeader(t *testing.T) {
	k := newKeyPair(t)
	g, _, _ := newGate(t, k.Set)
	real := k.Sign(t, "account:acct-1", 42, "executor-1")
	for name, c := range map[string]struct {
		grants []string
		reason string
	}{
		"absent":      {nil, "missing"},
		"empty":       {[]string{""}, "missing"},
		"given twice": {[]string{real, real}, "malformed"},
	} {
		w, ok := check(g, c.grants...)
		var body map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &body)
		if ok || w.Code != 401 || body["reason"] != c.reason {
			t.Errorf("%s: ok=%v %d %v, want 401 %s", name, ok, w.Code, body, c.reason)
		}
	}
	if w, ok := check(g, real); !ok || w.Body.Len() != 0 {
		t.Errorf("the real grant: ok=%v, answer %q", ok, w.Body.String())
	}
}

// Every reason's series exists at zero from the start, with or without keys;
// without keys every request passes and the start-up log warns.
func TestGateWithoutKeys(t *testing.T) {
	g, reg, logs := newGate(t, nil)
	if n := len(rejected(t, reg)); n != len(grant.Reasons) {
		t.Errorf("grant_rejected_total has %d series, want %d", n, len(grant.Reasons))
	}
	if g.Verifying() {
		t.Error("a gate without keys says it verifies")
	}
	if _, ok := check(g); !ok {
		t.Error("without keys a request without a grant was refused")
	}
	g.Announce("RAIL_PROXY_GRANT_KEYS_FILE", 0)
	ev := logs.Events("grants_not_verified")
	if len(ev) != 1 || ev[0]["level"] != "WARN" || !strings.Contains(ev[0]["msg"].(string), "RAIL_PROXY_GRANT_KEYS_FILE") {
		t.Errorf("start-up warning: %v", ev)
	}

	k := newKeyPair(t)
	g2, reg2, logs2 := newGate(t, k.Set)
	if n := len(rejected(t, reg2)); n != len(grant.Reasons) {
		t.Errorf("with keys, grant_rejected_total has %d series, want %d", n, len(grant.Reasons))
	}
	g2.Announce("PAYMENT_GRANT_KEYS_FILE", 1)
	if ev := logs2.Events("grants_verified"); len(ev) != 1 || len(logs2.Events("grants_not_verified")) != 0 {
		t.Errorf("start-up log with keys: %s", logs2.String())
	}
}
