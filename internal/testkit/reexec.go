package testkit

import (
	"errors"
	"os"
	"os/exec"
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
