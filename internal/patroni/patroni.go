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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	if c.cred, err = runAs(); err != nil {
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

func (c *Cluster) writeConfig(n *node) error {
	socket := filepath.Join(c.dir, "s"+strings.TrimPrefix(n.name, "pg"))
	if err := os.Mkdir(socket, 0o700); err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	if err := c.own(socket, 0o700); err != nil {
		return err
	}
	secs := func(d time.Duration) int { return max(1, int(d.Round(time.Second)/time.Second)) }
	sync := "true"
	if c.opts.Async {
		sync = "false"
	}
	// docs/operations/high-availability.md's Patroni settings, on loopback. The
	// pitfalls this configuration avoids: initdb's own pg_hba lines come first, so auth-host must not be trust;
	// each member has its own pgpass and socket directory; mode "off" is a
	// string (the YAML boolean is rejected by --validate-config); etcd 3.4 serves
	// the v3 API only (etcd3); a standby retries a missing slot after
	// wal_retrieve_retry_interval, which strict mode waits for.
	yml := fmt.Sprintf(`scope: %[1]s
namespace: /service/
name: %[2]s

restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d

etcd3:
  hosts: 127.0.0.1:%[4]d

bootstrap:
  dcs:
    ttl: %[5]d
    loop_wait: %[6]d
    retry_timeout: %[7]d
    maximum_lag_on_failover: %[18]d
    synchronous_mode: %[8]s
    synchronous_mode_strict: %[8]s
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_connections: 150
        shared_buffers: 32MB
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 128MB
        wal_log_hints: "on"
        wal_retrieve_retry_interval: 1s
        synchronous_commit: "on"
  initdb:
  - encoding: UTF8
  - locale: C.UTF-8
  - data-checksums
  - auth-host: scram-sha-256
  - auth-local: trust
  pg_hba:
  - local all all trust
  - host replication replicator 127.0.0.1/32 scram-sha-256
  - host all all 127.0.0.1/32 scram-sha-256

postgresql:
  listen: 127.0.0.1:%[9]d
  connect_address: 127.0.0.1:%[9]d
  data_dir: %[10]s
  bin_dir: %[11]s
  pgpass: %[12]s
  authentication:
    replication:
      username: replicator
      password: %[13]s
    superuser:
      username: %[14]s
      password: %[15]s
    rewind:
      username: rewind_user
      password: %[16]s
  parameters:
    unix_socket_directories: %[17]s

tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false

watchdog:
  mode: "off"
`, c.scope(), n.name, n.restPort, c.etcdClient, secs(c.opts.TTL), secs(c.opts.LoopWait), secs(c.opts.RetryTimeout), sync,
		n.pgPort, n.data, c.bin, filepath.Join(c.dir, n.name+".pgpass"), replPass, superuser, superPass, rewindPass, socket, c.maxLag())
	if err := os.WriteFile(n.config, []byte(yml), 0o600); err != nil {
		return fmt.Errorf("patroni: write %s: %w", n.config, err)
	}
	return c.own(n.config, 0o600)
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

// Members asks the members' REST APIs for the cluster (GET /cluster), the first
// that answers.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var lastErr error
	for _, n := range c.nodes {
		ms, err := c.members(ctx, n)
		if err == nil {
			return ms, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("patroni: no member answered /cluster: %w", lastErr)
}

func (c *Cluster) members(ctx context.Context, n *node) ([]Member, error) {
	var body struct {
		Members []struct {
			Name  string          `json:"name"`
			Role  string          `json:"role"`
			State string          `json:"state"`
			Host  string          `json:"host"`
			Port  int             `json:"port"`
			Lag   json.RawMessage `json:"lag"`
		} `json:"members"`
	}
	if err := c.rest(ctx, n, http.MethodGet, "/cluster", nil, &body); err != nil {
		return nil, err
	}
	out := make([]Member, 0, len(body.Members))
	for _, m := range body.Members {
		lag := int64(-1)
		if v, err := strconv.ParseInt(string(m.Lag), 10, 64); err == nil {
			lag = v
		} else if m.Role == "leader" {
			lag = 0
		}
		out = append(out, Member{Name: m.Name, Role: m.Role, State: m.State, Host: m.Host, Port: m.Port, Lag: lag})
	}
	return out, nil
}

// rest calls a member's REST API, bounded by restTimeout.
func (c *Cluster) rest(ctx context.Context, n *node, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("patroni: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://127.0.0.1:%d%s", n.restPort, path), body)
	if err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("patroni: %s %s on %s: %w", method, path, n.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("patroni: %s %s on %s: %w", method, path, n.name, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("patroni: %s %s on %s: %s: %s", method, path, n.name, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("patroni: %s %s on %s: %w", method, path, n.name, err)
		}
	}
	return nil
}

func byRole(ms []Member, role string) (Member, bool) {
	for _, m := range ms {
		if m.Role == role {
			return m, true
		}
	}
	return Member{}, false
}

// Leader is the member Patroni reports as leader now.
func (c *Cluster) Leader(ctx context.Context) (Member, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return Member{}, err
	}
	if m, ok := byRole(ms, "leader"); ok {
		return m, nil
	}
	return Member{}, fmt.Errorf("patroni: no leader among %v", ms)
}

// SyncStandby is the member Patroni reports as synchronous standby now.
func (c *Cluster) SyncStandby(ctx context.Context) (Member, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return Member{}, err
	}
	if m, ok := byRole(ms, "sync_standby"); ok {
		return m, nil
	}
	return Member{}, fmt.Errorf("patroni: no synchronous standby among %v", ms)
}

// WaitLeader waits until a member other than not ("" for any) leads and
// commits a write (on a synchronous cluster: acknowledged by its standby).
func (c *Cluster) WaitLeader(ctx context.Context, not string) (Member, error) {
	var (
		last    Member
		lastErr error
	)
	err := poll(ctx, 200*time.Millisecond, func(ctx context.Context) bool {
		l, err := c.Leader(ctx)
		if err != nil {
			lastErr = err
			return false
		}
		if l.Name == not {
			lastErr = fmt.Errorf("%s still leads", not)
			return false
		}
		if err := c.writeProbe(ctx, l.Name); err != nil {
			lastErr = err
			return false
		}
		last = l
		return true
	})
	if err != nil {
		return Member{}, fmt.Errorf("patroni: no leader other than %q accepting writes: %w (last: %v)", not, err, lastErr)
	}
	return last, nil
}

// writeProbe commits a transaction with a transaction id on member, bounded:
// its commit waits for a synchronous standby. A cancelled wait is a failure
// (the context's error), never a success.
func (c *Cluster) writeProbe(ctx context.Context, member string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url, err := c.MemberURL(member, "postgres")
	if err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	// A commit whose wait for the standby was cancelled answers success with a
	// WARNING: that is no acknowledged write.
	var warned atomic.Bool
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Severity == "WARNING" {
			warned.Store(true)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		return err
	}
	if inRecovery {
		return fmt.Errorf("%s is in recovery", member)
	}
	// A transaction that writes WAL before its commit record: only such a commit
	// waits for the synchronous standby (an xid alone, txid_current(), commits
	// without waiting), so its success proves a standby acknowledged it.
	if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, 'lock.dev/patroni', 'write probe')"); err != nil {
		return err
	}
	if warned.Load() {
		return errors.New("commit not acknowledged")
	}
	return nil
}

// WaitHealthy waits until every member runs, one leads and commits a write,
// and (on a synchronous cluster) one is its synchronous standby, and every
// other member streams from the leader.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var lastErr error
	err := poll(ctx, 250*time.Millisecond, func(ctx context.Context) bool {
		lastErr = c.healthy(ctx)
		return lastErr == nil
	})
	if err != nil {
		return fmt.Errorf("patroni: cluster not healthy: %w (last: %v)", err, lastErr)
	}
	return nil
}

func (c *Cluster) healthy(ctx context.Context) error {
	ms, err := c.Members(ctx)
	if err != nil {
		return err
	}
	if len(ms) != len(c.nodes) {
		return fmt.Errorf("%d of %d members: %v", len(ms), len(c.nodes), ms)
	}
	for _, m := range ms {
		if m.State != "running" && m.State != "streaming" {
			return fmt.Errorf("member %s is %s", m.Name, m.State)
		}
	}
	l, ok := byRole(ms, "leader")
	if !ok {
		return fmt.Errorf("no leader: %v", ms)
	}
	if _, ok := byRole(ms, "sync_standby"); !ok && !c.opts.Async {
		return fmt.Errorf("no synchronous standby: %v", ms)
	}
	if err := c.writeProbe(ctx, l.Name); err != nil {
		return err
	}
	url, err := c.MemberURL(l.Name, "postgres")
	if err != nil {
		return err
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var streaming int
	if err := conn.QueryRow(qctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&streaming); err != nil {
		return err
	}
	if streaming != len(c.nodes)-1 {
		return fmt.Errorf("%d of %d standbys stream from %s", streaming, len(c.nodes)-1, l.Name)
	}
	return nil
}

// Switchover hands the leadership to candidate (on a synchronous cluster the
// synchronous standby) with `patronictl switchover --force`, and returns when
// candidate leads and commits a write. patronictl exits 0 even when it refused,
// so its output is read too.
func (c *Cluster) Switchover(ctx context.Context, candidate string) error {
	l, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	if _, err := c.node(candidate); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, c.ctl, "-c", c.nodes[0].config, "switchover", "--force",
		"--leader", l.Name, "--candidate", candidate)
	cmd.Env = c.env()
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("patroni: patronictl switchover: %w: %s", err, bytes.TrimSpace(out))
	}
	if bytes.Contains(out, []byte("failed")) || !bytes.Contains(out, []byte("witched over")) {
		return fmt.Errorf("patroni: patronictl switchover did not switch over: %s", bytes.TrimSpace(out))
	}
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	m, err := c.WaitLeader(wctx, l.Name)
	if err != nil {
		return err
	}
	if m.Name != candidate {
		return fmt.Errorf("patroni: switchover to %s made %s the leader", candidate, m.Name)
	}
	return nil
}

// HoldReplication stops the leader's WAL senders (SIGSTOP): no standby
// receives WAL until release is called (or the leader dies). On a synchronous
// cluster every commit now waits for its standby — a commit in flight, neither
// acknowledged nor refused, which a failover must not lose; on an asynchronous
// one commits go on and exist on the leader alone. Stopping the senders (not a
// receiver) keeps the WAL at the leader's door: a stopped receiver would still
// find what its kernel had buffered once continued.
func (c *Cluster) HoldReplication(ctx context.Context) (leader Member, release func(), err error) {
	l, err := c.Leader(ctx)
	if err != nil {
		return Member{}, nil, err
	}
	pids, err := c.queryInts(ctx, l.Name, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		return Member{}, nil, err
	}
	if len(pids) == 0 {
		return Member{}, nil, fmt.Errorf("patroni: %s has no WAL sender", l.Name)
	}
	var stopped []int
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			for _, p := range stopped {
				_ = syscall.Kill(p, syscall.SIGCONT)
			}
			return Member{}, nil, fmt.Errorf("patroni: stop WAL sender %d: %w", pid, err)
		}
		stopped = append(stopped, pid)
	}
	var once sync.Once
	return l, func() {
		once.Do(func() {
			// Senders that died with their leader are gone, and their pids may
			// name other processes since: only this cluster's are continued.
			for _, p := range stopped {
				if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); err == nil && bytes.Contains(b, []byte(c.scope())) {
					_ = syscall.Kill(p, syscall.SIGCONT)
				}
			}
		})
	}, nil
}

// WaitCommitWaiting waits until at least one commit on member waits for a
// synchronous standby (wait_event SyncRep).
func (c *Cluster) WaitCommitWaiting(ctx context.Context, member string) error {
	var lastErr error
	err := poll(ctx, 10*time.Millisecond, func(ctx context.Context) bool {
		n, err := c.queryInts(ctx, member, `SELECT count(*)::int FROM pg_stat_activity WHERE wait_event = 'SyncRep'`)
		lastErr = err
		return err == nil && len(n) == 1 && n[0] > 0
	})
	if err != nil {
		return fmt.Errorf("patroni: no commit on %s waits for a standby: %w (last error: %v)", member, err, lastErr)
	}
	return nil
}

// queryInts runs a query returning one int column on member's postgres
// database, bounded.
func (c *Cluster) queryInts(ctx context.Context, member, sql string) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url, err := c.MemberURL(member, "postgres")
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("patroni: connect to %s: %w", member, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("patroni: %s on %s: %w", sql, member, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("patroni: %s on %s: %w", sql, member, err)
	}
	return out, nil
}

// StartMember starts member's Patroni (which starts its PostgreSQL, cloning or
// rewinding it as needed). It does not wait for the member to run.
func (c *Cluster) StartMember(ctx context.Context, name string) error {
	n, err := c.node(name)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.patroni != nil && !n.patroni.exited() {
		return fmt.Errorf("patroni: %s is running", name)
	}
	// A killed member may have left its postmaster; a start would then find the
	// data directory in use.
	if pm := postmasterPID(n.data); pm > 0 && alive(pm) {
		return fmt.Errorf("patroni: %s's postmaster %d still runs", name, pm)
	}
	p, err := c.launch(n.name, c.patroni, n.config)
	if err != nil {
		return err
	}
	n.patroni = p
	return nil
}

// Kill ends member's Patroni and every process of its PostgreSQL with
// SIGKILL, the way a machine that loses power ends them, and waits until they
// are gone. Its leader key, if it led, stays in etcd until the TTL expires.
func (c *Cluster) Kill(ctx context.Context, name string) error {
	n, err := c.node(name)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var pids []int
	if n.patroni != nil && !n.patroni.exited() {
		pid := n.patroni.cmd.Process.Pid
		// Patroni and what it ran in its process group (pg_ctl, pg_basebackup…):
		// stop them first, so nothing forks or restarts between list and kill.
		_ = syscall.Kill(-pid, syscall.SIGSTOP)
		pids = append(pids, groupMembers(pid)...)
	}
	// The postmaster runs in a session of its own (Patroni calls setsid), and
	// each of its children in its own too: they are found through the data
	// directory's postmaster.pid and /proc.
	if pm := postmasterPID(n.data); pm > 0 && alive(pm) {
		_ = syscall.Kill(pm, syscall.SIGSTOP)
		pids = append(pids, pm)
		pids = append(pids, descendants(pm)...)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if n.patroni != nil {
		select {
		case <-n.patroni.done:
		case <-ctx.Done():
			return fmt.Errorf("patroni: kill %s: %w", name, ctx.Err())
		}
	}
	return poll(ctx, 20*time.Millisecond, func(context.Context) bool {
		for _, pid := range pids {
			if alive(pid) {
				return false
			}
		}
		return true
	})
}

// StopMember stops member's Patroni gracefully (SIGTERM): it stops its
// PostgreSQL and, if it led, releases the leader key at once.
func (c *Cluster) StopMember(ctx context.Context, name string) error {
	n, err := c.node(name)
	if err != nil {
		return err
	}
	n.mu.Lock()
	p := n.patroni
	n.mu.Unlock()
	if p == nil || p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-ctx.Done():
		return fmt.Errorf("patroni: stop %s: %w", name, ctx.Err())
	}
	return poll(ctx, 50*time.Millisecond, func(context.Context) bool {
		pm := postmasterPID(n.data)
		return pm <= 0 || !alive(pm)
	})
}

// StartEtcd starts etcd (again, on the same data directory) and waits until it
// answers /health.
func (c *Cluster) StartEtcd(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.etcd != nil && !c.etcd.exited() {
		return errors.New("patroni: etcd is running")
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPeer)
	p, err := c.launch("etcd", c.etcdBin, "--name", "e0", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "e0="+peer, "--initial-cluster-state", "new", "--initial-cluster-token", c.scope())
	if err != nil {
		return err
	}
	c.etcd = p
	err = poll(ctx, 100*time.Millisecond, func(ctx context.Context) bool {
		if p.exited() {
			return true // reported below
		}
		rctx, cancel := context.WithTimeout(ctx, restTimeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, client+"/health", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode == http.StatusOK && bytes.Contains(b, []byte(`"true"`))
	})
	if err != nil {
		return fmt.Errorf("patroni: etcd not healthy: %w", err)
	}
	if p.exited() {
		return fmt.Errorf("patroni: etcd exited: %v", p.err)
	}
	return nil
}

// StopEtcd stops etcd (SIGTERM) and waits for it.
func (c *Cluster) StopEtcd(ctx context.Context) error {
	c.mu.Lock()
	p := c.etcd
	c.mu.Unlock()
	if p == nil || p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("patroni: stop etcd: %w", ctx.Err())
	}
}

// Stop stops every member gracefully (killing what does not stop in time),
// then etcd, and removes the directory.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopPatience)
		defer cancel()
		var wg sync.WaitGroup
		for _, n := range c.nodes {
			wg.Go(func() {
				if err := c.StopMember(ctx, n.name); err != nil {
					kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer kcancel()
					_ = c.Kill(kctx, n.name)
				}
				// A postmaster left by a killed Patroni is ended too.
				kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer kcancel()
				_ = c.Kill(kctx, n.name)
			})
		}
		wg.Wait()
		c.mu.Lock()
		p := c.etcd
		c.mu.Unlock()
		if p != nil && !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}
		if c.dir != "" {
			_ = os.RemoveAll(c.dir)
		}
	})
	return nil
}

// WriteLogs copies etcd's and every member's log to w.
func (c *Cluster) WriteLogs(w io.Writer) error {
	names := append([]string{"etcd"}, c.Names()...)
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(c.dir, name+".log"))
		if err != nil {
			continue
		}
		if _, err := fmt.Fprintf(w, "==== %s\n%s\n", name, b); err != nil {
			return fmt.Errorf("patroni: write logs: %w", err)
		}
	}
	return nil
}

// launch starts a long-running process as the cluster's user, in a process
// group of its own, its output appended to NAME.log, from a goroutine locked
// to its OS thread: the parent-death signal (which Linux ties to the creating
// thread) then fires only when this process dies, and a killed test binary
// takes etcd and Patroni with it (Patroni stops its PostgreSQL on SIGTERM).
func (c *Cluster) launch(name, exe string, args ...string) (*proc, error) {
	logPath := filepath.Join(c.dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	started := make(chan error, 1)
	p := &proc{done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		defer logf.Close()
		cmd := exec.Command(exe, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
		cmd.Dir = c.dir
		cmd.Env = c.env()
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("patroni: start %s: %w", name, err)
			return
		}
		p.cmd = cmd
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// env is the environment of the processes started: this one's without
// libpq's variables (a PGHOST would steer Patroni's own connections), with
// HOME in the cluster's directory.
func (c *Cluster) env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "PATRONI") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "HOME="+c.dir)
}

// own hands path to the user the servers run as (when we are root).
func (c *Cluster) own(path string, mode os.FileMode) error {
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("patroni: chmod %s: %w", path, err)
	}
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("patroni: chown %s: %w", path, err)
	}
	return nil
}

// runAs picks the unprivileged user to run as when we are root: postgres when
// it exists, else nobody.
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
	return nil, errors.New("patroni: running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")
}

// freePorts picks n distinct free loopback ports, holding each until all are
// picked.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("patroni: free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// poll calls check every interval until it returns true or ctx ends.
func poll(ctx context.Context, interval time.Duration, check func(context.Context) bool) error {
	for {
		if check(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// postmasterPID reads the postmaster's pid from the data directory (0: none).
// A killed postmaster leaves the file behind and its pid may since name another
// process: the pid counts only while its command line names this directory.
func postmasterPID(data string) int {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(data)) {
		return 0
	}
	return pid
}

// alive says whether pid runs (a zombie does not).
func alive(pid int) bool {
	st, ok := stat(pid)
	return ok && st.state != "Z" && st.state != "X"
}

type procStat struct {
	state      string
	ppid, pgid int
}

func stat(pid int) (procStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid pgrp …: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgid, _ := strconv.Atoi(f[2])
	return procStat{state: f[0], ppid: ppid, pgid: pgid}, true
}

func allPIDs() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// groupMembers lists the processes of process group pgid.
func groupMembers(pgid int) []int {
	var out []int
	for _, pid := range allPIDs() {
		if st, ok := stat(pid); ok && st.pgid == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// descendants lists pid's children, their children, and so on.
func descendants(pid int) []int {
	parent := map[int]int{}
	for _, p := range allPIDs() {
		if st, ok := stat(p); ok {
			parent[p] = st.ppid
		}
	}
	var out []int
	frontier := []int{pid}
	for len(frontier) > 0 {
		var next []int
		for p, pp := range parent {
			for _, f := range frontier {
				if pp == f {
					next = append(next, p)
				}
			}
		}
		out = append(out, next...)
		frontier = next
	}
	return out
}
