package deploytest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/openapi"
)

// object is one built Kubernetes object, as JSON and as the few typed fields
// the checks read (the schema check covers the rest).
type object struct {
	raw        map[string]any
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
}

func (o object) id() string { return o.Kind + "/" + o.Metadata.Name }

// build runs `kustomize build` through the kustomize API, as `kubectl apply -k` does.
func build(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []object
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var o object
		if err := json.Unmarshal(b, &o); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &o.raw); err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

func k8sDir(t *testing.T) string { return filepath.Join(root(t), "deploy", "k8s") }

// k8sSchemas compiles the Kubernetes OpenAPI definitions that ship inside the
// kustomize module (kyaml's built-in schema, Kubernetes v1.21.2) into JSON
// Schema, made strict the way kubeconform's strict schemas are: an object
// whose properties are listed takes no others, so a misspelt field fails.
// Keys are "apiVersion kind".
func k8sSchemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	b, err := json.Marshal(openapi.Schema().Definitions)
	if err != nil {
		t.Fatal(err)
	}
	var defs map[string]map[string]any
	if err := json.Unmarshal(b, &defs); err != nil {
		t.Fatal(err)
	}
	gvk := map[string]string{}
	for name, d := range defs {
		if _, has := d["properties"]; has {
			if _, set := d["additionalProperties"]; !set {
				d["additionalProperties"] = false
			}
		}
		list, _ := d["x-kubernetes-group-version-kind"].([]any)
		for _, e := range list {
			m := e.(map[string]any)
			gv := m["version"].(string)
			if g := m["group"].(string); g != "" {
				gv = g + "/" + gv
			}
			gvk[gv+" "+m["kind"].(string)] = name
		}
	}
	// Swagger 2 spells these as strings; YAML writes them as numbers too.
	defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = map[string]any{"type": []any{"string", "integer"}}
	defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{"type": []any{"string", "number"}}

	var doc any
	raw, _ := json.Marshal(map[string]any{"definitions": defs})
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft4)
	if err := c.AddResource("k8s.json", doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]*jsonschema.Schema{}
	for key, name := range gvk {
		s, err := c.Compile("k8s.json#/definitions/" + name)
		if err != nil {
			t.Fatalf("compile %s: %v", name, err)
		}
		out[key] = s
	}
	return out
}

// kustomize builds deploy/k8s, and every object it makes is valid
// by the Kubernetes schema.
func TestKustomizeBuildValidatesAgainstKubernetesSchemas(t *testing.T) {
	objs := build(t, k8sDir(t))
	schemas := k8sSchemas(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.Kind]++
		s := schemas[o.APIVersion+" "+o.Kind]
		if s == nil {
			t.Errorf("%s: no Kubernetes schema for %s %s", o.id(), o.APIVersion, o.Kind)
			continue
		}
		if err := s.Validate(o.raw); err != nil {
			t.Errorf("%s is not valid: %v", o.id(), err)
		}
		if o.Kind != "Namespace" && o.Metadata.Namespace != "lockdev" {
			t.Errorf("%s: namespace %q, want lockdev", o.id(), o.Metadata.Namespace)
		}
		if o.Kind == "Secret" {
			t.Errorf("%s: the base must not carry a Secret (its values would be literals in the repository)", o.id())
		}
	}
	for kind, n := range map[string]int{"Deployment": 6, "Job": 2, "Service": 4, "PodDisruptionBudget": 6, "NetworkPolicy": 1} {
		if kinds[kind] < n {
			t.Errorf("%d %s objects, want at least %d (built: %v)", kinds[kind], kind, n, kinds)
		}
	}
}

// The schema check catches a misspelt field and a wrong type.
func TestKubernetesSchemaCheckIsStrict(t *testing.T) {
	schemas := k8sSchemas(t)
	dep := schemas["apps/v1 Deployment"]
	for _, bad := range []string{
		`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"selector":{},"template":{"spec":{"containers":[{"name":"x","readinesProbe":{}}]}}}}`,
		`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"replicas":"two","selector":{},"template":{}}}`,
		`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"template":{}}}`,
	} {
		var v any
		if err := json.Unmarshal([]byte(bad), &v); err != nil {
			t.Fatal(err)
		}
		if err := dep.Validate(v); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// The typed parts of a pod template the checks read.
type podTemplate struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		ServiceAccountName string           `json:"serviceAccountName"`
		Volumes            []volume         `json:"volumes"`
		SecurityContext    *securityContext `json:"securityContext"`
		Containers         []container      `json:"containers"`
		InitContainers     []container      `json:"initContainers"`
		HostNetwork        bool             `json:"hostNetwork"`
		AutomountToken     *bool            `json:"automountServiceAccountToken"`
	} `json:"spec"`
}

type volume struct {
	Name   string `json:"name"`
	Secret *struct {
		SecretName string `json:"secretName"`
	} `json:"secret"`
	CSI *struct {
		Driver string `json:"driver"`
	} `json:"csi"`
	EmptyDir any `json:"emptyDir"`
	PVC      *struct {
		ClaimName string `json:"claimName"`
	} `json:"persistentVolumeClaim"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `json:"runAsNonRoot"`
	RunAsUser                *int64 `json:"runAsUser"`
	AllowPrivilegeEscalation *bool  `json:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool  `json:"readOnlyRootFilesystem"`
	Privileged               *bool  `json:"privileged"`
	Capabilities             *struct {
		Drop []string `json:"drop"`
		Add  []string `json:"add"`
	} `json:"capabilities"`
	SeccompProfile *struct {
		Type string `json:"type"`
	} `json:"seccompProfile"`
}

type probe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port any    `json:"port"`
	} `json:"httpGet"`
}

type container struct {
	Name    string   `json:"name"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
	Ports   []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	Env []struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `json:"name"`
				Key  string `json:"key"`
			} `json:"secretKeyRef"`
		} `json:"valueFrom"`
	} `json:"env"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
	LivenessProbe   *probe           `json:"livenessProbe"`
	ReadinessProbe  *probe           `json:"readinessProbe"`
	SecurityContext *securityContext `json:"securityContext"`
	Resources       struct {
		Requests map[string]any `json:"requests"`
		Limits   map[string]any `json:"limits"`
	} `json:"resources"`
}

func template(t *testing.T, o object) podTemplate {
	t.Helper()
	spec, _ := o.raw["spec"].(map[string]any)
	b, _ := json.Marshal(spec["template"])
	var p podTemplate
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("%s: %v", o.id(), err)
	}
	return p
}

// Settings each service may be given (docs/contracts/configuration.md,
// reconciliation.md, signed-grants.md); a misspelt one would be ignored by the
// service and silently leave a default in force.
var settings = map[string][]string{
	"lock-server": {"LOG_LEVEL", "LOCK_SERVER_ADDR", "LOCKDB_URL", "LOCKDB_MAX_CONNS", "LOCK_MIN_TTL", "LOCK_MAX_TTL", "UNSAFE_NON_DURABLE_DB", "LOCK_SERVER_SIGNING_KEY_FILE", "LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE",
		"LOCK_SERVER_HOLDERS", "LOCK_SERVER_READERS", "LOCKDB_ROLE_LOCK_SERVER"},
	"payment-resource": {"LOG_LEVEL", "PAYMENT_RESOURCE_ADDR", "PAYDB_URL", "PAYDB_MAX_CONNS", "UNSAFE_NON_DURABLE_DB", "PAYMENT_SETTLE_TOKEN", "PAYMENT_GRANT_KEYS_FILE",
		"PAYMENT_BOOKS_CHECK", "PAYMENT_SETTLE_AFTER", "PAYMENT_RAIL_PROFILE", "PAYMENT_CREATORS", "PAYMENT_WORKERS", "PAYMENT_SETTLERS", "PAYMENT_READERS", "GRANT_WID_REQUIRED"},
	"rail-proxy": {"LOG_LEVEL", "RAIL_PROXY_ADDR", "PAYDB_URL", "PAYDB_MAX_CONNS", "RAIL_BASE_URL", "RAIL_CONNECT_TIMEOUT", "RAIL_READ_TIMEOUT", "RAIL_PROXY_FENCING_ENABLED",
		"RAIL_PROXY_INTERRUPTED_AFTER", "RAIL_IDLE_CONN_TIMEOUT", "RAIL_PROXY_MAX_GROUP", "UNSAFE_NON_DURABLE_DB", "RAIL_PROXY_GRANT_KEYS_FILE",
		"RAIL_PROXY_BOOKS_CHECK", "RAIL_PROXY_SUBMITTERS", "RAIL_PROXY_READERS", "GRANT_WID_REQUIRED", "RAIL_ID",
		"RAIL_TLS_SERVER_NAME", "RAIL_TLS_CA_FILE", "RAIL_TLS_CERT_FILE", "RAIL_TLS_KEY_FILE", "RAIL_PROTOCOL"},
	"rail-stub": {"LOG_LEVEL", "RAIL_STUB_ADDR", "RAIL_STUB_LATENCY_MS", "RAIL_STUB_DECLINE_RATE", "RAIL_STUB_DROP_RATE", "RAIL_STUB_SEED", "RAIL_STUB_CALL_LOG",
		"RAIL_STUB_CLIENTS", "RAIL_STUB_READERS", "RAIL_STUB_ADMINS", "RAIL_STUB_PROTOCOL", "RAIL_STUB_STATEMENT_DIR", "RAIL_STUB_STATEMENT_EVERY"},
	"executor": {"LOG_LEVEL", "EXECUTOR_ADDR", "LOCK_SERVER_URL", "PAYMENT_RESOURCE_URL", "RAIL_PROXY_URL", "EXECUTOR_OWNER_ID", "EXECUTOR_WORKERS", "EXECUTOR_LEASE_TTL",
		"EXECUTOR_PROXY_TIMEOUT", "EXECUTOR_POLL_INTERVAL", "EXECUTOR_PAUSE_PROBABILITY", "EXECUTOR_PAUSE", "LOCK_SERVER_ID", "PAYMENT_RESOURCE_ID", "RAIL_PROXY_ID"},
	"reconciler": {"LOG_LEVEL", "RECONCILER_ADDR", "PAYDB_URL", "PAYDB_MAX_CONNS", "RAIL_PROXY_URL", "PAYMENT_RESOURCE_URL", "PAYMENT_SETTLE_TOKEN", "RECONCILER_INTERVAL",
		"RECONCILER_SETTLE_AFTER", "UNSAFE_NON_DURABLE_DB", "PAYMENT_RESOURCE_ID", "RAIL_PROXY_ID", "RECONCILER_STATEMENT_SOURCE", "RECONCILER_STATEMENT_DIR"},
}

// identitySettings are every service's (docs/contracts/workload-identity.md):
// its SVID, key and trust bundle, the plaintext health listener, and the
// override that lifts the refusal to run without them.
var identitySettings = []string{"TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CA_FILE", "HEALTH_ADDR", "UNSAFE_NO_AUTH"}

// roleSettings are the runtime logins migrate grants to, by the binary whose
// migrate applies the tree (docs/contracts/database.md).
var roleSettings = map[string][]string{
	"lock-server":      {"LOCKDB_ROLE_LOCK_SERVER"},
	"payment-resource": {"PAYDB_ROLE_RAIL_PROXY", "PAYDB_ROLE_PAYMENT", "PAYDB_ROLE_RECONCILER"},
	"rail-proxy":       {"PAYDB_ROLE_RAIL_PROXY", "PAYDB_ROLE_PAYMENT", "PAYDB_ROLE_RECONCILER"},
	"reconciler":       {"PAYDB_ROLE_RAIL_PROXY", "PAYDB_ROLE_PAYMENT", "PAYDB_ROLE_RECONCILER"},
}

// healthPorts are the HEALTH_ADDR ports of the manifests: probes and scrapes
// go there, plaintext, never to the mutual-TLS port.
var healthPorts = map[string]int{
	"lock-server":      9081,
	"payment-resource": 9082,
	"rail-proxy":       9083,
	"rail-stub":        9084,
	"executor":         9085,
	"reconciler":       9086,
}

// secretSettings never appear as literal values: they come from a Secret.
var secretSettings = []string{"LOCKDB_URL", "PAYDB_URL", "PAYMENT_SETTLE_TOKEN"}

func checkSecurity(t *testing.T, where string, p podTemplate) {
	t.Helper()
	psc := p.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s: the pod must run as non-root (runAsNonRoot true, a non-zero runAsUser)", where)
	}
	if p.Spec.HostNetwork {
		t.Errorf("%s: hostNetwork would bypass the network policies", where)
	}
	if p.Spec.AutomountToken == nil || *p.Spec.AutomountToken {
		t.Errorf("%s: no process talks to the Kubernetes API; do not mount a token", where)
	}
	for _, c := range append(p.Spec.Containers, p.Spec.InitContainers...) {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s/%s: no securityContext", where, c.Name)
			continue
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s/%s: allowPrivilegeEscalation must be false", where, c.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s/%s: readOnlyRootFilesystem must be true", where, c.Name)
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("%s/%s: privileged", where, c.Name)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
			t.Errorf("%s/%s: capabilities must drop ALL and add none", where, c.Name)
		}
		seccomp := sc.SeccompProfile
		if seccomp == nil && psc != nil {
			seccomp = psc.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != "RuntimeDefault" {
			t.Errorf("%s/%s: seccompProfile must be RuntimeDefault", where, c.Name)
		}
		for _, r := range []string{"cpu", "memory"} {
			if c.Resources.Requests[r] == nil || c.Resources.Limits[r] == nil {
				t.Errorf("%s/%s: needs a %s request and limit", where, c.Name, r)
			}
		}
	}
}

func checkEnv(t *testing.T, where, service string, c container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			continue // the Go runtime's, set from the memory limit
		}
		if !slices.Contains(settings[service], e.Name) && !slices.Contains(identitySettings, e.Name) && !slices.Contains(roleSettings[service], e.Name) {
			t.Errorf("%s: %s is not a setting of %s (docs/contracts/configuration.md)", where, e.Name, service)
		}
		if slices.Contains(secretSettings, e.Name) {
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s: %s must come from a Secret (secretKeyRef), never a literal", where, e.Name)
			}
		}
	}
}

// Every Deployment runs its own binary, has liveness and readiness probes on the
// paths (docs/contracts/observability.md) and its port
// (docs/contracts/configuration.md), runs as non-root on a read-only root
// filesystem without privilege escalation or capabilities, has requests and limits,
// a PodDisruptionBudget and, when it serves an API, a Service; the migration Jobs
// run `migrate` with the same hardening.
func TestDeploymentsProbesSecurityAndResources(t *testing.T) {
	objs := build(t, k8sDir(t))
	deployments := map[string]podTemplate{}
	pdbs, services := map[string]bool{}, map[string]map[string]any{}
	for _, o := range objs {
		switch o.Kind {
		case "Deployment":
			deployments[o.Metadata.Name] = template(t, o)
		case "PodDisruptionBudget":
			spec := o.raw["spec"].(map[string]any)
			sel := spec["selector"].(map[string]any)["matchLabels"].(map[string]any)
			pdbs[fmt.Sprint(sel["app.kubernetes.io/name"])] = true
		case "Service":
			services[o.Metadata.Name] = o.raw["spec"].(map[string]any)
		case "Job":
			p := template(t, o)
			checkSecurity(t, o.id(), p)
			want := map[string][]string{"lockdb-migrate": {"lock-server", "migrate"}, "paydb-migrate": {"rail-proxy", "migrate"}}[o.Metadata.Name]
			if want == nil || len(p.Spec.Containers) != 1 || !slices.Equal(p.Spec.Containers[0].Command, want) {
				t.Errorf("%s: runs %v, want a known migration", o.id(), p.Spec.Containers)
			} else {
				checkEnv(t, o.id(), want[0], p.Spec.Containers[0])
			}
		}
	}
	for svc, port := range ports {
		p, ok := deployments[svc]
		if !ok {
			t.Errorf("no Deployment %s", svc)
			continue
		}
		where := "Deployment/" + svc
		checkSecurity(t, where, p)
		if len(p.Spec.Containers) != 1 {
			t.Errorf("%s: %d containers, want 1", where, len(p.Spec.Containers))
			continue
		}
		c := p.Spec.Containers[0]
		if len(c.Command) == 0 || c.Command[0] != svc {
			t.Errorf("%s: command %v does not run %s", where, c.Command, svc)
		}
		checkEnv(t, where, svc, c)
		named := map[string]int{}
		for _, cp := range c.Ports {
			named[cp.Name] = cp.ContainerPort
		}
		if named["https"] != port {
			t.Errorf("%s: port https is %d, want %d (docs/contracts/configuration.md)", where, named["https"], port)
		}
		if named["health"] != healthPorts[svc] {
			t.Errorf("%s: port health is %d, want %d", where, named["health"], healthPorts[svc])
		}
		for kind, pr := range map[string]*probe{"/livez": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
			switch {
			case pr == nil || pr.HTTPGet == nil:
				t.Errorf("%s: no httpGet probe for %s", where, kind)
			case pr.HTTPGet.Path != kind:
				t.Errorf("%s: probe on %s, want %s (docs/contracts/observability.md)", where, pr.HTTPGet.Path, kind)
			case fmt.Sprint(pr.HTTPGet.Port) != "health" && fmt.Sprint(pr.HTTPGet.Port) != fmt.Sprint(healthPorts[svc]):
				// kubelet presents no client certificate: the mutual-TLS port would fail the handshake
				t.Errorf("%s: %s probed on port %v, want the health port %d", where, kind, pr.HTTPGet.Port, healthPorts[svc])
			}
		}
		if !pdbs[svc] {
			t.Errorf("%s has no PodDisruptionBudget", where)
		}
		if svc == "executor" || svc == "reconciler" {
			continue // metrics and health only; nothing calls them
		}
		s := services[svc]
		if s == nil {
			t.Errorf("%s has no Service", where)
			continue
		}
		sel, _ := s["selector"].(map[string]any)
		ps, _ := s["ports"].([]any)
		if sel["app.kubernetes.io/name"] != svc || len(ps) != 1 || ps[0].(map[string]any)["port"] != float64(port) {
			t.Errorf("Service/%s: selector %v ports %v, want %s on %d", svc, sel, ps, svc, port)
		}
	}
}
