package service

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"lock.dev/internal/serve"
)

// parse is a Command of two subcommands with two settings.
func parse(t *testing.T, args []string, vars map[string]string) (cmd, addr, level string, usage string, err error) {
	t.Helper()
	c := Command{Name: "demo-svc", Synopsis: "demo-svc [serve|migrate] [flags]", Commands: []string{"serve", "migrate"}}
	var out bytes.Buffer
	getenv := func(k string) string { return vars[k] }
	cmd, err = c.Parse(args, getenv, &out, func(s *serve.Settings) {
		s.String(&addr, "DEMO_ADDR", ":9000", "address to listen on")
		BindLogLevel(s, &level)
	})
	return cmd, addr, level, out.String(), err
}

func TestCommandParseReadsSubcommandFlagsAndEnvironment(t *testing.T) {
	cmd, addr, level, _, err := parse(t, nil, nil)
	if err != nil || cmd != "serve" || addr != ":9000" || level != "info" {
		t.Fatalf("no args: %q %q %q %v, want serve :9000 info", cmd, addr, level, err)
	}
	cmd, addr, level, _, err = parse(t, []string{"migrate", "--demo-addr", ":1"}, map[string]string{"DEMO_ADDR": ":2", "LOG_LEVEL": "debug"})
	if err != nil || cmd != "migrate" || addr != ":1" || level != "debug" {
		t.Fatalf("migrate with flag and env: %q %q %q %v, want migrate, the flag's :1, the variable's debug", cmd, addr, level, err)
	}
}

func TestCommandParseHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"migrate", "-h"}} {
		_, _, _, usage, err := parse(t, args, nil)
		if !errors.Is(err, serve.ErrHelp) {
			t.Fatalf("%v: %v, want serve.ErrHelp", args, err)
		}
		for _, want := range []string{"Usage: demo-svc [serve|migrate] [flags]", "--demo-addr", "DEMO_ADDR", "LOG_LEVEL", "(default info)"} {
			if !strings.Contains(usage, want) {
				t.Errorf("%v: usage lacks %q:\n%s", args, want, usage)
			}
		}
	}
}

func TestCommandParseRefusesInOneLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		vars map[string]string
		want string
	}{
		{[]string{"frobnicate"}, nil, `demo-svc: unknown command "frobnicate" (commands: serve, migrate)`},
		{[]string{"serve", "extra"}, nil, `demo-svc: unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, nil, "no-such-flag"},
		{nil, map[string]string{"LOG_LEVEL": ""}, ""}, // empty is unset: not an error
	} {
		_, _, _, _, err := parse(t, c.args, c.vars)
		if c.want == "" {
			if err != nil {
				t.Errorf("%v %v: %v, want no error", c.args, c.vars, err)
			}
			continue
		}
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, c.want) || strings.Contains(ue.Msg, "\n") {
			t.Errorf("%v: %v, want a one-line usage error containing %q", c.args, err, c.want)
		}
		var stderr bytes.Buffer
		if code := serve.ExitCode(err, &stderr); code != 2 || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%v: exit %d with %q, want 2 and one line", c.args, code, stderr.String())
		}
	}
}

func TestCheckBaseURLRedactsThePassword(t *testing.T) {
	if err := CheckBaseURL("RAIL_BASE_URL", "https://rail.example:8443/base"); err != nil {
		t.Fatalf("a good base URL: %v", err)
	}
	for _, raw := range []string{"ftp://u:s3cret@rail.example", "http://u:s3cret@rail.example/?q=1", "http:///nohost", "http://u:s3cret@rail.example/#f"} {
		err := CheckBaseURL("RAIL_BASE_URL", raw)
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "RAIL_BASE_URL") {
			t.Fatalf("%s: %v, want a usage error naming RAIL_BASE_URL", raw, err)
		}
		if strings.Contains(ue.Msg, "s3cret") {
			t.Errorf("%s: the refusal quotes the password: %s", raw, ue.Msg)
		}
	}
	if got := RedactURL("http://u:s3cret@h/p"); got != "http://u:xxxxx@h/p" {
		t.Errorf("RedactURL = %q", got)
	}
	if got := RedactURL("http://[::1"); got != "(unparseable)" {
		t.Errorf("RedactURL of no URL = %q", got)
	}
}

func TestCheckSettleTokenSaysWhyWithoutTheToken(t *testing.T) {
	if err := CheckSettleToken("binary-test-token-0123456789"); err != nil {
		t.Fatalf("a good token: %v", err)
	}
	const bad = "short!"
	err := CheckSettleToken(bad)
	var ue *serve.UsageError
	if !errors.As(err, &ue) || !strings.HasPrefix(ue.Msg, "invalid PAYMENT_SETTLE_TOKEN (--payment-settle-token): must be") {
		t.Fatalf("%v, want the setting and the reason, without the validator's prefix", err)
	}
	if strings.Contains(ue.Msg, bad) {
		t.Errorf("the refusal quotes the token: %s", ue.Msg)
	}
}

func TestSpecCheckNamesTheSetting(t *testing.T) {
	db := func(url string, maxConns int) *Database {
		d := &Database{URL: url, MaxConns: maxConns, MinConns: 2, ConnsBound: 10}
		d.Tree.Database = "paydb"
		return d
	}
	for _, c := range []struct {
		spec Spec
		want string // "" means no error
	}{
		{Spec{LogLevel: "info"}, ""},
		{Spec{LogLevel: "loud"}, "LOG_LEVEL"},
		{Spec{LogLevel: "warn", DB: db("", 2)}, ""},
		{Spec{LogLevel: "info", DB: db("postgres://u:s3cret@[::1", 2)}, "PAYDB_URL"},
		{Spec{LogLevel: "info", DB: db("", 1)}, "invalid PAYDB_MAX_CONNS (--paydb-max-conns): must be between 2 and 10, got 1"},
		{Spec{LogLevel: "info", DB: db("", 11)}, "PAYDB_MAX_CONNS"},
	} {
		err := c.spec.Check()
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: %v, want nil", c.spec, err)
			}
			continue
		}
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, c.want) || strings.Contains(ue.Msg, "s3cret") {
			t.Errorf("%+v: %v, want a usage error containing %q and no password", c.spec, err, c.want)
		}
	}
}
