package railstub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lock.dev/lockapi"
)

func fileLines(t *testing.T, path string) []Call {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []Call
	for line := range bytes.Lines(b) {
		var c Call
		if err := json.Unmarshal(line, &c); err != nil {
			t.Fatalf("file line %q: %v", line, err)
		}
		out = append(out, c)
	}
	return out
}

// The call-log file survives a restart: a stub started on it shows the calls of
// the one before (dropped and declined ones too) and seq continues. DELETE empties
// memory and file alike, and the next call is seq 1 again.
func TestCallLogFileSurvivesRestartAndReset(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	withFile := func(c *Config) { c.CallLogPath = path }

	first := startStub(t, withFile)
	pay(t, first, payment("p-1"))
	if _, err := first.Client.SetChaos(t.Context(), 0, 1, 0, nil); err != nil {
		t.Fatal(err)
	}
	pay(t, first, payment("p-2"))
	if _, err := first.Client.SetChaos(t.Context(), 0, 0, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Client.Pay(t.Context(), payment("p-3")); !isDropped(err) {
		t.Fatalf("want a dropped call, got %v", err)
	}
	before := calls(t, first)
	inFile := fileLines(t, path)
	if len(before) != 3 || len(inFile) != 3 {
		t.Fatalf("%d calls in memory, %d in the file, want 3 and 3", len(before), len(inFile))
	}
	for i := range before {
		if !sameCall(before[i], inFile[i]) {
			t.Fatalf("file line %d = %+v, memory %+v", i, inFile[i], before[i])
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := startStub(t, withFile)
	after := calls(t, second)
	if len(after) != 3 {
		t.Fatalf("restarted stub shows %d calls, want 3", len(after))
	}
	for i := range before {
		if !sameCall(before[i], after[i]) {
			t.Fatalf("after restart call %d = %+v, want %+v", i, after[i], before[i])
		}
	}
	if after[1].Result != ResultDeclined || after[1].Reason != DeclineReason || after[0].Reason != "" || !after[2].Dropped {
		t.Fatalf("flags lost across restart: %+v", after)
	}
	pay(t, second, payment("p-4"))
	if cs := calls(t, second); len(cs) != 4 || cs[3].Seq != 4 {
		t.Fatalf("after restart the next call is not seq 4: %+v", cs)
	}

	if err := second.Client.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Fatalf("after DELETE the file is %v bytes (err %v), want 0", fi.Size(), err)
	}
	if cs := calls(t, second); len(cs) != 0 {
		t.Fatalf("after DELETE %d calls remain", len(cs))
	}
	pay(t, second, payment("p-5"))
	if cs := fileLines(t, path); len(cs) != 1 || cs[0].Seq != 1 || cs[0].Reference != "p-5" {
		t.Fatalf("after DELETE the file holds %+v, want p-5 as seq 1", cs)
	}
}

// A torn last line (the process died inside the write, before answering) is cut
// off at start; seq continues after the last whole line.
func TestCallLogTornLastLineIsCut(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	whole := `{"seq":1,"receivedAt":"2026-01-02T03:04:05.123456789Z","reference":"p-1","accountId":"a","amountMinor":1,"currency":"EUR","beneficiary":"B1234","result":"ACCEPTED","railReference":"RS-X","latencyMs":0,"dropped":false}` + "\n"
	if err := os.WriteFile(path, []byte(whole+`{"seq":2,"receivedAt":"2026-01-02T03:04:06Z","refer`), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := startStub(t, func(c *Config) { c.CallLogPath = path })
	if ev := ts.logs.events(t, "call_log_torn"); len(ev) != 1 || ev[0]["level"] != "WARN" {
		t.Fatalf("call_log_torn log = %v, want one WARN", ev)
	}
	if b, _ := os.ReadFile(path); string(b) != whole {
		t.Fatalf("file after start = %q, want only the whole line", b)
	}
	pay(t, ts, payment("p-2"))
	cs := calls(t, ts)
	if len(cs) != 2 || cs[0].RailReference != "RS-X" || cs[1].Seq != 2 {
		t.Fatalf("calls = %+v", cs)
	}
}

// A stub refuses to start on books it cannot read.
func TestCallLogUnreadableFileIsRefused(t *testing.T) {
	t.Parallel()
	line := func(seq int) string {
		return `{"seq":` + string(rune('0'+seq)) + `,"receivedAt":"2026-01-02T03:04:05Z","reference":"p","accountId":"a","amountMinor":1,"currency":"EUR","beneficiary":"B","result":"ACCEPTED","railReference":"RS-X","latencyMs":0,"dropped":false}` + "\n"
	}
	for name, content := range map[string]string{
		"garbage line":      line(1) + "not json\n" + line(3),
		"seq backwards":     line(2) + line(1),
		"seq repeated":      line(1) + line(1),
		"unknown result":    strings.Replace(line(1), "ACCEPTED", "MAYBE", 1),
		"empty middle line": line(1) + "\n" + line(2),
	} {
		path := filepath.Join(t.TempDir(), "calls.jsonl")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.CallLogPath, cfg.LogOutput = path, &syncBuffer{}
		if s, err := New(cfg); err == nil {
			s.Close()
			t.Errorf("%s: New accepted the file", name)
		}
	}
}

// When the file cannot be written the stub books nothing and makes no payment:
// 503 UNAVAILABLE, no call in memory, and its health goes DOWN.
func TestCallLogWriteFailureRefusesPayments(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	ts := startStub(t, func(c *Config) { c.CallLogPath = path })
	// The file stops taking writes under the stub: swap in a read-only handle.
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ts.calls.mu.Lock()
	_ = ts.calls.file.Close()
	ts.calls.file = ro
	ts.calls.mu.Unlock()
	problem(t, pay(t, ts, payment("p-1")), http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	if cs := calls(t, ts); len(cs) != 0 {
		t.Fatalf("a call the file did not take was booked: %+v", cs)
	}
	if err := ts.Client.Health(t.Context()); err == nil {
		t.Fatal("health is UP with a failed call log")
	}
	if ev := ts.logs.events(t, "rail_call_refused"); len(ev) != 1 || ev[0]["level"] != "ERROR" {
		t.Fatalf("rail_call_refused log = %v", ev)
	}
}

// After Close a stub books nothing: a payment is refused with 503, unbooked.
func TestClosedStubRefusesPayments(t *testing.T) {
	t.Parallel()
	ts := startStub(t, nil)
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	problem(t, pay(t, ts, payment("p-1")), http.StatusServiceUnavailable, lockapi.CodeUnavailable)
	if cs := calls(t, ts); len(cs) != 0 {
		t.Fatalf("booked after Close: %+v", cs)
	}
}

// GET /rail/v1/calls pages by after/limit in arrival order; the Client follows
// the pages past 10 000; malformed paging is INVALID_REQUEST.
func TestCallsPaging(t *testing.T) {
	t.Parallel()
	ts := startStub(t, nil)
	raw, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/rail/v1/calls", "", nil)
	if err != nil || raw.status != http.StatusOK || strings.TrimSpace(string(raw.body)) != `{"calls":[]}` {
		t.Fatalf("empty list = %d %s (%v), want {\"calls\":[]}", raw.status, raw.body, err)
	}
	const n = MaxPageLimit + 5
	for i := range n {
		if _, err := ts.calls.record(func(c *Call) {
			// A call as the stub books one (the OpenAPI document pins every field).
			p := payment("p-" + string(rune('a'+i%26)))
			c.Reference, c.AccountID, c.AmountMinor, c.Currency, c.Beneficiary = p.Reference, p.AccountID, p.AmountMinor, p.Currency, p.Beneficiary
			c.Result, c.RailReference = ResultAccepted, fmt.Sprintf("RS-%026d", i)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		after int64
		limit int
		first int64
		count int
	}{{0, 10, 1, 10}, {10, 10, 11, 10}, {n - 3, 10, n - 2, 3}, {n, 10, 0, 0}, {0, MaxPageLimit, 1, MaxPageLimit}} {
		page, err := ts.Client.CallsPage(t.Context(), tc.after, tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) != tc.count || (tc.count > 0 && (page[0].Seq != tc.first || page[len(page)-1].Seq != tc.first+int64(tc.count)-1)) {
			t.Fatalf("after=%d limit=%d: %d calls from seq %v, want %d from %d", tc.after, tc.limit, len(page), page[0].Seq, tc.count, tc.first)
		}
	}
	def, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/rail/v1/calls?after=2", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var list CallList
	if err := json.Unmarshal(def.body, &list); err != nil || len(list.Calls) != MaxPageLimit || list.Calls[0].Seq != 3 {
		t.Fatalf("default limit: %d calls from %d (%v), want %d from 3", len(list.Calls), list.Calls[0].Seq, err, MaxPageLimit)
	}
	all, err := ts.Client.Calls(t.Context())
	if err != nil || len(all) != n || all[n-1].Seq != n {
		t.Fatalf("Client.Calls: %d calls (%v), want %d", len(all), err, n)
	}
	for _, q := range []string{"limit=10001", "limit=0", "limit=-1", "limit=abc", "limit=1.5", "limit=", "limit=1&limit=2",
		"after=-1", "after=x", "after=01", "after=+1", "after=99999999999999999999"} {
		r, err := send(t.Context(), http.DefaultClient, ts.URL, http.MethodGet, "/rail/v1/calls?"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		p := problem(t, r, http.StatusBadRequest, lockapi.CodeInvalidRequest)
		if f := fields(t, p); len(f) != 1 || !strings.HasPrefix(q, f[0]+"=") {
			t.Errorf("%s: fault fields %v", q, f)
		}
	}
}
