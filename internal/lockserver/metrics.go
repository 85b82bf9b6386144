package lockserver

import "github.com/prometheus/client_golang/prometheus"

// Results of the three lease calls, the closed label sets of docs/contracts/observability.md.
const (
	resultGranted  = "granted"
	resultHeld     = "held"
	resultRenewed  = "renewed"
	resultLost     = "lost"
	resultReleased = "released"
)

// metrics are lock-server's counters, registered in the instance's own registry.
// A call that was malformed or could not reach lockdb is in none of them: they
// count decisions lockdb made.
type metrics struct {
	grant   *prometheus.CounterVec // lock_grant_total{result}
	renew   *prometheus.CounterVec // lock_renew_total{result}
	release *prometheus.CounterVec // lock_release_total{result}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		grant: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lock_grant_total",
			Help: "Acquire calls lockdb decided, by result: granted (a new token) or held.",
		}, []string{"result"}),
		renew: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lock_renew_total",
			Help: "Renew calls lockdb decided, by result: renewed, or lost (not the current unexpired grant of that owner, or no such lock).",
		}, []string{"result"}),
		release: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lock_release_total",
			Help: "Release calls lockdb decided, by result: released (also a repeat of a release), or lost (a newer grant, another owner, or no such lock).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.grant, m.renew, m.release)
	// Every series exists from start-up at 0 (docs/contracts/observability.md).
	for _, r := range []string{resultGranted, resultHeld} {
		m.grant.WithLabelValues(r)
	}
	for _, r := range []string{resultRenewed, resultLost} {
		m.renew.WithLabelValues(r)
	}
	for _, r := range []string{resultReleased, resultLost} {
		m.release.WithLabelValues(r)
	}
	return m
}
