package patroni

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

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
