// Command rail-stub is the test double of a payment rail (docs/contracts/rail-stub.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/railstub"
	"lock.dev/internal/serve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	_, cfg, err := railstub.ParseConfig(os.Args[1:], os.Getenv)
	if err == nil {
		err = railstub.Run(ctx, cfg)
	}
	stop()
	os.Exit(serve.ExitCode(err, os.Stderr))
}
