package deploytest

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"lock.dev/internal/executor"
	"lock.dev/internal/lockserver"
	"lock.dev/internal/payment"
	"lock.dev/internal/railproxy"
	"lock.dev/internal/railstub"
	"lock.dev/internal/reconcile"
)

// pending are metric names a contract pins that no registry this test builds
// exports yet. Each is allowed only while no registry has it; once one does, the
// entry must go (TestPendingMetricsAreNotRegisteredYet), so this list can only
// shrink. tls_cert_expiry_seconds is the one name a registry built without
// identity files cannot export: its series (file="cert", "ca") carry the expiry
// of files the service has loaded, and a series of zeros would read as "expired
// in 1970" to the alert.
var pending = map[string]string{
	"tls_cert_expiry_seconds": "docs/contracts/workload-identity.md: one series per loaded file, set when the service loads its SVID",
}

// synthetic are series Prometheus itself makes for every target.
var synthetic = map[string]bool{"up": true}

// family is a metric family as the services export it: its type and, per
// label, the values its series have (every value of a closed set, since the
// services zero-initialise them, docs/contracts/observability.md).
type family struct {
	typ    dto.MetricType
	labels map[string]map[string]bool
	owners []string
}

// registries builds every service's registry the way the service does.
func registries() map[string]*prometheus.Registry {
	return map[string]*prometheus.Registry{
		"lock-server":      lockserver.MetricsRegistry(),
		"payment-resource": payment.MetricsRegistry(),
		"rail-proxy":       railproxy.MetricsRegistry(),
		"rail-stub":        railstub.MetricsRegistry(),
		"executor":         executor.MetricsRegistry(),
		"reconciler":       reconcile.MetricsRegistry(),
	}
}

func exported(t *testing.T) map[string]*family {
	t.Helper()
	out := map[string]*family{}
	for svc, reg := range registries() {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("%s: gather: %v", svc, err)
		}
		for _, mf := range mfs {
			f := out[mf.GetName()]
			if f == nil {
				f = &family{typ: mf.GetType(), labels: map[string]map[string]bool{}}
				out[mf.GetName()] = f
			}
			f.owners = append(f.owners, svc)
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if f.labels[lp.GetName()] == nil {
						f.labels[lp.GetName()] = map[string]bool{}
					}
					f.labels[lp.GetName()][lp.GetValue()] = true
				}
			}
		}
	}
	return out
}

// selector is one series selector of a PromQL expression.
type selector struct {
	name     string
	matchers []*labels.Matcher
}

var promql = parser.NewParser(parser.Options{})

// selectors parses expr and lists its selectors.
func selectors(expr string) ([]selector, error) {
	// Grafana's range variables are not PromQL.
	expr = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(expr)
	node, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var out []selector
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			s := selector{name: vs.Name}
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					s.name = m.Value
					continue
				}
				s.matchers = append(s.matchers, m)
			}
			out = append(out, s)
		}
		return nil
	})
	return out, nil
}

var alternation = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

// checkSelector reports a selector naming a metric no service exports, or a
// label or label value the metric does not have.
func checkSelector(errorf func(string, ...any), where string, s selector, fams map[string]*family) {
	if synthetic[s.name] {
		return
	}
	name := s.name
	f := fams[name]
	if f == nil {
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && fams[base] != nil &&
				(fams[base].typ == dto.MetricType_HISTOGRAM || fams[base].typ == dto.MetricType_SUMMARY) {
				name, f = base, fams[base]
			}
		}
	}
	if f == nil {
		if _, ok := pending[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")]; ok {
			return // pinned by a contract; no registry built here has it yet
		}
		errorf("%s: metric %q is exported by no service", where, s.name)
		return
	}
	for _, m := range s.matchers {
		values, ok := f.labels[m.Name]
		if !ok {
			if m.Name == "job" || m.Name == "instance" {
				continue
			}
			errorf("%s: %s has no label %q (it has %v)", where, name, m.Name, keys(f.labels))
			continue
		}
		switch m.Type {
		case labels.MatchEqual:
			if !values[m.Value] {
				errorf("%s: %s{%s} has no value %q (it has %v)", where, name, m.Name, m.Value, keys(values))
			}
		case labels.MatchRegexp:
			if alternation.MatchString(m.Value) {
				for _, v := range strings.Split(m.Value, "|") {
					if !values[v] {
						errorf("%s: %s{%s=~%q}: no value %q (it has %v)", where, name, m.Name, m.Value, v, keys(values))
					}
				}
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Every pending name is pinned by a contract and registered by no service yet.
func TestPendingMetricsAreNotRegisteredYet(t *testing.T) {
	fams := exported(t)
	for name, contract := range pending {
		if f := fams[name]; f != nil {
			t.Errorf("%s (%s) is registered by %v now: remove it from pending so its labels are checked", name, contract, f.owners)
		}
	}
}

// The alert rules parse with Prometheus's own rule parser (unknown fields
// refused, every expression and template checked), and every metric they name —
// with every label and label value they match on — is one a service exports.
func TestAlertRules(t *testing.T) {
	path := filepath.Join(root(t), "deploy", "observability", "alerts.yaml")
	groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rulefmt: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	fams := exported(t)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule %q; this file holds alerts", g.Name, r.Record)
				continue
			}
			n++
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: needs a summary and a description", r.Alert)
			}
			sels, err := selectors(r.Expr)
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
				continue
			}
			for _, s := range sels {
				checkSelector(t.Errorf, "alert "+r.Alert, s, fams)
			}
		}
	}
	if n < 8 {
		t.Errorf("%d alerts; the issue asks for ambiguous-rate, unresolved intents, rail unreachable, exceptions, stale writers, grants and more", n)
	}
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// Every panel of the dashboard queries metrics the services export, by labels
// and label values they have.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root(t), "deploy", "observability", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string  `json:"uid"`
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Fatal("the dashboard needs a uid and a title (Grafana provisioning keys on the uid)")
	}
	fams := exported(t)
	queried := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				sels, err := selectors(tg.Expr)
				if err != nil {
					t.Errorf("panel %q: %v", p.Title, err)
					continue
				}
				for _, s := range sels {
					queried[s.name] = true
					checkSelector(t.Errorf, "panel "+p.Title, s, fams)
				}
			}
		}
	}
	walk(d.Panels)
	// The panels an operator needs: each of these is on the dashboard.
	for _, m := range []string{"rail_submission_total", "lock_fenced_out_total", "rail_duplicate_attempted_total",
		"rail_submission_inflight", "rail_submission_duration_seconds_bucket", "lock_grant_total", "executor_payout_total",
		"reconciler_ambiguous_payouts", "reconciler_exception_total", "grant_rejected_total",
		"rail_proxy_books_check_enabled", "payment_books_check_enabled"} {
		if !queried[m] {
			t.Errorf("no panel queries %s", m)
		}
	}
}

// The checks above fail for what they should: a renamed metric, a label that
// does not exist and a label value outside the closed set.
func TestSelectorCheckCatchesRenames(t *testing.T) {
	fams := exported(t)
	for _, expr := range []string{
		`rate(rail_submissions_total[5m])`,
		`sum by (outcome) (rail_submission_total{result="acked"})`,
		`rail_submission_total{outcome="timeout"}`,
		`rail_submission_total{outcome=~"acked|lost"}`,
		`histogram_quantile(0.9, rate(rail_call_seconds_bucket[5m]))`,
	} {
		sels, err := selectors(expr)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range sels {
			checkSelector(func(string, ...any) { n++ }, expr, s, fams)
		}
		if n == 0 {
			t.Errorf("%s: not reported", expr)
		}
	}
}
