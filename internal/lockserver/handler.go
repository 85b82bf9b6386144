package lockserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// handler binds the calls (docs/contracts/lock-service.md) strictly, asks the
// store, and answers. Binding follows the order of docs/contracts/lock-service.md —
// content type (415), size (413), then every fault of the name, headers and body
// together (400) — and comes before any lookup, so a malformed call writes nothing.
type handler struct {
	store    *store
	metrics  *metrics
	logger   *slog.Logger
	clock    Clock
	minTTLMs int64
	maxTTLMs int64
	grants   grants // docs/contracts/signed-grants.md: the signer of every grant answered, if any
	// caller is the verified SPIFFE ID of a request's workload ("" without
	// identities): recorded as a lease's holder, the wid of its grant, and
	// the only workload that may renew or release it.
	caller func(*http.Request) string
}

// Grant history page sizes (docs/contracts/lock-service.md).
const (
	defaultGrantLimit = 100
	maxGrantLimit     = 1000
)

// leaseCall is a bound acquire, renew or release.
type leaseCall struct {
	name   string
	owner  string
	caller string // the workload's SPIFFE ID; "" without identities
	token  int64  // renew, release
	ttlMs  int64  // acquire, renew
}

// bind reads a lease call. withToken: the call presents X-Fencing-Token;
// withBody: it carries {"ttlMs"}. It answers the fault itself and returns false
// when the call is malformed.
func (h *handler) bind(w http.ResponseWriter, r *http.Request, withToken, withBody bool) (leaseCall, bool) {
	var body []byte
	if withBody {
		var fault *jsonbody.BodyFault
		if body, fault = jsonbody.ReadJSONBody(r); fault != nil {
			lockapi.WriteInvalid(w, fault.Status, fault.Errors)
			return leaseCall{}, false
		}
	}
	var c leaseCall
	errs := nameFaults(r)
	c.name = r.PathValue("name")
	f, herrs := lockapi.ParseFencingHeaders(r.Header, withToken, true, false)
	errs = append(errs, herrs...)
	c.owner, c.token = f.OwnerID, f.Token
	c.caller = h.caller(r)
	if withBody {
		c.ttlMs, errs = h.bindTTL(body, errs)
	}
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return leaseCall{}, false
	}
	return c, true
}

// bindTTL parses {"ttlMs": n} with n within the configured bounds, and nothing else.
func (h *handler) bindTTL(body []byte, errs []lockapi.FieldError) (int64, []lockapi.FieldError) {
	o, ferrs := jsonbody.ParseObject(body)
	if ferrs != nil {
		return 0, append(errs, ferrs...)
	}
	ttl, _ := o.Int64("ttlMs", true, h.minTTLMs, h.maxTTLMs)
	return ttl, append(errs, o.Finish()...)
}

func nameFaults(r *http.Request) []lockapi.FieldError {
	if err := lockapi.ValidateLockName(r.PathValue("name")); err != nil {
		return []lockapi.FieldError{{Field: "name", Problem: problemText(err)}}
	}
	return nil
}

// problemText is a validation error as the short sentence of errors[].problem.
func problemText(err error) string {
	return strings.TrimPrefix(err.Error(), lockapi.ErrInvalid.Error()+": ")
}

func (h *handler) acquire(w http.ResponseWriter, r *http.Request) {
	c, ok := h.bind(w, r, false, true)
	if !ok {
		return
	}
	start := h.clock.Now()
	l, err := h.store.grant(r.Context(), c.name, c.owner, c.caller, c.ttlMs)
	var held *HeldError
	switch {
	case err == nil:
		h.metrics.grant.WithLabelValues(resultGranted).Inc()
		h.logger.Info("lock granted", "event", "lock_granted", "lockName", c.name, "ownerId", c.owner, "identity", c.caller,
			"token", l.Token, "ttlMs", c.ttlMs, "expiresAt", lockapi.UTC(l.ExpiresAt), "durationMs", ms(since(h.clock, start)))
		h.writeLease(w, "acquire", l, c.ttlMs)
		return
	case errors.As(err, &held):
		h.metrics.grant.WithLabelValues(resultHeld).Inc()
		h.logger.Debug("lock held", "event", "lock_held", "lockName", c.name, "ownerId", c.owner, "holder", held.Holder)
	}
	h.writeError(w, "acquire", c, err)
}

func (h *handler) renew(w http.ResponseWriter, r *http.Request) {
	c, ok := h.bind(w, r, true, true)
	if !ok {
		return
	}
	start := h.clock.Now()
	l, err := h.store.renew(r.Context(), c.name, c.owner, c.caller, c.token, c.ttlMs)
	switch {
	case err == nil:
		h.metrics.renew.WithLabelValues(resultRenewed).Inc()
		h.logger.Debug("lease renewed", "event", "lease_renewed", "lockName", c.name, "ownerId", c.owner,
			"token", c.token, "expiresAt", lockapi.UTC(l.ExpiresAt), "durationMs", ms(since(h.clock, start)))
		h.writeLease(w, "renew", l, c.ttlMs)
		return
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
		h.metrics.renew.WithLabelValues(resultLost).Inc()
	}
	h.writeError(w, "renew", c, err)
}

func (h *handler) release(w http.ResponseWriter, r *http.Request) {
	// Release has no body: its Content-Type and body are not looked at
	// (docs/contracts/lock-service.md).
	c, ok := h.bind(w, r, true, false)
	if !ok {
		return
	}
	start := h.clock.Now()
	first, err := h.store.release(r.Context(), c.name, c.owner, c.caller, c.token)
	switch {
	case err == nil:
		h.metrics.release.WithLabelValues(resultReleased).Inc()
		h.logger.Info("lock released", "event", "lock_released", "lockName", c.name, "ownerId", c.owner,
			"token", c.token, "repeat", !first, "durationMs", ms(since(h.clock, start)))
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
		h.metrics.release.WithLabelValues(resultLost).Inc()
	}
	h.writeError(w, "release", c, err)
}

func (h *handler) getLock(w http.ResponseWriter, r *http.Request) {
	errs := append(nameFaults(r), queryFaults(r.URL.Query(), nil)...)
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	name := r.PathValue("name")
	st, err := h.store.lock(r.Context(), name)
	if err != nil {
		h.writeError(w, "read lock", leaseCall{name: name}, err)
		return
	}
	// No grant: only acquire and renew answer it, to the holder; a lock's state
	// is read by other workloads too (docs/contracts/workload-identity.md).
	out := lockapi.LockState{LockName: st.Name, Token: st.Token, Held: st.Held}
	if st.Held {
		out.OwnerID = &st.Owner
	}
	if !st.ExpiresAt.IsZero() {
		t := lockapi.UTC(st.ExpiresAt)
		out.ExpiresAt = &t
	}
	lockapi.WriteJSON(w, http.StatusOK, out)
}

func (h *handler) getGrants(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	errs := append(nameFaults(r), queryFaults(q, map[string]bool{"limit": true})...)
	limit, lerr := parseLimit(q)
	if lerr != nil {
		errs = append(errs, *lerr)
	}
	if len(errs) > 0 {
		lockapi.WriteInvalid(w, http.StatusBadRequest, errs)
		return
	}
	name := r.PathValue("name")
	gs, err := h.store.grants(r.Context(), name, limit)
	if err != nil {
		h.writeError(w, "read grants", leaseCall{name: name}, err)
		return
	}
	out := lockapi.GrantList{Grants: make([]lockapi.Grant, 0, len(gs))}
	for _, g := range gs {
		out.Grants = append(out.Grants, lockapi.Grant{Token: g.Token, OwnerID: g.Owner,
			AcquiredAt: lockapi.UTC(g.AcquiredAt), TTLMs: g.TTLMs, ReleasedAt: lockapi.UTCPtr(g.ReleasedAt),
			HolderIdentity: g.Holder})
	}
	lockapi.WriteJSON(w, http.StatusOK, out)
}

// queryFaults rejects query parameters the call does not know: a misspelt
// parameter silently ignored would answer a question nobody asked.
func queryFaults(q url.Values, known map[string]bool) []lockapi.FieldError {
	var errs []lockapi.FieldError
	for k := range q {
		if !known[k] {
			errs = append(errs, lockapi.FieldError{Field: k, Problem: "is not a known query parameter"})
		}
	}
	return errs
}

// parseLimit reads ?limit=: once, a decimal integer 1…1000 without sign or
// leading zero; absent means 100.
func parseLimit(q url.Values) (int, *lockapi.FieldError) {
	vs, ok := q["limit"]
	if !ok {
		return defaultGrantLimit, nil
	}
	bad := &lockapi.FieldError{Field: "limit", Problem: fmt.Sprintf("must be an integer between 1 and %d, given once", maxGrantLimit)}
	if len(vs) != 1 || vs[0] == "" || vs[0][0] < '1' || vs[0][0] > '9' || len(vs[0]) > 4 {
		return 0, bad
	}
	n, err := strconv.Atoi(vs[0])
	if err != nil || n > maxGrantLimit {
		return 0, bad
	}
	return n, nil
}

// writeError is the one table from a store outcome to a problem answer.
func (h *handler) writeError(w http.ResponseWriter, op string, c leaseCall, err error) {
	var held *HeldError
	var p *lockapi.Problem
	switch {
	case errors.As(err, &held):
		p = lockapi.NewProblemCode(lockapi.CodeLockHeld,
			fmt.Sprintf("lock %s is held until %s", c.name, lockapi.UTC(held.ExpiresAt).Format(time.RFC3339Nano)),
			map[string]any{"holder": held.Holder, "expiresAt": lockapi.UTC(held.ExpiresAt)})
	case errors.Is(err, ErrLeaseLost):
		h.logger.Info("lease lost", "event", "lease_lost", "op", op, "lockName", c.name, "ownerId", c.owner, "token", c.token)
		p = lockapi.NewProblemCode(lockapi.CodeLeaseLost,
			fmt.Sprintf("token %d of owner %s is not the current unexpired grant of lock %s", c.token, c.owner, c.name), nil)
	case errors.Is(err, ErrNotLeaseHolder):
		h.logger.Warn("lease call refused: another workload acquired the lease; nothing changed", "event", "not_lease_holder",
			"op", op, "lockName", c.name, "ownerId", c.owner, "token", c.token, "identity", c.caller)
		p = lockapi.NewProblemCode(lockapi.CodeNotLeaseHolder,
			fmt.Sprintf("token %d of lock %s was acquired by another workload than this one", c.token, c.name),
			map[string]any{"identity": c.caller})
	case errors.Is(err, ErrNotFound):
		p = lockapi.NewProblemCode(lockapi.CodeNotFound,
			fmt.Sprintf("lock %s has never been granted", c.name), nil)
	case errors.Is(err, ErrUnavailable):
		h.logger.Warn("lockdb unavailable", "op", op, "lockName", c.name, "error", err.Error())
		p = lockapi.NewProblemCode(lockapi.CodeUnavailable,
			"lockdb could not be reached in time: the call may or may not have taken effect "+
				"(a renew or release can be repeated; a grant nobody learned of ends with its TTL)", nil)
	default:
		h.logger.Error("internal error", "op", op, "lockName", c.name, "error", err.Error())
		p = lockapi.NewProblemCode(lockapi.CodeInternal, "internal error", nil)
	}
	lockapi.WriteProblem(w, p)
}

// writeLease answers an acquire or renewal with its grant
// (docs/contracts/signed-grants.md), whose wid is the workload that acquired
// the lease (docs/contracts/workload-identity.md). A grant that cannot be signed is a 500: the
// lease stands in lockdb and ends with its TTL.
func (h *handler) writeLease(w http.ResponseWriter, op string, l Lease, ttlMs int64) {
	dto := leaseDTO(l, ttlMs)
	g, err := h.grants.sign(l.Name, l.Token, l.Owner, l.Holder, l.AcquiredAt)
	if err != nil {
		h.writeError(w, op+": sign grant", leaseCall{name: l.Name, owner: l.Owner, token: l.Token}, err)
		return
	}
	dto.Grant = g
	lockapi.WriteJSON(w, http.StatusOK, dto)
}

func leaseDTO(l Lease, ttlMs int64) lockapi.Lease {
	return lockapi.Lease{LockName: l.Name, OwnerID: l.Owner, Token: l.Token,
		AcquiredAt: lockapi.UTC(l.AcquiredAt), ExpiresAt: lockapi.UTC(l.ExpiresAt), TTLMs: ttlMs}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
