package payment

import (
	"maps"
	"net/url"
	"slices"
	"strconv"
	"time"

	"lock.dev/internal/jsonbody"
	"lock.dev/lockapi"
)

// Request binding: every fault is collected, nothing touches paydb.

// Bounds the contract leaves open (docs/contracts/payments.md).
const (
	DefaultListLimit       = 100
	MaxListLimit           = 1000
	fieldPayoutID          = "payoutId"
	problemUnknownQueryArg = "is not a known parameter"
)

func checkPayoutID(id string) []lockapi.FieldError {
	if err := lockapi.ValidateIdentifier(id); err != nil {
		return []lockapi.FieldError{{Field: fieldPayoutID, Problem: lockapi.ProblemText(err)}}
	}
	return nil
}

// parsePostRequest binds a post's body: outcome required (PAID, DECLINED,
// AMBIGUOUS); railReference and declineReason optional and nullable. A PAID
// outcome needs a railReference and takes no declineReason.
func parsePostRequest(b []byte) (postUpdate, []lockapi.FieldError) {
	var u postUpdate
	o, errs := jsonbody.ParseObject(b)
	if errs != nil {
		return u, errs
	}
	outcome, outcomeOK := o.String("outcome", true, false, validateOutcome)
	ref, refOK := o.String("railReference", false, true, validateRailReference)
	reason, reasonOK := o.String("declineReason", false, true, validateDeclineReason)
	errs = o.Finish()
	u.Outcome = outcome
	if refOK {
		u.RailReference = &ref
	}
	if reasonOK {
		u.DeclineReason = &reason
	}
	if outcomeOK && outcome == lockapi.StatusPaid {
		if !refOK && !hasFault(errs, "railReference") {
			errs = append(errs, lockapi.FieldError{Field: "railReference", Problem: "is required when outcome is PAID"})
		}
		if reasonOK {
			errs = append(errs, lockapi.FieldError{Field: "declineReason", Problem: "must be absent or null when outcome is PAID"})
		}
	}
	return u, errs
}

func validateOutcome(s string) error {
	switch s {
	case lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusAmbiguous:
		return nil
	}
	return fault("must be PAID, DECLINED or AMBIGUOUS")
}

// validateRailReference and validateDeclineReason take the rail's words as
// rail-proxy relays them, but only as storable text: paydb must store them and
// people must read them as the rail gave them (lockapi.ValidateRailReference,
// lockapi.ValidateDeclineReason; docs/contracts/payments.md). rail-proxy never
// answers an accept or decline with other text, so a post carrying it is a bug
// to refuse, not a payment to record. An empty declineReason is kept as given.
func validateRailReference(s string) error { return lockapi.ValidateRailReference(s) }

func validateDeclineReason(s string) error { return lockapi.ValidateDeclineReason(s) }

func hasFault(errs []lockapi.FieldError, field string) bool {
	for _, e := range errs {
		if e.Field == field {
			return true
		}
	}
	return false
}

// parseListQuery binds GET /v1/payouts: status, accountId, updatedBefore, limit;
// each at most once and not empty; nothing else.
func parseListQuery(q url.Values) (listFilter, []lockapi.FieldError) {
	f := listFilter{Limit: DefaultListLimit}
	var errs []lockapi.FieldError
	add := func(field, p string) { errs = append(errs, lockapi.FieldError{Field: field, Problem: p}) }
	for _, name := range slices.Sorted(maps.Keys(q)) {
		switch name {
		case "status", "accountId", "updatedBefore", "limit":
		default:
			add(name, problemUnknownQueryArg)
		}
	}
	get := func(name string) (string, bool) {
		vs, ok := q[name]
		switch {
		case !ok:
			return "", false
		case len(vs) > 1:
			add(name, "must appear at most once")
			return "", false
		case vs[0] == "":
			add(name, "must not be empty when given")
			return "", false
		}
		return vs[0], true
	}
	if v, ok := get("status"); ok {
		switch v {
		case lockapi.StatusPending, lockapi.StatusClaimed, lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusAmbiguous,
			lockapi.StatusNotPresented:
			f.Status = v
		default:
			add("status", "must be PENDING, CLAIMED, PAID, DECLINED, AMBIGUOUS or NOT_PRESENTED")
		}
	}
	if v, ok := get("accountId"); ok {
		if err := lockapi.ValidateIdentifier(v); err != nil {
			add("accountId", lockapi.ProblemText(err))
		} else {
			f.AccountID = v
		}
	}
	if v, ok := get("updatedBefore"); ok {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			add("updatedBefore", "must be an RFC 3339 timestamp, e.g. 2025-01-02T15:04:05.123456Z")
		} else {
			t = t.UTC()
			f.UpdatedBefore = &t
		}
	}
	if v, ok := get("limit"); ok {
		n, err := strconv.Atoi(v)
		// Canonical digits only, as for JSON integers: no sign, no leading zero.
		if err != nil || strconv.Itoa(n) != v || n < 1 || n > MaxListLimit {
			add("limit", "must be an integer between 1 and "+strconv.Itoa(MaxListLimit))
		} else {
			f.Limit = n
		}
	}
	return f, errs
}

type faultError string

func (e faultError) Error() string { return string(e) }

func fault(p string) error { return faultError(p) }
