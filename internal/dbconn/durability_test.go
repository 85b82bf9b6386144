package dbconn_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/pgcluster"
)

func gaugeValue(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == dbconn.UnsafeGauge {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s gauge registered", dbconn.UnsafeGauge)
	return 0
}

// A database with fsync off is refused unless UNSAFE_NON_DURABLE_DB is set; with
// it, it is served, the log says so at ERROR and the gauge shows 1.
func TestRequireDurableRefusesFsyncOff(t *testing.T) {
	p, db := sharedPair(t) // a throwaway pair: fsync off
	pool := open(t, p.URL(db))
	ctx := context.Background()

	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	err := dbconn.RequireDurable(ctx, pool, "paydb", false, logger, prometheus.NewRegistry())
	if !errors.Is(err, dbconn.ErrNonDurable) || !strings.Contains(err.Error(), "UNSAFE_NON_DURABLE_DB") || !strings.Contains(err.Error(), "paydb") {
		t.Fatalf("fsync off without the setting: %v; want ErrNonDurable naming paydb and UNSAFE_NON_DURABLE_DB", err)
	}

	reg := prometheus.NewRegistry()
	if err := dbconn.RequireDurable(ctx, pool, "paydb", true, logger, reg); err != nil {
		t.Fatalf("fsync off with the setting: %v", err)
	}
	if v := gaugeValue(t, reg); v != 1 {
		t.Errorf("%s = %v with the setting, want 1", dbconn.UnsafeGauge, v)
	}
	line := logs.String()
	if !strings.Contains(line, `"level":"ERROR"`) || !strings.Contains(line, `"event":"unsafe_non_durable_db"`) || !strings.Contains(line, `"fsync":"off"`) {
		t.Errorf("start-up log with the setting: %s", line)
	}
}

// A durable database is served either way; without the setting nothing is
// logged and the gauge is 0 from start-up.
func TestRequireDurableServesFsyncOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true, MaxConnections: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	pool := open(t, c.URL("postgres"))
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	reg := prometheus.NewRegistry()
	if err := dbconn.RequireDurable(ctx, pool, "lockdb", false, logger, reg); err != nil {
		t.Fatalf("fsync on: %v", err)
	}
	if v := gaugeValue(t, reg); v != 0 {
		t.Errorf("%s = %v without the setting, want 0", dbconn.UnsafeGauge, v)
	}
	if logs.Len() != 0 {
		t.Errorf("logged without the setting: %s", logs.String())
	}
}
