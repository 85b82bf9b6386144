package deploytest

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// loadCompose loads compose.yaml with the compose-spec loader (the one docker
// compose uses): interpolation, validation against the compose schema,
// normalisation and the consistency check (every depends_on, network, volume
// and secret a service names exists). Env files are not read: they are the
// secrets deploy/compose/gen-secrets.sh makes, absent from a clean clone.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	dir := root(t)
	opts, err := cli.NewProjectOptions([]string{filepath.Join(dir, "compose.yaml")},
		cli.WithWorkingDirectory(dir),
		cli.WithEnv([]string{}),
		cli.WithoutEnvironmentResolution,
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("compose.yaml does not load: %v", err)
	}
	return p
}

// The lock.dev services of the compose file: name → binary.
var composeServices = map[string]string{
	"lock-server":      "lock-server",
	"payment-resource": "payment-resource",
	"rail-proxy":       "rail-proxy",
	"rail-stub":        "rail-stub",
	"reconciler":       "reconciler",
	"executor-1":       "executor",
	"executor-2":       "executor",
}

// What each service waits for, and how (start order by health).
var composeDeps = map[string]map[string]string{
	"lockdb-migrate":   {"lockdb": "service_healthy"},
	"paydb-migrate":    {"paydb": "service_healthy"},
	"lock-server":      {"lockdb-migrate": "service_completed_successfully"},
	"payment-resource": {"paydb-migrate": "service_completed_successfully"},
	"rail-stub":        {},
	"rail-proxy":       {"paydb-migrate": "service_completed_successfully", "rail-stub": "service_healthy"},
	"reconciler":       {"paydb-migrate": "service_completed_successfully", "rail-proxy": "service_healthy", "payment-resource": "service_healthy"},
	"executor-1":       {"lock-server": "service_healthy", "payment-resource": "service_healthy", "rail-proxy": "service_healthy"},
	"executor-2":       {"lock-server": "service_healthy", "payment-resource": "service_healthy", "rail-proxy": "service_healthy"},
	"lockdb":           {},
	"paydb":            {},
	"prometheus":       {},
	"grafana":          {"prometheus": "service_healthy"},
}

// A password in a URL: scheme://user:password@host.
var urlPassword = regexp.MustCompile(`://[^/@:\s]+:[^/@\s]+@`)

// compose.yaml loads with the compose-spec loader and has every service, health
// check and dependency: PostgreSQL 15 for lockdb and paydb, migrations as one-shot
// services, every lock.dev service with a /readyz health check on its port
// (docs/contracts/configuration.md) (through the image's healthcheck binary: the
// base has no shell), start order by health, hardening, and no literal secret.
func TestComposeFile(t *testing.T) {
	p := loadCompose(t)
	var names []string
	for name := range p.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	var want []string
	for name := range composeDeps {
		want = append(want, name)
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}

	for name, deps := range composeDeps {
		s := p.Services[name]
		got := map[string]string{}
		for dep, d := range s.DependsOn {
			got[dep] = d.Condition
			if d.Condition == "service_healthy" && (p.Services[dep].HealthCheck == nil || p.Services[dep].HealthCheck.Disable) {
				t.Errorf("%s waits for %s to be healthy, which has no health check", name, dep)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(deps) {
			t.Errorf("%s depends on %v, want %v", name, got, deps)
		}
		for k, v := range s.Environment {
			if v != nil && urlPassword.MatchString(*v) {
				t.Errorf("%s: %s carries a password in its URL; use the pgpass secret", name, k)
			}
			if k == "PAYMENT_SETTLE_TOKEN" || strings.Contains(k, "PASSWORD") && !strings.HasSuffix(k, "_FILE") {
				t.Errorf("%s: %s is set in compose.yaml; secrets come from secret files or env files", name, k)
			}
		}
	}

	for _, db := range []string{"lockdb", "paydb"} {
		s := p.Services[db]
		if s.Image != "postgres:15" {
			t.Errorf("%s: image %q, want postgres:15", db, s.Image)
		}
		if s.HealthCheck == nil || !slices.Contains(s.HealthCheck.Test, "pg_isready") {
			t.Errorf("%s: needs a pg_isready health check", db)
		}
		if s.Environment["POSTGRES_PASSWORD_FILE"] == nil {
			t.Errorf("%s: the password must come from a secret file", db)
		}
	}
	for name, cmd := range map[string][]string{"lockdb-migrate": {"lock-server", "migrate"}, "paydb-migrate": {"rail-proxy", "migrate"}} {
		s := p.Services[name]
		if !slices.Equal(s.Command, cmd) || s.Restart != "no" {
			t.Errorf("%s: command %v restart %q, want %v as a one-shot (restart no)", name, s.Command, s.Restart, cmd)
		}
	}
	checkLockdev := func(name string, s types.ServiceConfig) {
		if !strings.HasPrefix(s.Image, "lockdev:") || s.Build == nil {
			t.Errorf("%s: image %q, want lockdev built from the Dockerfile", name, s.Image)
		}
		if !s.ReadOnly || !slices.Contains(s.CapDrop, "ALL") || !slices.Contains(s.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("%s: needs read_only, cap_drop ALL and no-new-privileges", name)
		}
	}
	checkLockdev("lockdb-migrate", p.Services["lockdb-migrate"])
	checkLockdev("paydb-migrate", p.Services["paydb-migrate"])

	for name, binary := range composeServices {
		s := p.Services[name]
		checkLockdev(name, s)
		if len(s.Command) == 0 || s.Command[0] != binary {
			t.Errorf("%s: command %v, want %s", name, s.Command, binary)
		}
		// the health port: plaintext, no client certificate (the image's
		// healthcheck presents none)
		want := []string{"CMD", "healthcheck", fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPorts[binary])}
		if s.HealthCheck == nil || !slices.Equal(s.HealthCheck.Test, want) {
			t.Errorf("%s: health check %v, want %v", name, s.HealthCheck, want)
		}
		_, onRail := s.Networks["rail"]
		if onRail != (name == "rail-proxy" || name == "rail-stub") {
			t.Errorf("%s: on the rail network = %v; only rail-proxy and rail-stub are", name, onRail)
		}
	}
	if len(p.Services["rail-stub"].Networks) != 1 {
		t.Errorf("rail-stub must be on the rail network only, it is on %v", p.Services["rail-stub"].Networks)
	}
	for _, name := range []string{"payment-resource", "reconciler"} {
		if len(p.Services[name].EnvFiles) == 0 {
			t.Errorf("%s: PAYMENT_SETTLE_TOKEN must come from an env file", name)
		}
	}
	if p.Networks["rail"].Internal != true || p.Networks["db"].Internal != true {
		t.Errorf("the rail and db networks must be internal")
	}
	for name, s := range p.Secrets {
		if !strings.HasPrefix(s.File, filepath.Join(root(t), "deploy", "compose", "secrets")+string(filepath.Separator)) {
			t.Errorf("secret %s comes from %s, outside the git-ignored deploy/compose/secrets", name, s.File)
		}
	}
}

// Prometheus scrapes every lock.dev process on its health port
// (docs/contracts/workload-identity.md), loads the alert rules, and Grafana is
// provisioned with the datasource and the dashboard.
func TestComposeObservability(t *testing.T) {
	dir := root(t)
	raw, err := os.ReadFile(filepath.Join(dir, "deploy", "compose", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				targets[tg] = true
			}
		}
	}
	for name, binary := range composeServices {
		if tg := fmt.Sprintf("%s:%d", name, healthPorts[binary]); !targets[tg] {
			t.Errorf("prometheus does not scrape %s", tg)
		}
	}
	p := loadCompose(t)
	mounted := func(service, source string) bool {
		for _, v := range p.Services[service].Volumes {
			if v.Source == filepath.Join(dir, source) {
				return true
			}
		}
		return false
	}
	for service, sources := range map[string][]string{
		"prometheus": {"deploy/compose/prometheus.yml", "deploy/observability/alerts.yaml"},
		"grafana":    {"deploy/compose/grafana/provisioning", "deploy/observability/grafana-dashboard.json"},
	} {
		for _, src := range sources {
			if !mounted(service, src) {
				t.Errorf("%s does not mount %s", service, src)
			}
			if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
				t.Errorf("%s mounts %s: %v", service, src, err)
			}
		}
	}
	if len(cfg.RuleFiles) == 0 {
		t.Error("prometheus loads no rule files")
	}
	for _, f := range []string{"datasources/prometheus.yaml", "dashboards/lockdev.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, "deploy", "compose", "grafana", "provisioning", f)); err != nil {
			t.Errorf("grafana provisioning: %v", err)
		}
	}
}

// Every lock.dev service of compose.yaml runs with identities on
// (docs/contracts/workload-identity.md): its own SVID and key and the CA from
// the certificates `lock-server certs` made (gen-secrets.sh), https URLs for
// its callees, HEALTH_ADDR on its health port, never UNSAFE_NO_AUTH; rail-stub
// is not published on the host; the CA's key is mounted nowhere; and each
// service connects to its database as its own login, the one the migrations
// grant (docs/contracts/database.md).
func TestComposeRunsWithIdentitiesAndOwnLogins(t *testing.T) {
	p := loadCompose(t)
	certs := filepath.Join(root(t), "deploy", "compose", "secrets", "certs")
	for name, binary := range composeServices {
		s := p.Services[name]
		env := func(k string) string {
			if v := s.Environment[k]; v != nil {
				return *v
			}
			return ""
		}
		mountedAs := map[string]string{} // target file → secret file
		for _, sec := range s.Secrets {
			target := sec.Target
			if target == "" {
				target = sec.Source
			}
			mountedAs["/run/secrets/"+target] = p.Secrets[sec.Source].File
		}
		for k, want := range map[string]string{"TLS_CERT_FILE": binary + ".pem", "TLS_KEY_FILE": binary + ".key", "TLS_CA_FILE": "ca.pem"} {
			if got := mountedAs[env(k)]; got != filepath.Join(certs, want) {
				t.Errorf("%s: %s=%q mounts %q, want certs/%s", name, k, env(k), got, want)
			}
		}
		if _, set := s.Environment["UNSAFE_NO_AUTH"]; set {
			t.Errorf("%s: UNSAFE_NO_AUTH is set; compose runs with identities on", name)
		}
		if got, want := env("HEALTH_ADDR"), fmt.Sprintf(":%d", healthPorts[binary]); got != want {
			t.Errorf("%s: HEALTH_ADDR=%q, want %q", name, got, want)
		}
		for k, v := range s.Environment {
			if v != nil && strings.HasSuffix(k, "_URL") && !strings.HasSuffix(k, "DB_URL") && !strings.HasPrefix(*v, "https://") {
				t.Errorf("%s: %s=%q, want an https URL", name, k, *v)
			}
		}
	}
	if ps := p.Services["rail-stub"].Ports; len(ps) > 0 {
		t.Errorf("rail-stub is published on the host (%v); only rail-proxy reaches a rail", ps)
	}
	// Only the entry points are published, and on loopback only: rail-stub,
	// the databases, the executors and the reconciler are reached over the
	// compose networks alone.
	entryPoints := map[string]bool{"lock-server": true, "payment-resource": true, "rail-proxy": true, "prometheus": true, "grafana": true}
	for name, s := range p.Services {
		for _, port := range s.Ports {
			if !entryPoints[name] {
				t.Errorf("%s publishes %s:%s on the host; only %v are published", name, port.HostIP, port.Published, slices.Sorted(maps.Keys(entryPoints)))
			}
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %s on %q; published ports are bound to 127.0.0.1", name, port.Published, port.HostIP)
			}
		}
	}
	for name, sec := range p.Secrets {
		if strings.HasSuffix(sec.File, "ca.key") {
			t.Errorf("secret %s is the CA's key; it signs SVIDs and is mounted nowhere", name)
		}
	}

	// database logins: migrate as the owner, granting the login each service uses
	login := func(service, env string) string {
		v := p.Services[service].Environment[env]
		if v == nil {
			return ""
		}
		u, err := url.Parse(*v)
		if err != nil {
			t.Fatalf("%s: %s does not parse", service, env)
		}
		return u.User.Username()
	}
	roleOf := func(service, env string) string {
		if v := p.Services[service].Environment[env]; v != nil {
			return *v
		}
		return ""
	}
	uses := map[string]string{
		"lock-server":      roleOf("lockdb-migrate", "LOCKDB_ROLE_LOCK_SERVER"),
		"rail-proxy":       roleOf("paydb-migrate", "PAYDB_ROLE_RAIL_PROXY"),
		"payment-resource": roleOf("paydb-migrate", "PAYDB_ROLE_PAYMENT"),
		"reconciler":       roleOf("paydb-migrate", "PAYDB_ROLE_RECONCILER"),
	}
	owners := map[string]bool{login("lockdb-migrate", "LOCKDB_URL"): true, login("paydb-migrate", "PAYDB_URL"): true}
	seen := map[string]string{}
	for service, role := range uses {
		env := "PAYDB_URL"
		if service == "lock-server" {
			env = "LOCKDB_URL"
		}
		got := login(service, env)
		switch {
		case role == "":
			t.Errorf("the migration grants no login for %s", service)
		case got != role:
			t.Errorf("%s connects as %q, want %q, the login the migration grants", service, got, role)
		case owners[got]:
			t.Errorf("%s connects as the owner %q: an owner bypasses every grant", service, got)
		case seen[got] != "":
			t.Errorf("%s and %s share the login %q", service, seen[got], got)
		}
		seen[got] = service
	}
}
