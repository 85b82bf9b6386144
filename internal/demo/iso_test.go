package demo

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/invariants"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/stack"
)

// TestISO20022ScenarioFromStatementFiles is lockdemo --rail-protocol iso20022
// --statement-source dir, shortened: the fenced run under the full chaos with
// rail-proxy and rail-stub speaking ISO 20022 (pain.001 out, pain.002 back) and
// the reconciler closing the books from the camt.053 files rail-stub writes.
// Every invariant holds as with the stub rail, the statement judged as one of
// accepted calls only, and the statement copy holds every accepted call, read
// from files.
func TestISO20022ScenarioFromStatementFiles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := shortConfig()
	cfg.Payouts = 40
	cfg.RailProtocol, cfg.StatementSource = stack.RailISO20022, stack.StatementDir
	cfg.Keep = true // the system stays up for the checks below; Close stops it
	logs := &logcapture.Buffer{}
	r, err := runScenario(ctx, cfg, true, target{paydbURL: pgtest.PaydbURL(t), lockdbURL: pgtest.LockdbURL(t), log: logs,
		keysDir: filepath.Join(t.TempDir(), "keys")})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Settled || r.Crashes != 1 || !r.Report.OK() || !r.Report.Held(7) {
		var b strings.Builder
		_ = r.Report.WriteTable(&b)
		t.Errorf("settled %t, %d crashes, the run over ISO 20022 from statement files:\n%s", r.Settled, r.Crashes, b.String())
	}
	if rec := r.Report.Reconciliation; rec == nil || rec.StatementLines != r.Report.RailCalls.Accepted || rec.AmbiguousLeft != 0 {
		t.Errorf("reconciliation %+v, want a copy of the %d accepted calls and nothing AMBIGUOUS", rec, r.Report.RailCalls.Accepted)
	}
	files, err := filepath.Glob(filepath.Join(r.stack.StatementDir, "*.xml"))
	if err != nil || len(files) == 0 {
		t.Errorf("no statement file in %s: %v", r.stack.StatementDir, err)
	}
	// Both ends were told to speak ISO 20022, and said so at start-up.
	for service, field := range map[string]string{"rail-stub": "protocol", "rail-proxy": "railProtocol"} {
		spoke := false
		for _, l := range logs.Lines() {
			spoke = spoke || l["service"] == service && l[field] == stack.RailISO20022
		}
		if !spoke {
			t.Errorf("%s never logged %s iso20022", service, field)
		}
	}
	if n := r.Report.Count(invariants.CheckStatementCopy); n != 0 {
		t.Errorf("%d statement copy findings", n)
	}
}
