package payment

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockapi"
)

// metrics are payment-resource's series (docs/contracts/observability.md),
// registered in the service's own registry and zero-initialised for every label
// value of their closed sets.
type metrics struct {
	fencedOut   *prometheus.CounterVec // lock_fenced_out_total{resource}
	transitions *prometheus.CounterVec // payout_transition_total{to}
	settles     *prometheus.CounterVec // payout_settle_total{outcome}
	// booksCheck is payment_books_check_enabled: 1 when posts and settles are
	// checked against the audit trail and the statement copy, 0 when
	// PAYMENT_BOOKS_CHECK is false (docs/contracts/books.md).
	booksCheck prometheus.Gauge
}

// transitionLabels is the closed set of payout_transition_total's "to".
var transitionLabels = []string{"claimed", "paid", "declined", "ambiguous", "not_presented"}

// settleLabels is the closed set of payout_settle_total's "outcome".
var settleLabels = []string{"paid", "declined", "not_presented"}

func newMetrics(reg prometheus.Registerer, booksCheck bool) (*metrics, error) {
	m := &metrics{
		fencedOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lock_fenced_out_total",
			Help: "Calls refused because the presented fencing token was not the one the resource accepts.",
		}, []string{"resource"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payout_transition_total",
			Help: "Payout state changes, by the state entered.",
		}, []string{"to"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payout_settle_total",
			Help: "AMBIGUOUS payouts settled from the rail's statement, by outcome (identical repeats not counted).",
		}, []string{"outcome"}),
		booksCheck: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payment_books_check_enabled",
			Help: "1 when posts and settles must agree with the audit trail and the statement copy (PAYMENT_BOOKS_CHECK); 0 when they are not checked.",
		}),
	}
	for _, c := range []prometheus.Collector{m.fencedOut, m.transitions, m.settles, m.booksCheck} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	if booksCheck {
		m.booksCheck.Set(1)
	}
	m.fencedOut.WithLabelValues("payout")
	for _, to := range transitionLabels {
		m.transitions.WithLabelValues(to)
	}
	for _, o := range settleLabels {
		m.settles.WithLabelValues(o)
	}
	return m, nil
}

func (m *metrics) fenced() { m.fencedOut.WithLabelValues("payout").Inc() }

// transitioned counts entering status, one of CLAIMED, PAID, DECLINED, AMBIGUOUS,
// NOT_PRESENTED.
func (m *metrics) transitioned(status string) {
	switch status {
	case lockapi.StatusClaimed, lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusAmbiguous, lockapi.StatusNotPresented:
		m.transitions.WithLabelValues(strings.ToLower(status)).Inc()
	}
}

// settled counts a settle that moved a payout to status: a transition, and a settle.
func (m *metrics) settled(status string) {
	m.transitioned(status)
	m.settles.WithLabelValues(strings.ToLower(status)).Inc()
}
