package executor

import (
	"net/http"
	"strings"
	"testing"

	"lock.dev/lockapi"
)

// The executor never posts a rail reference or decline reason that is not
// storable text (docs/contracts/executor.md): whether an older rail-proxy
// answered with it or an audit row carries it, the payout is posted AMBIGUOUS,
// without the words, and the statement settles it.
func TestVerdictNeverPostsUnstorableText(t *testing.T) {
	t.Parallel()
	const token = 7
	acceptedWith := func(ref string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			lockapi.WriteJSON(w, 200, lockapi.SubmissionAccepted{SubmissionID: 1, PayoutID: "p-1", AccountID: "acct-1",
				PresentedToken: token, Outcome: "ACKED", RailReference: ref})
		}
	}
	cases := []struct {
		name  string
		proxy scriptedProxy
	}{
		{"200 with a NUL in the reference", scriptedProxy{submit: acceptedWith("RS-\x00-1")}},
		{"200 with a reference over 35 characters", scriptedProxy{submit: acceptedWith(strings.Repeat("R", 36))}},
		{"RAIL_REJECTED with a control character in the reason", scriptedProxy{submit: problemAnswer(422, lockapi.CodeRailRejected,
			map[string]any{"submissionId": 1, "declineReason": "limit\u0001"})}},
		{"DUPLICATE whose first reference has a C1 control", scriptedProxy{submit: problemAnswer(409, lockapi.CodeDuplicateSubmission,
			dupeMembers("ACKED", "RS-\u0085", nil))}},
		{"no answer, trail ACKED with a tab in the reference", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "ACKED", "RS\t9", "")}}},
		{"no answer, trail REJECTED with a reason over 140 characters", scriptedProxy{submit: hangUp,
			trail: []lockapi.Submission{row(1, token, "REJECTED", "", strings.Repeat("x", 141))}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := verdictAgainst(t, tc.proxy, token)
			if v.result != resultAmbiguous || postOutcome(v.post) != lockapi.StatusAmbiguous {
				t.Fatalf("counted %q, posts %s (%s); want %q posting AMBIGUOUS", v.result, postOutcome(v.post), v.why, resultAmbiguous)
			}
			if v.post.RailReference != nil || v.post.DeclineReason != nil {
				t.Fatalf("posts reference %q reason %q; want neither", deref(v.post.RailReference), deref(v.post.DeclineReason))
			}
		})
	}
}
