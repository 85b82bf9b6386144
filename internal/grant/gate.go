package grant

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/fence"
	"lock.dev/internal/identity"
	"lock.dev/lockapi"
)

// Challenge is the WWW-Authenticate header of every 401 GRANT_REJECTED.
const Challenge = fence.Challenge

// Gate is the grant check a fence point runs on each fenced request, after the
// request's own validation (a malformed request stays 400) and before anything
// is written or forwarded. Without a key set it lets every request through
// (tokens unverified), and says so at start-up. It is safe for concurrent use.
type Gate struct {
	verifier *fence.Verifier // nil: grants are not verified
	rejected *prometheus.CounterVec
	// withoutWid counts grants accepted without wid (GRANT_WID_REQUIRED=false,
	// a rolling upgrade): when it stays at zero the setting can be turned on.
	withoutWid prometheus.Counter
	logger     *slog.Logger

	// workloadBound: the fence point serves mutual TLS, so a grant's wid is
	// compared with the caller's SPIFFE ID (docs/contracts/workload-identity.md).
	workloadBound bool
	// widRequired is GRANT_WID_REQUIRED: a grant without wid is refused
	// (workload_mismatch) rather than accepted and logged (grant_without_wid).
	widRequired bool
}

// BindWorkload sets whether a grant's wid is compared with the caller's
// verified SPIFFE ID (bound: the service serves mutual TLS) and whether a grant
// without wid is refused (widRequired, GRANT_WID_REQUIRED).
func (g *Gate) BindWorkload(bound, widRequired bool) {
	g.workloadBound, g.widRequired = bound, widRequired
}

// NewGate checks grants with keys, or with nothing when keys is nil. It registers
// grant_rejected_total{reason} in reg with every reason at zero (docs/contracts/observability.md),
// and grant_without_wid_total at zero, also when it checks nothing: the series
// says so by staying at zero.
func NewGate(keys *KeySet, cacheSize int, reg prometheus.Registerer, logger *slog.Logger) (*Gate, error) {
	g := &Gate{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grant_rejected_total",
			Help: "Fenced requests refused because their grant did not prove the token (docs/contracts/signed-grants.md), by reason.",
		}, []string{"reason"}),
		withoutWid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grant_without_wid_total",
			Help: "Grants accepted without wid because GRANT_WID_REQUIRED is false (docs/contracts/workload-identity.md).",
		}),
		logger: logger,
	}
	if err := reg.Register(g.rejected); err != nil {
		return nil, fmt.Errorf("register grant_rejected_total: %w", err)
	}
	if err := reg.Register(g.withoutWid); err != nil {
		return nil, fmt.Errorf("register grant_without_wid_total: %w", err)
	}
	for _, r := range Reasons {
		g.rejected.WithLabelValues(r)
	}
	if keys != nil {
		v, err := fence.NewVerifier(keys, cacheSize)
		if err != nil {
			return nil, err
		}
		g.verifier = v
	}
	return g, nil
}

// Verifying reports whether grants are checked (a nil Gate checks nothing).
func (g *Gate) Verifying() bool { return g != nil && g.verifier != nil }

// Announce logs at start-up what the gate does: the key ids it verifies with, or,
// at WARN (event grants_not_verified), that setting is empty and any made-up
// token is taken at its word.
func (g *Gate) Announce(setting string, ignoredKeys int) {
	if g.verifier == nil {
		g.logger.Warn("grants are not verified: "+setting+" is empty, so a fencing token is taken at its word "+
			"and anyone who can reach this service can present any token for any account (docs/contracts/signed-grants.md)",
			"event", "grants_not_verified", "setting", setting)
		return
	}
	g.logger.Info("grants are verified", "event", "grants_verified", "setting", setting,
		"keyIds", g.verifier.Keys().IDs(), "ignoredKeys", ignoredKeys)
}

// Fenced is what a fenced request presents besides its grant.
type Fenced struct {
	AccountID string // the account whose lock the token must come from
	PayoutID  string // for the log
	Token     int64  // X-Fencing-Token
	OwnerID   string // X-Owner-Id
}

// Check verifies r's X-Fencing-Grant for f. It returns true when the request may
// go on. Otherwise it has answered 401 GRANT_REJECTED with the reason, counted it
// and logged it (never the grant), and the caller must do nothing more: nothing
// written, nothing forwarded.
//
// On a workload-bound gate the grant's wid must then name the caller's verified
// SPIFFE ID (workload_mismatch otherwise, also for a caller with none): a grant
// read or copied by another workload is worthless to it. A grant without wid is
// refused the same way when wid is required, else accepted, logged
// (grant_without_wid) and counted. The cache remembers claims, not verdicts, so
// wid is compared on every request.
func (g *Gate) Check(w http.ResponseWriter, r *http.Request, f Fenced) bool {
	if !g.Verifying() {
		return true
	}
	var err error
	var c Claims
	switch vs := r.Header.Values(lockapi.HeaderFencingGrant); {
	case len(vs) > 1:
		// A second grant is a second opinion about who presents which token.
		err = &Rejection{Reason: ReasonMalformed, Detail: "X-Fencing-Grant must appear exactly once"}
	case len(vs) == 0:
		_, err = g.verifier.Verify("", Presented{})
	default:
		c, err = g.verifier.Verify(vs[0], Presented{Lock: lockapi.AccountLockName(f.AccountID), Token: f.Token, Owner: f.OwnerID})
	}
	if err == nil && g.workloadBound {
		err = g.checkWorkload(r, c, f)
	}
	if err == nil {
		return true
	}
	rej, ok := err.(*Rejection) // the kit answers nothing else
	if !ok {
		rej = &Rejection{Reason: ReasonMalformed, Detail: err.Error()}
	}
	g.rejected.WithLabelValues(rej.Reason).Inc()
	g.logger.Warn("grant rejected: nothing written, nothing forwarded", "event", "grant_rejected",
		"reason", rej.Reason, "accountId", f.AccountID, "payoutId", f.PayoutID, "ownerId", f.OwnerID,
		"presentedToken", f.Token, "route", r.Pattern, "detail", rej.Detail)
	fence.WriteRejection(w, rej)
	return false
}

// checkWorkload compares the verified grant's wid with r's caller
// (fence.MatchWorkload). The caller's identity is identity.PeerID's, not the
// kit's: the project's servers terminate TLS in their own listener, so r.TLS is
// nil there. A grant without wid accepted under GRANT_WID_REQUIRED=false is
// logged and counted here, the project's own part.
func (g *Gate) checkWorkload(r *http.Request, c Claims, f Fenced) error {
	peer, err := identity.PeerID(r)
	caller := ""
	if err == nil {
		caller = peer.String()
	}
	if c.Workload == "" && !g.widRequired {
		g.withoutWid.Inc()
		g.logger.Info("grant accepted without wid: GRANT_WID_REQUIRED is false; it names no workload, so any workload holding it may use it",
			"event", "grant_without_wid", "accountId", f.AccountID, "ownerId", f.OwnerID, "presentedToken", f.Token, "identity", caller)
		return nil
	}
	return fence.MatchWorkload(c, caller, g.widRequired)
}
