package service_test

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"

	"lock.dev/internal/executor"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/payment"
	"lock.dev/internal/railproxy"
	"lock.dev/internal/railstub"
	"lock.dev/internal/reconcile"
	"lock.dev/internal/serve"
)

// A setting's heading in --help: its flag, the kind of value it takes, its
// variable, its default.
var settingHead = regexp.MustCompile(`^  --([a-z0-9-]+) (string|int|float|bool|duration) +env ([A-Z0-9_]+) \(default .*\)$`)

// Every service's --help (docs/contracts/configuration.md) shows each setting
// with the kind of value it takes and its default, said once: a usage text
// that carries its own "(default …)" would show two.
func TestEveryServiceHelpShowsKindAndDefaultOnce(t *testing.T) {
	t.Parallel()
	noEnv := func(string) string { return "" }
	for name, parse := range map[string]func(w io.Writer) error{
		"lock-server": func(w io.Writer) error {
			_, _, err := lockserver.ParseConfigTo([]string{"--help"}, noEnv, w)
			return err
		},
		"payment-resource": func(w io.Writer) error { _, _, err := payment.ParseConfigTo([]string{"--help"}, noEnv, w); return err },
		"rail-proxy": func(w io.Writer) error {
			_, _, err := railproxy.ParseConfigTo([]string{"--help"}, noEnv, w)
			return err
		},
		"rail-stub": func(w io.Writer) error { _, _, err := railstub.ParseConfigTo([]string{"--help"}, noEnv, w); return err },
		"executor":  func(w io.Writer) error { _, _, err := executor.ParseConfigTo([]string{"--help"}, noEnv, w); return err },
		"reconciler": func(w io.Writer) error {
			_, _, err := reconcile.ParseConfigTo([]string{"--help"}, noEnv, w)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := parse(&out); !errors.Is(err, serve.ErrHelp) {
				t.Fatalf("--help: %v", err)
			}
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			settings := 0
			for i, line := range lines {
				if !strings.HasPrefix(line, "  --") {
					continue
				}
				settings++
				m := settingHead.FindStringSubmatch(line)
				if m == nil {
					t.Errorf("heading %q does not read --flag KIND env VAR (default …)", line)
					continue
				}
				if serve.FlagName(m[3]) != m[1] {
					t.Errorf("--%s is shown with variable %s", m[1], m[3])
				}
				if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "      ") || strings.TrimSpace(lines[i+1]) == "" {
					t.Errorf("--%s: no description under its heading", m[1])
					continue
				}
				if desc := strings.ToLower(lines[i+1]); strings.Contains(desc, "(default") || strings.Contains(desc, "default:") {
					t.Errorf("--%s says its default twice: %q", m[1], lines[i+1])
				}
			}
			if settings < 5 {
				t.Errorf("%d settings in the usage:\n%s", settings, out.String())
			}
		})
	}
}
