package identity

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/serve"
)

// DefaultTrustDomain is the trust domain of the default IDs.
const DefaultTrustDomain = "lock.dev"

// The default workload names (docs/contracts/workload-identity.md).
const (
	NameLockServer      = "lock-server"
	NamePaymentResource = "payment-resource"
	NameRailProxy       = "rail-proxy"
	NameRailStub        = "rail-stub"
	NameExecutor        = "executor"
	NameReconciler      = "reconciler"
	NamePayoutCreator   = "payout-creator"
	NameOps             = "ops"
)

// DefaultNames are the workloads lock-server certs issues SVIDs for by default.
func DefaultNames() []string {
	return []string{NameLockServer, NamePaymentResource, NameRailProxy, NameRailStub,
		NameExecutor, NameReconciler, NamePayoutCreator, NameOps}
}

// DefaultID is the SPIFFE ID of name in the default trust domain, as a string:
// what the role settings default to.
func DefaultID(name string) string { return "spiffe://" + DefaultTrustDomain + "/" + name }

// DefaultIDs is DefaultID of each name, comma-separated: a role setting's default.
func DefaultIDs(names ...string) string {
	ids := make([]string, len(names))
	for i, n := range names {
		ids[i] = DefaultID(n)
	}
	return strings.Join(ids, ",")
}

// Settings are a workload's identity settings, the same on every service and
// client (docs/contracts/configuration.md).
type Settings struct {
	CertFile string // TLS_CERT_FILE: the workload's own SVID, PEM (leaf first, then intermediates)
	KeyFile  string // TLS_KEY_FILE: its private key, PEM
	CAFile   string // TLS_CA_FILE: the trust bundle, PEM
	// UnsafeNoAuth is UNSAFE_NO_AUTH: start without identity (plaintext) or grant
	// material instead of refusing to; logged at ERROR and auth_enabled reads 0.
	UnsafeNoAuth bool
}

// Bind binds the four settings to p.
func Bind(s *serve.Settings, p *Settings) {
	s.String(&p.CertFile, "TLS_CERT_FILE", "", "this workload's X.509-SVID, PEM (docs/contracts/workload-identity.md)")
	s.String(&p.KeyFile, "TLS_KEY_FILE", "", "the SVID's private key, PEM")
	s.String(&p.CAFile, "TLS_CA_FILE", "", "the trust bundle peers are verified against, PEM")
	s.Bool(&p.UnsafeNoAuth, "UNSAFE_NO_AUTH", false,
		"start without identity or grant material (plaintext, unverified callers; logged at ERROR): only for tests about something else")
}

// Enabled reports whether all three files are set: the workload speaks mutual TLS.
func (s Settings) Enabled() bool { return s.CertFile != "" && s.KeyFile != "" && s.CAFile != "" }

// Check refuses, naming the first empty setting, identity settings that leave
// the workload without mutual TLS, unless UNSAFE_NO_AUTH lifts the refusal.
func (s Settings) Check() error {
	if s.UnsafeNoAuth || s.Enabled() {
		return nil
	}
	for _, f := range []struct{ env, v string }{{"TLS_CERT_FILE", s.CertFile}, {"TLS_KEY_FILE", s.KeyFile}, {"TLS_CA_FILE", s.CAFile}} {
		if f.v == "" {
			return serve.Invalid(f.env, "must be set: every call is mutual TLS between workloads (docs/contracts/workload-identity.md); UNSAFE_NO_AUTH=true lifts the refusal, for tests only")
		}
	}
	return nil
}

// RequireMaterial refuses, naming env, an empty setting of other auth material
// (a signing key, a grant key set) unless UNSAFE_NO_AUTH lifts the refusal.
func (s Settings) RequireMaterial(env, value, what string) error {
	if value != "" || s.UnsafeNoAuth {
		return nil
	}
	return serve.Invalid(env, "must be set: %s (docs/contracts/workload-identity.md); UNSAFE_NO_AUTH=true lifts the refusal, for tests only", what)
}

// CheckURL refuses, naming env, a client's base URL whose scheme does not match
// the identity settings: https once TLS is set (a plaintext call would carry no
// identity), http or https otherwise.
func (s Settings) CheckURL(env, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return serve.Invalid(env, "must be an http or https URL with a host, got %q", redact(raw))
	}
	if s.Enabled() && u.Scheme != "https" {
		return serve.Invalid(env, "must be an https URL: TLS_CERT_FILE is set, so every call is mutual TLS, got %q", redact(raw))
	}
	return nil
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}

// ParseRole reads a role setting: comma-separated full SPIFFE IDs. An empty
// value is no one; a value that is not a SPIFFE ID is refused naming env.
func ParseRole(env, raw string) ([]spiffeid.ID, error) {
	var ids []spiffeid.ID
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, err := spiffeid.FromString(part)
		if err != nil {
			return nil, serve.Invalid(env, "must be comma-separated SPIFFE IDs (spiffe://trust-domain/name): %q: %v", part, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// ParsePeer reads a peer setting (LOCK_SERVER_ID, RAIL_PROXY_ID, …): the SPIFFE
// ID a client expects its server to present. Empty: name in td, the client's own
// trust domain.
func ParsePeer(env, raw string, td spiffeid.TrustDomain, name string) (spiffeid.ID, error) {
	if raw == "" {
		return spiffeid.FromSegments(td, name)
	}
	id, err := spiffeid.FromString(raw)
	if err != nil {
		return spiffeid.ID{}, serve.Invalid(env, "must be a SPIFFE ID (spiffe://trust-domain/name): %v", err)
	}
	return id, nil
}

// CheckPeer refuses, naming env, a peer setting that is set but not a SPIFFE
// ID; for a Validate that runs before the Source is loaded.
func CheckPeer(env, raw string) error {
	if raw == "" {
		return nil
	}
	_, err := ParsePeer(env, raw, spiffeid.TrustDomain{}, "")
	return err
}

// authDisabledEvery is how often a service without identity says so again.
const authDisabledEvery = 10 * time.Minute

// Announce exports auth_enabled (1 when enabled, else 0) in reg and, when not
// enabled, logs auth_disabled at ERROR now and every ten minutes until ctx ends,
// saying why (what is missing).
func Announce(ctx context.Context, reg prometheus.Registerer, logger *slog.Logger, enabled bool, why string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "auth_enabled",
		Help: "1 when the service verifies its callers over mutual TLS and, where grants apply, issues or verifies them; 0 under UNSAFE_NO_AUTH."})
	_ = reg.Register(g)
	if enabled {
		g.Set(1)
		return
	}
	say := func() {
		logger.Error("authentication is off: UNSAFE_NO_AUTH=true; "+why+"; any caller that can reach this service is believed",
			"event", "auth_disabled")
	}
	say()
	go func() {
		t := time.NewTicker(authDisabledEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				say()
			}
		}
	}()
}

// AuthFamilies registers auth_enabled as Announce does, for a registry built
// without running the service (deployment checks).
func AuthFamilies(reg prometheus.Registerer) {
	_ = reg.Register(prometheus.NewGauge(prometheus.GaugeOpts{Name: "auth_enabled",
		Help: "1 when the service verifies its callers over mutual TLS and, where grants apply, issues or verifies them; 0 under UNSAFE_NO_AUTH."}))
}

// IDsString is ids comma-separated, as a role setting has them: for a log line.
func IDsString(ids []spiffeid.ID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return strings.Join(s, ",")
}
