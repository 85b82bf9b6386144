package reconcile

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// The exception kinds (docs/contracts/reconciliation.md), as recorded; metric
// labels are lower case.
const (
	KindPresentedTwice        = "PRESENTED_TWICE"
	KindAmountMismatch        = "AMOUNT_MISMATCH"
	KindUnknownReference      = "UNKNOWN_REFERENCE"
	KindLineContradictsPayout = "LINE_CONTRADICTS_PAYOUT"
	KindPaidWithoutLine       = "PAID_WITHOUT_LINE"
	// KindUnstorableLine: a statement line whose text paydb cannot store and
	// show as it is; not copied (docs/contracts/reconciliation.md).
	KindUnstorableLine = "UNSTORABLE_LINE"
	// KindBeneficiaryMismatch: a line whose account, amount and currency are its
	// payout's and whose beneficiary is not (docs/contracts/reconciliation.md).
	KindBeneficiaryMismatch = "BENEFICIARY_MISMATCH"
	// KindAttemptMismatch: a CLAIMED payout whose own holder presented it with
	// fields the books refused (docs/contracts/reconciliation.md).
	KindAttemptMismatch = "ATTEMPT_MISMATCH"
	// KindStatementFileChanged: a statement file whose name was imported came
	// back with other bytes; nothing of it is imported
	// (docs/contracts/reconciliation.md).
	KindStatementFileChanged = "STATEMENT_FILE_CHANGED"
)

// Kinds lists the exception kinds in the contract's order.
var Kinds = []string{KindPresentedTwice, KindAmountMismatch, KindUnknownReference, KindLineContradictsPayout, KindPaidWithoutLine,
	KindUnstorableLine, KindBeneficiaryMismatch, KindAttemptMismatch, KindStatementFileChanged}

// Values of reconciler_settled_total{to}.
var settledLabels = []string{"paid", "declined", "not_presented"}

// Values of reconciler_pass_total{result}: a pass that ran to its end, one that
// failed part-way (the next pass takes up where it left off), and one skipped
// because another reconciler held the pass lock.
const (
	passCompleted = "completed"
	passFailed    = "failed"
	passSkipped   = "skipped"
)

var passResults = []string{passCompleted, passFailed, passSkipped}

// metrics are the reconciler's series (docs/contracts/reconciliation.md), in its own registry,
// every counter zero-initialised over its closed set (docs/contracts/observability.md).
type metrics struct {
	linesImported prometheus.Counter
	settled       *prometheus.CounterVec
	exceptions    *prometheus.CounterVec
	statementSeq  prometheus.Gauge
	ambiguous     prometheus.Gauge
	overdue       prometheus.Gauge
	passSeconds   prometheus.Histogram
	passes        *prometheus.CounterVec
	// statementFiles counts the statement files a pass looked at in dir mode.
	statementFiles *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		linesImported: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reconciler_lines_imported_total",
			Help: "Statement lines copied into paydb (each line once).",
		}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reconciler_settled_total",
			Help: "AMBIGUOUS payouts settled from the statement, by the status they were settled to.",
		}, []string{"to"}),
		exceptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reconciler_exception_total",
			Help: "Disagreements between the statement and the books recorded (each once), by kind.",
		}, []string{"kind"}),
		statementSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "reconciler_statement_seq",
			Help: "The last statement seq imported.",
		}),
		ambiguous: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "reconciler_ambiguous_payouts",
			Help: "AMBIGUOUS payouts left after the last pass.",
		}),
		overdue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "reconciler_overdue_intents",
			Help: "rail-proxy intents still unresolved 30 s past their interrupt_at at the last pass: no janitor is sweeping paydb.",
		}),
		passSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "reconciler_pass_seconds",
			Help:    "Duration of the passes that held the pass lock, completed or failed.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reconciler_pass_total",
			Help: "Passes, by result: completed, failed, or skipped (another reconciler held the pass lock).",
		}, []string{"result"}),
		statementFiles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reconciler_statement_files_total",
			Help: "Statement files looked at in dir mode, by result: imported; unchanged (a pass found it as imported); changed (a version of an imported name with other bytes, once per version); invalid (skipped; once per version seen).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.linesImported, m.settled, m.exceptions, m.statementSeq, m.ambiguous, m.overdue, m.passSeconds, m.passes, m.statementFiles)
	for _, to := range settledLabels {
		m.settled.WithLabelValues(to)
	}
	for _, k := range Kinds {
		m.exceptions.WithLabelValues(strings.ToLower(k))
	}
	for _, r := range passResults {
		m.passes.WithLabelValues(r)
	}
	for _, r := range fileResults {
		m.statementFiles.WithLabelValues(r)
	}
	return m
}
