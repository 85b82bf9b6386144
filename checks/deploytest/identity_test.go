package deploytest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The Kubernetes manifests against docs/contracts/workload-identity.md and the
// least-privilege section of docs/contracts/database.md: one ServiceAccount
// (so one SVID) per workload, mutual TLS everywhere with probes and scrapes on
// the plaintext health port, each service's own database login, default-deny
// network policies admitting only the callers the roles name, and the overlays
// that issue SVIDs with cert-manager or SPIRE.

// overlayDirs are the overlays of the base that issue SVIDs.
func overlayDirs(t *testing.T) map[string]string {
	dir := filepath.Join(root(t), "deploy", "k8s-overlays")
	return map[string]string{"cert-manager": filepath.Join(dir, "cert-manager"), "spire": filepath.Join(dir, "spire")}
}

// builds are the base and each overlay, built.
func builds(t *testing.T) map[string][]object {
	t.Helper()
	out := map[string][]object{"base": build(t, k8sDir(t))}
	for name, dir := range overlayDirs(t) {
		out[name] = build(t, dir)
	}
	return out
}

// env is a container's literal settings (those from a Secret map to "").
func env(c container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func TestEachWorkloadRunsUnderItsOwnServiceAccount(t *testing.T) {
	for name, objs := range builds(t) {
		accounts := map[string]bool{}
		for _, o := range objs {
			if o.Kind == "ServiceAccount" {
				if v, ok := o.raw["automountServiceAccountToken"].(bool); !ok || v {
					t.Errorf("%s: %s mounts a token; no process talks to the Kubernetes API", name, o.id())
				}
				accounts[o.Metadata.Name] = true
			}
		}
		users := map[string]string{} // account → the Deployment that runs under it
		for _, o := range objs {
			if o.Kind != "Deployment" {
				continue
			}
			sa := template(t, o).Spec.ServiceAccountName
			switch {
			case sa != o.Metadata.Name:
				// the overlays' IDs are spiffe://…/sa/{account}: the account names the service
				t.Errorf("%s: %s runs as ServiceAccount %q, want its own, %q", name, o.id(), sa, o.Metadata.Name)
			case users[sa] != "":
				t.Errorf("%s: %s and %s share ServiceAccount %s (one SVID for two workloads)", name, o.id(), users[sa], sa)
			case !accounts[sa]:
				t.Errorf("%s: %s runs as ServiceAccount %s, which the build does not create", name, o.id(), sa)
			}
			users[sa] = o.id()
		}
		if len(users) != len(ports) {
			t.Errorf("%s: %d Deployments with their own account, want %d", name, len(users), len(ports))
		}
	}
}

// Every service is given an SVID, key and bundle from files of a mounted
// volume, a health port its probes and scrape target, https URLs for its
// callees and never UNSAFE_NO_AUTH; in the overlays, the peers and roles are
// the ServiceAccount-template IDs.
func TestEveryServiceServesMutualTLSAndIsProbedOnItsHealthPort(t *testing.T) {
	for name, objs := range builds(t) {
		for _, o := range objs {
			if o.Kind != "Deployment" {
				continue
			}
			where := name + ": " + o.id()
			p := template(t, o)
			health, ok := healthPorts[o.Metadata.Name]
			if !ok || len(p.Spec.Containers) == 0 {
				t.Errorf("%s: not a known service", where)
				continue
			}
			c := p.Spec.Containers[0]
			e := env(c)
			for _, s := range []string{"TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CA_FILE"} {
				if !mounted(p, c, e[s]) {
					t.Errorf("%s: %s=%q is not a file of a mounted SVID volume", where, s, e[s])
				}
			}
			if v, set := e["UNSAFE_NO_AUTH"]; set {
				t.Errorf("%s: UNSAFE_NO_AUTH=%q; the manifests run with identities on", where, v)
			}
			if e["HEALTH_ADDR"] != fmt.Sprintf(":%d", health) {
				t.Errorf("%s: HEALTH_ADDR=%q, want :%d", where, e["HEALTH_ADDR"], health)
			}
			if a := o.annotation(t, "prometheus.io/port"); a != fmt.Sprint(health) {
				t.Errorf("%s: scraped on port %q, want the health port %d", where, a, health)
			}
			for k, v := range e {
				if strings.HasSuffix(k, "_URL") && v != "" {
					if u, err := url.Parse(v); err != nil || u.Scheme != "https" {
						t.Errorf("%s: %s=%q, want an https URL (mutual TLS)", where, k, v)
					}
				}
				if name != "base" && (strings.HasSuffix(k, "_ID") && k != "EXECUTOR_OWNER_ID" || isRole(k)) {
					for _, id := range strings.Split(v, ",") {
						if !strings.HasPrefix(id, "spiffe://lock.dev/ns/lockdev/sa/") {
							t.Errorf("%s: %s holds %q, want spiffe://lock.dev/ns/lockdev/sa/{account}", where, k, id)
						}
					}
				}
			}
			if name != "base" {
				for _, k := range overlayIDs[o.Metadata.Name] {
					if e[k] == "" {
						t.Errorf("%s: %s is not set; the default ID would not be the pod's", where, k)
					}
				}
			}
		}
	}
}

// overlayIDs are the peer and role settings the overlays must set: their IDs
// follow the ServiceAccount template, not the defaults.
var overlayIDs = map[string][]string{
	"lock-server":      {"LOCK_SERVER_HOLDERS", "LOCK_SERVER_READERS"},
	"payment-resource": {"PAYMENT_CREATORS", "PAYMENT_WORKERS", "PAYMENT_SETTLERS", "PAYMENT_READERS"},
	"rail-proxy":       {"RAIL_ID", "RAIL_PROXY_SUBMITTERS", "RAIL_PROXY_READERS"},
	"rail-stub":        {"RAIL_STUB_CLIENTS", "RAIL_STUB_READERS", "RAIL_STUB_ADMINS"},
	"executor":         {"LOCK_SERVER_ID", "PAYMENT_RESOURCE_ID", "RAIL_PROXY_ID"},
	"reconciler":       {"PAYMENT_RESOURCE_ID", "RAIL_PROXY_ID"},
}

func isRole(k string) bool {
	for _, ks := range overlayIDs {
		if slices.Contains(ks, k) && !strings.HasSuffix(k, "_ID") {
			return true
		}
	}
	return false
}

// mounted says whether file lies under a volume mount of c whose volume holds
// an SVID: the base's Secret, a CSI driver's volume or a helper's emptyDir.
func mounted(p podTemplate, c container, file string) bool {
	if file == "" {
		return false
	}
	for _, m := range c.VolumeMounts {
		if filepath.Dir(file) != filepath.Clean(m.MountPath) {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name && (v.Secret != nil || v.CSI != nil || v.EmptyDir != nil) {
				return true
			}
		}
	}
	return false
}

func (o object) annotation(t *testing.T, key string) string {
	t.Helper()
	spec, _ := o.raw["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	md, _ := tmpl["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	return fmt.Sprint(ann[key])
}

// Each service connects to its database as its own login (its own Secret
// key), the migration Jobs as the owner, granting every runtime login.
func TestEachServiceHasItsOwnDatabaseLogin(t *testing.T) {
	objs := build(t, k8sDir(t))
	keys := map[string]string{}
	for _, o := range objs {
		if o.Kind != "Deployment" && o.Kind != "Job" {
			continue
		}
		p := template(t, o)
		for _, c := range p.Spec.Containers {
			for _, e := range c.Env {
				if (e.Name == "PAYDB_URL" || e.Name == "LOCKDB_URL") && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					k := e.ValueFrom.SecretKeyRef.Key
					if other, dup := keys[k]; dup {
						t.Errorf("%s and %s connect with one login (%s)", o.id(), other, k)
					}
					keys[k] = o.id()
				}
			}
		}
		if o.Kind == "Job" {
			e := env(p.Spec.Containers[0])
			want := map[string][]string{"lockdb-migrate": {"LOCKDB_ROLE_LOCK_SERVER"}, "paydb-migrate": {"PAYDB_ROLE_RAIL_PROXY", "PAYDB_ROLE_PAYMENT", "PAYDB_ROLE_RECONCILER"}}[o.Metadata.Name]
			logins := map[string]bool{}
			for _, s := range want {
				if e[s] == "" || logins[e[s]] {
					t.Errorf("%s: %s=%q, want a login of its own", o.id(), s, e[s])
				}
				logins[e[s]] = true
			}
		}
	}
	want := map[string]string{"Deployment/lock-server": "lock-server-lockdb-url", "Deployment/payment-resource": "payment-resource-paydb-url",
		"Deployment/rail-proxy": "rail-proxy-paydb-url", "Deployment/reconciler": "reconciler-paydb-url",
		"Job/lockdb-migrate": "lockdb-owner-url", "Job/paydb-migrate": "paydb-owner-url"}
	for id, k := range want {
		if keys[k] != id {
			t.Errorf("the URL of key %s is used by %q, want %s alone", k, keys[k], id)
		}
	}
}

// isDefaultDeny: a policy selecting every pod, of typ, with no rule.
func isDefaultDeny(p networkPolicy, typ string) bool {
	empty := len(p.Spec.PodSelector.MatchLabels) == 0 && len(p.Spec.PodSelector.MatchExpressions) == 0
	rules := len(p.Spec.Egress)
	if typ == "Ingress" {
		rules = len(p.Spec.Ingress)
	}
	return empty && slices.Contains(p.Spec.PolicyTypes, typ) && rules == 0
}

// policies are the NetworkPolicies of objs.
func policies(t *testing.T, objs []object) []networkPolicy {
	t.Helper()
	var out []networkPolicy
	for _, o := range objs {
		if o.Kind == "NetworkPolicy" {
			out = append(out, decodePolicy(t, o))
		}
	}
	return out
}

func TestNetworkPoliciesDenyByDefaultAndNeverOpenTheInternet(t *testing.T) {
	for name, objs := range builds(t) {
		var ingress, egress bool
		for _, p := range policies(t, objs) {
			ingress = ingress || isDefaultDeny(p, "Ingress")
			egress = egress || isDefaultDeny(p, "Egress")
			for _, r := range append(slices.Clone(p.Spec.Egress), p.Spec.Ingress...) {
				for _, pe := range append(slices.Clone(r.To), r.From...) {
					if pe.IPBlock != nil && strings.HasSuffix(pe.IPBlock.CIDR, "/0") {
						t.Errorf("%s: NetworkPolicy/%s opens %s: name the address block", name, p.Name, pe.IPBlock.CIDR)
					}
				}
			}
		}
		if !ingress || !egress {
			t.Errorf("%s: default-deny ingress %v, egress %v; want both", name, ingress, egress)
		}
	}
}

// callers are the workloads each service's roles name, in the namespace
// (docs/contracts/workload-identity.md); every other pod is kept off its port.
var callers = map[string][]string{
	"lock-server":      {"executor", "reconciler"},
	"payment-resource": {"executor", "reconciler"},
	"rail-proxy":       {"executor", "reconciler"},
	"rail-stub":        {"rail-proxy"},
	"executor":         {},
	"reconciler":       {},
}

var scraper = endpoint{name: "prometheus", namespace: "monitoring", labels: map[string]string{"app.kubernetes.io/name": "prometheus"}}

func TestEachServiceAdmitsOnlyTheCallersItsRolesName(t *testing.T) {
	pods, c := podsAndCluster(t)
	c.namespaces["monitoring"] = nil
	stranger := endpoint{name: "a pod of another namespace", namespace: "default", labels: map[string]string{"app.kubernetes.io/name": "executor"}}
	from := slices.Sorted(maps.Keys(pods))
	for _, svc := range slices.Sorted(maps.Keys(callers)) {
		dst := pods[svc]
		var got []string
		for _, src := range from {
			// the service's own ingress decision: whether the caller's egress is
			// open too is its callees' list (TestOnlyRailProxyCanReachTheRail)
			if src != svc && c.allowed(dst, pods[src], "TCP", ports[svc], "Ingress") {
				got = append(got, src)
			}
		}
		if !slices.Equal(got, callers[svc]) {
			t.Errorf("whom %s admits on %d: %v, want %v", svc, ports[svc], got, callers[svc])
		}
		for _, ext := range []endpoint{scraper, stranger} {
			if c.allows(ext, dst, "TCP", ports[svc]) {
				t.Errorf("%s reaches %s's API port %d", ext.name, svc, ports[svc])
			}
		}
		// probes and scrapes: Prometheus reaches the health port, and a
		// workload that is no caller does not
		if !c.allows(scraper, dst, "TCP", healthPorts[svc]) {
			t.Errorf("Prometheus cannot scrape %s on its health port %d", svc, healthPorts[svc])
		}
		if svc != "executor" && c.allows(pods["executor"], dst, "TCP", healthPorts[svc]) {
			t.Errorf("executor reaches %s's health port %d", svc, healthPorts[svc])
		}
	}
}

// The admission check is not vacuous: without the default-deny ingress, a
// service whose ingress no other policy selects is open to every pod.
func TestIngressLeaksAreSeen(t *testing.T) {
	pods, c := podsAndCluster(t)
	var open cluster
	open.namespaces = c.namespaces
	for _, p := range c.policies {
		if isDefaultDeny(p, "Ingress") || p.Name == "allow-health" || p.Name == "lock-server-ingress" {
			continue
		}
		open.policies = append(open.policies, p)
	}
	// the reconciler's egress to lock-server is not allowed, so try from a pod
	// whose egress reaches it: the executor is allowed anyway, rail-proxy is not
	if !open.allows(pods["executor"], pods["lock-server"], "TCP", 8081) {
		t.Fatal("executor → lock-server denied without any ingress policy")
	}
	stranger := endpoint{name: "stranger", namespace: "default", labels: map[string]string{}}
	if !open.allows(stranger, pods["lock-server"], "TCP", 8081) {
		t.Error("without default-deny ingress, a pod of another namespace is not seen reaching lock-server")
	}
	if c.allows(stranger, pods["lock-server"], "TCP", 8081) {
		t.Error("a pod of another namespace reaches lock-server")
	}
}

func decodePolicy(t *testing.T, o object) networkPolicy {
	t.Helper()
	var np networkPolicy
	b, _ := json.Marshal(o.raw)
	if err := json.Unmarshal(b, &np); err != nil {
		t.Fatal(err)
	}
	np.Name, np.Namespace = o.Metadata.Name, o.Metadata.Namespace
	return np
}
