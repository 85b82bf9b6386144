package dbconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// UnsafeSetting is the setting that lets a service serve a database whose fsync
// is off (docs/contracts/configuration.md), named after etcd's --unsafe-no-fsync.
const UnsafeSetting = "UNSAFE_NON_DURABLE_DB"

// UnsafeEvent is the start-up log event (ERROR) of a service running with
// UNSAFE_NON_DURABLE_DB=true, and UnsafeGauge the gauge that shows it: 1 from
// start-up when the setting is true, else 0. Both are project additions beyond
// the tables of docs/contracts/observability.md.
const (
	UnsafeEvent = "unsafe_non_durable_db"
	UnsafeGauge = "db_unsafe_non_durable"
)

// ErrNonDurable says the database has fsync off and UNSAFE_NON_DURABLE_DB is not
// set.
var ErrNonDurable = errors.New("database has fsync off")

// RequireDurable is the start-up check every service with a database runs before it
// serves (UNSAFE_NON_DURABLE_DB, docs/contracts/configuration.md). With fsync off a
// crash of the database's server can forget committed transactions — a forwarded
// intent and the mark with it, a granted token — so such a database is refused (an
// error wrapping ErrNonDurable that names the setting) unless unsafe is true. With
// unsafe true it serves whatever fsync says, logs so at ERROR (event UnsafeEvent,
// with the database's fsync) and shows 1 on the gauge UnsafeGauge, which it
// registers in reg. database names the database in messages ("paydb", "lockdb").
//
// It reads fsync once, from the server a pool connection reaches (the primary):
// a server whose fsync is turned off later, or a standby promoted with fsync off,
// is not seen until the service restarts.
func RequireDurable(ctx context.Context, pool *pgxpool.Pool, database string, unsafe bool, logger *slog.Logger, reg prometheus.Registerer) error {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: UnsafeGauge,
		Help: "1 when this service was started with " + UnsafeSetting + "=true: it would serve a database whose fsync is off (never in production).",
	})
	if err := reg.Register(gauge); err != nil {
		return fmt.Errorf("register %s: %w", UnsafeGauge, err)
	}
	var fsync string
	if err := pool.QueryRow(ctx, "SELECT current_setting('fsync')").Scan(&fsync); err != nil {
		return fmt.Errorf("%s: reading fsync: %w", database, err)
	}
	if unsafe {
		gauge.Set(1)
		logger.Error(UnsafeSetting+" is set: a database whose fsync is off is served, and a crash of its server could forget committed intents, marks and tokens; only for throwaway test and demo databases",
			"event", UnsafeEvent, "database", database, "fsync", fsync)
		return nil
	}
	if fsync != "on" {
		return fmt.Errorf("%w: %s has fsync=%s, so a crash of its server can forget committed transactions; refusing to serve it (set %s=true only for a throwaway test or demo database)",
			ErrNonDurable, database, fsync, UnsafeSetting)
	}
	return nil
}
