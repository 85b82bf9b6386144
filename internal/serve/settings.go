// Package serve is how every lock.dev service runs: settings from environment
// variables and equal flags (docs/contracts/configuration.md), the JSON logger,
// metrics and health endpoints (docs/contracts/observability.md), problem+json for
// unknown routes, and a graceful HTTP server.
package serve

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"lock.dev/internal/version"
)

// ErrHelp is returned by Parse when --help was asked for; the usage has been
// written and the process should exit 0.
var ErrHelp = errors.New("help requested")

// ErrVersion is returned by Parse when --version was asked for; the version has
// been written to stdout and the process should exit 0 (docs/contracts/configuration.md).
var ErrVersion = errors.New("version requested")

// UsageError is a bad setting: the process exits 2 with its one-line message.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Settings binds each setting to an environment variable and a flag of the same
// name in kebab case (RAIL_READ_TIMEOUT ↔ --rail-read-timeout). A flag wins over the
// variable; the variable wins over the default.
type Settings struct {
	name     string
	fs       *flag.FlagSet
	getenv   func(string) string
	bindings []binding
	stdout   io.Writer // where --version is answered; nil means os.Stdout
}

// binding is one setting: its variable, its flag, and its value's kind for the
// usage ("string", "int", "float", "bool", "duration").
type binding struct{ env, flag, kind string }

// NewSettings starts the settings of the command name. getenv is os.Getenv in
// production and a map in tests.
func NewSettings(name string, getenv func(string) string) *Settings {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &Settings{name: name, fs: fs, getenv: getenv}
}

// FlagName is the flag that goes with environment variable env.
func FlagName(env string) string { return strings.ToLower(strings.ReplaceAll(env, "_", "-")) }

func (s *Settings) bind(env, kind string) string {
	name := FlagName(env)
	s.bindings = append(s.bindings, binding{env: env, flag: name, kind: kind})
	return name
}

// String binds a string setting. Its usage says what it is for; Usage adds the
// variable, the kind and the default, so the usage does not repeat them.
func (s *Settings) String(p *string, env, def, usage string) {
	s.fs.StringVar(p, s.bind(env, "string"), def, usage)
}

// Int binds an integer setting.
func (s *Settings) Int(p *int, env string, def int, usage string) {
	s.fs.IntVar(p, s.bind(env, "int"), def, usage)
}

// Float binds a floating-point setting.
func (s *Settings) Float(p *float64, env string, def float64, usage string) {
	s.fs.Float64Var(p, s.bind(env, "float"), def, usage)
}

// Bool binds a boolean setting.
func (s *Settings) Bool(p *bool, env string, def bool, usage string) {
	s.fs.BoolVar(p, s.bind(env, "bool"), def, usage)
}

// Duration binds a duration setting (Go syntax: 2s, 150ms). A value without a
// unit is refused saying so (DurationFlag).
func (s *Settings) Duration(p *time.Duration, env string, def time.Duration, usage string) {
	DurationFlag(s.fs, p, s.bind(env, "duration"), def, usage)
}

// DurationFlag defines a duration flag on fs, like fs.DurationVar, whose
// refusal of a value says what a duration looks like: the flag package's own
// says only "parse error", which leaves `--lock-min-ttl 5` a riddle.
func DurationFlag(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(durationValue{p}, name, usage)
}

// durationValue is a flag.Value of a time.Duration, in Go syntax.
type durationValue struct{ p *time.Duration }

// errNotDuration is every refusal of a duration, so that it reads the same from
// a flag and from a variable.
var errNotDuration = errors.New("want a duration such as 5s or 250ms")

func (d durationValue) Set(v string) error {
	parsed, err := time.ParseDuration(v)
	if err != nil {
		if _, numErr := strconv.ParseFloat(v, 64); numErr == nil {
			return fmt.Errorf("%w (a number needs its unit)", errNotDuration)
		}
		return errNotDuration
	}
	*d.p = parsed
	return nil
}

func (d durationValue) String() string {
	if d.p == nil { // the zero Value flag.isZeroValue builds
		return ""
	}
	return d.p.String()
}

// FlagSet exposes the flag set for flags that have no environment variable.
func (s *Settings) FlagSet() *flag.FlagSet { return s.fs }

// Parse reads args, then the environment for every setting no flag set. It
// answers --version itself (before any setting is looked at) with ErrVersion. It
// returns the remaining arguments, ErrHelp, or a *UsageError naming the setting.
func (s *Settings) Parse(args []string) ([]string, error) {
	if version.Requested(args) {
		out := s.stdout
		if out == nil {
			out = os.Stdout
		}
		fmt.Fprintln(out, version.String())
		return nil, ErrVersion
	}
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, ErrHelp
		}
		return nil, &UsageError{Msg: fmt.Sprintf("%s: %v", s.name, err)}
	}
	set := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, b := range s.bindings {
		if set[b.flag] {
			continue
		}
		v := s.getenv(b.env)
		if v == "" {
			continue
		}
		if err := s.fs.Set(b.flag, v); err != nil {
			return nil, &UsageError{Msg: fmt.Sprintf("%s: invalid value %q for %s: %v", s.name, v, b.env, unwrapFlagErr(err))}
		}
	}
	return s.fs.Args(), nil
}

func unwrapFlagErr(err error) error {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return ne.Err
	}
	return err
}

// Usage writes every setting: its flag and the kind of value it takes, its
// variable and its default (zero defaults included, which flag.PrintDefaults
// leaves out; an empty string as ""), then what it is for, each said once:
//
//	--lock-min-ttl duration    env LOCK_MIN_TTL (default 1s)
//	    shortest lease TTL a caller may ask for
//
// A flag with no variable (FlagSet) shows its kind as flag.UnquoteUsage finds it.
func (s *Settings) Usage(w io.Writer, synopsis string) {
	fmt.Fprintf(w, "Usage: %s\n\nSettings (a flag wins over its environment variable):\n", synopsis)
	byFlag := make(map[string]binding, len(s.bindings))
	for _, b := range s.bindings {
		byFlag[b.flag] = b
	}
	s.fs.VisitAll(func(f *flag.Flag) {
		b, bound := byFlag[f.Name]
		kind, usage := flag.UnquoteUsage(f)
		if bound {
			kind, usage = b.kind, f.Usage
		}
		def := f.DefValue
		if def == "" {
			def = `""`
		}
		head := "--" + f.Name
		if kind != "" {
			head += " " + kind
		}
		env := ""
		if bound {
			env = "env " + b.env + " "
		}
		fmt.Fprintf(w, "  %-40s %s(default %s)\n      %s\n", head, env, def, usage)
	})
}

// Invalid builds the *UsageError for a setting that parsed but is out of bounds.
func Invalid(env, format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf("invalid %s (--%s): %s", env, FlagName(env), fmt.Sprintf(format, args...))}
}

// SplitCommand splits a leading subcommand off args: "migrate", "serve", "run" …;
// def when args start with a flag or are empty.
func SplitCommand(args []string, def string) (string, []string) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], args[1:]
	}
	return def, args
}
