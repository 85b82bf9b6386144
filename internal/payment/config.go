package payment

import (
	"fmt"
	"io"
	"net"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/paydb"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// ServiceName is the service field of every log line and the binary's name.
const ServiceName = "payment-resource"

// Defaults (docs/contracts/configuration.md, docs/contracts/rail-proxy.md).
const (
	DefaultAddr      = ":8082"
	DefaultLogLevel  = "info"
	DefaultMaxConns  = 20
	DefaultDBTimeout = 2 * time.Second
	maxMaxConns      = 10_000
	// DefaultSettleAfter is PAYMENT_SETTLE_AFTER's default, the reconciler's
	// RECONCILER_SETTLE_AFTER default: a deployment sets the two alike
	// (docs/contracts/books.md).
	DefaultSettleAfter = 5 * time.Minute
)

// Config is every setting of payment-resource (docs/contracts/configuration.md)
// plus the in-process hooks.
type Config struct {
	Addr     string // PAYMENT_RESOURCE_ADDR
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
	SettleToken        string // PAYMENT_SETTLE_TOKEN; empty disables the settle endpoint
	// GrantKeysFile is PAYMENT_GRANT_KEYS_FILE: the JWK Set every claim's and
	// post's X-Fencing-Grant is verified with (docs/contracts/signed-grants.md).
	// Required unless UNSAFE_NO_AUTH; empty then: grants are not verified.
	GrantKeysFile string
	// GrantWidRequired is GRANT_WID_REQUIRED: with mutual TLS, a grant without
	// wid is refused (workload_mismatch); false accepts it, logged, during a
	// rolling upgrade (docs/contracts/workload-identity.md).
	GrantWidRequired bool
	// The roles (docs/contracts/workload-identity.md): comma-separated SPIFFE IDs
	// allowed each route; enforced only when the service serves mutual TLS.
	Creators string // PAYMENT_CREATORS: createPayout
	Workers  string // PAYMENT_WORKERS: claimPayout, postPayout
	Settlers string // PAYMENT_SETTLERS: settlePayout (the bearer stays required too)
	Readers  string // PAYMENT_READERS: listPayouts, getPayout
	// BooksCheck is PAYMENT_BOOKS_CHECK: a post must agree with the payout's
	// forwardable rail_submission row, a settle with the statement copy
	// (docs/contracts/books.md). false: posts and settles are judged by the
	// payout's status and token alone, for callers whose audit trail lives in
	// another database; start-up says so at WARN.
	BooksCheck bool
	// SettleAfter is PAYMENT_SETTLE_AFTER: a NOT_PRESENTED settle needs the
	// statement read this long after the payout's attempt (docs/contracts/books.md).
	SettleAfter time.Duration
	// RailProfile is PAYMENT_RAIL_PROFILE: ProfileStub (the default) or
	// ProfileISO20022, which refuses at creation a payout the ISO 20022 rail
	// could never present (profile.go, docs/contracts/payments.md).
	RailProfile string

	Listener  net.Listener // when set, serve on it instead of listening on Addr (tests, lockdemo)
	LogOutput io.Writer    // nil means os.Stdout

	// DBTimeout bounds one request's paydb work, the wait for a pool connection
	// included; past it the request answers 503 UNAVAILABLE. Zero means
	// DefaultDBTimeout (2 s, docs/contracts/configuration.md). Not a setting: a
	// test hook, so a test of the 503 path need not wait the full bound.
	DBTimeout time.Duration
}

// DefaultConfig is the configuration with every default of docs/contracts/configuration.md.
func DefaultConfig() Config {
	return Config{
		Addr:          DefaultAddr,
		LogLevel:      DefaultLogLevel,
		PaydbMaxConns: DefaultMaxConns,
		BooksCheck:    true,
		SettleAfter:   DefaultSettleAfter,
		RailProfile:   ProfileStub,

		GrantWidRequired: true,
		// The roles' defaults: the default workload names in the default trust
		// domain (docs/contracts/workload-identity.md).
		Creators: identity.DefaultIDs(identity.NamePayoutCreator, identity.NameOps),
		Workers:  identity.DefaultIDs(identity.NameExecutor),
		Settlers: identity.DefaultIDs(identity.NameReconciler),
		Readers:  identity.DefaultIDs(identity.NameExecutor, identity.NameReconciler, identity.NameOps),
	}
}

// roles are the parsed role settings.
type roles struct {
	creators, workers, settlers, readers []spiffeid.ID
}

// roles parses the four role settings; an error names the setting (exit 2).
func (c Config) roles() (roles, error) {
	var r roles
	for _, s := range []struct {
		env string
		raw string
		ids *[]spiffeid.ID
	}{
		{"PAYMENT_CREATORS", c.Creators, &r.creators},
		{"PAYMENT_WORKERS", c.Workers, &r.workers},
		{"PAYMENT_SETTLERS", c.Settlers, &r.settlers},
		{"PAYMENT_READERS", c.Readers, &r.readers},
	} {
		ids, err := identity.ParseRole(s.env, s.raw)
		if err != nil {
			return r, err
		}
		*s.ids = ids
	}
	return r, nil
}

// Validate checks every setting; an error names the variable.
func (c Config) Validate() error {
	if c.Listener == nil {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return serve.Invalid("PAYMENT_RESOURCE_ADDR", "must be host:port (e.g. :8082)")
		}
	}
	if err := c.spec().Check(); err != nil {
		return err
	}
	if c.SettleToken != "" {
		if err := service.CheckSettleToken(c.SettleToken); err != nil {
			return err
		}
	}
	if _, err := c.roles(); err != nil {
		return err
	}
	if c.SettleAfter <= 0 {
		return serve.Invalid("PAYMENT_SETTLE_AFTER", "must be positive, got %s", c.SettleAfter)
	}
	if !validProfile(c.RailProfile) {
		return serve.Invalid("PAYMENT_RAIL_PROFILE", "must be %s or %s, got %q", ProfileStub, ProfileISO20022, c.RailProfile)
	}
	if c.DBTimeout < 0 {
		return fmt.Errorf("payment: DBTimeout must not be negative")
	}
	return nil
}

// startupCheckTimeout bounds each start-up check of paydb: its schema version,
// then its durability.
const startupCheckTimeout = 10 * time.Second

// spec is payment-resource as the service skeleton runs it, over paydb; migrate
// applies the whole tree, rail-proxy's and the reconciler's tables too
// (docs/contracts/database.md).
func (c Config) spec() service.Spec {
	return service.Spec{Name: ServiceName, LogLevel: c.LogLevel, LogOutput: c.LogOutput, Addr: c.Addr, Listener: c.Listener, Identity: c.Identity, HealthAddr: c.HealthAddr, Validate: c.Validate,
		DB: &service.Database{Tree: paydb.Tree(), URL: c.PaydbURL, MaxConns: c.PaydbMaxConns, ConnsBound: maxMaxConns,
			UnsafeNonDurable: c.UnsafeNonDurableDB, Roles: c.DBRoles, MigrateCommand: ServiceName + " migrate", CheckTimeout: startupCheckTimeout},
		AuthMaterial: []service.Material{{Env: "PAYMENT_GRANT_KEYS_FILE", Value: c.GrantKeysFile,
			What: "the JWK Set of lock-server's public keys every claim's and post's grant is verified with"}}}
}

func (c Config) dbTimeout() time.Duration {
	if c.DBTimeout == 0 {
		return DefaultDBTimeout
	}
	return c.DBTimeout
}

const synopsis = ServiceName + " [serve|migrate] [flags]"

// ParseConfig reads the subcommand (serve by default, or migrate), the flags and
// the environment. --help writes the usage to stdout and returns serve.ErrHelp.
func ParseConfig(args []string, getenv func(string) string) (string, Config, error) {
	return ParseConfigTo(args, getenv, nil)
}

// ParseConfigTo is ParseConfig writing the usage for --help to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (string, Config, error) {
	cfg := DefaultConfig()
	def := DefaultConfig()
	c := service.Command{Name: ServiceName, Synopsis: synopsis, Commands: []string{"serve", "migrate"}}
	cmd, err := c.Parse(args, getenv, usage, func(s *serve.Settings) {
		s.String(&cfg.Addr, "PAYMENT_RESOURCE_ADDR", DefaultAddr, "listen address")
		service.BindLogLevel(s, &cfg.LogLevel)
		service.BindIdentity(s, &cfg.Identity, &cfg.HealthAddr)
		service.BindRoles(s, "paydb", &cfg.DBRoles)
		s.String(&cfg.PaydbURL, "PAYDB_URL", "", "paydb PostgreSQL URL; the libpq PG* environment when empty")
		s.Int(&cfg.PaydbMaxConns, "PAYDB_MAX_CONNS", DefaultMaxConns,
			"paydb pool size; a request waiting longer than 2s for paydb answers 503")
		s.Bool(&cfg.UnsafeNonDurableDB, "UNSAFE_NON_DURABLE_DB", false,
			"serve a paydb whose fsync is off (logged at ERROR); only for throwaway test and demo databases")
		s.String(&cfg.SettleToken, "PAYMENT_SETTLE_TOKEN", "",
			"bearer token the reconciler presents to settle AMBIGUOUS payouts (at least 16 characters); empty disables the settle endpoint (404). Prefer the variable: a flag shows in the process list")
		s.String(&cfg.GrantKeysFile, "PAYMENT_GRANT_KEYS_FILE", "",
			"JWK Set of lock-server's public keys: every claim and post must carry a grant signed by one of them (docs/contracts/signed-grants.md); required unless UNSAFE_NO_AUTH")
		s.Bool(&cfg.GrantWidRequired, "GRANT_WID_REQUIRED", true,
			"with mutual TLS, refuse a grant without wid (workload_mismatch); false accepts it, logged grant_without_wid, only while lock-server is upgraded (docs/contracts/workload-identity.md)")
		s.String(&cfg.Creators, "PAYMENT_CREATORS", def.Creators,
			"SPIFFE IDs, comma-separated, that may create payouts (docs/contracts/workload-identity.md)")
		s.String(&cfg.Workers, "PAYMENT_WORKERS", def.Workers,
			"SPIFFE IDs, comma-separated, that may claim and post payouts")
		s.String(&cfg.Settlers, "PAYMENT_SETTLERS", def.Settlers,
			"SPIFFE IDs, comma-separated, that may settle payouts (the bearer PAYMENT_SETTLE_TOKEN is required too)")
		s.String(&cfg.Readers, "PAYMENT_READERS", def.Readers,
			"SPIFFE IDs, comma-separated, that may read payouts")
		s.Bool(&cfg.BooksCheck, "PAYMENT_BOOKS_CHECK", true,
			"post only the outcome the audit trail recorded and settle only as the statement copy says (docs/contracts/books.md); false only when the callers' books live in another database (logged at WARN)")
		s.Duration(&cfg.SettleAfter, "PAYMENT_SETTLE_AFTER", DefaultSettleAfter,
			"how long after a payout's attempt the statement must have been read before a NOT_PRESENTED settle is taken; set it as RECONCILER_SETTLE_AFTER")
		s.String(&cfg.RailProfile, "PAYMENT_RAIL_PROFILE", ProfileStub,
			"the rail whose limits a payout must fit at creation: stub (any payout the API allows) or iso20022 (also refuses a payoutId over 35, an accountId or beneficiary over 34 characters, a currency without an ISO 4217 minor unit; set it with rail-proxy's RAIL_PROTOCOL=iso20022)")
	})
	if err != nil {
		return cmd, cfg, err
	}
	return cmd, cfg, cfg.Validate()
}
