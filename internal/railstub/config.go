package railstub

import (
	"io"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// MaxLatencyMs bounds the injected latency. A minute is beyond every timeout of
// the system; a larger value is far more likely a unit mistake than an experiment.
const MaxLatencyMs = 60_000

// The values of RAIL_STUB_PROTOCOL: the language the stub takes payments in.
const (
	ProtocolStub     = "stub"
	ProtocolISO20022 = "iso20022"
)

// DefaultStatementEvery is RAIL_STUB_STATEMENT_EVERY's default.
const DefaultStatementEvery = 5 * time.Second

// Config is every rail-stub setting of docs/contracts/configuration.md, plus the in-process hooks
// every service has.
type Config struct {
	Addr        string  // RAIL_STUB_ADDR
	LogLevel    string  // LOG_LEVEL
	LatencyMs   int     // RAIL_STUB_LATENCY_MS
	DeclineRate float64 // RAIL_STUB_DECLINE_RATE, 0..1
	DropRate    float64 // RAIL_STUB_DROP_RATE, 0..1
	Seed        *int64  // RAIL_STUB_SEED; nil picks a random seed, which is logged
	CallLogPath string  // RAIL_STUB_CALL_LOG; empty keeps the call log in memory only
	// Protocol is RAIL_STUB_PROTOCOL: ProtocolStub (the JSON payment route) or
	// ProtocolISO20022 (pain.001 in, pain.002 back, camt.053 for the books).
	Protocol string
	// StatementDir is RAIL_STUB_STATEMENT_DIR: where a camt.053 file of the
	// accepted calls is written every StatementEvery; empty writes none.
	StatementDir string
	// StatementEvery is RAIL_STUB_STATEMENT_EVERY, the period of the statement
	// files; positive.
	StatementEvery time.Duration

	// Identity is TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE and UNSAFE_NO_AUTH
	// (docs/contracts/workload-identity.md): with the three files set the stub
	// serves mutual TLS only; Run refuses to start without them unless
	// UNSAFE_NO_AUTH=true.
	Identity identity.Settings
	// HealthAddr is HEALTH_ADDR: /livez, /readyz and /metrics (only) also
	// served there, plaintext, for probes and scrapes without an SVID.
	HealthAddr string
	// Clients is RAIL_STUB_CLIENTS, Readers RAIL_STUB_READERS and Admins
	// RAIL_STUB_ADMINS: comma-separated SPIFFE IDs allowed to pay, to read the
	// call log, and to use the test double's admin routes (reset the call log,
	// read and set chaos); enforced only when the stub serves mutual TLS.
	Clients string
	Readers string
	Admins  string

	Listener net.Listener // when set, serve on it instead of listening on Addr
	// HealthListener, when set, is served instead of listening on HealthAddr
	// (tests).
	HealthListener net.Listener
	LogOutput      io.Writer // nil means os.Stdout

	// drainReplies is how long a delayed reply may still be sent once shutdown
	// has begun; 0 means serve.ShutdownGrace less a second. A test hook.
	drainReplies time.Duration
}

// DefaultConfig is the configuration with every default (docs/contracts/configuration.md).
func DefaultConfig() Config {
	return Config{Addr: ":8084", LogLevel: "info", Protocol: ProtocolStub, StatementEvery: DefaultStatementEvery,
		Clients: identity.DefaultIDs(identity.NameRailProxy),
		Readers: identity.DefaultIDs(identity.NameRailProxy, identity.NameOps),
		Admins:  identity.DefaultIDs(identity.NameOps)}
}

// roles are the allowed callers of each route a role guards.
type roles struct{ clients, readers, admins []spiffeid.ID }

// roles parses the three role settings; an error names the setting.
func (c Config) roles() (roles, error) {
	var r roles
	var err error
	if r.clients, err = identity.ParseRole("RAIL_STUB_CLIENTS", c.Clients); err != nil {
		return r, err
	}
	if r.readers, err = identity.ParseRole("RAIL_STUB_READERS", c.Readers); err != nil {
		return r, err
	}
	if r.admins, err = identity.ParseRole("RAIL_STUB_ADMINS", c.Admins); err != nil {
		return r, err
	}
	return r, nil
}

// Validate checks every bound; an error names the variable.
func (c Config) Validate() error {
	if c.Addr == "" && c.Listener == nil {
		return serve.Invalid("RAIL_STUB_ADDR", "must not be empty")
	}
	if err := service.CheckLogLevel(c.LogLevel); err != nil {
		return err
	}
	if c.LatencyMs < 0 || c.LatencyMs > MaxLatencyMs {
		return serve.Invalid("RAIL_STUB_LATENCY_MS", "must be between 0 and %d, got %d", MaxLatencyMs, c.LatencyMs)
	}
	if !validRate(c.DeclineRate) {
		return serve.Invalid("RAIL_STUB_DECLINE_RATE", "must be between 0 and 1, got %v", c.DeclineRate)
	}
	if !validRate(c.DropRate) {
		return serve.Invalid("RAIL_STUB_DROP_RATE", "must be between 0 and 1, got %v", c.DropRate)
	}
	if c.Protocol != ProtocolStub && c.Protocol != ProtocolISO20022 {
		return serve.Invalid("RAIL_STUB_PROTOCOL", "must be %s or %s, got %q", ProtocolStub, ProtocolISO20022, c.Protocol)
	}
	if c.StatementEvery <= 0 {
		return serve.Invalid("RAIL_STUB_STATEMENT_EVERY", "must be a positive duration, got %v", c.StatementEvery)
	}
	if _, err := c.roles(); err != nil {
		return err
	}
	return nil
}

func validRate(r float64) bool { return !math.IsNaN(r) && r >= 0 && r <= 1 }

// ParseConfig reads the subcommand (only "serve", the default), flags and
// environment. --help writes the usage to stdout and returns serve.ErrHelp.
func ParseConfig(args []string, getenv func(string) string) (cmd string, cfg Config, err error) {
	return ParseConfigTo(args, getenv, nil)
}

// ParseConfigTo is ParseConfig with the usage written to usage.
func ParseConfigTo(args []string, getenv func(string) string, usage io.Writer) (cmd string, cfg Config, err error) {
	cfg = DefaultConfig()
	def := cfg
	var seed string
	c := service.Command{Name: "rail-stub", Synopsis: "rail-stub [serve] [flags]", Commands: []string{"serve"}}
	cmd, err = c.Parse(args, getenv, usage, func(s *serve.Settings) {
		s.String(&cfg.Addr, "RAIL_STUB_ADDR", def.Addr, "address to listen on")
		service.BindLogLevel(s, &cfg.LogLevel)
		s.Int(&cfg.LatencyMs, "RAIL_STUB_LATENCY_MS", def.LatencyMs, "delay before every reply, in milliseconds, 0.."+strconv.Itoa(MaxLatencyMs))
		s.Float(&cfg.DeclineRate, "RAIL_STUB_DECLINE_RATE", def.DeclineRate, "fraction of payments declined, 0..1")
		s.Float(&cfg.DropRate, "RAIL_STUB_DROP_RATE", def.DropRate, "fraction of accepted payments whose connection is closed without a reply, 0..1")
		s.String(&seed, "RAIL_STUB_SEED", "", "seed of the chaos decisions, a 64-bit integer; empty: a random one, logged at start")
		s.String(&cfg.CallLogPath, "RAIL_STUB_CALL_LOG", def.CallLogPath, "JSON-lines file every call is appended to (fsynced) and loaded from at start; empty: none, calls kept in memory only")
		s.String(&cfg.Protocol, "RAIL_STUB_PROTOCOL", def.Protocol, "the language payments are taken in: stub (JSON, POST /rail/v1/payments) or iso20022 (pain.001, pain.002, camt.053)")
		s.String(&cfg.StatementDir, "RAIL_STUB_STATEMENT_DIR", def.StatementDir, "directory a camt.053 file of the accepted calls is written to every RAIL_STUB_STATEMENT_EVERY; empty: none written")
		s.Duration(&cfg.StatementEvery, "RAIL_STUB_STATEMENT_EVERY", def.StatementEvery, "period of the statement files, a positive duration")
		service.BindIdentity(s, &cfg.Identity, &cfg.HealthAddr)
		s.String(&cfg.Clients, "RAIL_STUB_CLIENTS", def.Clients, "SPIFFE IDs, comma-separated, that may present payments (docs/contracts/workload-identity.md)")
		s.String(&cfg.Readers, "RAIL_STUB_READERS", def.Readers, "SPIFFE IDs, comma-separated, that may read the call log")
		s.String(&cfg.Admins, "RAIL_STUB_ADMINS", def.Admins, "SPIFFE IDs, comma-separated, that may reset the call log and read and set chaos")
	})
	if err != nil {
		return cmd, cfg, err
	}
	if seed != "" {
		v, err := strconv.ParseInt(seed, 10, 64)
		if err != nil {
			return cmd, cfg, serve.Invalid("RAIL_STUB_SEED", "must be a 64-bit integer, got %q", seed)
		}
		cfg.Seed = &v
	}
	return cmd, cfg, cfg.Validate()
}
