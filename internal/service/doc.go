// Package service is the skeleton every lock.dev service is built on. A service is
// made of the same parts, and this package holds each of them once:
//
//   - its command line (config.go): a subcommand, then settings read from flags and
//     environment variables, a bad one refused in one line (exit 2);
//   - its JSON logger (log.go), with the service's name on every line;
//   - its database, when it has one (db.go): a pool that follows the primary, a
//     schema no older than the binary, a durable server, the replication
//     preconditions watched, and the migrate command that brings a schema up;
//   - its metrics registry (registry.go), Run's and the deployment checks' alike;
//   - at a fence point, the keys grants are verified with (grants.go);
//   - its run (run.go): start-up in a fixed order, health and metrics endpoints,
//     serving until the context ends, then a drain; and the cmd/ main that picks
//     a subcommand and turns the outcome into an exit status.
//
// What a service does beyond that — its routes, its own settings and checks, a
// reconciler's loop, an executor's workers — stays in the service's package.
// docs/contracts/configuration.md and docs/contracts/observability.md are the
// contracts these parts keep.
package service
