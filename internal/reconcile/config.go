// Package reconcile is the reconciler (docs/contracts/reconciliation.md): it reads the rail's
// statement through rail-proxy, keeps a durable copy of it in paydb, settles every
// AMBIGUOUS payout from it through payment-resource — PAID, DECLINED or
// NOT_PRESENTED — and records every disagreement between the statement and the
// books as an exception, once. After it, the ledger equals what the rail accepted,
// and the books close.
package reconcile

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"time"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// ServiceName is the service field of every log line and the binary's name.
const ServiceName = "reconciler"

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
	Addr          string // RECONCILER_ADDR
	LogLevel      string // LOG_LEVEL
	PaydbURL      string // PAYDB_URL; libpq PG* environment when empty
	PaydbMaxConns int    // PAYDB_MAX_CONNS
	// UnsafeNonDurableDB (UNSAFE_NON_DURABLE_DB) serves a paydb whose fsync is
	// off: only for throwaway test and demo databases (dbconn.RequireDurable).
	UnsafeNonDurableDB bool
	RailProxyURL       string        // RAIL_PROXY_URL
	PaymentResourceURL string        // PAYMENT_RESOURCE_URL
	SettleToken        string        // PAYMENT_SETTLE_TOKEN
	Interval           time.Duration // RECONCILER_INTERVAL
	SettleAfter        time.Duration // RECONCILER_SETTLE_AFTER

	Listener  net.Listener // when set, serve on it instead of listening on Addr
	LogOutput io.Writer    // nil means os.Stdout
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
	}
}

// Validate checks every setting `migrate` needs; an error names the variable and
// never quotes a secret.
func (c Config) Validate() error {
	if c.Addr == "" && c.Listener == nil {
		return serve.Invalid("RECONCILER_ADDR", "must not be empty")
	}
	if _, err := serve.NewLogger(io.Discard, ServiceName, c.LogLevel); err != nil {
		return err
	}
	if err := dbconn.CheckURL(c.PaydbURL); err != nil {
		return serve.Invalid("PAYDB_URL", "cannot be parsed as a PostgreSQL connection string")
	}
	if c.PaydbMaxConns < 2 || c.PaydbMaxConns > MaxPaydbConns {
		// A pass holds one connection for its advisory lock; readiness needs another.
		return serve.Invalid("PAYDB_MAX_CONNS", "must be between 2 and %d, got %d", MaxPaydbConns, c.PaydbMaxConns)
	}
	return nil
}

// ValidateServe checks every setting `serve` needs besides those of Validate.
func (c Config) ValidateServe() error {
	if err := c.Validate(); err != nil {
		return err
	}
	for _, u := range []struct{ env, val string }{
		{"RAIL_PROXY_URL", c.RailProxyURL}, {"PAYMENT_RESOURCE_URL", c.PaymentResourceURL},
	} {
		p, err := url.Parse(u.val)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.RawQuery != "" || p.Fragment != "" {
			return serve.Invalid(u.env, "must be an http or https URL with a host, got %q", redactURL(u.val))
		}
	}
	if c.SettleToken == "" {
		return serve.Invalid("PAYMENT_SETTLE_TOKEN", "must be set: it is the bearer token payment-resource's settle endpoint was given")
	}
	if err := lockapi.ValidateBearerToken(c.SettleToken); err != nil {
		return serve.Invalid("PAYMENT_SETTLE_TOKEN", "%s", problemOf(err))
	}
	if c.Interval <= 0 {
		return serve.Invalid("RECONCILER_INTERVAL", "must be positive, got %s", c.Interval)
	}
	if c.SettleAfter <= 0 {
		return serve.Invalid("RECONCILER_SETTLE_AFTER", "must be positive, got %s", c.SettleAfter)
	}
	return nil
}

const synopsis = ServiceName + " [serve|migrate] [flags]"

// ParseConfig reads the subcommand ("serve", the default, or "migrate"), flags and
// environment. --help writes the usage to stdout and returns serve.ErrHelp.
func ParseConfig(args []string, getenv func(string) string) (string, Config, error) {
	return ParseConfigTo(args, getenv, os.Stdout)
}

// ParseConfigTo is ParseConfig with the usage written to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (cmd string, cfg Config, err error) {
	cmd, rest := serve.SplitCommand(args, "serve")
	cfg = DefaultConfig()
	def := cfg
	s := serve.NewSettings(ServiceName, getenv)
	s.String(&cfg.Addr, "RECONCILER_ADDR", def.Addr, "address of the metrics and health endpoints")
	s.String(&cfg.LogLevel, "LOG_LEVEL", def.LogLevel, "log level: debug, info, warn or error")
	s.String(&cfg.PaydbURL, "PAYDB_URL", def.PaydbURL, "paydb connection URL; empty uses the libpq PG* environment")
	s.Int(&cfg.PaydbMaxConns, "PAYDB_MAX_CONNS", def.PaydbMaxConns, "paydb pool size (a pass holds one connection for its advisory lock)")
	s.Bool(&cfg.UnsafeNonDurableDB, "UNSAFE_NON_DURABLE_DB", false,
		"serve a paydb whose fsync is off (logged at ERROR); only for throwaway test and demo databases")
	s.String(&cfg.RailProxyURL, "RAIL_PROXY_URL", def.RailProxyURL, "rail-proxy, where the rail's statement is read")
	s.String(&cfg.PaymentResourceURL, "PAYMENT_RESOURCE_URL", def.PaymentResourceURL, "payment-resource, where settles are posted")
	s.String(&cfg.SettleToken, "PAYMENT_SETTLE_TOKEN", def.SettleToken,
		"bearer token for payment-resource's settle endpoint (the same value it was given; required for serve). Prefer the variable: a flag shows in the process list")
	s.Duration(&cfg.Interval, "RECONCILER_INTERVAL", def.Interval, "pause between passes")
	s.Duration(&cfg.SettleAfter, "RECONCILER_SETTLE_AFTER", def.SettleAfter,
		"how long after an attempt's submitted_at a call that has not reached the statement is taken as never presented (NOT_PRESENTED); must exceed the longest a call can take to reach the rail's books")
	extra, err := s.Parse(rest)
	if err != nil {
		if errors.Is(err, serve.ErrHelp) {
			s.Usage(usage, synopsis)
		}
		return cmd, cfg, err
	}
	if cmd != "serve" && cmd != "migrate" {
		return cmd, cfg, &serve.UsageError{Msg: fmt.Sprintf("%s: unknown command %q (commands: serve, migrate)", ServiceName, cmd)}
	}
	if len(extra) > 0 {
		return cmd, cfg, &serve.UsageError{Msg: fmt.Sprintf("%s: unexpected argument %q", ServiceName, extra[0])}
	}
	if cmd == "migrate" {
		return cmd, cfg, cfg.Validate()
	}
	return cmd, cfg, cfg.ValidateServe()
}

// redactURL hides a password in a URL before it is logged or quoted.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}

// problemOf is the short sentence of a lockapi validation error.
func problemOf(err error) string {
	const prefix = "invalid value: "
	msg := err.Error()
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		return msg[len(prefix):]
	}
	return msg
}
