package payment

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
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
)

// Config is every setting of payment-resource (docs/contracts/configuration.md)
// plus the in-process hooks.
type Config struct {
	Addr          string // PAYMENT_RESOURCE_ADDR
	LogLevel      string // LOG_LEVEL
	PaydbURL      string // PAYDB_URL; libpq PG* environment when empty
	PaydbMaxConns int    // PAYDB_MAX_CONNS
	// UnsafeNonDurableDB (UNSAFE_NON_DURABLE_DB) serves a paydb whose fsync is
	// off: only for throwaway test and demo databases (dbconn.RequireDurable).
	UnsafeNonDurableDB bool
	SettleToken        string // PAYMENT_SETTLE_TOKEN; empty disables the settle endpoint
	// GrantKeysFile is PAYMENT_GRANT_KEYS_FILE: the JWK Set every claim's and
	// post's X-Fencing-Grant is verified with (docs/contracts/signed-grants.md).
	// Empty: grants are not verified.
	GrantKeysFile string

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
	}
}

// Validate checks every setting; an error names the variable.
func (c Config) Validate() error {
	if c.Listener == nil {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return serve.Invalid("PAYMENT_RESOURCE_ADDR", "must be host:port (e.g. :8082)")
		}
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return serve.Invalid("LOG_LEVEL", "must be debug, info, warn or error")
	}
	if err := dbconn.CheckURL(c.PaydbURL); err != nil {
		// Never echo the value: it may carry a password.
		return serve.Invalid("PAYDB_URL", "cannot be parsed as a PostgreSQL connection string")
	}
	if c.PaydbMaxConns < 1 || c.PaydbMaxConns > maxMaxConns {
		return serve.Invalid("PAYDB_MAX_CONNS", "must be between 1 and %d", maxMaxConns)
	}
	if c.SettleToken != "" {
		if err := lockapi.ValidateBearerToken(c.SettleToken); err != nil {
			// Never echo the value: it is a secret.
			return serve.Invalid("PAYMENT_SETTLE_TOKEN", "%s", problem(err))
		}
	}
	if c.DBTimeout < 0 {
		return fmt.Errorf("payment: DBTimeout must not be negative")
	}
	return nil
}

func (c Config) logOutput() io.Writer {
	if c.LogOutput == nil {
		return os.Stdout
	}
	return c.LogOutput
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
	return ParseConfigTo(args, getenv, os.Stdout)
}

// ParseConfigTo is ParseConfig writing the usage for --help to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (string, Config, error) {
	cmd, rest := serve.SplitCommand(args, "serve")
	cfg := DefaultConfig()
	s := serve.NewSettings(ServiceName, getenv)
	s.String(&cfg.Addr, "PAYMENT_RESOURCE_ADDR", DefaultAddr, "listen address")
	s.String(&cfg.LogLevel, "LOG_LEVEL", DefaultLogLevel, "log level: debug, info, warn or error")
	s.String(&cfg.PaydbURL, "PAYDB_URL", "", "paydb PostgreSQL URL; the libpq PG* environment when empty")
	s.Int(&cfg.PaydbMaxConns, "PAYDB_MAX_CONNS", DefaultMaxConns,
		"paydb pool size; a request waiting longer than 2s for paydb answers 503")
	s.Bool(&cfg.UnsafeNonDurableDB, "UNSAFE_NON_DURABLE_DB", false,
		"serve a paydb whose fsync is off (logged at ERROR); only for throwaway test and demo databases")
	s.String(&cfg.SettleToken, "PAYMENT_SETTLE_TOKEN", "",
		"bearer token the reconciler presents to settle AMBIGUOUS payouts (at least 16 characters); empty disables the settle endpoint (404). Prefer the variable: a flag shows in the process list")
	s.String(&cfg.GrantKeysFile, "PAYMENT_GRANT_KEYS_FILE", "",
		"JWK Set of lock-server's public keys: every claim and post must carry a grant signed by one of them (C7); empty: tokens are not verified")
	switch cmd {
	case "serve", "migrate":
	case "help":
		s.Usage(usage, synopsis)
		return cmd, cfg, serve.ErrHelp
	default:
		return cmd, cfg, &serve.UsageError{Msg: fmt.Sprintf("%s: unknown subcommand %q (want serve or migrate)", ServiceName, cmd)}
	}
	extra, err := s.Parse(rest)
	if err != nil {
		if err == serve.ErrHelp {
			s.Usage(usage, synopsis)
		}
		return cmd, cfg, err
	}
	if len(extra) > 0 {
		return cmd, cfg, &serve.UsageError{Msg: fmt.Sprintf("%s: unexpected argument %q", ServiceName, extra[0])}
	}
	if err := cfg.Validate(); err != nil {
		return cmd, cfg, err
	}
	return cmd, cfg, nil
}
