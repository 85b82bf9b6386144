// Command lock-server grants leases with fencing tokens over lockdb
// (docs/contracts/lock-service.md).
//
//	lock-server [serve]   serve the API (default)
//	lock-server migrate   apply lockdb's migrations and exit
//	lock-server keygen --out DIR   make a key pair for signing grants
//
// Every setting is an environment variable and an equal flag; --help lists them.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/internal/lockserver"
	"lock.dev/internal/serve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	os.Exit(serve.ExitCode(err, os.Stderr))
}

func run(ctx context.Context) error {
	cmd, cfg, err := lockserver.ParseConfig(os.Args[1:], os.Getenv)
	if err != nil {
		return err
	}
	if cmd == lockserver.CmdMigrate {
		return lockserver.Migrate(ctx, cfg)
	}
	if cmd == lockserver.CmdKeygen {
		return lockserver.Keygen(os.Args[2:], os.Stdout)
	}
	return lockserver.Run(ctx, cfg)
}
