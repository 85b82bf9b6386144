package executor

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
	"lock.dev/lockapi"
)

// ServiceName is the service field of every log line and the binary's name.
const ServiceName = "executor"

// Defaults (docs/contracts/configuration.md).
const (
	DefaultAddr               = ":8085"
	DefaultLogLevel           = "info"
	DefaultLockServerURL      = "http://127.0.0.1:8081"
	DefaultPaymentResourceURL = "http://127.0.0.1:8082"
	DefaultRailProxyURL       = "http://127.0.0.1:8083"
	DefaultWorkers            = 4
	DefaultLeaseTTL           = 15 * time.Second
	DefaultProxyTimeout       = 10 * time.Second
	DefaultPollInterval       = 500 * time.Millisecond

	maxWorkers = 1024
	// maxLeaseTTL is lock-server's default upper bound
	// (docs/contracts/lock-service.md); the server enforces its own configured
	// bounds, this only catches a unit mistake at start-up.
	maxLeaseTTL = 5 * time.Minute
)

// Config is every executor setting of docs/contracts/configuration.md plus the
// in-process hooks every service has and the executor's test hooks.
type Config struct {
	Addr     string // EXECUTOR_ADDR: metrics and health only
	LogLevel string // LOG_LEVEL
	// Identity is TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE and UNSAFE_NO_AUTH
	// (docs/contracts/workload-identity.md).
	Identity identity.Settings
	// HealthAddr is HEALTH_ADDR: /livez, /readyz and /metrics also served there, plaintext.
	HealthAddr         string
	LockServerURL      string // LOCK_SERVER_URL
	PaymentResourceURL string // PAYMENT_RESOURCE_URL
	RailProxyURL       string // RAIL_PROXY_URL
	// LockServerID, PaymentResourceID and RailProxyID are LOCK_SERVER_ID,
	// PAYMENT_RESOURCE_ID and RAIL_PROXY_ID: the SPIFFE ID each server must
	// present over mutual TLS. Empty: the service's default name in the
	// executor's own trust domain (docs/contracts/workload-identity.md).
	LockServerID      string
	PaymentResourceID string
	RailProxyID       string
	OwnerID           string        // EXECUTOR_OWNER_ID; {hostname}:{pid} by default
	Workers           int           // EXECUTOR_WORKERS
	LeaseTTL          time.Duration // EXECUTOR_LEASE_TTL
	ProxyTimeout      time.Duration // EXECUTOR_PROXY_TIMEOUT: bounds one submission, end to end
	PollInterval      time.Duration // EXECUTOR_POLL_INTERVAL: idle wait between looks for work
	PauseProbability  float64       // EXECUTOR_PAUSE_PROBABILITY: the stale-writer maker, 0 = off
	Pause             time.Duration // EXECUTOR_PAUSE: how long a pause lasts

	Listener net.Listener // when set, serve on it instead of listening on Addr (tests, lockdemo)
	// HealthListener, when set, serves what HEALTH_ADDR would (tests, lockdemo).
	HealthListener net.Listener
	LogOutput      io.Writer // nil means os.Stdout

	// Test hooks; none of them is a setting.

	// Seed seeds the pause draw, so a run with a pause probability is repeatable.
	// Zero picks a random seed (logged at start-up).
	Seed int64
	// PauseHook, when set, replaces the sleep of a pause: the lease is frozen, the
	// hook is called and the pause ends when it returns. Tests use it to decide
	// exactly when a frozen executor wakes. ctx is cancelled when the executor stops.
	PauseHook func(ctx context.Context, payoutID string)
	// ReconcileInterval is how often the reconcile pass looks for payouts left
	// CLAIMED. Zero means 4 × PollInterval; negative turns the pass off (a test
	// that needs a second executor to leave stale claims alone).
	ReconcileInterval time.Duration
	// RequestTimeout bounds every call other than a submission (lock-server,
	// payment-resource, the audit trail). Zero means 5 s.
	RequestTimeout time.Duration
}

const defaultRequestTimeout = 5 * time.Second

// DefaultConfig is the configuration with every default of docs/contracts/configuration.md.
func DefaultConfig() Config {
	return Config{
		Addr:               DefaultAddr,
		LogLevel:           DefaultLogLevel,
		LockServerURL:      DefaultLockServerURL,
		PaymentResourceURL: DefaultPaymentResourceURL,
		RailProxyURL:       DefaultRailProxyURL,
		OwnerID:            DefaultOwnerID(),
		Workers:            DefaultWorkers,
		LeaseTTL:           DefaultLeaseTTL,
		ProxyTimeout:       DefaultProxyTimeout,
		PollInterval:       DefaultPollInterval,
	}
}

// DefaultOwnerID is {hostname}:{pid}. A hostname with characters an owner id may
// not carry has them replaced, so the default is always a valid X-Owner-Id.
func DefaultOwnerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "executor"
	}
	b := []byte(host)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '@' || c == '/' || c == '-'
		if !ok {
			b[i] = '-'
		}
	}
	id := string(b) + ":" + strconv.Itoa(os.Getpid())
	if len(id) > lockapi.MaxOwnerIDLen {
		id = id[len(id)-lockapi.MaxOwnerIDLen:]
	}
	return id
}

// Validate checks every setting; an error names the variable.
func (c Config) Validate() error {
	if c.Listener == nil {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return serve.Invalid("EXECUTOR_ADDR", "must be host:port (e.g. :8085)")
		}
	}
	if err := c.spec().Check(); err != nil {
		return err
	}
	for _, u := range []struct{ env, val string }{
		{"LOCK_SERVER_URL", c.LockServerURL},
		{"PAYMENT_RESOURCE_URL", c.PaymentResourceURL},
		{"RAIL_PROXY_URL", c.RailProxyURL},
	} {
		if err := checkBaseURL(u.val); err != nil {
			return serve.Invalid(u.env, "%v", err)
		}
		// With TLS set every call is mutual TLS: an http:// URL would carry no
		// identity, so it is refused here rather than failing every call later.
		if err := c.Identity.CheckURL(u.env, u.val); err != nil {
			return err
		}
	}
	for _, p := range []struct{ env, val string }{
		{"LOCK_SERVER_ID", c.LockServerID},
		{"PAYMENT_RESOURCE_ID", c.PaymentResourceID},
		{"RAIL_PROXY_ID", c.RailProxyID},
	} {
		if err := identity.CheckPeer(p.env, p.val); err != nil {
			return err
		}
	}
	if err := lockapi.ValidateOwnerID(c.OwnerID); err != nil {
		return serve.Invalid("EXECUTOR_OWNER_ID", "must be 1–128 characters of A-Z a-z 0-9 . _ : @ / -")
	}
	if c.Workers < 1 || c.Workers > maxWorkers {
		return serve.Invalid("EXECUTOR_WORKERS", "must be between 1 and %d, got %d", maxWorkers, c.Workers)
	}
	// Lease TTLs travel in whole milliseconds (ttlMs).
	if c.LeaseTTL < time.Millisecond || c.LeaseTTL > maxLeaseTTL || c.LeaseTTL%time.Millisecond != 0 {
		return serve.Invalid("EXECUTOR_LEASE_TTL", "must be whole milliseconds between 1ms and %s, got %s", maxLeaseTTL, c.LeaseTTL)
	}
	if c.ProxyTimeout <= 0 {
		return serve.Invalid("EXECUTOR_PROXY_TIMEOUT", "must be positive, got %s", c.ProxyTimeout)
	}
	if c.PollInterval <= 0 {
		return serve.Invalid("EXECUTOR_POLL_INTERVAL", "must be positive, got %s", c.PollInterval)
	}
	if math.IsNaN(c.PauseProbability) || c.PauseProbability < 0 || c.PauseProbability > 1 {
		return serve.Invalid("EXECUTOR_PAUSE_PROBABILITY", "must be between 0 and 1, got %v", c.PauseProbability)
	}
	if c.Pause < 0 {
		return serve.Invalid("EXECUTOR_PAUSE", "must not be negative, got %s", c.Pause)
	}
	if c.RequestTimeout < 0 {
		return fmt.Errorf("executor: RequestTimeout must not be negative")
	}
	return nil
}

func checkBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("must be an absolute http(s) URL such as http://127.0.0.1:8083")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("must be a base URL without user info, query or fragment, got %q", u.Redacted())
	}
	return nil
}

func (c Config) spec() service.Spec {
	return service.Spec{Name: ServiceName, LogLevel: c.LogLevel, LogOutput: c.LogOutput, Addr: c.Addr, Listener: c.Listener, Identity: c.Identity, HealthAddr: c.HealthAddr, HealthListener: c.HealthListener, Validate: c.Validate}
}

func (c Config) reconcileInterval() time.Duration {
	if c.ReconcileInterval == 0 {
		return 4 * c.PollInterval
	}
	return c.ReconcileInterval
}

func (c Config) requestTimeout() time.Duration {
	if c.RequestTimeout == 0 {
		return defaultRequestTimeout
	}
	return c.RequestTimeout
}

const synopsis = ServiceName + " [run] [flags]"

// ParseConfig reads the subcommand (run, the default), the flags and the
// environment. --help writes the usage to stdout and returns serve.ErrHelp.
func ParseConfig(args []string, getenv func(string) string) (string, Config, error) {
	return ParseConfigTo(args, getenv, nil)
}

// ParseConfigTo is ParseConfig writing the usage for --help to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (string, Config, error) {
	cfg := DefaultConfig()
	def := cfg
	c := service.Command{Name: ServiceName, Synopsis: synopsis, Commands: []string{"run"}}
	cmd, err := c.Parse(args, getenv, usage, func(s *serve.Settings) {
		s.String(&cfg.Addr, "EXECUTOR_ADDR", def.Addr, "listen address of the metrics and health endpoints")
		service.BindLogLevel(s, &cfg.LogLevel)
		service.BindIdentity(s, &cfg.Identity, &cfg.HealthAddr)
		s.String(&cfg.LockServerURL, "LOCK_SERVER_URL", def.LockServerURL, "base URL of lock-server")
		s.String(&cfg.PaymentResourceURL, "PAYMENT_RESOURCE_URL", def.PaymentResourceURL, "base URL of payment-resource")
		s.String(&cfg.RailProxyURL, "RAIL_PROXY_URL", def.RailProxyURL, "base URL of rail-proxy")
		s.String(&cfg.LockServerID, "LOCK_SERVER_ID", def.LockServerID, "SPIFFE ID lock-server must present (empty: spiffe://{own trust domain}/lock-server)")
		s.String(&cfg.PaymentResourceID, "PAYMENT_RESOURCE_ID", def.PaymentResourceID, "SPIFFE ID payment-resource must present (empty: spiffe://{own trust domain}/payment-resource)")
		s.String(&cfg.RailProxyID, "RAIL_PROXY_ID", def.RailProxyID, "SPIFFE ID rail-proxy must present (empty: spiffe://{own trust domain}/rail-proxy)")
		s.String(&cfg.OwnerID, "EXECUTOR_OWNER_ID", def.OwnerID, "owner id presented with every lease and token ({hostname}:{pid} by default)")
		s.Int(&cfg.Workers, "EXECUTOR_WORKERS", def.Workers, "concurrent workers, each working one account at a time")
		s.Duration(&cfg.LeaseTTL, "EXECUTOR_LEASE_TTL", def.LeaseTTL, "account lease TTL (renewed every TTL/3); payouts CLAIMED longer than this are reconciled")
		s.Duration(&cfg.ProxyTimeout, "EXECUTOR_PROXY_TIMEOUT", def.ProxyTimeout, "bound of one submission to rail-proxy; should exceed the proxy's worst case (7s with its defaults)")
		s.Duration(&cfg.PollInterval, "EXECUTOR_POLL_INTERVAL", def.PollInterval, "wait between looks for work when there was none")
		s.Float(&cfg.PauseProbability, "EXECUTOR_PAUSE_PROBABILITY", def.PauseProbability, "demonstrations only: chance of a pause between claim and submit (the stale-writer maker), 0..1; 0 is off")
		s.Duration(&cfg.Pause, "EXECUTOR_PAUSE", def.Pause, "demonstrations only: length of such a pause")
	})
	if err != nil {
		return cmd, cfg, err
	}
	return cmd, cfg, cfg.Validate()
}
