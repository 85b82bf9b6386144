package railstub

import "github.com/prometheus/client_golang/prometheus"

// Values of rail_stub_calls_total{result}: each recorded call counts once. A
// dropped call is an accepted payment whose reply was withheld; it counts as
// dropped, not accepted, so accepted + dropped is the money that moved.
const (
	metricAccepted = "accepted"
	metricDeclined = "declined"
	metricDropped  = "dropped"
)

// Values of rail_stub_statement_files_total{result}.
const (
	metricWritten = "written"
	metricFailed  = "failed"
)

type metrics struct {
	calls          *prometheus.CounterVec
	statementFiles *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rail_stub_calls_total",
			Help: "Payments the rail-stub recorded, by what chaos made of them (accepted and answered, declined, accepted and dropped).",
		}, []string{"result"}),
	}
	m.statementFiles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rail_stub_statement_files_total",
		Help: "camt.053 statement files (RAIL_STUB_STATEMENT_DIR): written, or failed (their calls go into the next file).",
	}, []string{"result"})
	reg.MustRegister(m.calls, m.statementFiles)
	// Zero-initialise the closed sets (docs/contracts/observability.md).
	for _, r := range []string{metricAccepted, metricDeclined, metricDropped} {
		m.calls.WithLabelValues(r)
	}
	for _, r := range []string{metricWritten, metricFailed} {
		m.statementFiles.WithLabelValues(r)
	}
	return m
}

func (m *metrics) observe(d decision) {
	switch {
	case d.declined:
		m.calls.WithLabelValues(metricDeclined).Inc()
	case d.dropped:
		m.calls.WithLabelValues(metricDropped).Inc()
	default:
		m.calls.WithLabelValues(metricAccepted).Inc()
	}
}
