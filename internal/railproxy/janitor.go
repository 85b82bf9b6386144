package railproxy

import (
	"context"
	"log/slog"
	"time"
)

// janitorBatch bounds one sweep statement; a sweep repeats until a batch comes
// back short.
const janitorBatch = 500

// janitor resolves interrupted intents: rows still unresolved long after any
// rail call of a live proxy could have finished (RAIL_PROXY_INTERRUPTED_AFTER,
// which Validate holds above admission + connect + read + resolution). Such a row
// belongs to a proxy that died between the intent commit and the resolution. The
// rail may have acted on it, so it becomes TIMEOUT — ambiguous, to be reconciled
// from the rail's records — and nothing resubmits it.
type janitor struct {
	store    *Store
	metrics  *metrics
	logger   *slog.Logger
	age      time.Duration
	interval time.Duration
}

// sweep resolves every interrupted intent there is now.
func (j *janitor) sweep(ctx context.Context) error {
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rows, err := j.store.ResolveInterrupted(sctx, j.age, janitorBatch)
		cancel()
		if err != nil {
			return err
		}
		for _, r := range rows {
			j.metrics.submissions.WithLabelValues(metricAmbiguous).Inc()
			j.logger.Error("interrupted intent resolved TIMEOUT: do not resubmit, reconcile from the rail's records",
				"event", "rail_ambiguous", "payoutId", r.PayoutID, "accountId", r.AccountID,
				"presentedToken", r.PresentedToken, "ownerId", r.OwnerID, "submissionId", r.SubmissionID,
				"elapsedMs", r.ResolvedAt.Sub(r.SubmittedAt).Milliseconds(), "cause", CauseInterrupted)
		}
		if len(rows) < janitorBatch {
			return nil
		}
	}
}

// run sweeps every interval until ctx is done.
func (j *janitor) run(ctx context.Context) {
	t := time.NewTicker(j.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := j.sweep(ctx); err != nil && ctx.Err() == nil {
				j.logger.Warn("interrupted-intent sweep failed; will try again", "error", err.Error())
			}
		}
	}
}
