package testkit

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ScrapeTimeout bounds one scrape when the caller's context allows longer.
const ScrapeTimeout = 5 * time.Second

// maxExposition bounds the exposition read from one scrape.
const maxExposition = 16 << 20

// Families is a parsed metric exposition: the metric families by name.
type Families map[string]*dto.MetricFamily

// ParseMetrics parses a Prometheus text exposition.
func ParseMetrics(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("testkit: parse metrics: %w", err)
	}
	return Families(fams), nil
}

// Scrape GETs url (a /metrics address) with client (http.DefaultClient when
// nil), within ctx and at most ScrapeTimeout, and parses the exposition. An
// answer other than 200 is an error.
func Scrape(ctx context.Context, client *http.Client, url string) (Families, error) {
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("testkit: scrape %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("testkit: scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("testkit: scrape %s: status %d", url, resp.StatusCode)
	}
	fams, err := ParseMetrics(io.LimitReader(resp.Body, maxExposition))
	if err != nil {
		return nil, fmt.Errorf("testkit: scrape %s: %w", url, err)
	}
	return fams, nil
}

// ReadMetric reads one series of base/metrics: the series as exposed, its name
// with all its labels (e.g. `payout_settle_total{outcome="paid"}`; the order of
// the labels does not matter). A series that is not exposed is an error.
func ReadMetric(ctx context.Context, base, series string) (float64, error) {
	return ReadMetricWith(ctx, nil, base, series)
}

// ReadMetricWith is ReadMetric through client (nil: a plain client of
// Scrape's); a service serving mutual TLS needs a client with a workload's
// certificate.
func ReadMetricWith(ctx context.Context, client *http.Client, base, series string) (float64, error) {
	fams, err := Scrape(ctx, client, base+"/metrics")
	if err != nil {
		return 0, err
	}
	v, ok, err := fams.Lookup(series)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("metrics of %s: no series %s", base, series)
	}
	return v, nil
}

// Metric is ReadMetric for a test: it fails t when the series cannot be read.
func Metric(t testing.TB, base, series string) float64 {
	t.Helper()
	v, err := ReadMetric(context.Background(), base, series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// MetricOr reads series (as in ReadMetric) of base/metrics through client
// (http.DefaultClient when nil), returning absent when it is not exposed; it
// fails t when the scrape fails or the series does not parse.
func MetricOr(t testing.TB, client *http.Client, base, series string, absent float64) float64 {
	t.Helper()
	fams, err := Scrape(context.Background(), client, base+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	v, ok, err := fams.Lookup(series)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return absent
	}
	return v
}

// Value returns the value of series (as in ReadMetric) and whether it is
// exposed. A malformed series is not exposed.
func (f Families) Value(series string) (float64, bool) {
	v, ok, err := f.Lookup(series)
	return v, ok && err == nil
}

// Lookup returns the value of series (as in ReadMetric) and whether it is
// exposed; the error says the series itself does not parse. The _sum, _count
// and _bucket{le=…} series of a histogram and the _sum, _count and
// {quantile=…} series of a summary are found in their family.
func (f Families) Lookup(series string) (float64, bool, error) {
	name, want, err := parseSeries(series)
	if err != nil {
		return 0, false, err
	}
	if fam, ok := f[name]; ok {
		switch fam.GetType() {
		case dto.MetricType_COUNTER, dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
			for _, m := range fam.GetMetric() {
				if sameLabels(m.GetLabel(), want, "") {
					return plainValue(m), true, nil
				}
			}
			return 0, false, nil
		case dto.MetricType_SUMMARY:
			if q, ok := want[model.QuantileLabel]; ok {
				return f.summaryQuantile(fam, want, q)
			}
		}
	}
	for _, suffix := range []string{"_sum", "_count", "_bucket"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		fam, ok := f[base]
		if !ok {
			return 0, false, nil
		}
		return aggregateValue(fam, suffix, want)
	}
	return 0, false, nil
}

func (f Families) summaryQuantile(fam *dto.MetricFamily, want map[string]string, q string) (float64, bool, error) {
	qv, err := strconv.ParseFloat(q, 64)
	if err != nil {
		return 0, false, fmt.Errorf("testkit: quantile %q: %w", q, err)
	}
	for _, m := range fam.GetMetric() {
		if !sameLabels(m.GetLabel(), want, model.QuantileLabel) {
			continue
		}
		for _, sq := range m.GetSummary().GetQuantile() {
			if sq.GetQuantile() == qv {
				return sq.GetValue(), true, nil
			}
		}
	}
	return 0, false, nil
}

// aggregateValue is the _sum, _count or _bucket series of a histogram or
// summary family.
func aggregateValue(fam *dto.MetricFamily, suffix string, want map[string]string) (float64, bool, error) {
	isHist := fam.GetType() == dto.MetricType_HISTOGRAM || fam.GetType() == dto.MetricType_GAUGE_HISTOGRAM
	if !isHist && fam.GetType() != dto.MetricType_SUMMARY {
		return 0, false, nil
	}
	ignore := ""
	var le float64
	if suffix == "_bucket" {
		if !isHist {
			return 0, false, nil
		}
		s, ok := want[model.BucketLabel]
		if !ok {
			return 0, false, nil
		}
		var err error
		if le, err = strconv.ParseFloat(s, 64); err != nil {
			return 0, false, fmt.Errorf("testkit: bucket le=%q: %w", s, err)
		}
		ignore = model.BucketLabel
	}
	for _, m := range fam.GetMetric() {
		if !sameLabels(m.GetLabel(), want, ignore) {
			continue
		}
		switch {
		case isHist && suffix == "_sum":
			return m.GetHistogram().GetSampleSum(), true, nil
		case isHist && suffix == "_count":
			return float64(m.GetHistogram().GetSampleCount()), true, nil
		case isHist:
			if math.IsInf(le, +1) {
				return float64(m.GetHistogram().GetSampleCount()), true, nil
			}
			for _, b := range m.GetHistogram().GetBucket() {
				if b.GetUpperBound() == le {
					return float64(b.GetCumulativeCount()), true, nil
				}
			}
			return 0, false, nil
		case suffix == "_sum":
			return m.GetSummary().GetSampleSum(), true, nil
		default:
			return float64(m.GetSummary().GetSampleCount()), true, nil
		}
	}
	return 0, false, nil
}

func plainValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}

// parseSeries splits a series as exposed into its name and labels, with the
// exposition's own parser: the series is read as a one-line exposition.
func parseSeries(series string) (string, map[string]string, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(series + " 0\n"))
	if err != nil || len(fams) != 1 {
		return "", nil, fmt.Errorf("testkit: series %q does not parse: %v", series, err)
	}
	for name, fam := range fams {
		labels := map[string]string{}
		for _, l := range fam.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		return name, labels, nil
	}
	panic("unreachable")
}

// sameLabels says whether got is exactly want, leaving out the label ignore
// (the bucket's or quantile's own, found elsewhere in the sample).
func sameLabels(got []*dto.LabelPair, want map[string]string, ignore string) bool {
	n := len(want)
	if ignore != "" {
		if _, ok := want[ignore]; ok {
			n--
		}
	}
	if len(got) != n {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() || l.GetName() == ignore {
			return false
		}
	}
	return true
}
