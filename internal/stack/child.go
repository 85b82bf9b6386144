package stack

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"lock.dev/internal/serve"
)

// childVar names the service a child process runs.
const childVar = "LOCKDEV_STACK_CHILD"

// Runner runs a service in a child process until ctx is cancelled. getenv reads
// the child's environment; log is its stdout.
type Runner func(ctx context.Context, getenv func(string) string, log io.Writer) error

// ChildMain returns at once in a normal process. In a child started by this
// package it runs the service it was started for and exits. rail-proxy is built
// in; extra adds services (tests add "executor" to kill one mid-cycle).
func ChildMain(extra map[string]Runner) {
	name := os.Getenv(childVar)
	if name == "" {
		return
	}
	runners := map[string]Runner{
		"rail-proxy": func(ctx context.Context, getenv func(string) string, log io.Writer) error {
			return runProxy(ctx, nil, getenv, log)
		},
	}
	maps.Copy(runners, extra)
	run, ok := runners[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "stack: unknown child service %q\n", name)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Getenv, os.Stdout)
	stop()
	os.Exit(serve.ExitCode(err, os.Stderr))
}

// Child is a service running in a child process of this one.
type Child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	once sync.Once
}

// StartChild starts service (a built-in or one the child's ChildMain was given) in
// a child process with env as its settings on top of this process's environment.
func (s *Stack) StartChild(ctx context.Context, service string, env map[string]string) (*Child, error) {
	return startChild(service, env, s.opts.Log)
}

// ServiceURLs are the settings an executor needs to find the system: with
// Options.Tap, the taps in front of the services.
func (s *Stack) ServiceURLs() map[string]string {
	if s.taps != nil {
		return map[string]string{
			"LOCK_SERVER_URL":      s.taps.url("lock-server"),
			"PAYMENT_RESOURCE_URL": s.taps.url("payment-resource"),
			"RAIL_PROXY_URL":       s.taps.url("rail-proxy"),
		}
	}
	return map[string]string{
		"LOCK_SERVER_URL":      s.LockServerURL,
		"PAYMENT_RESOURCE_URL": s.PaymentURL,
		"RAIL_PROXY_URL":       s.ProxyURL,
	}
}

func startChild(service string, env map[string]string, log io.Writer) (*Child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("stack: own executable: %w", err)
	}
	var environ []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, overridden := env[k]; !overridden && k != childVar {
			environ = append(environ, kv)
		}
	}
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	environ = append(environ, childVar+"="+service)

	c := &Child{name: service, done: make(chan struct{})}
	startErr := make(chan error, 1)
	// Started from a goroutine locked to its OS thread: Linux sends the
	// parent-death signal when the creating thread exits, so the thread must live
	// as long as the child. A dying parent then takes its children with it.
	go func() {
		runtime.LockOSThread()
		cmd := exec.Command(exe)
		cmd.Env = environ
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			startErr <- fmt.Errorf("stack: start %s: %w", service, err)
			return
		}
		c.cmd = cmd
		startErr <- nil
		c.err = cmd.Wait()
		close(c.done)
	}()
	if err := <-startErr; err != nil {
		return nil, err
	}
	return c, nil
}

// Kill ends the child with SIGKILL and waits for it: a crash, not a stop.
func (c *Child) Kill() { c.kill() }

func (c *Child) kill() {
	c.once.Do(func() { _ = c.cmd.Process.Signal(syscall.SIGKILL) })
	<-c.done
}

// Stop asks the child to shut down gracefully (SIGTERM) and waits; after 15 s it
// is killed.
func (c *Child) Stop() error { return c.stop() }

func (c *Child) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		c.kill()
		return fmt.Errorf("%s: did not stop within 15s; killed", c.name)
	}
	if c.err != nil { // Wait reports a non-zero exit or a signal
		return fmt.Errorf("%s: %w", c.name, c.err)
	}
	return nil
}

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Listener opens a loopback listener on a free port (for callers that run a
// service in-process next to the stack).
func Listener() (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:0")
}
