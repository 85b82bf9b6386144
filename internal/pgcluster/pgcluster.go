// Package pgcluster starts a throwaway PostgreSQL cluster from the local server
// binaries: data in a temporary directory, listening on a free loopback port, run
// as an unprivileged user when the caller is root (PostgreSQL refuses to run as
// root), and removed on Stop. Tests and lockdemo use it; production never does.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoServer says no PostgreSQL server binaries could be found.
var ErrNoServer = errors.New("no PostgreSQL server binaries found (initdb, postgres): install them, e.g. `apt-get install postgresql` (Debian) — or set TEST_DATABASE_URL / PAYDB_URL to an existing server")

// Options tune the cluster.
type Options struct {
	// Durable keeps fsync and synchronous_commit on (benchmarks that compare with
	// the database's own ceiling). Off, the cluster trades durability for speed,
	// which is right for tests: a crash loses a throwaway database.
	Durable bool
	// MaxConnections defaults to 300.
	MaxConnections int
	// Log receives the server's output; nil discards it.
	Log *os.File
}

// Cluster is a running throwaway PostgreSQL.
type Cluster struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}

	stopOnce sync.Once
	waitErr  error
}

// FindBinDir finds the directory with initdb and postgres: PATH, then
// `pg_config --bindir`, then /usr/lib/postgresql/*/bin (newest first).
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir := filepath.Dir(real)
			if fileExists(filepath.Join(dir, "postgres")) {
				return dir, nil
			}
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if fileExists(filepath.Join(dir, "initdb")) && fileExists(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, dir := range matches {
		if fileExists(filepath.Join(dir, "initdb")) && fileExists(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", ErrNoServer
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// Start initialises and starts a cluster. It returns when the server accepts
// connections.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "lockdev-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: temp dir: %w", err)
	}
	c := &Cluster{dir: dir, done: make(chan struct{})}
	fail := func(err error) (*Cluster, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if cred != nil {
		if err := os.Chmod(dir, 0o755); err != nil {
			return fail(err)
		}
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(fmt.Errorf("pgcluster: chown temp dir: %w", err))
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", data, "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	var out bytes.Buffer
	initdb.Stdout, initdb.Stderr = &out, &out
	if err := initdb.Run(); err != nil {
		return fail(fmt.Errorf("pgcluster: initdb: %w: %s", err, out.String()))
	}

	settings := []string{
		"listen_addresses=127.0.0.1",
		"unix_socket_directories=" + dir,
		"max_connections=" + strconv.Itoa(opts.MaxConnections),
		"shared_buffers=128MB",
		"log_min_messages=warning",
		"logging_collector=off",
		"max_prepared_transactions=0",
	}
	if opts.Durable {
		settings = append(settings, "fsync=on", "synchronous_commit=on")
	} else {
		settings = append(settings, "fsync=off", "synchronous_commit=off", "full_page_writes=off")
	}

	// A port picked by a probe can be taken before the server binds it; try a few.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		args := []string{"-D", data, "-p", strconv.Itoa(port)}
		for _, s := range settings {
			args = append(args, "-c", s)
		}
		if err := c.launch(filepath.Join(bin, "postgres"), args, cred, opts.Log); err != nil {
			return fail(err)
		}
		c.port = port
		if err := c.waitReady(ctx); err != nil {
			lastErr = err
			c.kill()
			c.done = make(chan struct{})
			continue
		}
		return c, nil
	}
	return fail(fmt.Errorf("pgcluster: server did not start: %w", lastErr))
}

// launch starts postgres from a goroutine locked to its OS thread, so that the
// parent-death signal (which Linux ties to the creating thread) fires only when
// this process dies: a killed test binary takes its server with it.
func (c *Cluster) launch(path string, args []string, cred *syscall.Credential, logf *os.File) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		cmd := exec.Command(path, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
		if logf != nil {
			cmd.Stdout, cmd.Stderr = logf, logf
		}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("pgcluster: start postgres: %w", err)
			return
		}
		c.cmd = cmd
		started <- nil
		c.waitErr = cmd.Wait()
		close(c.done)
	}()
	return <-started
}

func (c *Cluster) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			return fmt.Errorf("postgres exited: %v", c.waitErr)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, c.URL("postgres"))
		if err == nil {
			err = conn.Ping(cctx)
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after 30s: %w", lastErr)
}

// URL is the connection string of database db on this cluster.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Port is the cluster's TCP port.
func (c *Cluster) Port() int { return c.port }

// CreateDatabase creates database name, optionally from a template.
func (c *Cluster) CreateDatabase(ctx context.Context, name, template string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgcluster: %s: %w", sql, err)
	}
	return nil
}

// Stop shuts the server down (fast mode) and removes its files.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		if c.cmd != nil && c.cmd.Process != nil {
			_ = c.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-c.done:
			case <-time.After(15 * time.Second):
				c.kill()
			}
		}
		_ = os.RemoveAll(c.dir)
	})
	return nil
}

func (c *Cluster) kill() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// runAs picks the unprivileged user the server runs as when we are root: the
// "postgres" user when it exists, else "nobody".
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("pgcluster: running as root and no unprivileged user (postgres, nobody) exists to run PostgreSQL as")
}
