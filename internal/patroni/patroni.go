// Package patroni starts a throwaway highly available PostgreSQL for tests: a
// one-node etcd and N PostgreSQL servers managed by Patroni, all on 127.0.0.1 on
// free ports, all state in one temporary directory that Stop removes. Patroni
// runs with synchronous_mode and synchronous_mode_strict on, the configuration
// docs/operations/high-availability.md asks of a production cluster: a failover
// promotes only the synchronous standby, and with no standby commits wait.
//
// Tests kill a member (SIGKILL to Patroni and every PostgreSQL process), stop it
// gracefully, start it again, switch over with patronictl, and stop or start
// etcd, while the services run on the cluster's multi-host URL. Production never
// uses this package.
//
// When the caller is root, etcd and Patroni run as the unprivileged postgres
// user (PostgreSQL refuses to run as root), like internal/pgcluster.
package patroni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/pgcluster"
)

// The cluster's fixed names and throwaway passwords.
const (
	superuser    = "postgres"
	superPass    = "su-pass"
	replPass     = "rep-pass"
	rewindPass   = "rewind-pass"
	installHint  = "apt-get install patroni etcd-server"
	restTimeout  = 3 * time.Second
	stopPatience = 30 * time.Second
)

// Options shape the cluster.
type Options struct {
	// Nodes is the number of PostgreSQL members; 3 when 0.
	Nodes int
	// TTL, LoopWait and RetryTimeout are Patroni's ttl, loop_wait and
	// retry_timeout: 20 s, 2 s and 5 s when 0. A killed leader is replaced only
	// once its key expired, so TTL bounds how long a failover takes; Patroni
	// wants TTL >= LoopWait + 2*RetryTimeout.
	TTL, LoopWait, RetryTimeout time.Duration
	// Async, when true, runs the cluster with synchronous_mode off: streaming
	// replication is asynchronous and Patroni promotes any replica within
	// maximum_lag_on_failover. Only a test that shows what the checks catch on
	// such a cluster sets it.
	Async bool
	// Log receives etcd's and Patroni's logs when Start fails, and on
	// WriteLogs; nil discards them.
	Log io.Writer
}

// Member is one PostgreSQL member as Patroni's REST /cluster reports it.
type Member struct {
	Name string
	// Role is "leader", "sync_standby" or "replica".
	Role string
	// State is "running", "streaming", "stopped", "starting", …
	State string
	Host  string
	Port  int
	// Lag is the replication lag in bytes Patroni reports (0 for the leader,
	// -1 when unknown).
	Lag int64
}

// Cluster is a running etcd and its Patroni members.
type Cluster struct {
	opts    Options
	dir     string
	bin     string // PostgreSQL's server binaries
	cred    *syscall.Credential
	patroni string // executables
	ctl     string
	etcdBin string

	etcdClient, etcdPeer int
	nodes                []*node

	mu   sync.Mutex
	etcd *proc

	stopOnce sync.Once
}

type node struct {
	name     string
	pgPort   int
	restPort int
	config   string // the YAML file
	data     string

	mu      sync.Mutex
	patroni *proc
}

// proc is a process this package started and waits for.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Check says whether the cluster can run here: patroni, patronictl, etcd and
// PostgreSQL's server binaries. Its error names what to install.
func Check() error {
	var missing []string
	for _, exe := range []string{"patroni", "patronictl", "etcd"} {
		if _, err := lookPath(exe); err != nil {
			missing = append(missing, exe)
		}
	}
	if _, err := pgcluster.FindBinDir(); err != nil {
		missing = append(missing, "PostgreSQL's server binaries (initdb, postgres)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("patroni: %s not found: install them, e.g. `%s postgresql` (Debian)", strings.Join(missing, ", "), installHint)
	}
	return nil
}

// lookPath finds exe on PATH or in /usr/bin and /usr/local/bin (a test's PATH
// may be trimmed).
func lookPath(exe string) (string, error) {
	if p, err := exec.LookPath(exe); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/bin", "/usr/local/bin"} {
		p := filepath.Join(dir, exe)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("patroni: %s not found", exe)
}

// Start starts etcd and opts.Nodes Patroni members, the first bootstrapping the
// cluster and the others cloning it, and returns when a leader accepts writes
// and a synchronous standby streams (with Async: when every member streams).
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.TTL == 0 {
		opts.TTL = 20 * time.Second
	}
	if opts.LoopWait == 0 {
		opts.LoopWait = 2 * time.Second
	}
	if opts.RetryTimeout == 0 {
		opts.RetryTimeout = 5 * time.Second
	}
	if opts.Nodes < 2 {
		return nil, errors.New("patroni: at least 2 nodes")
	}
	c = &Cluster{opts: opts}
	c.bin, _ = pgcluster.FindBinDir()
	c.patroni, _ = lookPath("patroni")
	c.ctl, _ = lookPath("patronictl")
	c.etcdBin, _ = lookPath("etcd")
	if c.cred, err = pgcluster.RunAs(); err != nil {
		return nil, err
	}
	if c.dir, err = os.MkdirTemp("", "lockdev-patroni-"); err != nil {
		return nil, fmt.Errorf("patroni: temp dir: %w", err)
	}
	// A failed start returns a nil cluster: what it had started is stopped
	// through its own reference.
	started := c
	defer func() {
		if err != nil {
			if opts.Log != nil {
				_ = started.WriteLogs(opts.Log)
			}
			_ = started.Stop()
		}
	}()
	if err := c.own(c.dir, 0o700); err != nil {
		return nil, err
	}
	ports, err := freePorts(2 + 2*opts.Nodes)
	if err != nil {
		return nil, err
	}
	c.etcdClient, c.etcdPeer = ports[0], ports[1]
	for i := range opts.Nodes {
		n := &node{name: fmt.Sprintf("pg%d", i), pgPort: ports[2+2*i], restPort: ports[3+2*i]}
		n.data = filepath.Join(c.dir, n.name)
		n.config = filepath.Join(c.dir, n.name+".yml")
		if err := c.writeConfig(n); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	if err := c.StartEtcd(ctx); err != nil {
		return nil, err
	}
	// The first member bootstraps alone; the others clone it once it leads.
	if err := c.StartMember(ctx, c.nodes[0].name); err != nil {
		return nil, err
	}
	// Alone, it leads but cannot commit a write (strict mode waits for a
	// synchronous standby): its role is what there is to wait for.
	if err := poll(ctx, 200*time.Millisecond, func(ctx context.Context) bool {
		l, err := c.Leader(ctx)
		return err == nil && l.Name == c.nodes[0].name && l.State == "running"
	}); err != nil {
		return nil, fmt.Errorf("patroni: %s did not bootstrap and lead: %w", c.nodes[0].name, err)
	}
	for _, n := range c.nodes[1:] {
		if err := c.StartMember(ctx, n.name); err != nil {
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// scope is Patroni's cluster name, which PostgreSQL also shows in every
// process's title (cluster_name): the temporary directory's name, so that a
// cluster's processes can be told from any other's.
func (c *Cluster) scope() string { return filepath.Base(c.dir) }

// Dir is the cluster's temporary directory (data, configuration, logs).
func (c *Cluster) Dir() string { return c.dir }

// ProcessesUnder lists the processes whose command line names dir or its base
// name (a Patroni cluster's scope, in its PostgreSQL processes' titles): what a
// cluster in dir left running.
func ProcessesUnder(dir string) []string {
	var out []string
	base := []byte(filepath.Base(dir))
	for _, pid := range allPIDs() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !alive(pid) {
			continue
		}
		if bytes.Contains(b, []byte(dir)) || bytes.Contains(b, base) {
			out = append(out, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(bytes.TrimRight(b, "\x00"), []byte{0}, []byte{' '})))
		}
	}
	return out
}

// maxLag is Patroni's maximum_lag_on_failover: 1 MiB, its default; on an
// Async cluster any lag, so that a replica held behind is still promoted (the
// loss the Async cluster exists to show).
func (c *Cluster) maxLag() int64 {
	if c.opts.Async {
		return 1 << 40
	}
	return 1 << 20
}

// URL is the connection string of database db naming every member, with
// target_session_attrs=read-write: a client connects to whichever is the
// leader, and follows a failover by connecting again.
func (c *Cluster) URL(db string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.pgPort)
	}
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		superuser, superPass, strings.Join(hosts, ","), db)
}

// MemberURL is the connection string of database db on one member alone.
func (c *Cluster) MemberURL(member, db string) (string, error) {
	n, err := c.node(member)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", superuser, superPass, n.pgPort, db), nil
}

// Names are the members' names, in the order they were configured.
func (c *Cluster) Names() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.name
	}
	return out
}

func (c *Cluster) node(name string) (*node, error) {
	for _, n := range c.nodes {
		if n.name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("patroni: no member %q", name)
}

// CreateDatabase creates database name on the leader.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	l, err := c.WaitLeader(ctx, "")
	if err != nil {
		return err
	}
	return c.Exec(ctx, l.Name, "postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
}

// Exec runs sql on database db of one member.
func (c *Cluster) Exec(ctx context.Context, member, db, sql string) error {
	url, err := c.MemberURL(member, db)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("patroni: connect to %s: %w", member, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("patroni: %s on %s: %w", sql, member, err)
	}
	return nil
}
