package deploytest

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// A NetworkPolicy evaluator for the objects of deploy/k8s, conservative where
// the API leaves room: an ipBlock may match any address, pod IPs included (how
// a CNI treats pod IPs in ipBlocks differs), and a named port matches any port.
// So "denied" here means denied by every conforming CNI.

type labelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels"`
	MatchExpressions []struct {
		Key      string   `json:"key"`
		Operator string   `json:"operator"`
		Values   []string `json:"values"`
	} `json:"matchExpressions"`
}

func (s *labelSelector) matches(labels map[string]string) bool {
	if s == nil {
		return true
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		v, has := labels[e.Key]
		switch e.Operator {
		case "In":
			if !has || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if has && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !has {
				return false
			}
		case "DoesNotExist":
			if has {
				return false
			}
		default:
			return false
		}
	}
	return true
}

type peer struct {
	PodSelector       *labelSelector `json:"podSelector"`
	NamespaceSelector *labelSelector `json:"namespaceSelector"`
	IPBlock           *struct {
		CIDR string `json:"cidr"`
	} `json:"ipBlock"`
}

type policyPort struct {
	Protocol string `json:"protocol"`
	Port     any    `json:"port"`
	EndPort  *int   `json:"endPort"`
}

type rule struct {
	To    []peer       `json:"to"`
	From  []peer       `json:"from"`
	Ports []policyPort `json:"ports"`
}

type networkPolicy struct {
	Name      string `json:"-"`
	Namespace string `json:"-"`
	Spec      struct {
		PodSelector labelSelector `json:"podSelector"`
		PolicyTypes []string      `json:"policyTypes"`
		Egress      []rule        `json:"egress"`
		Ingress     []rule        `json:"ingress"`
	} `json:"spec"`
}

// endpoint is one side of a connection: a pod (namespace and labels) or an
// address outside the cluster.
type endpoint struct {
	name      string
	namespace string
	labels    map[string]string
	external  bool
}

type cluster struct {
	policies   []networkPolicy
	namespaces map[string]map[string]string // name → labels
}

func (c cluster) nsLabels(ns string) map[string]string {
	l := maps.Clone(c.namespaces[ns])
	if l == nil {
		l = map[string]string{}
	}
	l["kubernetes.io/metadata.name"] = ns
	return l
}

func (c cluster) peerMatches(p peer, policyNS string, e endpoint) bool {
	if p.IPBlock != nil {
		return true
	}
	if e.external {
		return false
	}
	if p.NamespaceSelector == nil {
		if e.namespace != policyNS {
			return false
		}
	} else if !p.NamespaceSelector.matches(c.nsLabels(e.namespace)) {
		return false
	}
	return p.PodSelector.matches(e.labels)
}

func portMatches(ports []policyPort, proto string, port int) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		pp := p.Protocol
		if pp == "" {
			pp = "TCP"
		}
		if pp != proto {
			continue
		}
		switch v := p.Port.(type) {
		case nil:
			return true
		case float64:
			hi := int(v)
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			if port >= int(v) && port <= hi {
				return true
			}
		default:
			return true // a named port: conservatively, any
		}
	}
	return false
}

func hasType(p networkPolicy, typ string) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return typ == "Ingress" || len(p.Spec.Egress) > 0
	}
	return slices.Contains(p.Spec.PolicyTypes, typ)
}

// allows says whether a connection from src to dst on proto/port is allowed
// by the policies: egress of src's namespace, then ingress of dst's.
func (c cluster) allows(src, dst endpoint, proto string, port int) bool {
	return c.allowed(src, dst, proto, port, "Egress") && (dst.external || c.allowed(dst, src, proto, port, "Ingress"))
}

func (c cluster) allowed(subject, other endpoint, proto string, port int, typ string) bool {
	selected := false
	for _, p := range c.policies {
		if p.Namespace != subject.namespace || !hasType(p, typ) || !p.Spec.PodSelector.matches(subject.labels) {
			continue
		}
		selected = true
		rules := p.Spec.Egress
		if typ == "Ingress" {
			rules = p.Spec.Ingress
		}
		for _, r := range rules {
			peers := r.To
			if typ == "Ingress" {
				peers = r.From
			}
			if !portMatches(r.Ports, proto, port) {
				continue
			}
			if len(peers) == 0 {
				return true
			}
			for _, pe := range peers {
				if c.peerMatches(pe, p.Namespace, other) {
					return true
				}
			}
		}
	}
	return !selected
}

// pods lists the pod templates of the built objects, by workload name.
func podsAndCluster(t *testing.T) (map[string]endpoint, cluster) {
	t.Helper()
	objs := build(t, k8sDir(t))
	pods := map[string]endpoint{}
	c := cluster{namespaces: map[string]map[string]string{}}
	for _, o := range objs {
		switch o.Kind {
		case "Deployment", "Job":
			p := template(t, o)
			pods[o.Metadata.Name] = endpoint{name: o.Metadata.Name, namespace: o.Metadata.Namespace, labels: p.Metadata.Labels}
		case "Namespace":
			c.namespaces[o.Metadata.Name] = o.Metadata.Labels
		case "NetworkPolicy":
			var np networkPolicy
			b, _ := json.Marshal(o.raw)
			if err := json.Unmarshal(b, &np); err != nil {
				t.Fatal(err)
			}
			np.Name, np.Namespace = o.Metadata.Name, o.Metadata.Namespace
			c.policies = append(c.policies, np)
		}
	}
	return pods, c
}

var (
	kubeDNS  = endpoint{name: "kube-dns", namespace: "kube-system", labels: map[string]string{"k8s-app": "kube-dns"}}
	external = endpoint{name: "an address outside the cluster", external: true}
)

// railTargets are the ways to reach the rail: the rail-stub pods on their port,
// and a rail outside the cluster on the usual ports (any address: a real
// rail's is not in the base).
func railTargets(pods map[string]endpoint) []struct {
	dst  endpoint
	port int
} {
	return []struct {
		dst  endpoint
		port int
	}{{pods["rail-stub"], 8084}, {external, 443}, {external, 8084}, {external, 80}}
}

func railReachers(pods map[string]endpoint, c cluster) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		for _, r := range railTargets(pods) {
			if c.allows(pods[name], r.dst, "TCP", r.port) {
				out = append(out, fmt.Sprintf("%s → %s:%d", name, r.dst.name, r.port))
			}
		}
	}
	return out
}

// "rail-proxy is the only process permitted to call the rail" is
// true at the network level. No pod but rail-proxy's can open a connection to
// the rail (rail-stub's pods, or an outside address on the rail's ports), while
// every pod still reaches what it needs: DNS, its database, its callees.
func TestOnlyRailProxyCanReachTheRail(t *testing.T) {
	pods, c := podsAndCluster(t)
	for _, name := range []string{"rail-proxy", "rail-stub", "executor", "reconciler", "lock-server", "payment-resource", "lockdb-migrate", "paydb-migrate"} {
		if _, ok := pods[name]; !ok {
			t.Fatalf("no pod template %s", name)
		}
	}
	got := railReachers(pods, c)
	want := []string{"rail-proxy → rail-stub:8084"}
	if !slices.Equal(got, want) {
		t.Errorf("who can reach the rail: %v, want only %v", got, want)
	}

	reach := func(from, to string, toEP endpoint, port int, wantAllowed bool) {
		t.Helper()
		if got := c.allows(pods[from], toEP, "TCP", port); got != wantAllowed {
			t.Errorf("%s → %s:%d allowed=%v, want %v", from, to, port, got, wantAllowed)
		}
	}
	for name, p := range pods {
		if !c.allows(p, kubeDNS, "UDP", 53) {
			t.Errorf("%s cannot resolve names (kube-dns UDP 53)", name)
		}
	}
	for _, name := range []string{"lock-server", "payment-resource", "rail-proxy", "reconciler", "lockdb-migrate", "paydb-migrate"} {
		reach(name, "database", external, 5432, true)
	}
	for _, name := range []string{"executor", "rail-stub"} {
		reach(name, "database", external, 5432, false)
	}
	reach("executor", "lock-server", pods["lock-server"], 8081, true)
	reach("executor", "payment-resource", pods["payment-resource"], 8082, true)
	reach("executor", "rail-proxy", pods["rail-proxy"], 8083, true)
	reach("reconciler", "rail-proxy", pods["rail-proxy"], 8083, true)
	reach("reconciler", "payment-resource", pods["payment-resource"], 8082, true)
	reach("payment-resource", "rail-proxy", pods["rail-proxy"], 8083, false)
	reach("rail-stub", "an outside address", external, 443, false)
}

// The evaluator is not vacuous: without the namespace-wide egress policies (the
// default deny, and allow-dns, which selects every pod too), a pod no other
// egress policy selects is unconfined and seen reaching an outside rail; and a
// rule that opens port 443 to the executors is seen as a path to the rail.
func TestRailEgressLeaksAreSeen(t *testing.T) {
	pods, c := podsAndCluster(t)
	var noDefault cluster
	noDefault.namespaces = c.namespaces
	for _, p := range c.policies {
		if len(p.Spec.PodSelector.MatchLabels) == 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 && hasType(p, "Egress") {
			continue
		}
		noDefault.policies = append(noDefault.policies, p)
	}
	if got := railReachers(pods, noDefault); !slices.Contains(got, "rail-stub → an address outside the cluster:443") {
		t.Errorf("without a namespace-wide egress policy, rail-stub is not seen unconfined: %v", got)
	}

	leaky := cluster{namespaces: c.namespaces, policies: slices.Clone(c.policies)}
	var open networkPolicy
	open.Name, open.Namespace = "oops", "lockdev"
	open.Spec.PodSelector = labelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "executor"}}
	open.Spec.PolicyTypes = []string{"Egress"}
	open.Spec.Egress = []rule{{To: []peer{{IPBlock: &struct {
		CIDR string `json:"cidr"`
	}{CIDR: "0.0.0.0/0"}}}, Ports: []policyPort{{Port: float64(443)}}}}
	leaky.policies = append(leaky.policies, open)
	if got := railReachers(pods, leaky); !slices.Contains(got, "executor → an address outside the cluster:443") {
		t.Errorf("an executor allowed out on 443 is not seen reaching an outside rail: %v", got)
	}
}
