package patroni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

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
