package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/invariants"
)

// TestPatroniFailoverScenarioHoldsEveryInvariant is `lockdemo --failover=patroni`,
// shortened, through lockdemo's own command line: paydb and lockdb on a real
// Patroni cluster (etcd and three PostgreSQL 15 nodes, synchronous_mode_strict),
// the demo's chaos against them, and mid-run Patroni's leader killed with SIGKILL
// (its Patroni and its PostgreSQL) and a standby promoted by Patroni while every
// service runs on. The exit status is 0, the run crossed the failover (tokens
// handed out before and after the kill, a submission admitted after it), Patroni
// promoted the member that was the synchronous standby at the kill, and every
// invariant held — the tokens handed out judged against lock_grant included.
func TestPatroniFailoverScenarioHoldsEveryInvariant(t *testing.T) {
	t.Parallel()
	// Bounds a hang, not the run: the run ends when every payout is settled; the
	// Patroni failover itself takes the leader key's ttl (20 s) and more.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	logPath := filepath.Join(t.TempDir(), "services.log")
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{
		"--failover=patroni", "--json", "--log=" + logPath,
		"--payouts=40", "--accounts=4", "--executors=2", "--workers=2", "--pause-probability=0.2", "--seed=7",
		// Generous: an unsettled payout at the bound is a violation, and this
		// test is about the failover, not about the machine's speed.
		"--max-duration=5m",
	}, &stdout, &stderr)
	t.Logf("progress:\n%s", stderr.String())
	if code != 0 {
		t.Errorf("lockdemo --failover=patroni exited %d; the services', etcd's and Patroni's logs: %s\n%s", code, logPath, stdout.String())
	}
	var out Output
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("the --json report: %v\n%s", err, stdout.String())
	}
	if !out.OK || !out.Settings.Failover || out.Settings.FailoverMode != FailoverPatroni || len(out.Runs) != 1 {
		t.Fatalf("verdict %t, settings %+v, %d runs: want a pass of one run with failover mode %q", out.OK, out.Settings, len(out.Runs), FailoverPatroni)
	}
	r := out.Runs[0]
	f := r.Failover
	if f == nil {
		t.Fatal("the run ended without a failover")
	}
	if f.Mode != FailoverPatroni || f.KilledLeader == "" || f.NewLeader == "" || f.NewLeader == f.KilledLeader {
		t.Errorf("the failover: mode %q, killed %q, new leader %q: want Patroni's leader killed and another promoted", f.Mode, f.KilledLeader, f.NewLeader)
	}
	if f.NewLeader != f.SyncStandby {
		t.Errorf("Patroni promoted %s, but the synchronous standby at the kill was %s", f.NewLeader, f.SyncStandby)
	}
	if f.FirstAdmittedMs < 0 || f.BeforeKill == 0 || f.AfterKill == 0 || f.BeforeKill+f.AfterKill != f.TokensHandedOut {
		t.Errorf("the run did not cross the failover (tokens before and after the kill, a submission admitted after it): %+v", f)
	}
	if !r.Fencing || !r.BooksChecked || !r.Identities || !r.Settled || !r.Report.OK() || !r.Report.Held(6) ||
		!slices.ContainsFunc(r.Report.Checks, func(c invariants.Check) bool { return c.ID == invariants.CheckTokenIssuedTwice }) {
		var b strings.Builder
		_ = r.Report.WriteTable(&b)
		t.Errorf("across the Patroni failover (fenced, books checked, identities on, every payout settled, tokens judged):\n%s", b.String())
	}
	var b strings.Builder
	writeFailover(&b, out.Runs)
	for _, want := range []string{
		"failover (patroni)", "the new leader was the synchronous standby at the kill   yes",
		"kill → new leader accepting writes", "kill → first admitted submission", "503 answers meanwhile",
		"before the kill", "twice: 0; not in lock_grant: 0", "invariants across it: 1 held",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the failover section lacks %q:\n%s", want, b.String())
		}
	}
	t.Logf("\n%s", b.String())
}
