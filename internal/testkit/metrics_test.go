package testkit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"lock.dev/internal/testkit"
)

// A real registry served over HTTP: counters, gauges, histograms and summaries
// are read by their series as exposed, labels in any order; an absent series
// is reported absent.
func TestReadMetricFromARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	total := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "payout_total", Help: "h"}, []string{"result", "to"})
	reg.MustRegister(total)
	total.WithLabelValues("paid", "x").Add(3)
	total.WithLabelValues("declined", "x").Inc()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "inflight", Help: "h"})
	reg.MustRegister(g)
	g.Set(7.5)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "group_size", Help: "h", Buckets: []float64{1, 4}})
	reg.MustRegister(h)
	for _, v := range []float64{1, 2, 8} {
		h.Observe(v)
	}
	s := prometheus.NewSummary(prometheus.SummaryOpts{Name: "wait_seconds", Help: "h", Objectives: map[float64]float64{0.5: 0.05}})
	reg.MustRegister(s)
	s.Observe(2)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	for series, want := range map[string]float64{
		`payout_total{result="paid",to="x"}`:     3,
		`payout_total{to="x",result="declined"}`: 1,
		"inflight":                               7.5,
		"group_size_sum":                         11,
		"group_size_count":                       3,
		`group_size_bucket{le="1"}`:              1,
		`group_size_bucket{le="4"}`:              2,
		`group_size_bucket{le="+Inf"}`:           3,
		"wait_seconds_count":                     1,
		"wait_seconds_sum":                       2,
		`wait_seconds{quantile="0.5"}`:           2,
	} {
		got, err := testkit.ReadMetric(context.Background(), srv.URL, series)
		if err != nil || got != want {
			t.Errorf("%s = %v, %v; want %v", series, got, err, want)
		}
	}
	for _, series := range []string{`payout_total{result="paid"}`, `payout_total{result="paid",to="x",z="1"}`, "absent_total", "group_size"} {
		if v, err := testkit.ReadMetric(context.Background(), srv.URL, series); err == nil {
			t.Errorf("%s = %v, want an error: not exposed", series, v)
		}
	}
	if _, err := testkit.ReadMetric(context.Background(), srv.URL, `bad{`); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Errorf("a malformed series: %v", err)
	}

	fams, err := testkit.Scrape(context.Background(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := fams.Value("inflight"); !ok || v != 7.5 {
		t.Errorf("Families.Value(inflight) = %v %v", v, ok)
	}
	if v := testkit.Metric(t, srv.URL, `payout_total{result="paid",to="x"}`); v != 3 {
		t.Errorf("Metric = %v", v)
	}
	if v := testkit.MetricOr(t, srv.Client(), srv.URL, "absent_total", -1); v != -1 {
		t.Errorf("MetricOr of an absent series = %v, want -1", v)
	}
}

// A scrape of an address that does not answer 200 is an error.
func TestScrapeRefusesAnError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	if _, err := testkit.Scrape(context.Background(), nil, srv.URL+"/metrics"); err == nil {
		t.Fatal("a 404 scraped without error")
	}
}

// Eventually returns once its condition holds.
func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	testkit.Eventually(t, 10*time.Second, "the third ask", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("asked %d times", n)
	}
}
