package railproxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Values of rail_submission_total{outcome} (docs/contracts/observability.md): a closed set. No
// identifier is ever a label value; identifiers go in logs.
const (
	metricAcked       = "acked"
	metricRejected    = "rejected"
	metricAmbiguous   = "ambiguous"
	metricFenced      = "fenced"
	metricDuplicate   = "duplicate"
	metricUnavailable = "unavailable"
	metricUnbooked    = "unbooked" // the books refused it (docs/contracts/books.md)
)

var metricOutcomes = []string{metricAcked, metricRejected, metricAmbiguous, metricFenced, metricDuplicate, metricUnavailable, metricUnbooked}

// metrics are rail-proxy's families (docs/contracts/observability.md), in the
// service's own registry.
type metrics struct {
	submissions       *prometheus.CounterVec
	duplicates        prometheus.Counter
	fencedOut         *prometheus.CounterVec
	submissionSeconds *prometheus.HistogramVec
	callSeconds       prometheus.Histogram
	inflight          prometheus.Gauge
	fencingEnabled    prometheus.Gauge
	booksEnabled      prometheus.Gauge // rail_proxy_books_check_enabled

	// Project additions (docs/contracts/observability.md).
	lateResolutions    prometheus.Counter
	reusedConnFailures prometheus.Counter
	statementReads     *prometheus.CounterVec // rail_statement_read_total{result}, statement.go
	groupSize          prometheus.Histogram   // rail_admission_group_size, group.go
	resolveGroupSize   prometheus.Histogram   // rail_resolution_group_size, group.go
	notDurable         prometheus.Counter     // rail_resolution_not_durable_total, admission.go
	workerPanics       *prometheus.CounterVec // rail_proxy_worker_panic_total{worker}, worker.go
}

func newMetrics(reg prometheus.Registerer, fencing, books bool) *metrics {
	m := &metrics{
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rail_submission_total",
			Help: "Submissions answered, by outcome.",
		}, []string{"outcome"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rail_duplicate_attempted_total",
			Help: "Submissions refused because the payout already has a forwardable attempt.",
		}),
		fencedOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lock_fenced_out_total",
			Help: "Submissions refused because their token was not strictly above the account's mark.",
		}, []string{"resource"}),
		submissionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rail_submission_duration_seconds",
			Help:    "Time from a submission's arrival to its answer, by outcome.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"outcome"}),
		callSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rail_call_duration_seconds",
			Help:    "Duration of the proxy→rail hop alone.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rail_submission_inflight",
			Help: "Submissions being admitted, forwarded or resolved right now.",
		}),
		fencingEnabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rail_proxy_fencing_enabled",
			Help: "1 when tokens not above the mark are refused; 0 when fencing is off (never in production).",
		}),
		booksEnabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rail_proxy_books_check_enabled",
			Help: "1 when a submission is admitted only as the books hold it (docs/contracts/books.md); 0 when RAIL_PROXY_BOOKS_CHECK is off.",
		}),
		lateResolutions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rail_resolution_late_total",
			Help: "Resolving writes paydb did not take at once and that were written later, in the background, before the row's interrupt_at.",
		}),
		reusedConnFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rail_reused_conn_failure_total",
			Help: "Rail calls that failed on a reused connection before any byte of reply (ambiguous; often a connection the rail closed as idle: see RAIL_IDLE_CONN_TIMEOUT).",
		}),
	}
	reg.MustRegister(m.submissions, m.duplicates, m.fencedOut, m.submissionSeconds, m.callSeconds, m.inflight, m.fencingEnabled,
		m.booksEnabled, m.lateResolutions, m.reusedConnFailures)
	m.statementReads = newStatementMetric(reg)
	m.groupSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rail_admission_group_size",
		Help:    "Submissions admitted per admission transaction (RAIL_PROXY_MAX_GROUP bounds it; 1 at low load).",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
	})
	m.resolveGroupSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rail_resolution_group_size",
		Help:    "Resolving writes made per statement (RAIL_PROXY_MAX_GROUP bounds it; 1 at low load).",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
	})
	reg.MustRegister(m.groupSize, m.resolveGroupSize)
	m.notDurable = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rail_resolution_not_durable_total",
		Help: "Resolving writes committed on the primary but not known to be on the synchronous standby (its wait was cancelled, or the COMMIT landed after its deadline and could not be confirmed since).",
	})
	m.workerPanics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rail_proxy_worker_panic_total",
		Help: "Panics recovered in the admission and resolution workers; their members were answered as their facts say.",
	}, []string{"worker"})
	reg.MustRegister(m.notDurable, m.workerPanics)
	for _, w := range workerNames {
		m.workerPanics.WithLabelValues(w)
	}
	// Every series exists from start-up (docs/contracts/observability.md), so rate() over a fresh
	// process is right and alerts see the series before the first event.
	for _, o := range metricOutcomes {
		m.submissions.WithLabelValues(o)
		m.submissionSeconds.WithLabelValues(o)
	}
	m.fencedOut.WithLabelValues("rail")
	if fencing {
		m.fencingEnabled.Set(1)
	}
	if books {
		m.booksEnabled.Set(1)
	}
	return m
}
