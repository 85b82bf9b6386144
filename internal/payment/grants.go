package payment

import (
	"context"
	"net/http"

	"lock.dev/internal/grant"
	"lock.dev/lockapi"
)

// checkGrant applies docs/contracts/signed-grants.md at fence point (a), between the
// request's validation and any write. The grant must be of the payout's own
// account, so the payout is read first: an unknown payout stays 404 NOT_FOUND, and
// only then does a grant that does not prove the token answer 401 — before
// PAYOUT_FINAL and FENCED_OUT, so a caller without a grant learns nothing about the
// payout's state. A payout's account never changes, so the read cannot go stale
// before the write. It returns false when it has answered.
func (h *handlers) checkGrant(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, f lockapi.Fencing) bool {
	if !h.grants.Verifying() {
		return true
	}
	p, err := h.store.Get(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return false
	}
	return h.grants.Check(w, r, grant.Fenced{AccountID: p.AccountID, PayoutID: id, Token: f.Token, OwnerID: f.OwnerID})
}
