package payment

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockapi"
)

// metrics are payment-resource's C4 series, registered in the service's own
// registry and zero-initialised for every label value of their closed sets.
type metrics struct {
	fencedOut   *prometheus.CounterVec // lock_fenced_out_total{resource}
	transitions *prometheus.CounterVec // payout_transition_total{to}
}

// transitionLabels is the closed set of payout_transition_total's "to".
var transitionLabels = []string{"claimed", "paid", "declined", "ambiguous"}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		fencedOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lock_fenced_out_total",
			Help: "Calls refused because the presented fencing token was not the one the resource accepts.",
		}, []string{"resource"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payout_transition_total",
			Help: "Payout state changes, by the state entered.",
		}, []string{"to"}),
	}
	for _, c := range []prometheus.Collector{m.fencedOut, m.transitions} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	m.fencedOut.WithLabelValues("payout")
	for _, to := range transitionLabels {
		m.transitions.WithLabelValues(to)
	}
	return m, nil
}

func (m *metrics) fenced() { m.fencedOut.WithLabelValues("payout").Inc() }

// transitioned counts entering status, one of CLAIMED, PAID, DECLINED, AMBIGUOUS.
func (m *metrics) transitioned(status string) {
	switch status {
	case lockapi.StatusClaimed, lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusAmbiguous:
		m.transitions.WithLabelValues(strings.ToLower(status)).Inc()
	}
}
