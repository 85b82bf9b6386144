// Package railproxy is rail-proxy, fence point (c): the only process permitted to
// call the payment rail. Every submission passes a durable per-account high-water
// mark of fencing tokens in paydb before the rail is touched, leaves one
// rail_submission row, and reaches the rail at most once
// (docs/contracts/database.md, docs/contracts/rail-proxy.md).
package railproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/paydb"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
	"lock.dev/rail"
	"lock.dev/rail/iso20022"
	"lock.dev/rail/stubjson"
)

// Fixed bounds of docs/contracts/rail-proxy.md. They are not settings: the interrupted-intent
// rule below is stated in terms of them.
const (
	// AdmissionBound covers the admission transaction, waiting for a pool
	// connection included.
	AdmissionBound = 2 * time.Second
	// ResolveBound covers the resolving write, its retries included.
	ResolveBound = 2 * time.Second
	// HealthTimeout bounds the railStub readiness probe.
	HealthTimeout = time.Second
	// DefaultJanitorInterval is how often unresolved intents are swept
	// (docs/contracts/rail-proxy.md asks for at least every 10 s).
	DefaultJanitorInterval = 10 * time.Second
	// MaxPaydbConns is a sanity bound on PAYDB_MAX_CONNS.
	MaxPaydbConns = 1000
	// InterruptMargin is how far RAIL_PROXY_INTERRUPTED_AFTER must at least exceed
	// the in-flight bound (docs/contracts/rail-proxy.md "Interrupted intents"):
	// room for pauses of the process (a GC, a descheduled container) on top of
	// every bound it keeps.
	InterruptMargin = 2 * time.Second
	// DefaultRailIdleConnTimeout is RAIL_IDLE_CONN_TIMEOUT's default: below the
	// idle timeouts of common HTTP servers and proxies in front of a rail (Node
	// and Apache httpd close idle connections after 5 s; nginx after 75 s, Go
	// servers and most cloud load balancers after 60 s or more), so the proxy
	// closes a pooled connection before the rail would (docs/contracts/rail-proxy.md).
	DefaultRailIdleConnTimeout = 4 * time.Second
)

// Config is every rail-proxy setting of docs/contracts/configuration.md, plus the in-process hooks
// every service has.
type Config struct {
	Addr     string // RAIL_PROXY_ADDR
	LogLevel string // LOG_LEVEL
	// Identity is TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE and UNSAFE_NO_AUTH
	// (docs/contracts/workload-identity.md).
	Identity identity.Settings
	// HealthAddr is HEALTH_ADDR: /livez, /readyz and /metrics also served there, plaintext.
	HealthAddr string
	// DBRoles are the PAYDB role settings migrate grants to.
	DBRoles            service.Roles
	PaydbURL           string        // PAYDB_URL; libpq PG* environment when empty
	PaydbMaxConns      int           // PAYDB_MAX_CONNS
	RailBaseURL        string        // RAIL_BASE_URL
	RailConnectTimeout time.Duration // RAIL_CONNECT_TIMEOUT
	RailReadTimeout    time.Duration // RAIL_READ_TIMEOUT
	FencingEnabled     bool          // RAIL_PROXY_FENCING_ENABLED
	InterruptedAfter   time.Duration // RAIL_PROXY_INTERRUPTED_AFTER
	// RailProtocol is RAIL_PROTOCOL: the language the rail speaks, one of the
	// built-in adapters (ProtocolStub, ProtocolISO20022); "" is the default,
	// stub. With Adapter set it must be "" or Adapter's own name.
	RailProtocol string
	// Adapter is a hook for a rail-proxy binary built around its own rail's
	// adapter (lock.dev/rail/gate): when set, it speaks to the rail instead of
	// the built-in adapter RAIL_PROTOCOL names.
	Adapter rail.Adapter
	// BooksCheck is RAIL_PROXY_BOOKS_CHECK: a submission is admitted only when
	// payment-resource's payout row (same paydb) holds it claimed by this token and
	// owner, with the same account, amount, currency and beneficiary
	// (docs/contracts/books.md). Off only for a gate whose callers' books live in
	// another database.
	BooksCheck bool
	// RailIdleConnTimeout is RAIL_IDLE_CONN_TIMEOUT: how long a rail connection
	// may sit idle in the pool; 0 disables reuse (a new connection per call).
	RailIdleConnTimeout time.Duration
	// RailTLS is RAIL_ID and RAIL_TLS_*: how the hop to the rail is verified
	// (railtls.go).
	RailTLS            RailTLS
	UnsafeNonDurableDB bool // UNSAFE_NON_DURABLE_DB: serve a paydb whose fsync is off (throwaway databases only)
	// GrantKeysFile is RAIL_PROXY_GRANT_KEYS_FILE: the JWK Set every submission's
	// X-Fencing-Grant is verified with (docs/contracts/signed-grants.md). Empty is
	// refused at start unless UNSAFE_NO_AUTH=true: grants are then not verified.
	GrantKeysFile string
	// MaxGroup is RAIL_PROXY_MAX_GROUP: at most this many submissions are
	// admitted in one transaction (and resolved in one statement); 1 admits one
	// by one (group.go).
	MaxGroup int
	// GrantWidRequired is GRANT_WID_REQUIRED: with mutual TLS, a grant without
	// wid is refused (workload_mismatch); false accepts it, logged, only while
	// lock-server is upgraded (docs/contracts/workload-identity.md).
	GrantWidRequired bool
	// Submitters is RAIL_PROXY_SUBMITTERS and Readers RAIL_PROXY_READERS: the
	// SPIFFE IDs, comma-separated, allowed to submit (submitPayment) and to read
	// the audit trail and the statement (listSubmissions, readStatement);
	// enforced only when the proxy serves mutual TLS
	// (docs/contracts/workload-identity.md).
	Submitters string
	Readers    string

	Listener  net.Listener // when set, serve on it instead of listening on Addr
	LogOutput io.Writer    // nil means os.Stdout

	// JanitorInterval is a test hook, not a setting: how often the
	// interrupted-intent janitor sweeps. Zero means the production cadence,
	// min(DefaultJanitorInterval, InterruptedAfter/4); a value above that is
	// lowered to it.
	JanitorInterval time.Duration
	// RailDial is a test hook, not a setting: when set, it opens connections to
	// the rail instead of a net.Dialer (a test makes a dial that never completes
	// without depending on the kernel). It must honour ctx.
	RailDial func(ctx context.Context, network, addr string) (net.Conn, error)

	// hooks are seams only this package's tests set (worker.go).
	hooks *hooks
}

// DefaultConfig is the configuration with every default (docs/contracts/configuration.md).
func DefaultConfig() Config {
	return Config{
		Addr:               ":8083",
		LogLevel:           "info",
		PaydbMaxConns:      20,
		RailBaseURL:        "http://127.0.0.1:8084",
		RailProtocol:       ProtocolStub,
		RailConnectTimeout: time.Second,
		RailReadTimeout:    2 * time.Second,
		FencingEnabled:     true,
		BooksCheck:         true,
		InterruptedAfter:   60 * time.Second,

		RailIdleConnTimeout: DefaultRailIdleConnTimeout,
		MaxGroup:            DefaultMaxGroup,
		GrantWidRequired:    true,
		Submitters:          identity.DefaultIDs(identity.NameExecutor),
		Readers:             identity.DefaultIDs(identity.NameExecutor, identity.NameReconciler, identity.NameOps),
	}
}

// The built-in adapters' names, RAIL_PROTOCOL's values.
const (
	ProtocolStub     = "stub"     // rail-stub's JSON (lock.dev/rail/stubjson)
	ProtocolISO20022 = "iso20022" // pain.001, pain.002, camt.053 (lock.dev/rail/iso20022)
)

// builtinAdapter is the built-in adapter named protocol ("" : the default);
// nil when there is none of that name.
func builtinAdapter(protocol string) rail.Adapter {
	switch protocol {
	case "", ProtocolStub:
		return stubjson.New()
	case ProtocolISO20022:
		return iso20022.New()
	}
	return nil
}

// adapter is the adapter the gate speaks to the rail with: the hook's, else
// RAIL_PROTOCOL's (Validate refuses a name that is neither).
func (c Config) adapter() rail.Adapter {
	if c.Adapter != nil {
		return c.Adapter
	}
	return builtinAdapter(c.RailProtocol)
}

// checkProtocol refuses a RAIL_PROTOCOL that names no adapter, or, with the
// Adapter hook set, another adapter than the hook's.
func (c Config) checkProtocol() error {
	if c.Adapter != nil {
		own := c.Adapter.Protocol()
		if own == "" {
			return serve.Invalid("RAIL_PROTOCOL", "the rail adapter this rail-proxy is built with has no name (its Protocol() is empty)")
		}
		if c.RailProtocol != "" && c.RailProtocol != own {
			return serve.Invalid("RAIL_PROTOCOL", "this rail-proxy is built with the rail adapter %q; RAIL_PROTOCOL must be empty or %q, got %q", own, own, c.RailProtocol)
		}
		return nil
	}
	if builtinAdapter(c.RailProtocol) == nil {
		return serve.Invalid("RAIL_PROTOCOL", "must be %s or %s, got %q", ProtocolStub, ProtocolISO20022, c.RailProtocol)
	}
	return nil
}

// InFlightBound is the longest a submission can hold an unresolved row while its
// proxy is alive: admission + connect + read + resolution.
func (c Config) InFlightBound() time.Duration {
	return AdmissionBound + c.RailConnectTimeout + c.RailReadTimeout + ResolveBound
}

// Validate checks every bound; an error names the variable.
func (c Config) Validate() error {
	if c.Addr == "" && c.Listener == nil {
		return serve.Invalid("RAIL_PROXY_ADDR", "must not be empty")
	}
	if err := c.spec().Check(); err != nil {
		return err
	}
	// The URL may carry the rail's credentials: the message shows it redacted.
	if err := service.CheckBaseURL("RAIL_BASE_URL", c.RailBaseURL); err != nil {
		return err
	}
	if err := c.checkProtocol(); err != nil {
		return err
	}
	if err := c.RailTLS.check(c.Identity, c.RailBaseURL); err != nil {
		return err
	}
	if c.RailConnectTimeout <= 0 {
		return serve.Invalid("RAIL_CONNECT_TIMEOUT", "must be positive, got %s", c.RailConnectTimeout)
	}
	if c.RailReadTimeout <= 0 {
		return serve.Invalid("RAIL_READ_TIMEOUT", "must be positive, got %s", c.RailReadTimeout)
	}
	if c.RailIdleConnTimeout < 0 {
		return serve.Invalid("RAIL_IDLE_CONN_TIMEOUT", "must not be negative (0 disables reuse), got %s", c.RailIdleConnTimeout)
	}
	// A janitor that takes over rows younger than the longest a live proxy can
	// hold one would mark a call still in flight TIMEOUT, and its real answer
	// would then be lost to the audit trail; the margin covers the proxy's own
	// pauses on top of every bound.
	if c.InterruptedAfter < c.InFlightBound()+InterruptMargin {
		return serve.Invalid("RAIL_PROXY_INTERRUPTED_AFTER",
			"must exceed admission %s + RAIL_CONNECT_TIMEOUT %s + RAIL_READ_TIMEOUT %s + resolution %s = %s by at least %s, got %s",
			AdmissionBound, c.RailConnectTimeout, c.RailReadTimeout, ResolveBound, c.InFlightBound(), InterruptMargin, c.InterruptedAfter)
	}
	if c.MaxGroup < 1 || c.MaxGroup > MaxMaxGroup {
		return serve.Invalid("RAIL_PROXY_MAX_GROUP", "must be between 1 and %d, got %d", MaxMaxGroup, c.MaxGroup)
	}
	if c.JanitorInterval < 0 {
		return errors.New("railproxy: JanitorInterval must not be negative")
	}
	if _, err := c.roles(); err != nil {
		return err
	}
	return nil
}

// roles are the allowed callers of each route guarded by a role.
type roles struct{ submitters, readers []spiffeid.ID }

// roles parses RAIL_PROXY_SUBMITTERS and RAIL_PROXY_READERS; an error names the
// setting.
func (c Config) roles() (roles, error) {
	var r roles
	var err error
	if r.submitters, err = identity.ParseRole("RAIL_PROXY_SUBMITTERS", c.Submitters); err != nil {
		return r, err
	}
	if r.readers, err = identity.ParseRole("RAIL_PROXY_READERS", c.Readers); err != nil {
		return r, err
	}
	return r, nil
}

// startupCheckTimeout bounds each start-up check of paydb: standby and schema
// version, then durability.
const startupCheckTimeout = 15 * time.Second

// spec is rail-proxy as the service skeleton runs it: its log batched (it logs
// on the submission path), over paydb's primary only; migrate applies the whole
// tree, payment-resource's and the reconciler's tables too. BackendPID: a COMMIT
// whose answer was lost is resolved by looking its backend up in
// pg_stat_activity by the connection's announced pid.
func (c Config) spec() service.Spec {
	return service.Spec{Name: "rail-proxy", LogLevel: c.LogLevel, LogOutput: c.LogOutput, Addr: c.Addr, Listener: c.Listener, Identity: c.Identity, HealthAddr: c.HealthAddr, Validate: c.Validate,
		BatchLog: true, DB: &service.Database{Tree: paydb.Tree(), URL: c.PaydbURL, MaxConns: c.PaydbMaxConns, ConnsBound: MaxPaydbConns,
			UnsafeNonDurable: c.UnsafeNonDurableDB, Roles: c.DBRoles, MigrateCommand: "rail-proxy migrate", CheckTimeout: startupCheckTimeout,
			Check: refuseStandby, BackendPID: true},
		AuthMaterial: []service.Material{{Env: "RAIL_PROXY_GRANT_KEYS_FILE", Value: c.GrantKeysFile,
			What: "the JWK Set of lock-server's public keys every submission's grant is verified with"}}}
}

// janitorInterval is min(10 s, RAIL_PROXY_INTERRUPTED_AFTER/4), or the test hook
// when it is smaller. A row becomes interrupted at InterruptedAfter and is swept at
// most one interval later, so with a short InterruptedAfter (a demo's few seconds)
// a fixed 10 s would leave it unresolved for several times its own age; a quarter
// keeps that delay proportionate and never beyond the 10 s of
// docs/contracts/rail-proxy.md.
func (c Config) janitorInterval() time.Duration {
	d := DefaultJanitorInterval
	if q := c.InterruptedAfter / 4; q > 0 && q < d {
		d = q
	}
	if c.JanitorInterval > 0 && c.JanitorInterval < d {
		d = c.JanitorInterval
	}
	return d
}

// ParseConfig reads the subcommand ("serve", the default, or "migrate"), flags and
// environment. --help writes the usage to stdout and returns serve.ErrHelp.
func ParseConfig(args []string, getenv func(string) string) (cmd string, cfg Config, err error) {
	return ParseConfigTo(args, getenv, nil)
}

// ParseConfigTo is ParseConfig with the usage written to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (cmd string, cfg Config, err error) {
	return parseConfig(args, getenv, usage, nil)
}

// ParseConfigWith is ParseConfig for a rail-proxy built around its own
// adapter a (lock.dev/rail/gate): Config.Adapter is a, and RAIL_PROTOCOL
// defaults to a's name (any other value is refused).
func ParseConfigWith(a rail.Adapter) func(args []string, getenv func(string) string) (string, Config, error) {
	return func(args []string, getenv func(string) string) (string, Config, error) {
		return parseConfig(args, getenv, nil, a)
	}
}

func parseConfig(args []string, getenv func(string) string, usage io.Writer, a rail.Adapter) (cmd string, cfg Config, err error) {
	cfg = DefaultConfig()
	if a != nil {
		cfg.Adapter, cfg.RailProtocol = a, a.Protocol()
	}
	def := cfg
	protocols := "the rail's language: " + ProtocolStub + " (rail-stub's JSON) or " + ProtocolISO20022 + " (pain.001, pain.002, camt.053); docs/integrating-your-rail.md"
	if a != nil {
		protocols = "the rail's language: this rail-proxy speaks " + a.Protocol() + " only; docs/integrating-your-rail.md"
	}
	c := service.Command{Name: "rail-proxy", Synopsis: "rail-proxy [serve|migrate] [flags]", Commands: []string{"serve", "migrate"}}
	cmd, err = c.Parse(args, getenv, usage, func(s *serve.Settings) {
		s.String(&cfg.Addr, "RAIL_PROXY_ADDR", def.Addr, "address to listen on")
		service.BindLogLevel(s, &cfg.LogLevel)
		service.BindIdentity(s, &cfg.Identity, &cfg.HealthAddr)
		service.BindRoles(s, "paydb", &cfg.DBRoles)
		s.String(&cfg.PaydbURL, "PAYDB_URL", def.PaydbURL, "paydb connection URL; empty uses the libpq PG* environment")
		s.Int(&cfg.PaydbMaxConns, "PAYDB_MAX_CONNS", def.PaydbMaxConns, "paydb pool size (a submission waiting longer than its 2s admission bound for a connection answers 503)")
		s.String(&cfg.RailBaseURL, "RAIL_BASE_URL", def.RailBaseURL, "base URL of the payment rail")
		s.String(&cfg.RailProtocol, "RAIL_PROTOCOL", def.RailProtocol, protocols)
		bindRailTLS(s, &cfg.RailTLS)
		s.Duration(&cfg.RailConnectTimeout, "RAIL_CONNECT_TIMEOUT", def.RailConnectTimeout, "bound on opening a connection to the rail")
		s.Duration(&cfg.RailReadTimeout, "RAIL_READ_TIMEOUT", def.RailReadTimeout, "bound from the request written to the whole reply read")
		s.Bool(&cfg.FencingEnabled, "RAIL_PROXY_FENCING_ENABLED", def.FencingEnabled, "refuse tokens not strictly above the account's mark (false only to demonstrate the hazard; never in production)")
		s.Bool(&cfg.BooksCheck, "RAIL_PROXY_BOOKS_CHECK", def.BooksCheck, "admit only a payout the books (paydb's payout table) hold claimed by this token and owner, as booked (false only for a gate whose callers' books live in another database; logged at ERROR)")
		s.Duration(&cfg.InterruptedAfter, "RAIL_PROXY_INTERRUPTED_AFTER", def.InterruptedAfter, "age after which an unresolved intent is taken for a dead proxy's and resolved TIMEOUT; must exceed 2s + connect + read + 2s by at least 2s")
		s.Duration(&cfg.RailIdleConnTimeout, "RAIL_IDLE_CONN_TIMEOUT", def.RailIdleConnTimeout, "how long an idle rail connection is kept for reuse; keep it below the rail's own idle timeout; 0 disables reuse")
		s.Bool(&cfg.UnsafeNonDurableDB, "UNSAFE_NON_DURABLE_DB", def.UnsafeNonDurableDB, "serve a paydb whose fsync is off (logged at ERROR); only for throwaway test and demo databases")
		s.String(&cfg.GrantKeysFile, "RAIL_PROXY_GRANT_KEYS_FILE", def.GrantKeysFile, "JWK Set of lock-server's public keys: every submission must carry a grant signed by one of them (docs/contracts/signed-grants.md); required unless UNSAFE_NO_AUTH=true")
		s.Int(&cfg.MaxGroup, "RAIL_PROXY_MAX_GROUP", def.MaxGroup, "at most this many submissions admitted in one paydb transaction, and resolved in one statement (1: one by one)")
		s.Bool(&cfg.GrantWidRequired, "GRANT_WID_REQUIRED", def.GrantWidRequired,
			"with mutual TLS, refuse a grant without wid (workload_mismatch); false accepts it, logged grant_without_wid, only while lock-server is upgraded (docs/contracts/workload-identity.md)")
		s.String(&cfg.Submitters, "RAIL_PROXY_SUBMITTERS", def.Submitters, "SPIFFE IDs, comma-separated, that may present submissions (docs/contracts/workload-identity.md)")
		s.String(&cfg.Readers, "RAIL_PROXY_READERS", def.Readers, "SPIFFE IDs, comma-separated, that may read the audit trail and the statement")
	})
	if err != nil {
		return cmd, cfg, err
	}
	return cmd, cfg, cfg.Validate()
}
