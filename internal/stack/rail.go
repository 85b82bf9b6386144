package stack

import (
	"fmt"
	"os"
	"path/filepath"
)

// checkRail refuses a rail protocol or statement source the stack does not know.
func (o Options) checkRail() error {
	switch o.RailProtocol {
	case "", RailStub, RailISO20022:
	default:
		return fmt.Errorf("stack: RailProtocol %q: want %q or %q", o.RailProtocol, RailStub, RailISO20022)
	}
	switch o.StatementSource {
	case "", StatementProxy, StatementDir:
	default:
		return fmt.Errorf("stack: StatementSource %q: want %q or %q", o.StatementSource, StatementProxy, StatementDir)
	}
	return nil
}

// Protocol is the rail protocol the stack runs: RailStub or RailISO20022.
func (s *Stack) Protocol() string {
	if s.opts.RailProtocol == "" {
		return RailStub
	}
	return s.opts.RailProtocol
}

// StatementSource is where the stack's reconcilers read the statement:
// StatementProxy or StatementDir.
func (s *Stack) StatementSource() string {
	if s.opts.StatementSource == "" {
		return StatementProxy
	}
	return s.opts.StatementSource
}

// railEnv is the settings Options.RailProtocol and Options.StatementSource give
// service, under its base settings and Options.Env. A default (stub, proxy) sets
// nothing: the services' own defaults are those.
func (s *Stack) railEnv(service string) map[string]string {
	m := map[string]string{}
	if s.Protocol() == RailISO20022 {
		switch service {
		case "rail-stub":
			m["RAIL_STUB_PROTOCOL"] = RailISO20022
		case "rail-proxy":
			m["RAIL_PROTOCOL"] = RailISO20022
		case "payment-resource":
			m["PAYMENT_RAIL_PROFILE"] = RailISO20022
		}
	}
	if s.StatementSource() == StatementDir {
		switch service {
		case "rail-stub":
			m["RAIL_STUB_STATEMENT_DIR"] = s.StatementDir
			m["RAIL_STUB_STATEMENT_EVERY"] = StatementEvery.String()
		case "reconciler":
			m["RECONCILER_STATEMENT_SOURCE"] = StatementDir
			m["RECONCILER_STATEMENT_DIR"] = s.StatementDir
		}
	}
	return m
}

// statementDir makes the statement directory under the stack's temporary
// directory, with Options.StatementSource dir.
func (s *Stack) statementDir() error {
	if s.StatementSource() != StatementDir {
		return nil
	}
	tmp, err := s.tempDir()
	if err != nil {
		return fmt.Errorf("stack: statement directory: %w", err)
	}
	s.StatementDir = filepath.Join(tmp, "statements")
	if err := os.Mkdir(s.StatementDir, 0o700); err != nil {
		return fmt.Errorf("stack: statement directory: %w", err)
	}
	return nil
}

// tempDir is the stack's temporary directory, made on first use and removed by
// Close.
func (s *Stack) tempDir() (string, error) {
	if s.tmp != "" {
		return s.tmp, nil
	}
	tmp, err := os.MkdirTemp("", "lockdev-stack-")
	if err != nil {
		return "", err
	}
	s.tmp = tmp
	return tmp, nil
}
