package dbconn

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The warning is recognised by its text, or — on a server whose lc_messages
// translates it — by severity WARNING with SQLSTATE 01000 or 57P01. Notices that
// are not warnings are not.
func TestSyncRepCancelledRecognisesTheWarning(t *testing.T) {
	for _, c := range []struct {
		n    pgconn.Notice
		want bool
	}{
		{pgconn.Notice{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000", Message: syncRepCancelMessage, Detail: syncRepDetail}, true},
		{pgconn.Notice{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "57P01", Message: syncRepTerminateMessage, Detail: syncRepDetail}, true},
		{pgconn.Notice{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "01000", Message: "breche Warten auf synchrone Replikation ab"}, true},
		{pgconn.Notice{Severity: "ATTENTION", SeverityUnlocalized: "WARNING", Code: "57P01", Message: "annulation de l'attente"}, true},
		{pgconn.Notice{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: "relation already exists, skipping"}, false},
		{pgconn.Notice{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "25P01", Message: "there is no transaction in progress"}, false},
	} {
		n := c.n
		if got := syncRepCancelled(&n); got != c.want {
			t.Errorf("%s %s %q: %v, want %v", n.SeverityUnlocalized, n.Code, n.Message, got, c.want)
		}
	}
}
