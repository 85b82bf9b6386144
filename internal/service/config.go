package service

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"

	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
	"lock.dev/lockapi"
)

// Command is a binary's command line: `Name [subcommand] [flags]`. The settings
// are bound by the service (serve.Settings: an environment variable and an equal
// flag each, the flag winning); Command reads the subcommand and the settings and
// refuses what does not parse, in one line naming it (docs/contracts/configuration.md).
type Command struct {
	Name     string   // the binary's name, which starts every refusal
	Synopsis string   // the first line of the usage
	Commands []string // the subcommands it knows; the first is the default
}

// HelpCommand is the subcommand that writes the usage, like --help.
const HelpCommand = "help"

// Parse reads args: a leading subcommand (Commands[0] when args are empty or
// start with a flag), then every setting bind binds, from the flags that follow
// and the environment (getenv). It returns the subcommand, and
//   - serve.ErrHelp after writing the usage to usage (nil: os.Stdout), for
//     `help` and --help;
//   - serve.ErrVersion after writing the version to stdout, for --version;
//   - a *serve.UsageError for an unknown subcommand, a bad flag or value, or an
//     argument left over.
//
// It does not validate the settings' values against each other: the service's
// Config.Validate does, after Parse.
func (c Command) Parse(args []string, getenv func(string) string, usage io.Writer, bind func(*serve.Settings)) (string, error) {
	usage = Output(usage)
	cmd, rest := serve.SplitCommand(args, c.Commands[0])
	s := serve.NewSettings(c.Name, getenv)
	bind(s)
	switch {
	case cmd == HelpCommand:
		s.Usage(usage, c.Synopsis)
		return cmd, serve.ErrHelp
	case !slices.Contains(c.Commands, cmd):
		return cmd, &serve.UsageError{Msg: fmt.Sprintf("%s: unknown command %q (commands: %s)", c.Name, cmd, strings.Join(c.Commands, ", "))}
	}
	extra, err := s.Parse(rest)
	if err != nil {
		if errors.Is(err, serve.ErrHelp) {
			s.Usage(usage, c.Synopsis)
		}
		return cmd, err
	}
	if len(extra) > 0 {
		return cmd, &serve.UsageError{Msg: fmt.Sprintf("%s: unexpected argument %q", c.Name, extra[0])}
	}
	return cmd, nil
}

// BindLogLevel binds LOG_LEVEL, which every service has, to p (default info).
func BindLogLevel(s *serve.Settings, p *string) {
	s.String(p, "LOG_LEVEL", "info", "log level: debug, info, warn or error")
}

// RedactURL is raw with its password hidden, for a log line or a refusal;
// "(unparseable)" when raw is no URL.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}

// CheckBaseURL refuses, naming env, a value that is not an http or https URL
// with a host and without query or fragment: the base URL of a service called.
// The value is quoted redacted, since it may carry a password.
func CheckBaseURL(env, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return serve.Invalid(env, "must be an http or https URL with a host, got %q", RedactURL(raw))
	}
	return nil
}

// CheckSettleToken refuses a PAYMENT_SETTLE_TOKEN that is no valid bearer token,
// saying why without quoting it: it is a secret.
func CheckSettleToken(token string) error {
	if err := lockapi.ValidateBearerToken(token); err != nil {
		return serve.Invalid("PAYMENT_SETTLE_TOKEN", "%s", strings.TrimPrefix(err.Error(), lockapi.ErrInvalid.Error()+": "))
	}
	return nil
}

// BindIdentity binds the identity settings every service has — TLS_CERT_FILE,
// TLS_KEY_FILE, TLS_CA_FILE, UNSAFE_NO_AUTH (docs/contracts/workload-identity.md)
// — and HEALTH_ADDR.
func BindIdentity(s *serve.Settings, id *identity.Settings, healthAddr *string) {
	identity.Bind(s, id)
	s.String(healthAddr, "HEALTH_ADDR", "", "also serve /livez, /readyz and /metrics (only) here, plaintext, for probes and scrapes without an SVID; empty: only on the main listener")
}
