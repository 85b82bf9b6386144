package railstub

import (
	"io"
	"math"
	"net"
	"strconv"
	"time"

	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// MaxLatencyMs bounds the injected latency. A minute is beyond every timeout of
// the system; a larger value is far more likely a unit mistake than an experiment.
const MaxLatencyMs = 60_000

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

	Listener  net.Listener // when set, serve on it instead of listening on Addr
	LogOutput io.Writer    // nil means os.Stdout

	// drainReplies is how long a delayed reply may still be sent once shutdown
	// has begun; 0 means serve.ShutdownGrace less a second. A test hook.
	drainReplies time.Duration
}

// DefaultConfig is the configuration with every default (docs/contracts/configuration.md).
func DefaultConfig() Config {
	return Config{Addr: ":8084", LogLevel: "info"}
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
		s.Int(&cfg.LatencyMs, "RAIL_STUB_LATENCY_MS", def.LatencyMs, "delay before every reply, in milliseconds, 0.."+strconv.Itoa(MaxLatencyMs)+" (default 0)")
		s.Float(&cfg.DeclineRate, "RAIL_STUB_DECLINE_RATE", def.DeclineRate, "fraction of payments declined, 0..1 (default 0)")
		s.Float(&cfg.DropRate, "RAIL_STUB_DROP_RATE", def.DropRate, "fraction of accepted payments whose connection is closed without a reply, 0..1 (default 0)")
		s.String(&seed, "RAIL_STUB_SEED", "", "seed of the chaos decisions, a 64-bit integer; (default: a random one, logged at start)")
		s.String(&cfg.CallLogPath, "RAIL_STUB_CALL_LOG", def.CallLogPath, "JSON-lines file every call is appended to (fsynced) and loaded from at start; (default: none, calls kept in memory only)")
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
