package fence

import (
	"context"
	"errors"
	"net/http"

	"lock.dev/lockapi"
)

// LockFunc names the lock whose fencing token a request presents — the lock the
// handler's write is fenced on, such as "ledger:" + r.PathValue("account"). An
// error, or a name that is not a lock name, is answered 400 INVALID_REQUEST with
// the error's text: the request names nothing that can be fenced.
type LockFunc func(r *http.Request) (string, error)

// Option changes what Middleware checks or reports.
type Option func(*options)

type options struct {
	plaintext        bool
	acceptWithoutWid bool
	onRefusal        func(r *http.Request, status int, err error)
}

// WithoutMutualTLS says the resource serves plaintext, so no caller has a
// workload identity to compare a grant's wid with, and none is asked for. Without
// it, a request that did not come over a mutual TLS connection is refused
// (workload_mismatch): a plaintext listener wired in front of the middleware by
// mistake fails closed instead of accepting grants any workload may have copied.
// Use it only where the whole deployment runs without workload identity, and say
// so (lock.dev's own services call that UNSAFE_NO_AUTH).
func WithoutMutualTLS() Option { return func(o *options) { o.plaintext = true } }

// AcceptGrantsWithoutWorkload lets a grant without wid pass, comparing wid only
// when present: for the step of a rollout where resources already compare and
// lock-server does not yet write wid (docs/contracts/workload-identity.md).
// Without it a grant without wid is refused (workload_mismatch).
func AcceptGrantsWithoutWorkload() Option { return func(o *options) { o.acceptWithoutWid = true } }

// OnRefusal calls f after each refusal has been answered, with the status
// answered (400 or 401) and why: for a 401 a *Rejection, whose Reason is the
// label to count by. It is where a service logs and counts refusals; neither the
// error nor the request's grant is meant to be logged whole — log the reason,
// the lock and the presented token.
func OnRefusal(f func(r *http.Request, status int, err error)) Option {
	return func(o *options) { o.onRefusal = f }
}

// Middleware guards a handler that writes under a fencing token. For each
// request it
//
//  1. reads X-Fencing-Token and X-Owner-Id strictly (each exactly once, the
//     token a positive decimal int64, the owner 1–128 characters of
//     [A-Za-z0-9._:@/-]) and the lock name lock derives from the request — any
//     fault is 400 INVALID_REQUEST listing every fault;
//  2. verifies X-Fencing-Grant (exactly once) with v for that lock, token and
//     owner;
//  3. over mutual TLS, compares the grant's wid with the caller's SPIFFE ID
//     (PeerID of r.TLS); a request without a verified client certificate is
//     refused unless WithoutMutualTLS;
//
// and answers a refusal 401 GRANT_REJECTED as application/problem+json with
// member reason and the header WWW-Authenticate: Challenge, calling nothing
// further. A request that passes reaches next with the grant's claims in its
// context (FromContext).
//
// The middleware proves the token is real; it cannot know whether it is stale.
// That is the resource's comparison, made in the same transaction as its
// write: the claims' Token against the highest token the resource has seen for
// that lock (package lock.dev/fence/fencepg for PostgreSQL).
func Middleware(v *Verifier, lock LockFunc, opts ...Option) func(http.Handler) http.Handler {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if v == nil || lock == nil {
				// A guard built without a verifier guards nothing: fail closed.
				lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeInternal, "the fencing guard has no grant verifier", nil))
				return
			}
			f, faults := lockapi.ParseFencingHeaders(r.Header, true, true, false)
			name, err := lock(r)
			if err == nil {
				err = lockapi.ValidateLockName(name)
			}
			if err != nil {
				faults = append(faults, lockapi.FieldError{Field: "lock", Problem: lockapi.ProblemText(err)})
			}
			if len(faults) > 0 {
				lockapi.WriteInvalid(w, http.StatusBadRequest, faults)
				o.refused(r, http.StatusBadRequest, errors.New(faults[0].Field+": "+faults[0].Problem))
				return
			}
			c, rej := o.check(v, r, Presented{Lock: name, Token: f.Token, Owner: f.OwnerID})
			if rej != nil {
				WriteRejection(w, rej)
				o.refused(r, http.StatusUnauthorized, rej)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimsKey{}, c)))
		})
	}
}

// check is steps 2 and 3: the grant, then the workload.
func (o *options) check(v *Verifier, r *http.Request, p Presented) (Claims, *Rejection) {
	g := ""
	switch vs := r.Header.Values(lockapi.HeaderFencingGrant); len(vs) {
	case 0:
	case 1:
		g = vs[0]
	default:
		// A second grant is a second opinion about who presents which token.
		return Claims{}, reject(ReasonMalformed, "X-Fencing-Grant must appear exactly once")
	}
	c, rej := v.verify(g, p)
	if rej != nil || o.plaintext {
		return c, rej
	}
	peer, err := PeerID(r.TLS)
	if err != nil {
		// Checked before wid itself: without a peer there is nobody to bind the
		// grant to, whatever the grant says.
		return Claims{}, reject(ReasonWorkloadMismatch, "the caller presents no verified workload identity")
	}
	if rej := matchWorkload(c, peer.String(), !o.acceptWithoutWid); rej != nil {
		return Claims{}, rej
	}
	return c, nil
}

func (o *options) refused(r *http.Request, status int, err error) {
	if o.onRefusal != nil {
		o.onRefusal(r, status, err)
	}
}

// WriteRejection answers rej as lock.dev's fence points do: 401 problem code
// GRANT_REJECTED with member reason, header WWW-Authenticate: Challenge. For a
// resource that can only name the lock once it has read its own row, and so
// calls Verifier.Verify in its handler rather than through Middleware.
func WriteRejection(w http.ResponseWriter, rej *Rejection) {
	w.Header().Set("WWW-Authenticate", Challenge)
	lockapi.WriteProblem(w, lockapi.NewProblemCode(lockapi.CodeGrantRejected,
		rej.Detail, map[string]any{"reason": rej.Reason}))
}

// claimsKey is the context key of the verified claims.
type claimsKey struct{}

// FromContext returns the claims of the grant Middleware verified for the
// request whose context ctx is, and false when no grant was verified.
func FromContext(ctx context.Context) (Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(Claims)
	return c, ok
}
