package service

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/serve"
)

// Spec is what every service is told besides its own settings.
type Spec struct {
	Name      string       // the binary's name: the service field of every log line
	LogLevel  string       // LOG_LEVEL
	LogOutput io.Writer    // the log's destination; nil means stdout
	Addr      string       // the address to listen on
	Listener  net.Listener // when set, served instead of listening on Addr (tests, lockdemo)
	// BatchLog batches the log's lines on stdout (NewBatchedLogger): for a
	// service that logs on its hot path.
	BatchLog bool
	// Validate checks the service's settings; its error names the setting (exit 2).
	Validate func() error
	// DB is the database the service serves; nil when it has none.
	DB *Database
	// Identity is TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE and UNSAFE_NO_AUTH
	// (docs/contracts/workload-identity.md): with all three files set the
	// service serves mutual TLS only, and its clients call with the same SVID.
	Identity identity.Settings
	// HealthAddr is HEALTH_ADDR: when set, /livez, /readyz and /metrics (only)
	// are also served there, plaintext, for probes and scrapes that present no
	// SVID.
	HealthAddr string
	// HealthListener, when set, is served instead of listening on HealthAddr
	// (tests).
	HealthListener net.Listener
	// Getenv is the environment libpq's defaults are looked for in when
	// DB.URL is empty (Database.checkURLSet); nil means os.Getenv.
	Getenv func(string) string
	// AuthMaterial is the service's other auth material (a signing key, a grant
	// key set): like the identity files, an empty one is refused at start
	// (exit 2 naming it) unless UNSAFE_NO_AUTH lifts the refusal. Only a
	// service's run checks it and the identity files: migrate needs neither.
	AuthMaterial []Material
}

// Material is one setting of auth material: its variable, its value, and what
// it is for, for the refusal.
type Material struct{ Env, Value, What string }

// Check checks the settings every service shares, for its Validate to call:
// LOG_LEVEL, and the database's URL and pool size. An error names the setting.
func (spec Spec) Check() error {
	if err := CheckLogLevel(spec.LogLevel); err != nil {
		return err
	}
	if spec.DB != nil {
		return spec.DB.check()
	}
	return nil
}

// Service is a running service's skeleton: its logger, registry and readiness,
// its database once OpenDB has opened it, and what Close releases.
type Service struct {
	Logger   *slog.Logger         // JSON, with service=Spec.Name on every line
	Registry *prometheus.Registry // the service's own (never the global one)
	Health   *serve.Health        // readiness: OpenDB adds db, the service its own components
	// Identity is the service's SVID and trust bundle, re-read on change; nil
	// when the service runs without identity (UNSAFE_NO_AUTH).
	Identity *identity.Source

	spec        Spec
	authMissing []string // what UNSAFE_NO_AUTH let the service start without
	served      bool
	closers     []func() // run by Close, last first
}

// Start begins a service's run: it validates spec, then builds the logger, the
// registry (Go and process collectors) and readiness with no component yet. A
// handed-in Listener is closed when Start fails, and by Close when the run fails
// before serving it, so its clients see a refused connection rather than a hang.
func Start(spec Spec) (*Service, error) {
	s := &Service{spec: spec}
	if err := spec.Validate(); err != nil {
		s.closeListener()
		return nil, err
	}
	if err := spec.checkDBURLSet(); err != nil {
		s.closeListener()
		return nil, err
	}
	if err := spec.checkAuth(); err != nil {
		s.closeListener()
		return nil, err
	}
	var err error
	if spec.BatchLog {
		var closeLog func()
		s.Logger, closeLog, err = NewBatchedLogger(spec.LogOutput, spec.Name, spec.LogLevel)
		if err == nil {
			s.closers = append(s.closers, closeLog)
		}
	} else {
		s.Logger, err = NewLogger(spec.LogOutput, spec.Name, spec.LogLevel)
	}
	if err != nil {
		s.closeListener()
		return nil, err
	}
	s.Registry = serve.NewRegistry()
	s.Health = serve.NewHealth()
	if spec.Identity.Enabled() {
		if s.Identity, err = identity.Load(spec.Identity, s.Logger); err != nil {
			s.closeListener()
			return nil, err
		}
		s.Identity.Register(s.Registry)
	} else {
		s.NoteAuthMissing("TLS_CERT_FILE, TLS_KEY_FILE or TLS_CA_FILE is empty: plaintext, callers not verified")
	}
	return s, nil
}

// NoteAuthMissing records auth material the service runs without (only
// UNSAFE_NO_AUTH lets it start so): auth_enabled then reads 0 and auth_disabled
// says why, at start and every ten minutes.
func (s *Service) NoteAuthMissing(why string) { s.authMissing = append(s.authMissing, why) }

// AuthEnabled reports whether the service verifies its callers over mutual
// TLS and has every piece of grant material it needs.
func (s *Service) AuthEnabled() bool { return s.Identity != nil && len(s.authMissing) == 0 }

// Guard is the service's role check over routes (the operationIds of its
// OpenAPI document), enabled when it serves mutual TLS.
func (s *Service) Guard(routes ...string) *identity.Guard {
	return identity.NewGuard(s.Identity != nil, routes, s.Registry, s.Logger)
}

// ClientTLS is the TLS configuration of a client of the workload peer (its
// SPIFFE ID), or nil when the service runs without identity (plaintext).
func (s *Service) ClientTLS(peer spiffeid.ID) *tls.Config {
	if s.Identity == nil {
		return nil
	}
	return s.Identity.ClientConfig(peer)
}

// Secure is ln serving mutual TLS with the service's SVID, re-read on change
// until ctx ends, and auth_enabled announced; ln itself without identity. A
// service that serves through Serve does not call it.
func (s *Service) Secure(ctx context.Context, ln net.Listener) net.Listener {
	return identity.Secure(ctx, ln, s.Identity, s.Registry, s.Logger, s.AuthEnabled(), strings.Join(s.authMissing, "; "))
}

// ServeHealth serves /livez, /readyz and /metrics plaintext on HEALTH_ADDR
// until ctx ends, when it is set; it returns at once otherwise. Its error (the
// address cannot be listened on) ends the run.
func (s *Service) ServeHealth(ctx context.Context) (<-chan error, error) {
	return serve.ServeProbes(ctx, s.spec.HealthAddr, s.spec.HealthListener, s.Health, s.Registry, s.Logger)
}

// checkAuth refuses to run without identity or auth material unless
// UNSAFE_NO_AUTH lifts the refusal (docs/contracts/workload-identity.md: fail
// closed).
func (spec Spec) checkAuth() error {
	if err := spec.Identity.Check(); err != nil {
		return err
	}
	for _, m := range spec.AuthMaterial {
		if err := spec.Identity.RequireMaterial(m.Env, m.Value, m.What); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) closeListener() {
	if s.spec.Listener != nil && !s.served {
		_ = s.spec.Listener.Close()
	}
}

// Close releases what the run holds, last acquired first: the replication
// watch and the database pool, then the log's last lines. With *errp set (the
// run failed) it also closes a handed-in listener that was never served. Run
// defers it with its named error: defer s.Close(&err).
func (s *Service) Close(errp *error) {
	if *errp != nil {
		s.closeListener()
	}
	for _, c := range slices.Backward(s.closers) {
		c()
	}
}

// Run is a service's run: Start, then run with the Service, then Close. It
// returns Start's error or run's.
func Run(spec Spec, run func(*Service) error) (err error) {
	s, err := Start(spec)
	if err != nil {
		return err
	}
	defer s.Close(&err)
	return run(s)
}

// Listen opens Spec.Addr, or takes Spec.Listener when one was handed in; from
// then on the server owns it and closes it on shutdown.
func (s *Service) Listen() (net.Listener, error) {
	ln, err := serve.Listen(s.spec.Addr, s.spec.Listener)
	if err == nil {
		s.served = true
	}
	return ln, err
}

// Server serves h on ln until ctx is cancelled, then drains: readiness goes
// DOWN, no new connections are taken, in-flight requests get serve.ShutdownGrace;
// nil after a clean drain. serve.Serve (net/http) and fastserve.ServeFast are two.
type Server func(ctx context.Context, ln net.Listener, h http.Handler, health *serve.Health, logger *slog.Logger) error

// Serve listens (Listen), tells started the address it listens on — where a
// service logs that it is starting, with its settings; started may be nil — and
// serves h with server until ctx is cancelled, then drains.
func (s *Service) Serve(ctx context.Context, h http.Handler, server Server, started func(addr string)) error {
	ln, err := s.Listen()
	if err != nil {
		return err
	}
	hctx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	healthDone, err := s.ServeHealth(hctx)
	if err != nil {
		_ = ln.Close()
		return err
	}
	if started != nil {
		started(ln.Addr().String())
	}
	ln = s.Secure(ctx, ln)
	err = server(ctx, ln, h, s.Health, s.Logger)
	stopHealth()
	if herr := <-healthDone; err == nil && herr != nil {
		err = herr
	}
	return err
}

// Commands maps a binary's subcommands to what each runs with the parsed
// configuration C.
type Commands[C any] map[string]func(context.Context, C) error

// Main is a service binary's main: it parses os.Args and the environment with
// parse, runs the subcommand's function until SIGINT or SIGTERM cancels its
// context, and exits with serve.ExitCode: 0, 2 for a bad setting (its one line on
// stderr), 1 for anything else.
func Main[C any](parse func(args []string, getenv func(string) string) (string, C, error), commands Commands[C]) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, parse, commands)
	stop()
	os.Exit(serve.ExitCode(err, os.Stderr))
}

// run is Main without the process around it.
func run[C any](ctx context.Context, args []string, getenv func(string) string,
	parse func([]string, func(string) string) (string, C, error), commands Commands[C]) error {
	cmd, cfg, err := parse(args, getenv)
	if err != nil {
		return err
	}
	f, ok := commands[cmd]
	if !ok {
		return errors.New("no such command: " + cmd)
	}
	return f(ctx, cfg)
}
