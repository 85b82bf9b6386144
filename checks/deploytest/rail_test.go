package deploytest

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The overlay for a real ISO 20022 rail (deploy/k8s-overlays/iso20022-rail, and
// deploy/k8s/README.md's "The rail") does what the README says: it builds, every
// object valid by the Kubernetes schema and every setting one of its service's;
// rail-stub is gone; rail-proxy speaks iso20022 to the rail's https URL over
// ordinary TLS with the rail's files mounted; payment-resource refuses what that
// rail cannot take; the reconciler reads the statement files from a mounted
// claim; and only rail-proxy reaches the rail, at an address block.
func TestISO20022RailOverlay(t *testing.T) {
	objs := build(t, filepath.Join(root(t), "deploy", "k8s-overlays", "iso20022-rail"))
	schemas := k8sSchemas(t)
	deployments := map[string]podTemplate{}
	var claims []string
	for _, o := range objs {
		if s := schemas[o.APIVersion+" "+o.Kind]; s == nil {
			t.Errorf("%s: no Kubernetes schema for %s %s", o.id(), o.APIVersion, o.Kind)
		} else if err := s.Validate(o.raw); err != nil {
			t.Errorf("%s is not valid: %v", o.id(), err)
		}
		if o.Metadata.Name == "rail-stub" || o.Metadata.Name == "rail-stub-ingress" {
			t.Errorf("%s: rail-stub is still there", o.id())
		}
		switch o.Kind {
		case "Deployment":
			p := template(t, o)
			deployments[o.Metadata.Name] = p
			checkSecurity(t, o.id(), p)
			checkEnv(t, o.id(), o.Metadata.Name, p.Spec.Containers[0])
		case "PersistentVolumeClaim":
			claims = append(claims, o.Metadata.Name)
		case "NetworkPolicy":
			if o.Metadata.Name == "allow-rail" {
				checkAllowRail(t, o)
			}
		}
	}
	if len(deployments) != 5 {
		t.Errorf("%d Deployments, want the base's five services without rail-stub", len(deployments))
	}

	proxy := deployments["rail-proxy"]
	pe := env(proxy.Spec.Containers[0])
	if pe["RAIL_PROTOCOL"] != "iso20022" || !strings.HasPrefix(pe["RAIL_BASE_URL"], "https://") || pe["RAIL_TLS_SERVER_NAME"] == "" {
		t.Errorf("rail-proxy: RAIL_PROTOCOL=%q RAIL_BASE_URL=%q RAIL_TLS_SERVER_NAME=%q, want iso20022 to an https rail verified by name",
			pe["RAIL_PROTOCOL"], pe["RAIL_BASE_URL"], pe["RAIL_TLS_SERVER_NAME"])
	}
	if _, set := pe["RAIL_ID"]; set {
		t.Errorf("rail-proxy: RAIL_ID with RAIL_TLS_SERVER_NAME is refused at start-up")
	}
	for _, k := range []string{"RAIL_TLS_CA_FILE", "RAIL_TLS_CERT_FILE", "RAIL_TLS_KEY_FILE"} {
		if !underMount(proxy, pe[k], func(v volume) bool { return v.Secret != nil && v.Secret.SecretName == "lockdev-rail-tls" }) {
			t.Errorf("rail-proxy: %s=%q is not a file of the mounted Secret lockdev-rail-tls", k, pe[k])
		}
	}
	if e := env(deployments["payment-resource"].Spec.Containers[0]); e["PAYMENT_RAIL_PROFILE"] != "iso20022" {
		t.Errorf("payment-resource: PAYMENT_RAIL_PROFILE=%q, want iso20022", e["PAYMENT_RAIL_PROFILE"])
	}
	rec := deployments["reconciler"]
	re := env(rec.Spec.Containers[0])
	if re["RECONCILER_STATEMENT_SOURCE"] != "dir" {
		t.Errorf("reconciler: RECONCILER_STATEMENT_SOURCE=%q, want dir", re["RECONCILER_STATEMENT_SOURCE"])
	}
	if !underMount(rec, filepath.Join(re["RECONCILER_STATEMENT_DIR"], "x.xml"), func(v volume) bool {
		return v.PVC != nil && slices.Contains(claims, v.PVC.ClaimName)
	}) {
		t.Errorf("reconciler: RECONCILER_STATEMENT_DIR=%q is not a mounted claim of the build (%v)", re["RECONCILER_STATEMENT_DIR"], claims)
	}
}

// underMount says whether file lies under a volume mount of p's first container
// whose volume is one ok accepts.
func underMount(p podTemplate, file string, ok func(volume) bool) bool {
	if file == "" {
		return false
	}
	for _, m := range p.Spec.Containers[0].VolumeMounts {
		if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name && ok(v) {
				return true
			}
		}
	}
	return false
}

// checkAllowRail: rail-proxy only, egress to address blocks only, none of them
// the whole internet.
func checkAllowRail(t *testing.T, o object) {
	t.Helper()
	spec, _ := o.raw["spec"].(map[string]any)
	sel, _ := spec["podSelector"].(map[string]any)["matchLabels"].(map[string]any)
	if sel["app.kubernetes.io/name"] != "rail-proxy" {
		t.Errorf("allow-rail selects %v, want rail-proxy only", sel)
	}
	egress, _ := spec["egress"].([]any)
	if len(egress) == 0 {
		t.Errorf("allow-rail has no egress rule")
	}
	for _, r := range egress {
		to, _ := r.(map[string]any)["to"].([]any)
		for _, peer := range to {
			block, _ := peer.(map[string]any)["ipBlock"].(map[string]any)
			if cidr, _ := block["cidr"].(string); cidr == "" || cidr == "0.0.0.0/0" || len(peer.(map[string]any)) != 1 {
				t.Errorf("allow-rail peer %v: want the rail's address block only", peer)
			}
		}
	}
}
