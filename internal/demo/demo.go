// Package demo is lockdemo: the whole lock.dev system on one machine, under chaos,
// ending in a verdict. It starts a throwaway PostgreSQL (or uses given databases),
// lock-server, payment-resource, rail-stub and rail-proxy (as a child process, so it
// can be crashed), seeds payouts, runs executors that freeze past their lease
// (stale writers) against a rail that is slow past the proxy's read timeout and
// drops replies, kills rail-proxy mid-run, and then judges the ground truth with
// package invariants. By default the same seeded scenario runs twice, with fencing
// on and off, on fresh databases and a fresh rail-stub each. With --failover it is
// one fenced run on replicated databases whose primary is killed mid-run: a pair
// promoted by hand (failover.go), or a Patroni cluster (internal/patroni) that
// promotes by itself.
//
// A binary using this package calls stack.ChildMain first thing in main: the
// crashed rail-proxy is this binary started again.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"lock.dev/internal/invariants"
	"lock.dev/internal/patroni"
	"lock.dev/internal/pgcluster"
	"lock.dev/internal/stack"
)

// Main is lockdemo's whole command line: it parses args, runs, writes the report
// to stdout and progress to stderr, and returns the exit status: 0 only when every
// invariant held in the fenced run (or, for a single --fencing=false run, in that
// run) and, with --attack, every rogue and insider attempt was refused where
// grants are verified and the books checked; 1 otherwise or on failure, 2 for a
// usage error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := ParseArgs(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockdemo: %v (see --help)\n", err)
		return 2
	}
	// Patroni, etcd and PostgreSQL's server binaries are not Go: missing, the
	// run cannot start, and the error says what to install.
	if cfg.Failover == FailoverPatroni {
		if err := patroni.Check(); err != nil {
			fmt.Fprintf(stderr, "lockdemo: --failover=patroni: %v\n", err)
			return 2
		}
	}
	ok, err := Run(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "lockdemo: %v\n", err)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

// Output is the --json document.
type Output struct {
	Seed     int64     `json:"seed"`
	Settings Settings  `json:"settings"`
	Runs     []*Result `json:"runs"`
	// Attack is the rogue client's attempts, with grants verified and not
	// (docs/contracts/signed-grants.md).
	Attack []*AttackResult `json:"attack,omitempty"`
	// Insider is an insider's moves with genuine leases, with the books checked
	// and not (docs/contracts/books.md).
	Insider []*InsiderResult `json:"insider,omitempty"`
	// Identity is the workloads' attacks on each other, with identities as the
	// run has them (docs/contracts/workload-identity.md).
	Identity *IdentityResult `json:"identity,omitempty"`
	// Identities: every service ran with workload identities (mutual TLS, roles
	// per route); false with --unsafe-no-auth.
	Identities bool `json:"identities"`
	// OK is the exit status's verdict: every invariant held in the fenced run,
	// every rogue attempt was refused with grants verified, every insider move
	// with the books checked, and, with identities on, every identity row.
	OK bool `json:"ok"`
	// LogPath is the services' JSON logs; empty when lockdemo made the file
	// itself and removed it after a pass (--log names a file that stays).
	LogPath string `json:"logPath"`
}

// Settings echoes what the runs were given.
type Settings struct {
	Payouts            int     `json:"payouts"`
	Accounts           int     `json:"accounts"`
	Executors          int     `json:"executors"`
	Workers            int     `json:"workersPerExecutor"`
	Chaos              float64 `json:"chaos"`
	PauseProbability   float64 `json:"pauseProbability"`
	Crashes            int     `json:"proxyCrashes"`
	LeaseTTLMs         int64   `json:"leaseTtlMs"`
	PauseMs            int64   `json:"pauseMs"`
	RailReadTimeoutMs  int64   `json:"railReadTimeoutMs"`
	InterruptedAfterMs int64   `json:"interruptedAfterMs"`
	SettleAfterMs      int64   `json:"reconcilerSettleAfterMs"`
	Failover           bool    `json:"failover,omitempty"`
	// FailoverMode is --failover's value: "promote" or "patroni".
	FailoverMode string `json:"failoverMode,omitempty"`
	// RailProtocol and StatementSource are --rail-protocol and
	// --statement-source: the rail's language and where the reconciler read
	// its statement.
	RailProtocol    string `json:"railProtocol"`
	StatementSource string `json:"statementSource"`
}

// Run runs the configured scenario(s), writes the report and reports whether the
// verdict is a pass. With cfg.Keep it then waits for ctx to end before stopping
// the servers.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (ok bool, err error) {
	if err := cfg.Validate(); err != nil {
		return false, err
	}
	p := newProgress(stderr)
	svcLog, err := openLog(cfg.LogPath, "")
	if err != nil {
		return false, err
	}
	logPath, logFile := svcLog.path, svcLog.file
	// Runs last, once every server has stopped writing.
	defer func() { svcLog.close(ok && err == nil && !cfg.Keep, p) }()
	p.say("lockdemo: seed %d, %d payouts over %d accounts, %d executors × %d workers, identities %s, rail protocol %s, statement from %s; service logs in %s",
		cfg.Seed, cfg.Payouts, cfg.Accounts, cfg.Executors, cfg.Workers, onOff(!cfg.UnsafeNoAuth), cfg.RailProtocol, cfg.StatementSource, logPath)
	keysRoot, removeKeys, err := makeKeysRoot()
	if err != nil {
		return false, err
	}
	defer removeKeys()

	settings := []bool{cfg.Fencing}
	if cfg.Compare {
		settings = []bool{true, false}
	}
	targets := make([]target, len(settings))
	var cluster *pgcluster.Cluster
	if cfg.PaydbURL != "" {
		for i := range targets {
			targets[i] = target{paydbURL: cfg.PaydbURL, lockdbURL: cfg.LockdbURL, wipe: i > 0}
		}
	} else if cfg.Failover == FailoverPromote {
		p.say("starting a throwaway PostgreSQL primary and a synchronous standby …")
		for i := range targets {
			targets[i] = target{replicated: true}
		}
	} else if cfg.Failover == FailoverPatroni {
		pc, perr := startPatroni(ctx, logFile, p)
		if perr != nil {
			return false, perr
		}
		defer func() {
			// A failed run's evidence: etcd's and Patroni's logs beside the
			// services' (the file is kept after a failure).
			if !ok || err != nil {
				_ = pc.WriteLogs(logFile)
			}
			if serr := pc.Stop(); serr != nil {
				p.say("lockdemo: stopping the Patroni cluster: %v", serr)
			}
		}()
		for i := range targets {
			targets[i] = target{paydbURL: pc.URL("paydb"), lockdbURL: pc.URL("lockdb"), patroni: pc}
		}
	} else {
		p.say("starting a throwaway PostgreSQL …")
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		cluster, err = pgcluster.Start(sctx, pgcluster.Options{})
		if err != nil {
			cancel()
			return false, fmt.Errorf("start a throwaway PostgreSQL: %w", err)
		}
		defer func() { _ = cluster.Stop() }()
		for i, on := range settings {
			suffix := "fencing_" + onOff(on)
			for _, db := range []string{"paydb_" + suffix, "lockdb_" + suffix} {
				if err := cluster.CreateDatabase(sctx, db, ""); err != nil {
					cancel()
					return false, err
				}
			}
			targets[i] = target{paydbURL: cluster.URL("paydb_" + suffix), lockdbURL: cluster.URL("lockdb_" + suffix)}
		}
		cancel()
	}

	var runs []*Result
	defer func() {
		for _, r := range runs {
			_ = r.Close()
		}
	}()
	for i, on := range settings {
		t := targets[i]
		t.log, t.progress = logFile, p
		t.keysDir = filepath.Join(keysRoot, "run-fencing-"+onOff(on))
		p.say("run %d of %d: fencing %s, books checks %s (RAIL_PROXY_FENCING_ENABLED=%t, RAIL_PROXY_BOOKS_CHECK=%t, PAYMENT_BOOKS_CHECK=%t)",
			i+1, len(settings), onOff(on), onOff(on), on, on, on)
		r, err := runScenario(ctx, cfg, on, t)
		if err != nil {
			return false, fmt.Errorf("run with fencing %s: %w", onOff(on), err)
		}
		r.URLs = withDatabases(r.URLs, t)
		runs = append(runs, r)
	}

	var attacks []*AttackResult
	var insiders []*InsiderResult
	var ident *IdentityResult
	if cfg.Attack && cluster != nil {
		if attacks, err = runAttacks(ctx, cluster, cfg, keysRoot, logFile, p); err != nil {
			return false, err
		}
		if insiders, err = runInsiders(ctx, cluster, cfg, keysRoot, logFile, p); err != nil { // insider.go
			return false, err
		}
		if ident, err = runIdentity(ctx, cluster, cfg, keysRoot, logFile, p); err != nil { // identity.go
			return false, err
		}
	}
	ok = verdict(runs) && attackVerdict(attacks) && insiderVerdict(insiders) && identityVerdict(ident) && failoverVerdict(cfg, runs)
	shownLog := logPath
	if svcLog.removedAfter(ok && !cfg.Keep) {
		shownLog = ""
	}
	if cfg.JSON {
		out := Output{Seed: cfg.Seed, Settings: settingsOf(cfg), Runs: runs, Attack: attacks, Insider: insiders, Identity: ident,
			Identities: !cfg.UnsafeNoAuth, OK: ok, LogPath: shownLog}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return false, err
		}
	} else if err := writeReport(stdout, cfg, runs, attacks, insiders, ident, ok, shownLog); err != nil {
		return false, err
	}
	if cfg.Keep {
		w := stdout
		if cfg.JSON {
			w = stderr
		}
		if err := writeKeep(ctx, w, runs); err != nil {
			return false, err
		}
		<-ctx.Done()
		p.say("stopping the servers …")
	}
	return ok, nil
}

// verdict is the exit status's judgement: the fenced run's, when there is one.
func verdict(runs []*Result) bool {
	for _, r := range runs {
		if r.Fencing {
			return r.Report.OK()
		}
	}
	return len(runs) > 0 && runs[0].Report.OK()
}

// attackVerdict: every rogue attempt refused where grants are verified.
func attackVerdict(attacks []*AttackResult) bool {
	for _, a := range attacks {
		if a.GrantsVerified && !a.OK {
			return false
		}
	}
	return true
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// serviceLog is the file a run's services log to: the one --log names, or one
// lockdemo makes in the temp directory. It is the run's evidence when something
// went wrong, and a megabyte of noise in the temp directory when nothing did:
// a file lockdemo made is removed after a pass (not with --keep), and kept, its
// path said, after a failure. A file --log named is the caller's and stays.
type serviceLog struct {
	path string
	file *os.File
	made bool // lockdemo made it
}

// openLog opens path for the services' logs, or makes a lockdemo-*.log in dir
// when path is empty (dir "": the temp directory).
func openLog(path, dir string) (*serviceLog, error) {
	if path == "" {
		f, err := os.CreateTemp(dir, "lockdemo-*.log")
		if err != nil {
			return nil, fmt.Errorf("create the log file: %w", err)
		}
		return &serviceLog{path: f.Name(), file: f, made: true}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the log file: %w", err)
	}
	return &serviceLog{path: path, file: f}, nil
}

// removedAfter reports whether close(done) removes the file: the run passed
// and nothing is kept (done), and lockdemo made the file.
func (l *serviceLog) removedAfter(done bool) bool { return done && l.made }

// close closes the file. done is a pass without --keep: then a file lockdemo
// made is removed; otherwise p is told where the logs are kept.
func (l *serviceLog) close(done bool, p *progress) {
	_ = l.file.Close()
	if l.removedAfter(done) {
		_ = os.Remove(l.path)
		return
	}
	if !done {
		p.say("lockdemo: the services' logs are kept in %s", l.path)
	}
}

func withDatabases(urls map[string]string, t target) map[string]string {
	if urls == nil {
		return nil
	}
	if t.paydbURL == "" { // the stack started the databases (--failover=promote): its URLs stand
		return urls
	}
	urls["paydb"], urls["lockdb"] = t.paydbURL, t.lockdbURL
	return urls
}

func settingsOf(cfg Config) Settings {
	return Settings{
		Payouts: cfg.Payouts, Accounts: cfg.Accounts, Executors: cfg.Executors, Workers: cfg.Workers,
		Chaos: cfg.Chaos, PauseProbability: cfg.PauseProbability * cfg.Chaos, Crashes: cfg.Crashes, LeaseTTLMs: cfg.LeaseTTL.Milliseconds(), PauseMs: cfg.Pause.Milliseconds(),
		RailReadTimeoutMs: cfg.RailReadTimeout.Milliseconds(), InterruptedAfterMs: cfg.InterruptedAfter().Milliseconds(),
		SettleAfterMs: cfg.SettleAfter().Milliseconds(), Failover: cfg.Failover != "", FailoverMode: cfg.Failover,
		RailProtocol: cfg.RailProtocol, StatementSource: cfg.StatementSource,
	}
}

// writeReport is the human report: the settings, the table, the verdict.
func writeReport(w io.Writer, cfg Config, runs []*Result, attacks []*AttackResult, insiders []*InsiderResult, ident *IdentityResult, ok bool, logPath string) error {
	cols := make([]invariants.Column, len(runs))
	extra := []invariants.Row{
		{Label: "the fence checked at the gate (RAIL_PROXY_FENCING_ENABLED)"},
		{Label: "the books checked at the gate (RAIL_PROXY_BOOKS_CHECK)"},
		{Label: "the books checked at post and settle (PAYMENT_BOOKS_CHECK)"},
		{Label: "grants signed and verified"},
		{Label: "workload identities (mutual TLS, roles per route)"},
		{Label: "wall time"}, {Label: "every payout settled in time"}, {Label: "executor pauses (stale-writer makers)"},
		{Label: "rail-proxy crashes (SIGKILL, restart)"}, {Label: "slow-rail windows (latency > read timeout)"},
	}
	for i, r := range runs {
		cols[i] = invariants.Column{Title: "fencing " + onOff(r.Fencing), Report: r.Report}
		for j, v := range []string{yesNo(r.Fencing), yesNo(r.BooksChecked), yesNo(r.BooksChecked), yesNo(r.Grants), yesNo(r.Identities),
			fmt.Sprintf("%.1fs", r.Elapsed.Seconds()), yesNo(r.Settled), strconv.FormatInt(r.Pauses, 10),
			strconv.Itoa(r.Crashes), strconv.Itoa(r.SlowWindows)} {
			extra[j].Values = append(extra[j].Values, v)
		}
	}
	fmt.Fprintf(w, "\nlockdemo report — seed %d: %d payouts over %d accounts, %d executors × %d workers, chaos %.2g:\n"+
		"lease TTL %s, pause %s with probability %.2g per cycle, rail read timeout %s, RAIL_PROXY_INTERRUPTED_AFTER %s,\n"+
		"RECONCILER_SETTLE_AFTER %s\n%s\n%s\n\n",
		cfg.Seed, cfg.Payouts, cfg.Accounts, cfg.Executors, cfg.Workers, cfg.Chaos,
		cfg.LeaseTTL, cfg.Pause, cfg.PauseProbability*cfg.Chaos, cfg.RailReadTimeout, cfg.InterruptedAfter(), cfg.SettleAfter(),
		identitiesLine(cfg), railLine(cfg))
	if err := invariants.WriteTable(w, cols, extra...); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, r := range runs {
		if !r.Fencing {
			fmt.Fprintf(w, "With fencing off the gate admitted %d stale submissions: a holder whose lease had\n"+
				"expired still reached the rail after a newer token had been admitted.\n", r.Report.Count(invariants.CheckStaleAdmission))
			fmt.Fprintln(w, r.Report.MoneyAtRiskLine()) // what they cost: internal/invariants/risk.go
			if !r.BooksChecked {
				fmt.Fprintln(w, "The fencing-off run checks nothing against the books either: it shows what the fence alone\n"+
					"prevents. With the books checked, a superseded holder presenting a payout a newer holder has\n"+
					"re-claimed is refused by the books (NOT_IN_BOOKS, mismatch token) even with fencing off.")
			}
		}
	}
	writeBooks(w, runs) // books.go
	fmt.Fprintln(w, "Rail overtakes and presentations by superseded holders are reported, not failed: no gate in\n"+
		"front of a memoryless rail can order calls in flight, nor fence a token before the newer one\n"+
		"reaches it. docs/lockdemo.md explains every row.")
	writeAttack(w, attacks)
	writeInsider(w, insiders) // insider.go
	writeIdentity(w, ident)   // identity.go
	writeFailover(w, runs)    // failover.go
	switch {
	case ok && cfg.Failover == FailoverPatroni:
		fmt.Fprintln(w, "\nVERDICT: PASS — every invariant held with fencing on, across a Patroni failover of paydb and lockdb\n"+
			"(the leader killed with SIGKILL, a standby promoted by Patroni).")
	case ok && cfg.Failover != "":
		fmt.Fprintln(w, "\nVERDICT: PASS — every invariant held with fencing on, across a failover of paydb and lockdb.")
	case !failoverVerdict(cfg, runs):
		fmt.Fprintln(w, "\nVERDICT: FAIL — the run ended before the failover (see --max-duration).")
	case ok && len(attacks) > 0 && ident != nil && ident.Identities:
		fmt.Fprintln(w, "\nVERDICT: PASS — every invariant held with fencing and the books checked, every rogue attempt was\n"+
			"refused with grants verified, every insider move was refused with the books checked, and every\n"+
			"workload's attack on another was refused by the identities.")
	case ok && len(attacks) > 0:
		fmt.Fprintln(w, "\nVERDICT: PASS — every invariant held with fencing and the books checked, every rogue attempt was\n"+
			"refused with grants verified, and every insider move was refused with the books checked\n"+
			"(identities were OFF: the identity rows show what they stop, and do not decide the verdict).")
	case ok:
		fmt.Fprintln(w, "\nVERDICT: PASS — every invariant held with fencing and the books checked.")
	case !attackVerdict(attacks):
		fmt.Fprintln(w, "\nVERDICT: FAIL — a rogue attempt was not refused with grants verified (see the attack above).")
	case !identityVerdict(ident):
		fmt.Fprintln(w, "\nVERDICT: FAIL — a workload's attack on another was not refused with identities on (see the\n"+
			"identity section above).")
	case !insiderVerdict(insiders):
		fmt.Fprintln(w, "\nVERDICT: FAIL — an insider move was not refused with the books checked, or invariant 8 broke\n"+
			"there (see the insider section above).")
	default:
		fmt.Fprintln(w, "\nVERDICT: FAIL — an invariant did not hold in the run that decides the exit status (see violations above).")
	}
	if logPath == "" {
		fmt.Fprintln(w, "Service logs: removed after the pass (--log FILE keeps them)")
	} else {
		fmt.Fprintf(w, "Service logs: %s\n", logPath)
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// identitiesLine is the report's word on workload identities.
func identitiesLine(cfg Config) string {
	if cfg.UnsafeNoAuth {
		return "workload identities OFF (--unsafe-no-auth): every service plaintext with UNSAFE_NO_AUTH=true, any caller believed"
	}
	return "workload identities on: every call mutual TLS between named workloads, roles per route (docs/contracts/workload-identity.md)"
}

// railLine is the report's word on the rail's language and the statement's
// source.
func railLine(cfg Config) string {
	var proto, source string
	switch cfg.RailProtocol {
	case stack.RailISO20022:
		proto = "rail protocol iso20022: pain.001 out, pain.002 back (RAIL_PROTOCOL, RAIL_STUB_PROTOCOL, PAYMENT_RAIL_PROFILE; docs/contracts/iso20022.md)"
	default:
		proto = "rail protocol stub: rail-stub's JSON (RAIL_PROTOCOL=stub)"
	}
	switch {
	case cfg.StatementSource == stack.StatementDir:
		source = "statement from camt.053 files rail-stub writes every " + stack.StatementEvery.String() +
			" (RECONCILER_STATEMENT_SOURCE=dir): a declined call is on no statement"
	case cfg.RailProtocol == stack.RailISO20022:
		source = "statement from rail-proxy's camt.053 route (RECONCILER_STATEMENT_SOURCE=proxy): a declined call is on no statement"
	default:
		source = "statement from rail-proxy's statement route (RECONCILER_STATEMENT_SOURCE=proxy)"
	}
	return proto + ",\n" + source
}

// writeKeep prints the kept servers and requests to try (keep.go).
func writeKeep(ctx context.Context, w io.Writer, runs []*Result) error {
	for _, r := range runs {
		if r.URLs == nil {
			continue
		}
		seed, err := seedKeep(ctx, r)
		if err != nil {
			return fmt.Errorf("--keep: %w", err)
		}
		writeKeepRun(w, r, seed)
	}
	fmt.Fprintln(w, "\nCtrl-C stops them.")
	return nil
}
