// Package reconcile is the reconciler (docs/contracts/reconciliation.md): it reads the rail's
// statement through rail-proxy, keeps a durable copy of it in paydb, settles every
// AMBIGUOUS payout from it through payment-resource — PAID, DECLINED or
// NOT_PRESENTED — and records every disagreement between the statement and the
// books as an exception, once. After it, the ledger equals what the rail accepted,
// and the books close.
package reconcile

import (
	"io"
	"net"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/paydb"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// ServiceName is the service field of every log line and the binary's name.
const ServiceName = "reconciler"

// The values of RECONCILER_STATEMENT_SOURCE.
const (
	// SourceProxy reads the rail's statement through rail-proxy, page by page.
	SourceProxy = "proxy"
	// SourceDir imports the camt.053 files that appear in RECONCILER_STATEMENT_DIR.
	SourceDir = "dir"
)

// Bounds that are not settings.
const (
	// MaxPaydbConns is a sanity bound on PAYDB_MAX_CONNS.
	MaxPaydbConns = 1000
	// DBTimeout bounds each of a pass's paydb steps (one transaction or query).
	DBTimeout = 10 * time.Second
	// HTTPTimeout bounds each call to rail-proxy or payment-resource.
	HTTPTimeout = 10 * time.Second
	// HealthTimeout bounds the railProxy readiness probe.
	HealthTimeout = time.Second
	// shortSettleWindow is the settle window below which start-up warns: the
	// window must cover the longest a call can take to reach the rail's books.
	shortSettleWindow = time.Minute
)

// Config is every reconciler setting of docs/contracts/reconciliation.md and
// docs/contracts/configuration.md, plus the in-process hooks every service has.
type Config struct {
	Addr     string // RECONCILER_ADDR
	LogLevel string // LOG_LEVEL
	// Identity is TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE and UNSAFE_NO_AUTH
	// (docs/contracts/workload-identity.md).
	Identity identity.Settings
	// HealthAddr is HEALTH_ADDR: /livez, /readyz and /metrics also served there, plaintext.
	HealthAddr string
	// DBRoles are the PAYDB role settings migrate grants to.
	DBRoles       service.Roles
	PaydbURL      string // PAYDB_URL; libpq PG* environment when empty
	PaydbMaxConns int    // PAYDB_MAX_CONNS
	// UnsafeNonDurableDB (UNSAFE_NON_DURABLE_DB) serves a paydb whose fsync is
	// off: only for throwaway test and demo databases (dbconn.RequireDurable).
	UnsafeNonDurableDB bool
	RailProxyURL       string // RAIL_PROXY_URL
	PaymentResourceURL string // PAYMENT_RESOURCE_URL
	// RailProxyID and PaymentResourceID are RAIL_PROXY_ID and
	// PAYMENT_RESOURCE_ID: the SPIFFE ID each server must present over mutual
	// TLS. Empty: the service's default name in the reconciler's own trust
	// domain (docs/contracts/workload-identity.md).
	RailProxyID       string
	PaymentResourceID string
	SettleToken       string        // PAYMENT_SETTLE_TOKEN
	Interval          time.Duration // RECONCILER_INTERVAL
	SettleAfter       time.Duration // RECONCILER_SETTLE_AFTER
	// StatementSource is RECONCILER_STATEMENT_SOURCE: SourceProxy (the
	// statement read through rail-proxy) or SourceDir (camt.053 files in
	// StatementDir, RECONCILER_STATEMENT_DIR).
	StatementSource string
	StatementDir    string

	Listener net.Listener // when set, serve on it instead of listening on Addr
	// HealthListener, when set, serves what HEALTH_ADDR would (tests).
	HealthListener net.Listener
	LogOutput      io.Writer // nil means os.Stdout
}

// DefaultConfig is the configuration with every default of
// docs/contracts/configuration.md and docs/contracts/reconciliation.md.
func DefaultConfig() Config {
	return Config{
		Addr:               ":8086",
		LogLevel:           "info",
		PaydbMaxConns:      20,
		RailProxyURL:       "http://127.0.0.1:8083",
		PaymentResourceURL: "http://127.0.0.1:8082",
		Interval:           5 * time.Second,
		SettleAfter:        5 * time.Minute,
		StatementSource:    SourceProxy,
	}
}

// Validate checks every setting `migrate` needs; an error names the variable and
// never quotes a secret.
func (c Config) Validate() error {
	if c.Addr == "" && c.Listener == nil {
		return serve.Invalid("RECONCILER_ADDR", "must not be empty")
	}
	if err := c.spec(nil).Check(); err != nil {
		return err
	}
	return nil
}

// ValidateServe checks every setting `serve` needs besides those of Validate.
func (c Config) ValidateServe() error {
	if err := c.Validate(); err != nil {
		return err
	}
	urls := []struct{ env, val string }{{"PAYMENT_RESOURCE_URL", c.PaymentResourceURL}}
	switch c.StatementSource {
	case SourceProxy:
		urls = append(urls, struct{ env, val string }{"RAIL_PROXY_URL", c.RailProxyURL})
		if err := identity.CheckPeer("RAIL_PROXY_ID", c.RailProxyID); err != nil {
			return err
		}
	case SourceDir:
		// The statement comes from files: rail-proxy is not called, so neither
		// its URL nor its identity matters.
		if c.StatementDir == "" {
			return serve.Invalid("RECONCILER_STATEMENT_DIR", "must be set with RECONCILER_STATEMENT_SOURCE=dir: the directory the camt.053 statement files appear in")
		}
	default:
		return serve.Invalid("RECONCILER_STATEMENT_SOURCE", "must be %s or %s, got %q", SourceProxy, SourceDir, c.StatementSource)
	}
	for _, u := range urls {
		if err := service.CheckBaseURL(u.env, u.val); err != nil {
			return err
		}
		// With TLS set every call is mutual TLS: an http:// URL would carry no
		// identity, so it is refused here rather than failing every pass later.
		if err := c.Identity.CheckURL(u.env, u.val); err != nil {
			return err
		}
	}
	if err := identity.CheckPeer("PAYMENT_RESOURCE_ID", c.PaymentResourceID); err != nil {
		return err
	}
	if c.SettleToken == "" {
		return serve.Invalid("PAYMENT_SETTLE_TOKEN", "must be set: it is the bearer token payment-resource's settle endpoint was given")
	}
	if err := service.CheckSettleToken(c.SettleToken); err != nil {
		return err
	}
	if c.Interval <= 0 {
		return serve.Invalid("RECONCILER_INTERVAL", "must be positive, got %s", c.Interval)
	}
	if c.SettleAfter <= 0 {
		return serve.Invalid("RECONCILER_SETTLE_AFTER", "must be positive, got %s", c.SettleAfter)
	}
	return nil
}

// startupCheckTimeout bounds each start-up check of paydb: its schema version,
// then its durability.
const startupCheckTimeout = 15 * time.Second

// spec is the reconciler as the service skeleton runs it, over paydb, its
// settings checked by validate; migrate applies the whole tree, one for every
// service of paydb (docs/contracts/database.md). A pass holds one connection for
// its advisory lock and readiness needs another: at least two.
func (c Config) spec(validate func() error) service.Spec {
	return service.Spec{Name: ServiceName, LogLevel: c.LogLevel, LogOutput: c.LogOutput, Addr: c.Addr, Listener: c.Listener, Identity: c.Identity, HealthAddr: c.HealthAddr, HealthListener: c.HealthListener, Validate: validate,
		DB: &service.Database{Tree: paydb.Tree(), URL: c.PaydbURL, MaxConns: c.PaydbMaxConns, MinConns: 2, ConnsBound: MaxPaydbConns,
			UnsafeNonDurable: c.UnsafeNonDurableDB, Roles: c.DBRoles, MigrateCommand: ServiceName + " migrate", CheckTimeout: startupCheckTimeout}}
}

// synopsis names the exceptions command too, which has a usage of its own.
const synopsis = ServiceName + " [serve|migrate] [flags]\n       " +
	ServiceName + " " + ExceptionsCommand + " list|show|resolve … (see `" + ServiceName + " " + ExceptionsCommand + " help`)"

// ParseConfig reads the subcommand ("serve", the default, or "migrate"), flags and
// environment. --help writes the usage to stdout and returns serve.ErrHelp.
func ParseConfig(args []string, getenv func(string) string) (string, Config, error) {
	return ParseConfigTo(args, getenv, nil)
}

// ParseConfigTo is ParseConfig with the usage written to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (cmd string, cfg Config, err error) {
	cfg = DefaultConfig()
	def := cfg
	c := service.Command{Name: ServiceName, Synopsis: synopsis, Commands: []string{"serve", "migrate"}}
	cmd, err = c.Parse(args, getenv, usage, func(s *serve.Settings) {
		s.String(&cfg.Addr, "RECONCILER_ADDR", def.Addr, "address of the metrics and health endpoints")
		service.BindLogLevel(s, &cfg.LogLevel)
		service.BindIdentity(s, &cfg.Identity, &cfg.HealthAddr)
		service.BindRoles(s, "paydb", &cfg.DBRoles)
		s.String(&cfg.PaydbURL, "PAYDB_URL", def.PaydbURL, "paydb connection URL; empty uses the libpq PG* environment")
		s.Int(&cfg.PaydbMaxConns, "PAYDB_MAX_CONNS", def.PaydbMaxConns, "paydb pool size (a pass holds one connection for its advisory lock)")
		s.Bool(&cfg.UnsafeNonDurableDB, "UNSAFE_NON_DURABLE_DB", false,
			"serve a paydb whose fsync is off (logged at ERROR); only for throwaway test and demo databases")
		s.String(&cfg.RailProxyURL, "RAIL_PROXY_URL", def.RailProxyURL, "rail-proxy, where the rail's statement is read")
		s.String(&cfg.PaymentResourceURL, "PAYMENT_RESOURCE_URL", def.PaymentResourceURL, "payment-resource, where settles are posted")
		s.String(&cfg.RailProxyID, "RAIL_PROXY_ID", def.RailProxyID, "SPIFFE ID rail-proxy must present (empty: spiffe://{own trust domain}/rail-proxy)")
		s.String(&cfg.PaymentResourceID, "PAYMENT_RESOURCE_ID", def.PaymentResourceID, "SPIFFE ID payment-resource must present (empty: spiffe://{own trust domain}/payment-resource)")
		s.String(&cfg.SettleToken, "PAYMENT_SETTLE_TOKEN", def.SettleToken,
			"bearer token for payment-resource's settle endpoint (the same value it was given; required for serve). Prefer the variable: a flag shows in the process list")
		s.String(&cfg.StatementSource, "RECONCILER_STATEMENT_SOURCE", def.StatementSource,
			"where the rail's statement comes from: proxy (read through rail-proxy) or dir (camt.053 files in RECONCILER_STATEMENT_DIR)")
		s.String(&cfg.StatementDir, "RECONCILER_STATEMENT_DIR", def.StatementDir,
			"the directory camt.053 statement files appear in (required with RECONCILER_STATEMENT_SOURCE=dir); each *.xml file is imported once")
		s.Duration(&cfg.Interval, "RECONCILER_INTERVAL", def.Interval, "pause between passes")
		s.Duration(&cfg.SettleAfter, "RECONCILER_SETTLE_AFTER", def.SettleAfter,
			"how long after an attempt's submitted_at a call that has not reached the statement is taken as never presented (NOT_PRESENTED); must exceed the longest a call can take to reach the rail's books")
	})
	switch {
	case err != nil:
		return cmd, cfg, err
	case cmd == "migrate":
		return cmd, cfg, cfg.Validate()
	}
	return cmd, cfg, cfg.ValidateServe()
}
