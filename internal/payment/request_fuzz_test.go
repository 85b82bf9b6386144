package payment

import (
	"net/url"
	"strings"
	"testing"

	"lock.dev/lockapi"
)

// The post body binder never panics; whatever it accepts is a post the store
// can record (a final outcome; PAID with a railReference and no declineReason);
// whatever it refuses says what is wrong. Seeds: the catalogue of
// TestBadInputsWriteNothing's post bodies plus good ones. Run longer with
// go test -fuzz FuzzParsePostRequest ./internal/payment
func FuzzParsePostRequest(f *testing.F) {
	for _, s := range []string{
		`{"outcome":"PAID","railReference":"RS-1"}`,
		`{"outcome":"DECLINED","declineReason":"insufficient funds"}`,
		`{"outcome":"AMBIGUOUS","railReference":null,"declineReason":null}`,
		`{"outcome":"PAID"}`, `{"outcome":"PAID","railReference":null}`, `{"outcome":"paid"}`,
		`{"outcome":"PAID","railReference":"RS-2","declineReason":"x"}`, `{"outcome":"DECLINED","railReference":""}`,
		`{"outcome":"DECLINED","amountMinor":1}`, `{"outcome":1}`, `{}`, `[]`, `{"outcome":"PAID"} {}`,
		`{"outcome":"PAID","outcome":"DECLINED"}`, `{"railReference":"\u0000"}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, errs := parsePostRequest(b)
		for _, e := range errs {
			// Field may be "": it is the member's name, and JSON allows "" as one.
			if e.Problem == "" {
				t.Fatalf("fault without a problem: %+v", e)
			}
		}
		if len(errs) > 0 {
			return
		}
		switch u.Outcome {
		case lockapi.StatusPaid:
			if u.RailReference == nil || *u.RailReference == "" || u.DeclineReason != nil {
				t.Fatalf("accepted PAID post %+v", u)
			}
		case lockapi.StatusDeclined, lockapi.StatusAmbiguous:
		default:
			t.Fatalf("accepted outcome %q", u.Outcome)
		}
		for _, s := range []*string{u.RailReference, u.DeclineReason} {
			if s != nil && strings.ContainsRune(*s, 0) {
				t.Fatalf("accepted text %q", *s)
			}
		}
	})
}

// The list query binder never panics and accepts only what the store can run.
func FuzzParseListQuery(f *testing.F) {
	for _, s := range []string{
		"", "status=PENDING&accountId=acct-1&updatedBefore=2025-01-02T03:04:05.123456789Z&limit=1000",
		"limit=0", "limit=1001", "limit=ten", "limit=010", "status=DONE", "accountId=a%20b",
		"updatedBefore=yesterday", "status=PENDING&status=PAID", "status=", "offset=5",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		lf, errs := parseListQuery(q)
		if len(errs) > 0 {
			return
		}
		if lf.Limit < 1 || lf.Limit > MaxListLimit {
			t.Fatalf("accepted limit %d", lf.Limit)
		}
		if lf.AccountID != "" && lockapi.ValidateIdentifier(lf.AccountID) != nil {
			t.Fatalf("accepted accountId %q", lf.AccountID)
		}
		switch lf.Status {
		case "", lockapi.StatusPending, lockapi.StatusClaimed, lockapi.StatusPaid, lockapi.StatusDeclined, lockapi.StatusAmbiguous:
		default:
			t.Fatalf("accepted status %q", lf.Status)
		}
		if lf.UpdatedBefore != nil && lf.UpdatedBefore.Location().String() != "UTC" {
			t.Fatalf("updatedBefore not in UTC: %v", lf.UpdatedBefore)
		}
	})
}
