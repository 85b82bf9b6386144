package lockserver

import (
	"io"
	"math"
	"net"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/lockdb"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// Config is everything lock-server is told (docs/contracts/configuration.md), plus the hooks that
// let tests and lockdemo run it in-process.
type Config struct {
	Addr     string // LOCK_SERVER_ADDR
	LogLevel string // LOG_LEVEL
	// Identity is TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE and UNSAFE_NO_AUTH
	// (docs/contracts/workload-identity.md).
	Identity identity.Settings
	// HealthAddr is HEALTH_ADDR: /livez, /readyz and /metrics also served there, plaintext.
	HealthAddr string
	// Holders is LOCK_SERVER_HOLDERS: the SPIFFE IDs that may acquire, renew,
	// release and read a lock (docs/contracts/workload-identity.md).
	Holders string
	// Readers is LOCK_SERVER_READERS: the SPIFFE IDs that may read a lock and
	// its grants history.
	Readers string
	// DBRoles are the LOCKDB role settings migrate grants to.
	DBRoles        service.Roles
	LockdbURL      string        // LOCKDB_URL; empty means the libpq PG* environment
	LockdbMaxConns int           // LOCKDB_MAX_CONNS
	MinTTL         time.Duration // LOCK_MIN_TTL: shortest lease a caller may ask for
	MaxTTL         time.Duration // LOCK_MAX_TTL: longest lease a caller may ask for
	// UnsafeNonDurableDB (UNSAFE_NON_DURABLE_DB) serves a lockdb whose fsync is
	// off: only for throwaway test and demo databases (dbconn.RequireDurable).
	UnsafeNonDurableDB bool

	// SigningKeyFile is LOCK_SERVER_SIGNING_KEY_FILE: a PEM PKCS#8 Ed25519 private
	// key; every grant is signed with it (docs/contracts/signed-grants.md). Empty:
	// no grants are signed.
	SigningKeyFile string
	// PreviousPublicKeysFile is LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE: a JWK Set
	// published at GET /v1/keys beside the current key, so verifiers can be
	// handed a rotation in advance. Optional.
	PreviousPublicKeysFile string

	// Listener, when set, is served instead of listening on Addr (tests, lockdemo).
	Listener net.Listener
	// LogOutput receives the JSON log; nil means os.Stdout.
	LogOutput io.Writer
	// Clock is the server's own clock; nil means the system clock. It is a test
	// hook and deliberately powerless: lease time is database time
	// (docs/contracts/lock-service.md), so the server reads its clock only to
	// measure how long its own calls took. A test injects a skewed clock to show
	// grants and expiry do not move.
	Clock Clock
}

// Defaults of docs/contracts/configuration.md.
const (
	defaultAddr     = ":8081"
	defaultMaxConns = 20
	defaultMinTTL   = time.Second
	defaultMaxTTL   = 5 * time.Minute
)

// The role defaults (docs/contracts/workload-identity.md): the executor holds
// leases; the reconciler and ops read them.
var (
	defaultHolders = identity.DefaultIDs(identity.NameExecutor)
	defaultReaders = identity.DefaultIDs(identity.NameReconciler, identity.NameOps)
)

// maxTTLBound is the longest TTL lock_grant.ttl_ms (an integer column) can record.
const maxTTLBound = time.Duration(math.MaxInt32) * time.Millisecond

// DefaultConfig is the configuration with every default (docs/contracts/configuration.md).
func DefaultConfig() Config {
	return Config{
		Addr:           defaultAddr,
		LogLevel:       "info",
		LockdbMaxConns: defaultMaxConns,
		MinTTL:         defaultMinTTL,
		MaxTTL:         defaultMaxTTL,
		Holders:        defaultHolders,
		Readers:        defaultReaders,
	}
}

// roles are who may call which route: the parsed role settings.
type roles struct {
	holders []spiffeid.ID // acquireLock, renewLock, releaseLock, getLock
	readers []spiffeid.ID // getLock, listGrants
}

func (c Config) roles() (roles, error) {
	var r roles
	var err error
	if r.holders, err = identity.ParseRole("LOCK_SERVER_HOLDERS", c.Holders); err != nil {
		return r, err
	}
	if r.readers, err = identity.ParseRole("LOCK_SERVER_READERS", c.Readers); err != nil {
		return r, err
	}
	return r, nil
}

// Validate checks every setting; an error names the variable (exit 2).
func (c Config) Validate() error {
	if c.Listener == nil && c.Addr == "" {
		return serve.Invalid("LOCK_SERVER_ADDR", "must not be empty")
	}
	if err := c.spec().Check(); err != nil {
		return err
	}
	if _, err := c.roles(); err != nil {
		return err
	}
	// TTLs travel as whole milliseconds (ttlMs), so the bounds must be whole
	// milliseconds too, or a bound could not be asked for exactly.
	if c.MinTTL < time.Millisecond || c.MinTTL%time.Millisecond != 0 {
		return serve.Invalid("LOCK_MIN_TTL", "must be a whole number of milliseconds, at least 1ms")
	}
	if c.MaxTTL%time.Millisecond != 0 || c.MaxTTL > maxTTLBound {
		return serve.Invalid("LOCK_MAX_TTL", "must be a whole number of milliseconds, at most %s", maxTTLBound)
	}
	if c.MaxTTL < c.MinTTL {
		return serve.Invalid("LOCK_MAX_TTL", "must not be shorter than LOCK_MIN_TTL (%s)", c.MinTTL)
	}
	return nil
}

// schemaCheckTimeout bounds each start-up check of lockdb: its schema version,
// then its durability.
const schemaCheckTimeout = 10 * time.Second

// spec is lock-server as the service skeleton runs it, over lockdb.
func (c Config) spec() service.Spec {
	return service.Spec{Name: "lock-server", LogLevel: c.LogLevel, LogOutput: c.LogOutput, Addr: c.Addr, Listener: c.Listener, Identity: c.Identity, HealthAddr: c.HealthAddr, Validate: c.Validate,
		DB: &service.Database{Tree: lockdb.Tree(), URL: c.LockdbURL, MaxConns: c.LockdbMaxConns, ConnsBound: math.MaxInt32,
			UnsafeNonDurable: c.UnsafeNonDurableDB, Roles: c.DBRoles, MigrateCommand: "lock-server migrate", CheckTimeout: schemaCheckTimeout},
		// Without a signing key a grant is a bare number anyone can make up
		// (docs/contracts/signed-grants.md): refused unless UNSAFE_NO_AUTH.
		AuthMaterial: []service.Material{{Env: "LOCK_SERVER_SIGNING_KEY_FILE", Value: c.SigningKeyFile,
			What: "the Ed25519 key every grant is signed with (lock-server keygen)"}}}
}

func (c Config) clock() Clock {
	if c.Clock == nil {
		return systemClock{}
	}
	return c.Clock
}

// Subcommands of lock-server (docs/contracts/configuration.md).
const (
	CmdServe   = "serve"
	CmdMigrate = "migrate"
	CmdKeygen  = "keygen" // docs/contracts/signed-grants.md: lock-server keygen --out DIR
	// CmdCerts: lock-server certs --out DIR [--trust-domain TD] [--names a,b,…] [--valid D]
	// (docs/contracts/workload-identity.md).
	CmdCerts = "certs"
)

const synopsis = "lock-server [serve|migrate] [flags]  |  lock-server keygen --out DIR  |  " +
	"lock-server certs --out DIR [--trust-domain lock.dev] [--names a,b,…] [--valid 720h]"

// ParseConfig reads the subcommand (serve by default), then flags and environment
// variables (a flag wins). --help writes the usage to stdout and returns serve.ErrHelp.
func ParseConfig(args []string, getenv func(string) string) (string, Config, error) {
	return parseConfig(args, getenv, nil)
}

// ParseConfigTo is ParseConfig with the usage written to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (string, Config, error) {
	return parseConfig(args, getenv, usage)
}

func parseConfig(args []string, getenv func(string) string, usage io.Writer) (string, Config, error) {
	cfg := DefaultConfig()
	if cmd, _ := serve.SplitCommand(args, CmdServe); cmd == CmdKeygen || cmd == CmdCerts {
		// keygen and certs have flags of their own and need none of the
		// service's settings: the caller hands the arguments after them to
		// Keygen or Certs.
		return cmd, cfg, nil
	}
	c := service.Command{Name: "lock-server", Synopsis: synopsis, Commands: []string{CmdServe, CmdMigrate, CmdKeygen, CmdCerts}}
	cmd, err := c.Parse(args, getenv, usage, func(s *serve.Settings) {
		s.String(&cfg.Addr, "LOCK_SERVER_ADDR", defaultAddr, "address to listen on")
		service.BindLogLevel(s, &cfg.LogLevel)
		service.BindIdentity(s, &cfg.Identity, &cfg.HealthAddr)
		service.BindRoles(s, "lockdb", &cfg.DBRoles)
		s.String(&cfg.LockdbURL, "LOCKDB_URL", "", "lockdb connection URL (libpq PG* environment when empty)")
		s.Int(&cfg.LockdbMaxConns, "LOCKDB_MAX_CONNS", defaultMaxConns, "most lockdb connections")
		s.Duration(&cfg.MinTTL, "LOCK_MIN_TTL", defaultMinTTL, "shortest lease TTL a caller may ask for")
		s.Duration(&cfg.MaxTTL, "LOCK_MAX_TTL", defaultMaxTTL, "longest lease TTL a caller may ask for")
		s.Bool(&cfg.UnsafeNonDurableDB, "UNSAFE_NON_DURABLE_DB", false,
			"serve a lockdb whose fsync is off (logged at ERROR); only for throwaway test and demo databases")
		s.String(&cfg.SigningKeyFile, "LOCK_SERVER_SIGNING_KEY_FILE", "", "PEM PKCS#8 Ed25519 private key every grant is signed with (docs/contracts/signed-grants.md); empty: grants are not signed")
		s.String(&cfg.Holders, "LOCK_SERVER_HOLDERS", defaultHolders,
			"SPIFFE IDs (comma-separated) that may acquire, renew, release and read a lock")
		s.String(&cfg.Readers, "LOCK_SERVER_READERS", defaultReaders,
			"SPIFFE IDs (comma-separated) that may read a lock and its grants history")
		s.String(&cfg.PreviousPublicKeysFile, "LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE", "", "JWK Set published at GET /v1/keys beside the current key (a rotation announced in advance)")
	})
	if err != nil {
		return cmd, cfg, err
	}
	return cmd, cfg, cfg.Validate()
}
