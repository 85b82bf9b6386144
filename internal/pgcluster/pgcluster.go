// Package pgcluster starts throwaway PostgreSQL clusters from the local server
// binaries: data in a temporary directory, listening on a free loopback port, run
// as an unprivileged user when the caller is root (PostgreSQL refuses to run as
// root), and removed on Stop. Start gives one server; StartPair a primary with a
// streaming standby that can be held back, killed and promoted (replica.go).
// Tests and lockdemo use it; production never does.
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
	dir  string // temporary directory: data/ and the unix socket
	bin  string
	cred *syscall.Credential // nil: run as ourselves
	logf *os.File
	port int
	cmd  *exec.Cmd
	done chan struct{}

	stopOnce sync.Once
	waitErr  error

	mu      sync.Mutex
	stopped []int // processes held by SIGSTOP (Hold), to continue on Release
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
	c, err := newCluster(opts.Log)
	if err != nil {
		return nil, err
	}
	if err := c.initdb(ctx); err != nil {
		c.remove()
		return nil, err
	}
	if err := c.start(ctx, baseSettings(c.dir, opts)); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// newCluster makes the temporary directory a server (run as cred) can own.
func newCluster(logf *os.File) (*Cluster, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := RunAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "lockdev-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: temp dir: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin, cred: cred, logf: logf, done: make(chan struct{})}
	if err := c.own(dir, 0o755); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// own hands path to the user the server runs as (when we are root).
func (c *Cluster) own(path string, mode os.FileMode) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("pgcluster: chmod %s: %w", path, err)
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("pgcluster: chown %s: %w", path, err)
	}
	return nil
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// run runs one of the server's tools (initdb, pg_basebackup, pg_ctl) as the
// server's user and returns its output with the error.
func (c *Cluster) run(ctx context.Context, tool string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, tool), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgcluster: %s: %w: %s", tool, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (c *Cluster) initdb(ctx context.Context) error {
	return c.run(ctx, "initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
}

// baseSettings are every cluster's server settings.
func baseSettings(dir string, opts Options) []string {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
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
		return append(settings, "fsync=on", "synchronous_commit=on")
	}
	return append(settings, "fsync=off", "synchronous_commit=off", "full_page_writes=off")
}

// start runs postgres on the data directory with settings, on a free port, and
// returns when it accepts connections.
func (c *Cluster) start(ctx context.Context, settings []string) error {
	// A port picked by a probe can be taken before the server binds it; try a few.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		args := []string{"-D", c.data(), "-p", strconv.Itoa(port)}
		for _, s := range settings {
			args = append(args, "-c", s)
		}
		if err := c.launch(filepath.Join(c.bin, "postgres"), args); err != nil {
			return err
		}
		c.port = port
		if err := c.waitReady(ctx); err != nil {
			lastErr = err
			c.kill()
			c.done = make(chan struct{})
			continue
		}
		return nil
	}
	return fmt.Errorf("pgcluster: server did not start: %w", lastErr)
}

// launch starts postgres from a goroutine locked to its OS thread, so that the
// parent-death signal (which Linux ties to the creating thread) fires only when
// this process dies: a killed test binary takes its server with it.
func (c *Cluster) launch(path string, args []string) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		cmd := exec.Command(path, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
		if c.logf != nil {
			cmd.Stdout, cmd.Stderr = c.logf, c.logf
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

// Stop shuts the server down (fast mode) and removes its files. A server that was
// held is continued first, so that it can hear the request.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.release()
		if c.cmd != nil && c.cmd.Process != nil {
			_ = c.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-c.done:
			case <-time.After(15 * time.Second):
				c.kill()
			}
		}
		c.remove()
	})
	return nil
}

func (c *Cluster) remove() { _ = os.RemoveAll(c.dir) }

// kill ends every process of the server with SIGKILL, the way a machine that
// loses power ends them, and waits for the postmaster. Each PostgreSQL child is
// the leader of its own session (the postmaster calls setsid for it), so a signal
// to the postmaster's process group would reach the postmaster alone.
func (c *Cluster) kill() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	pm := c.cmd.Process.Pid
	// Stopped, the postmaster forks nothing more while its children are listed,
	// and no child is restarted between the two kills.
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	for _, pid := range children(pm) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(pm, syscall.SIGKILL)
	<-c.done
	c.mu.Lock()
	c.stopped = nil
	c.mu.Unlock()
}

// hold stops every process of the server with SIGSTOP: it neither receives nor
// replays nor answers until release.
func (c *Cluster) hold() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped != nil {
		return errors.New("pgcluster: already held")
	}
	select {
	case <-c.done:
		return errors.New("pgcluster: server is not running")
	default:
	}
	pm := c.cmd.Process.Pid
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgcluster: stop postmaster: %w", err)
	}
	c.stopped = []int{pm}
	for _, pid := range children(pm) {
		if syscall.Kill(pid, syscall.SIGSTOP) == nil {
			c.stopped = append(c.stopped, pid)
		}
	}
	return nil
}

// release continues what hold stopped; it does nothing when nothing is held.
func (c *Cluster) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.stopped) - 1; i >= 0; i-- { // the children first, the postmaster last
		_ = syscall.Kill(c.stopped[i], syscall.SIGCONT)
	}
	c.stopped = nil
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses, so read
		// after its last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// RunAs picks the unprivileged user the server runs as when we are root: the
// "postgres" user when it exists, else "nobody". Nil when we are not root.
func RunAs() (*syscall.Credential, error) {
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
