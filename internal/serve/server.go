package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"lock.dev/lockapi"
)

// NewLogger is the logger (docs/contracts/observability.md): one JSON object per
// line, every line with service.
func NewLogger(w io.Writer, service, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, Invalid("LOG_LEVEL", "must be debug, info, warn or error")
	}
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})
	return slog.New(h).With("service", service), nil
}

// NewRegistry is a service's own registry (never the global one, so several
// services run in one process) with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Check reports a component's health; nil is UP.
type Check func(ctx context.Context) error

// Health serves liveness and readiness (docs/contracts/observability.md).
//
// A component's detail in the answer says only UP or DOWN: readiness is served to
// anyone who can reach the port, and a check's error names hosts, users and
// databases. Why a component is DOWN goes to the service's log instead, redacted,
// once per change.
type Health struct {
	mu       sync.Mutex
	names    []string
	checks   map[string]Check
	draining atomic.Bool
	timeout  time.Duration

	logger *slog.Logger      // set by Serve; nil logs nothing
	last   map[string]string // per component, the last reason logged ("" while UP)
}

// NewHealth returns a Health with no components.
func NewHealth() *Health {
	return &Health{checks: map[string]Check{}, timeout: 2 * time.Second, last: map[string]string{}}
}

// downDetail is a DOWN component's detail in the answer.
const downDetail = "check failed; the reason is in the service's log"

// SetLogger sets where a component's changes of state are logged (Serve sets the
// service's logger when none was set).
func (h *Health) SetLogger(l *slog.Logger) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logger = l
}

// note logs a component's reason for being DOWN, or its return to UP, when it
// differs from the last one logged: a probe every few seconds does not repeat it.
func (h *Health) note(name string, err error) {
	reason := ""
	if err != nil {
		reason = Redact(err.Error())
	}
	h.mu.Lock()
	prev, seen := h.last[name]
	h.last[name] = reason
	logger := h.logger
	h.mu.Unlock()
	switch {
	case logger == nil || (seen && prev == reason) || (!seen && reason == ""):
	case reason != "":
		logger.Warn("readiness component DOWN", "event", "readiness_down", "component", name, "error", reason)
	default:
		logger.Info("readiness component UP again", "event", "readiness_up", "component", name)
	}
}

// Add adds a readiness component.
func (h *Health) Add(name string, c Check) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.names = append(h.names, name)
	h.checks[name] = c
}

// Drain makes readiness DOWN from now on: the process is shutting down.
func (h *Health) Drain() { h.draining.Store(true) }

// Component is one component of a readiness answer: UP or DOWN, and why.
type Component struct {
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// Readiness is the body of every readiness answer (/readyz and its
// /actuator aliases): the overall status and each component's.
type Readiness struct {
	Status     string               `json:"status"`
	Components map[string]Component `json:"components"`
}

// Ready runs every check concurrently and reports the result.
func (h *Health) Ready(ctx context.Context) (bool, map[string]Component) {
	h.mu.Lock()
	names := append([]string(nil), h.names...)
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	out := make(map[string]Component, len(names)+1)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := Component{Status: "UP", Detail: "ok"}
			err := h.checks[n](ctx)
			if err != nil {
				c = Component{Status: "DOWN", Detail: downDetail}
			}
			h.note(n, err)
			mu.Lock()
			out[n] = c
			mu.Unlock()
		}()
	}
	wg.Wait()
	up := true
	for _, c := range out {
		if c.Status != "UP" {
			up = false
		}
	}
	if h.draining.Load() {
		up = false
		out["lifecycle"] = Component{Status: "DOWN", Detail: "shutting down"}
	}
	return up, out
}

func (h *Health) live(w http.ResponseWriter, _ *http.Request) {
	writeHealth(w, http.StatusOK, map[string]string{"status": "UP"})
}

func (h *Health) ready(w http.ResponseWriter, r *http.Request) {
	up, comps := h.Ready(r.Context())
	body := Readiness{Status: "UP", Components: comps}
	status := http.StatusOK
	if !up {
		body.Status = "DOWN"
		status = http.StatusServiceUnavailable
	}
	writeHealth(w, status, body)
}

func writeHealth(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// Mount adds the health and metrics endpoints every service has (docs/contracts/observability.md).
func Mount(mux *http.ServeMux, h *Health, reg *prometheus.Registry) {
	for _, p := range []string{"/livez", "/actuator/health/liveness"} {
		mux.HandleFunc("GET "+p, h.live)
	}
	for _, p := range []string{"/readyz", "/actuator/health/readiness", "/actuator/health"} {
		mux.HandleFunc("GET "+p, h.ready)
	}
	m := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	mux.Handle("GET /metrics", m)
	mux.Handle("GET /actuator/prometheus", m)
}

var probeMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch}

// Handler wraps mux so that an unknown route answers 404 NOT_FOUND and a known
// route with another method 405 METHOD_NOT_ALLOWED, both as problem+json, and a
// panic in a handler becomes a logged 500 INTERNAL instead of a dropped connection.
func Handler(mux *http.ServeMux, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				logger.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
				lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal, "internal error", nil))
			}
		}()
		if _, pattern := mux.Handler(r); pattern != "" {
			nw := &notingWriter{ResponseWriter: w}
			mux.ServeHTTP(nw, r)
			logRefused(logger, r, pattern, nw.problem)
			return
		}
		var allow []string
		for _, m := range probeMethods {
			if m == r.Method {
				continue
			}
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, p := mux.Handler(probe); p != "" {
				allow = append(allow, m)
			}
		}
		status := http.StatusNotFound
		if len(allow) > 0 {
			status = http.StatusMethodNotAllowed
		}
		logger.Info("request refused: no such route", "event", "request_refused", "method", r.Method, "status", status)
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeMethodNotAllowed,
				fmt.Sprintf("%s is not allowed here; allowed: %s", r.Method, strings.Join(allow, ", ")), nil))
			return
		}
		lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeNotFound, "no such route", nil))
	})
}

// notingWriter remembers the problem a handler answered with.
type notingWriter struct {
	http.ResponseWriter
	problem *lockapi.Problem
}

func (n *notingWriter) NoteProblem(p *lockapi.Problem) { n.problem = p }

// Unwrap lets http.ResponseController reach the connection (deadlines, hijack).
func (n *notingWriter) Unwrap() http.ResponseWriter { return n.ResponseWriter }

// logRefused says in the log why a request was refused when no pinned event of the
// service already does: malformed input (what was wrong, by field and rule — never
// the values sent), an unknown resource, or a failure inside the service.
func logRefused(logger *slog.Logger, r *http.Request, pattern string, p *lockapi.Problem) {
	if p == nil {
		return
	}
	attrs := []any{"event", "request_refused", "route", pattern, "status", p.Status, "code", p.Code, "detail", p.Detail}
	switch p.Code {
	case lockapi.CodeInvalidRequest:
		var errs []lockapi.FieldError
		_, _ = p.Member("errors", &errs)
		logger.Warn("request refused as malformed: nothing written, nothing called", append(attrs, "errors", errs)...)
	case lockapi.CodeNotFound:
		logger.Info("request refused: not found", attrs...)
	case lockapi.CodeInternal:
		logger.Error("request failed inside the service", attrs...)
	}
}

// Server timeouts (docs/contracts/rail-proxy.md): headers within 5 s, the body within a further
// 10 s, idle connections closed after 60 s.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 15 * time.Second
	IdleTimeout       = 60 * time.Second
	ShutdownGrace     = 10 * time.Second
)

// Listen opens addr, or returns ln when the caller already has a listener
// (tests and lockdemo pass one bound to port 0).
func Listen(addr string, ln net.Listener) (net.Listener, error) {
	if ln != nil {
		return ln, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return l, nil
}

// Serve serves h on ln until ctx is cancelled, then drains: readiness goes DOWN,
// no new connections are taken, in-flight requests get ShutdownGrace to finish.
// It returns nil after a clean drain.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, health *Health, logger *slog.Logger) error {
	ln = newHeadLimitListener(ln)
	srv := &http.Server{
		Handler:           h,
		MaxHeaderBytes:    MaxHeaderBytes - netHTTPSlop,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		IdleTimeout:       IdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		ConnContext:       WithConn,
	}
	health.mu.Lock()
	if health.logger == nil {
		health.logger = logger
	}
	health.mu.Unlock()
	return Until(ctx, ln, health, logger, srv.Serve, func(sctx context.Context) error {
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
			return err
		}
		return nil
	}, http.ErrServerClosed)
}

// Until runs serve on ln until ctx is cancelled, then drains: readiness
// DOWN, shutdown given ShutdownGrace. serve's return after a clean shutdown is
// nil or closed. Serve and fastserve.ServeFast share it.
func Until(ctx context.Context, ln net.Listener, health *Health, logger *slog.Logger,
	serve func(net.Listener) error, shutdown func(context.Context) error, closed error) error {
	errc := make(chan error, 1)
	go func() { errc <- serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	health.Drain()
	logger.Info("shutting down", "grace", ShutdownGrace.String())
	// A fresh context: the one that told us to stop is already cancelled.
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	if err := shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, closed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// ExitCode maps Run's error to the process exit status: 0, 2 for a bad setting
// (its one line on stderr), 1 for anything else.
func ExitCode(err error, stderr io.Writer) int {
	var ue *UsageError
	switch {
	case err == nil, errors.Is(err, ErrHelp), errors.Is(err, ErrVersion):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, ue.Msg)
		return 2
	default:
		fmt.Fprintln(stderr, "error:", err)
		return 1
	}
}

// userinfoPassword is the password of a URL's userinfo (scheme://user:password@);
// keyValuePassword a libpq key=value password.
var (
	userinfoPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*):[^/?#@\s]*@`)
	keyValuePassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)
)

// Redact hides passwords in text bound for a log: the password of any URL's
// userinfo and any password=… of a libpq connection string. Everything else —
// host, user, database — stays: an operator needs it and it is no secret.
func Redact(text string) string {
	text = userinfoPassword.ReplaceAllString(text, "${1}:xxxxx@")
	return keyValuePassword.ReplaceAllString(text, "${1}xxxxx")
}

// connKey carries a request's connection in its context.
type connKey struct{}

// WithConn is ctx carrying c, the connection a request arrived on: Serve sets
// it on every connection (http.Server.ConnContext), so that a request's caller
// can be named from its connection (identity.PeerID).
func WithConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// ConnFrom is the connection WithConn put in ctx; nil when none.
func ConnFrom(ctx context.Context) net.Conn {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	return c
}

// ServeProbes serves /livez, /readyz and /metrics — nothing else — plaintext on
// addr (or ln, when handed one) until ctx ends: HEALTH_ADDR, for kubelet probes
// and scrapes that present no SVID (docs/contracts/workload-identity.md). With
// neither addr nor ln it returns a closed channel at once; otherwise the
// channel carries the listener's end.
func ServeProbes(ctx context.Context, addr string, ln net.Listener, health *Health, reg *prometheus.Registry, logger *slog.Logger) (<-chan error, error) {
	done := make(chan error, 1)
	if addr == "" && ln == nil {
		close(done)
		return done, nil
	}
	ln, err := Listen(addr, ln)
	if err != nil {
		return nil, fmt.Errorf("HEALTH_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	Mount(mux, health, reg)
	only := http.NewServeMux()
	for _, p := range []string{"/livez", "/readyz", "/metrics"} {
		only.Handle("GET "+p, mux)
	}
	logger = logger.With("listener", "health")
	go func() {
		done <- Serve(ctx, ln, Handler(only, logger), NewHealth(), logger)
	}()
	return done, nil
}
