package executor

import "github.com/prometheus/client_golang/prometheus"

// Results of executor_payout_total (docs/contracts/observability.md): a closed set.
const (
	resultPaid        = "paid"
	resultDeclined    = "declined"
	resultAmbiguous   = "ambiguous"
	resultFenced      = "fenced"
	resultDuplicate   = "duplicate"
	resultUnavailable = "unavailable"
	resultSkipped     = "skipped"
	// resultUnbooked: rail-proxy's books refused the payout's own fields
	// (NOT_IN_BOOKS, a mismatch other than not_claimed, token or owner); the
	// payout stays CLAIMED for a person (docs/contracts/books.md).
	resultUnbooked = "unbooked"
	// resultMismatch: a first or recorded attempt's account, amount, currency or
	// beneficiary is not the payout's; its outcome is not adopted and the payout
	// stays CLAIMED for a person (docs/contracts/books.md).
	resultMismatch = "mismatch"
)

var results = []string{resultPaid, resultDeclined, resultAmbiguous, resultFenced, resultDuplicate, resultUnavailable,
	resultSkipped, resultUnbooked, resultMismatch}

type metrics struct {
	payouts *prometheus.CounterVec
	pauses  prometheus.Counter
	// resent is a project addition (docs/contracts/observability.md).
	resent prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		payouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "executor_payout_total",
			Help: "Payout cycles by how they ended: paid, declined, ambiguous, fenced, duplicate, unavailable, skipped, unbooked, mismatch.",
		}, []string{"result"}),
		pauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "executor_pause_total",
			Help: "Pauses between claim and submit (the stale-writer maker; demonstrations only).",
		}),
		resent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "executor_submission_resent_total",
			Help: "Submissions sent a second time, same token, on a fresh connection after a reused connection to rail-proxy failed before any answer.",
		}),
	}
	for _, c := range []prometheus.Collector{m.payouts, m.pauses, m.resent} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Zero-initialise every label value (docs/contracts/observability.md).
	for _, r := range results {
		m.payouts.WithLabelValues(r)
	}
	return m, nil
}

func (m *metrics) count(result string) { m.payouts.WithLabelValues(result).Inc() }
