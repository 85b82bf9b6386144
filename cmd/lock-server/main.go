// Command lock-server grants leases with fencing tokens over lockdb
// (docs/contracts/lock-service.md).
//
//	lock-server [serve]   serve the API (default)
//	lock-server migrate   apply lockdb's migrations and exit
//	lock-server keygen --out DIR   make a key pair for signing grants
//	lock-server certs --out DIR [--trust-domain lock.dev] [--names a,b,…] [--valid 720h]
//	                               make a throwaway authority and workload certificates
//
// Every setting is an environment variable and an equal flag; --help lists them.
package main

import (
	"context"
	"os"

	"lock.dev/internal/lockserver"
	"lock.dev/internal/service"
)

func main() {
	service.Main(lockserver.ParseConfig, service.Commands[lockserver.Config]{
		lockserver.CmdServe:   lockserver.Run,
		lockserver.CmdMigrate: lockserver.Migrate,
		lockserver.CmdKeygen: func(context.Context, lockserver.Config) error {
			return lockserver.Keygen(os.Args[2:], os.Stdout)
		},
		lockserver.CmdCerts: func(context.Context, lockserver.Config) error {
			return lockserver.Certs(os.Args[2:], os.Stdout)
		},
	})
}
