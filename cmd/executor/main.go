// Command executor works payouts: it takes account leases from lock-server, claims
// payouts at payment-resource and submits them through rail-proxy (docs/contracts/executor.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/executor"
	"lock.dev/internal/serve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	_, cfg, err := executor.ParseConfig(os.Args[1:], os.Getenv)
	if err == nil {
		// ParseConfig accepts only "run".
		err = executor.Run(ctx, cfg)
	}
	stop()
	os.Exit(serve.ExitCode(err, os.Stderr))
}
