// Command lockdemo runs the whole lock.dev system on one machine under chaos and
// ends in a verdict: with fencing on every invariant holds, with fencing off stale
// holders reach the rail. See docs/lockdemo.md; the work is in internal/demo.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/demo"
	"lock.dev/internal/stack"
	"lock.dev/internal/version"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.String())
		return
	}
	// The rail-proxy lockdemo crashes is this binary started again as a child.
	stack.ChildMain(nil)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := demo.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
