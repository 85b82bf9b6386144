// Command adopt is lock.dev adopted by a team's own code: a worker that takes
// a lease with lockclient and writes to a ledger — the team's own service —
// that fences its writes with lock.dev/fence (the grant verified by the
// middleware) and lock.dev/fence/fencepg (the token compared with the account's
// mark in the transaction that writes). It then shows a stale holder refused:
// worker-a's lease ends, worker-b takes the lock with a newer token and
// writes, and worker-a, still believing itself the holder, writes again — 409.
//
//	adopt -lock-server https://127.0.0.1:8081 -keys jwks.json \
//	      -db postgres://ledger@127.0.0.1/ledger -certs certs/
//
// -certs is a directory as `lock-server certs --names lock-server,executor,ledger`
// writes it: the workers call as executor, the ledger serves as ledger. Without
// it everything is plaintext, which -unsafe-no-auth must say explicitly.
// docs/adopting.md walks through it.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "adopt:", err)
		os.Exit(1)
	}
}

// run is the whole program: settings, the ledger on a port of its own, and the
// two workers' story, told on stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		return err
	}
	ids, err := loadIdentities(cfg)
	if err != nil {
		return err
	}
	ledger, err := startLedger(ctx, cfg, ids)
	if err != nil {
		return err
	}
	defer ledger.close()
	return story(ctx, cfg, ids, ledger.url, stdout)
}
