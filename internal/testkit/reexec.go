package testkit

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"testing"
)

// RunMainIfChild makes the test binary the program itself when the
// environment variable env is set: it runs main with name as argument zero and
// the arguments after "--" (see MainCommand), and reports true — TestMain then
// returns without running the tests. Call it first in TestMain.
func RunMainIfChild(env, name string, main func()) bool {
	if os.Getenv(env) == "" {
		return false
	}
	args := []string{name}
	for i, a := range os.Args {
		if a == "--" {
			args = append(args, os.Args[i+1:]...)
			break
		}
	}
	os.Args = args
	main()
	return true
}

// MainCommand is the test binary run as the program (see RunMainIfChild):
// main with args, this process's environment plus env set to 1 and extra.
func MainCommand(env string, extra []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(append(os.Environ(), env+"=1"), extra...)
	return cmd
}

// ExitCode is the exit status err (from exec.Cmd's Run or Wait) reports: 0 for
// nil, -1 for an error that is not an exit.
func ExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// InChild says whether this process is a child that RerunInChild started with
// childEnv.
func InChild(childEnv string) bool { return os.Getenv(childEnv) != "" }

// RerunInChild runs t's test (a top-level test) alone in a child process of
// the test binary, with this process's environment plus childEnv set to 1 and
// extra; there InChild(childEnv) is true. It fails t, with the child's output,
// when the child fails. For what a process reads once from its environment.
func RerunInChild(t testing.TB, childEnv string, extra ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), extra...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// ProxyEnv is the environment that sends a process's HTTP and HTTPS requests
// through the proxy at proxyURL, with no exceptions.
func ProxyEnv(proxyURL string) []string {
	return []string{"HTTP_PROXY=" + proxyURL, "HTTPS_PROXY=" + proxyURL,
		"http_proxy=" + proxyURL, "https_proxy=" + proxyURL, "NO_PROXY=", "no_proxy="}
}

// StartMain starts the test binary as the program (as MainCommand) and returns
// it with the lines of its standard output; the channel is closed when the
// program closes its standard output. The program is killed when t ends if it
// still runs.
func StartMain(t testing.TB, env string, extra []string, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := MainCommand(env, extra, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// RunMain runs the program (as MainCommand) to its end and returns what it
// wrote to its standard output and error and its exit status (as ExitCode).
func RunMain(env string, extra []string, args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	cmd := MainCommand(env, extra, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	code = ExitCode(cmd.Run())
	return out.String(), errOut.String(), code
}
