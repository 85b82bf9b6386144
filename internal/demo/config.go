package demo

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"lock.dev/internal/railproxy"
	"lock.dev/internal/stack"
)

// Config is everything lockdemo can be told. Flags only
// (docs/contracts/configuration.md: lockdemo is a command-line tool); ParseArgs
// fills it.
type Config struct {
	Payouts   int     // payouts seeded per run
	Accounts  int     // accounts they are spread over
	Executors int     // executor instances, each its own owner id
	Workers   int     // workers per executor
	Chaos     float64 // chaos intensity 0..1: scales pauses, drops, declines and slow-rail windows
	// PauseProbability is EXECUTOR_PAUSE_PROBABILITY at chaos 1: the chance that a
	// cycle freezes between claim and submit for Pause.
	PauseProbability float64
	Crashes          int   // abrupt rail-proxy crashes (SIGKILL + restart) per run
	Seed             int64 // seeds the payouts, the rail-stub's draws, the executors' pauses and the chaos schedule

	MaxDuration time.Duration // bound of one run; payouts still unsettled then are violations
	Fencing     bool          // RAIL_PROXY_FENCING_ENABLED of a single run
	Compare     bool          // run fencing on and off on fresh databases, side by side
	// Grants: lock-server signs every grant and rail-proxy and payment-resource
	// verify them (docs/contracts/signed-grants.md), in the runs. Attack: after the
	// runs, a rogue client with no lease presents a huge token, with and without
	// verification, and an insider with genuine leases makes moves the books never
	// made, with and without the books checks (docs/contracts/books.md).
	Grants bool
	Attack bool
	// UnsafeNoAuth runs every service plaintext with UNSAFE_NO_AUTH=true: no
	// workload identities (docs/contracts/workload-identity.md). By default they
	// are on: every call is mutual TLS between named workloads, each service
	// allows each workload only its part, and grants are always signed and
	// verified. The attack's identity rows then show what identities stop.
	UnsafeNoAuth bool
	// Failover is --failover: "" none, FailoverPromote or FailoverPatroni.
	// Promote runs paydb and lockdb on a primary and a synchronous standby and,
	// mid-run, kills the primary (SIGKILL) and promotes the standby by hand
	// (pg_ctl promote). Patroni runs them on a Patroni cluster (etcd and three
	// PostgreSQL nodes in synchronous_mode_strict) and, mid-run, kills the
	// leader (SIGKILL, Patroni and its PostgreSQL) and lets Patroni promote.
	// Either is one fenced run: no --compare, no --attack.
	Failover string

	// RailProtocol is the language rail-proxy and rail-stub speak: "stub"
	// (rail-stub's JSON) or "iso20022" (pain.001 out, pain.002 back, camt.053
	// for the books; docs/contracts/iso20022.md). StatementSource is where the
	// reconciler reads the rail's statement: "proxy" (rail-proxy's statement
	// route) or "dir" (camt.053 files rail-stub writes to a directory;
	// docs/contracts/reconciliation.md).
	RailProtocol    string
	StatementSource string

	JSON bool // the report as JSON on stdout
	Keep bool // leave the servers running after the report until interrupted

	PaydbURL, LockdbURL string // existing, empty databases instead of a throwaway PostgreSQL
	LogPath             string // the services' JSON logs; empty: a file in the temp directory

	// Timing. The defaults make stale writers: a pause outlives the lease.
	LeaseTTL           time.Duration // EXECUTOR_LEASE_TTL
	Pause              time.Duration // EXECUTOR_PAUSE
	RailReadTimeout    time.Duration // RAIL_READ_TIMEOUT
	RailConnectTimeout time.Duration // RAIL_CONNECT_TIMEOUT
}

// The values of Config.Failover (--failover=…); a bare --failover is
// FailoverPromote, as before the flag took a value.
const (
	FailoverPromote = "promote"
	FailoverPatroni = "patroni"
)

// patroniMaxDuration is --max-duration's default with --failover=patroni:
// Patroni promotes only once the dead leader's key has expired in etcd (ttl,
// 20 s at the least), during which nothing is admitted, so the run needs that
// much more than the default to settle every payout.
const patroniMaxDuration = 2 * time.Minute

// failoverFlag is --failover's flag.Value. It is a boolean flag to the flag
// package (IsBoolFlag), so a bare --failover still parses, as "true", and means
// FailoverPromote; a mode is given with "=": --failover=patroni. (A boolean
// flag takes no separate argument: "--failover patroni" leaves "patroni" as an
// argument, which ParseArgs refuses with a hint.)
type failoverFlag struct{ mode *string }

func (f failoverFlag) String() string {
	if f.mode == nil {
		return ""
	}
	return *f.mode
}

func (f failoverFlag) IsBoolFlag() bool { return true }

func (f failoverFlag) Set(v string) error {
	switch v {
	case "true", FailoverPromote:
		*f.mode = FailoverPromote
	case "false", "":
		*f.mode = ""
	case FailoverPatroni:
		*f.mode = FailoverPatroni
	default:
		return fmt.Errorf("must be %s or %s (a bare --failover is %s)", FailoverPromote, FailoverPatroni, FailoverPromote)
	}
	return nil
}

// DefaultConfig is lockdemo's defaults: both runs finish well inside two minutes
// on a two-core machine.
func DefaultConfig() Config {
	return Config{
		Payouts:            200,
		Accounts:           16,
		Executors:          4,
		Workers:            2,
		Chaos:              1,
		PauseProbability:   0.06,
		Crashes:            1,
		Seed:               42,
		MaxDuration:        50 * time.Second,
		Fencing:            true,
		Compare:            true,
		Grants:             true,
		Attack:             true,
		RailProtocol:       stack.RailStub,
		StatementSource:    stack.StatementProxy,
		LeaseTTL:           time.Second,
		Pause:              2 * time.Second,
		RailReadTimeout:    400 * time.Millisecond,
		RailConnectTimeout: 200 * time.Millisecond,
	}
}

// InterruptedAfter is the RAIL_PROXY_INTERRUPTED_AFTER lockdemo gives rail-proxy:
// as short as docs/contracts/rail-proxy.md allows for the timeouts in use (it must
// exceed admission + connect + read + resolution by at least the 2 s margin), so a
// crash's interrupted intents settle within the run.
func (c Config) InterruptedAfter() time.Duration {
	return railproxy.AdmissionBound + c.RailConnectTimeout + c.RailReadTimeout + railproxy.ResolveBound + railproxy.InterruptMargin
}

// ProxyTimeout is the executors' EXECUTOR_PROXY_TIMEOUT: above the proxy's worst
// case with these timeouts, as docs/contracts/rail-proxy.md asks.
func (c Config) ProxyTimeout() time.Duration {
	return c.InterruptedAfter() + 400*time.Millisecond
}

// Validate checks every bound; an error names the flag.
func (c Config) Validate() error {
	switch {
	case c.Payouts < 1 || c.Payouts > 100_000:
		return errors.New("--payouts must be between 1 and 100000")
	case c.Accounts < 1 || c.Accounts > c.Payouts:
		return errors.New("--accounts must be between 1 and --payouts")
	case c.Executors < 1 || c.Executors > 64:
		return errors.New("--executors must be between 1 and 64")
	case c.Workers < 1 || c.Workers > 64:
		return errors.New("--workers must be between 1 and 64")
	case c.Chaos < 0 || c.Chaos > 1:
		return errors.New("--chaos must be between 0 and 1")
	case c.PauseProbability < 0 || c.PauseProbability > 1:
		return errors.New("--pause-probability must be between 0 and 1")
	case c.Crashes < 0 || c.Crashes > 10:
		return errors.New("--crashes must be between 0 and 10")
	case c.MaxDuration < 5*time.Second:
		return errors.New("--max-duration must be at least 5s")
	case c.LeaseTTL < time.Second || c.LeaseTTL%time.Millisecond != 0:
		return errors.New("--lease-ttl must be whole milliseconds, at least 1s (lock-server's LOCK_MIN_TTL)")
	case c.Pause < 0:
		return errors.New("--pause must not be negative")
	case c.RailReadTimeout <= 0 || c.RailConnectTimeout <= 0:
		return errors.New("--rail-read-timeout and --rail-connect-timeout must be positive")
	case (c.PaydbURL == "") != (c.LockdbURL == ""):
		return errors.New("--paydb-url and --lockdb-url go together")
	case c.Failover != "" && c.Failover != FailoverPromote && c.Failover != FailoverPatroni:
		return fmt.Errorf("--failover must be %s or %s", FailoverPromote, FailoverPatroni)
	case c.Failover != "" && c.PaydbURL != "":
		return errors.New("--failover starts its own replicated databases: not with --paydb-url")
	case c.Failover != "" && (c.Compare || c.Attack):
		return errors.New("--failover is one run on replicated databases: not with --compare or --attack")
	case !c.Grants && !c.UnsafeNoAuth:
		return errors.New("--grants=false needs --unsafe-no-auth: with identities on every service requires its grant keys (docs/contracts/workload-identity.md)")
	case c.RailProtocol != stack.RailStub && c.RailProtocol != stack.RailISO20022:
		return fmt.Errorf("--rail-protocol must be %s or %s", stack.RailStub, stack.RailISO20022)
	case c.StatementSource != stack.StatementProxy && c.StatementSource != stack.StatementDir:
		return fmt.Errorf("--statement-source must be %s or %s", stack.StatementProxy, stack.StatementDir)
	case c.Keep && c.Compare && c.PaydbURL != "":
		return errors.New("--keep with --compare needs the throwaway PostgreSQL: two runs cannot both stay on the given databases")
	}
	return nil
}

// ParseArgs reads lockdemo's flags. --fencing without --compare means a single run
// with that setting; otherwise both settings run side by side. --help writes the
// usage to usage and returns flag.ErrHelp; any other error is a usage error.
func ParseArgs(args []string, usage io.Writer) (Config, error) {
	if usage == nil {
		usage = io.Discard
	}
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("lockdemo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&cfg.Payouts, "payouts", cfg.Payouts, "payouts seeded per run")
	fs.IntVar(&cfg.Accounts, "accounts", cfg.Accounts, "accounts the payouts are spread over")
	fs.IntVar(&cfg.Executors, "executors", cfg.Executors, "executors (each its own owner id)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "workers per executor")
	fs.Float64Var(&cfg.Chaos, "chaos", cfg.Chaos, "chaos intensity 0..1: executor pauses, dropped replies, declines, slow-rail windows (0 = none)")
	fs.Float64Var(&cfg.PauseProbability, "pause-probability", cfg.PauseProbability, "EXECUTOR_PAUSE_PROBABILITY at chaos 1: chance a cycle freezes between claim and submit")
	fs.IntVar(&cfg.Crashes, "crashes", cfg.Crashes, "abrupt rail-proxy crashes (SIGKILL, then restart on the same port) per run")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the payouts, the rail-stub's draws, the executors' pauses and the chaos schedule")
	fs.DurationVar(&cfg.MaxDuration, "max-duration", cfg.MaxDuration, "bound of one run; payouts still unsettled then fail the run")
	fs.BoolVar(&cfg.Fencing, "fencing", cfg.Fencing, "RAIL_PROXY_FENCING_ENABLED for a single run (given alone, turns --compare off)")
	fs.BoolVar(&cfg.Compare, "compare", cfg.Compare, "run the same seeded scenario with fencing on and off, on fresh databases, side by side")
	fs.BoolVar(&cfg.Grants, "grants", cfg.Grants, "lock-server signs grants and rail-proxy and payment-resource verify them (docs/contracts/signed-grants.md) in the runs")
	fs.BoolVar(&cfg.Attack, "attack", cfg.Attack, "after the runs, a rogue client with no lease presents a huge token, with grants verified and not, and an insider with genuine leases makes moves the books never made, with the books checked and not (needs the throwaway PostgreSQL)")
	fs.BoolVar(&cfg.UnsafeNoAuth, "unsafe-no-auth", cfg.UnsafeNoAuth, "run every service plaintext with UNSAFE_NO_AUTH=true: no workload identities, no roles (the attack's identity rows then succeed); grants only with --grants")
	fs.Var(failoverFlag{&cfg.Failover}, "failover", "one fenced run on replicated paydb and lockdb, the primary killed (SIGKILL) mid-run: bare or =promote, a primary and a synchronous standby promoted by hand (pg_ctl promote); =patroni, a Patroni cluster (etcd, three PostgreSQL nodes, synchronous_mode_strict) whose leader is killed and Patroni promotes (needs patroni and etcd installed; see docs/operations/high-availability.md)")
	fs.StringVar(&cfg.RailProtocol, "rail-protocol", cfg.RailProtocol, "the rail's language: stub (rail-stub's JSON) or iso20022 (pain.001, pain.002, camt.053; RAIL_PROTOCOL, RAIL_STUB_PROTOCOL, PAYMENT_RAIL_PROFILE; docs/contracts/iso20022.md)")
	fs.StringVar(&cfg.StatementSource, "statement-source", cfg.StatementSource, "where the reconciler reads the rail's statement: proxy (rail-proxy's statement route) or dir (camt.053 files rail-stub writes every 500ms; RECONCILER_STATEMENT_SOURCE, RAIL_STUB_STATEMENT_DIR)")
	fs.BoolVar(&cfg.JSON, "json", cfg.JSON, "print the report as JSON on stdout")
	fs.BoolVar(&cfg.Keep, "keep", cfg.Keep, "leave the servers running after the report; print their URLs; Ctrl-C stops them")
	fs.StringVar(&cfg.PaydbURL, "paydb-url", "", "use this empty paydb instead of a throwaway PostgreSQL (with --lockdb-url)")
	fs.StringVar(&cfg.LockdbURL, "lockdb-url", "", "use this empty lockdb instead of a throwaway PostgreSQL (with --paydb-url)")
	fs.StringVar(&cfg.LogPath, "log", "", "file for the services' JSON logs (default: a new file in the temp directory)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "EXECUTOR_LEASE_TTL")
	fs.DurationVar(&cfg.Pause, "pause", cfg.Pause, "EXECUTOR_PAUSE: a paused executor's freeze; longer than --lease-ttl makes stale writers")
	fs.DurationVar(&cfg.RailReadTimeout, "rail-read-timeout", cfg.RailReadTimeout, "RAIL_READ_TIMEOUT; slow-rail windows answer later than this")
	fs.DurationVar(&cfg.RailConnectTimeout, "rail-connect-timeout", cfg.RailConnectTimeout, "RAIL_CONNECT_TIMEOUT")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(usage)
			fmt.Fprint(usage, `lockdemo: the whole lock.dev system on one machine, under chaos, ending in a verdict.

Starts a throwaway PostgreSQL, lock-server, payment-resource, rail-stub and rail-proxy
with workload identities on (mutual TLS between named workloads, roles per route,
leases bound to their workload; docs/contracts/workload-identity.md), seeds payouts,
runs executors with stale-writer pauses, a slow and lossy rail and a rail-proxy
crash, then checks the invariants from ground truth. By default it runs the
same seeded scenario twice, with fencing on and off, with grants signed and verified
(docs/contracts/signed-grants.md); the fenced run checks every move against the books
(docs/contracts/books.md), the fencing-off run checks neither fence nor books. Then it
shows a rogue client's made-up token refused with grants verified and admitted without,
an insider's moves with genuine leases refused with the books checked and made
without, and the workloads' attacks on each other refused by their identities (made, with
--unsafe-no-auth). Exit status 0 only when every invariant held in the fenced run, and every
rogue attempt and insider move was refused (the identity rows: with identities on). See
docs/lockdemo.md.

usage: lockdemo [flags]

`)
			fs.PrintDefaults()
			return cfg, flag.ErrHelp
		}
		return cfg, err
	}
	if fs.NArg() > 0 {
		if a := fs.Arg(0); cfg.Failover != "" && (a == FailoverPromote || a == FailoverPatroni) {
			return cfg, fmt.Errorf("unexpected argument %q: write --failover=%s", a, a)
		}
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["fencing"] && !set["compare"] {
		cfg.Compare = false
	}
	// --failover alone is one run on replicated databases; --compare or --attack
	// given with it are refused by Validate.
	if cfg.Failover != "" {
		if !set["compare"] {
			cfg.Compare = false
		}
		if !set["attack"] {
			cfg.Attack = false
		}
	}
	if cfg.Failover == FailoverPatroni && !set["max-duration"] {
		cfg.MaxDuration = patroniMaxDuration
	}
	return cfg, cfg.Validate()
}
