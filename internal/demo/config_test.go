package demo

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/invariants"
)

func TestParseArgs(t *testing.T) {
	t.Parallel()
	cfg, err := ParseArgs(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Compare || !cfg.Fencing || !cfg.Grants || !cfg.Attack || cfg.UnsafeNoAuth || cfg.Payouts != DefaultConfig().Payouts {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = ParseArgs([]string{"--fencing=false", "--payouts", "30", "--accounts=3", "--seed=9", "--max-duration=20s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Compare || cfg.Fencing || cfg.Payouts != 30 || cfg.Accounts != 3 || cfg.Seed != 9 || cfg.MaxDuration != 20*time.Second {
		t.Errorf("--fencing=false alone is a single unfenced run: %+v", cfg)
	}
	cfg, err = ParseArgs([]string{"--fencing=false", "--compare"}, nil)
	if err != nil || !cfg.Compare {
		t.Errorf("--compare given explicitly wins: %+v %v", cfg, err)
	}
	cfg, err = ParseArgs([]string{"--failover"}, nil)
	if err != nil || cfg.Failover != FailoverPromote || cfg.Compare || cfg.Attack || !cfg.Fencing || cfg.MaxDuration != DefaultConfig().MaxDuration {
		t.Errorf("--failover alone is one fenced run on a pair promoted by hand, no attack: %+v %v", cfg, err)
	}
	for _, args := range [][]string{{"--failover=promote"}, {"--failover=true"}, {"-failover"}} {
		if cfg, err := ParseArgs(args, nil); err != nil || cfg.Failover != FailoverPromote {
			t.Errorf("%v: %q %v, want %q", args, cfg.Failover, err, FailoverPromote)
		}
	}
	cfg, err = ParseArgs([]string{"--failover=patroni"}, nil)
	if err != nil || cfg.Failover != FailoverPatroni || cfg.Compare || cfg.Attack || !cfg.Fencing || cfg.MaxDuration != patroniMaxDuration {
		t.Errorf("--failover=patroni is one fenced run on a Patroni cluster, no attack, the longer bound: %+v %v", cfg, err)
	}
	if cfg, err := ParseArgs([]string{"--failover=patroni", "--max-duration=90s"}, nil); err != nil || cfg.MaxDuration != 90*time.Second {
		t.Errorf("--max-duration given with --failover=patroni wins: %v %v", cfg.MaxDuration, err)
	}
	if cfg, err := ParseArgs([]string{"--failover=false"}, nil); err != nil || cfg.Failover != "" || !cfg.Compare {
		t.Errorf("--failover=false is no failover: %q %v", cfg.Failover, err)
	}
	if _, err := ParseArgs([]string{"--failover", "patroni"}, nil); err == nil || !strings.Contains(err.Error(), "--failover=patroni") {
		t.Errorf("--failover patroni (a space): %v, want a hint to write --failover=patroni", err)
	}
	for _, bad := range [][]string{
		{"--failover", "--compare"}, {"--failover", "--attack"}, {"--failover=patroni", "--attack"},
		{"--failover=stolon"}, {"--failover=Patroni"},
		{"--failover", "--paydb-url=postgres://x/p", "--lockdb-url=postgres://x/l"},
		{"--failover=patroni", "--paydb-url=postgres://x/p", "--lockdb-url=postgres://x/l"},
		{"--payouts=0"}, {"--accounts=500"}, {"--chaos=1.5"}, {"--lease-ttl=500ms"}, {"--executors=0"},
		{"--paydb-url=postgres://x/y"}, {"--nope"}, {"extra"}, {"--max-duration=1s"}, {"--pause-probability=2"},
		{"--keep", "--paydb-url=postgres://x/p", "--lockdb-url=postgres://x/l"},
		{"--grants=false"}, // with identities on every service requires its grant keys
		{"--rail-protocol=swift"}, {"--rail-protocol=ISO20022"}, {"--statement-source=sftp"},
	} {
		if _, err := ParseArgs(bad, nil); err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("%v accepted", bad)
		}
	}
	if cfg, err := ParseArgs([]string{"--unsafe-no-auth", "--grants=false"}, nil); err != nil || !cfg.UnsafeNoAuth || cfg.Grants {
		t.Errorf("--unsafe-no-auth --grants=false: %+v %v", cfg, err)
	}
	if cfg.RailProtocol != "stub" || cfg.StatementSource != "proxy" {
		t.Errorf("rail defaults: %q %q, want stub and proxy", cfg.RailProtocol, cfg.StatementSource)
	}
	if cfg, err := ParseArgs([]string{"--rail-protocol", "iso20022", "--statement-source=dir"}, nil); err != nil ||
		cfg.RailProtocol != "iso20022" || cfg.StatementSource != "dir" {
		t.Errorf("--rail-protocol iso20022 --statement-source=dir: %+v %v", cfg, err)
	}
	var usage bytes.Buffer
	if _, err := ParseArgs([]string{"--help"}, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	for _, want := range []string{"-payouts", "-fencing", "-compare", "-json", "-keep", "-seed", "-chaos", "-grants", "-attack", "-failover", "-unsafe-no-auth", "-rail-protocol", "-statement-source", "docs/lockdemo.md"} {
		if !strings.Contains(usage.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
}

func TestMainExitCodes(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, &out, &errOut); code != 0 || out.Len() == 0 {
		t.Errorf("--help: exit %d, usage %q", code, out.String())
	}
	errOut.Reset()
	if code := Main(context.Background(), []string{"--payouts=-1"}, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), "--payouts") || strings.Count(errOut.String(), "\n") != 1 {
		t.Errorf("bad flag: exit %d, stderr %q", code, errOut.String())
	}
}

// The interrupted-intent age is the shortest rail-proxy accepts for the demo's
// timeouts: above admission + connect + read + resolution, by the 2 s margin of
// docs/contracts/rail-proxy.md.
func TestInterruptedAfter(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	bound := 2*time.Second + cfg.RailConnectTimeout + cfg.RailReadTimeout + 2*time.Second
	if got := cfg.InterruptedAfter(); got < bound+2*time.Second || got > bound+3*time.Second {
		t.Errorf("InterruptedAfter = %s, bound %s", got, bound)
	}
	if cfg.ProxyTimeout() <= bound {
		t.Errorf("ProxyTimeout %s does not exceed the proxy's worst case %s", cfg.ProxyTimeout(), bound)
	}
}

func TestVerdictIsTheFencedRun(t *testing.T) {
	t.Parallel()
	pass := invariants.Report{}
	fail := invariants.Report{Violations: []invariants.Finding{{Check: invariants.CheckStaleAdmission}}}
	cases := []struct {
		runs []*Result
		want bool
	}{
		{[]*Result{{Fencing: true, Report: pass}, {Fencing: false, Report: fail}}, true},
		{[]*Result{{Fencing: true, Report: fail}, {Fencing: false, Report: pass}}, false},
		{[]*Result{{Fencing: false, Report: fail}}, false},
		{[]*Result{{Fencing: false, Report: pass}}, true},
		{nil, false},
	}
	for i, c := range cases {
		if got := verdict(c.runs); got != c.want {
			t.Errorf("case %d: verdict %v, want %v", i, got, c.want)
		}
	}
}
