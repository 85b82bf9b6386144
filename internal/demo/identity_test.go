package demo

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
)

func runIdentityColumn(t *testing.T, unsafe bool) *IdentityResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := DefaultConfig()
	cfg.UnsafeNoAuth = unsafe
	r, err := runIdentitySite(ctx, cfg, identitySite{
		paydbURL: pgtest.PaydbURL(t), lockdbURL: pgtest.LockdbURL(t),
		keysDir: filepath.Join(t.TempDir(), "keys"), log: io.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func identityTable(r *IdentityResult) string {
	var b bytes.Buffer
	writeIdentity(&b, r)
	return b.String()
}

// rowsWant are the rows of the identity section, in order.
var rowsWant = []string{"1", "2", "3", "4a", "4b", "5", "6", "7a", "7b"}

func checkRows(t *testing.T, r *IdentityResult) {
	t.Helper()
	if len(r.Rows) != len(rowsWant) {
		t.Fatalf("%d rows, want %d:\n%s", len(r.Rows), len(rowsWant), identityTable(r))
	}
	for i, row := range r.Rows {
		if row.Row != rowsWant[i] {
			t.Errorf("row %d is %q, want %q", i, row.Row, rowsWant[i])
		}
	}
}

// With identities on every workload's attack on another is refused as
// docs/contracts/workload-identity.md says — a workload without the role 403
// FORBIDDEN, another authority's certificate at the handshake, a replayed grant
// 401 workload_mismatch, another's lease 403 NOT_LEASE_HOLDER — and nothing is
// written to lockdb or paydb nor sent to the rail; the executor's own attempts
// are refused by the books without a rail call.
func TestIdentityRowsRefusedWithIdentities(t *testing.T) {
	t.Parallel()
	r := runIdentityColumn(t, false)
	checkRows(t, r)
	if !r.Identities {
		t.Fatal("the section ran without identities")
	}
	for _, row := range r.Rows {
		if !row.Refused {
			t.Errorf("row %s (%s): %s; %s — want %s and nothing written", row.Row, row.Attack, row.answer(), row.Written, row.Want)
		}
	}
	if !r.OK || !identityVerdict(r) {
		t.Error("the section's verdict is not OK")
	}
	out := identityTable(r)
	t.Logf("\n%s\nrow 2's failure: %s", out, r.Rows[1].Error)
	for _, want := range []string{"403 FORBIDDEN; no lease in lockdb", "the TLS handshake failed", "401 GRANT_REJECTED workload_mismatch",
		"403 NOT_LEASE_HOLDER; lease unchanged", "403 NOT_LEASE_HOLDER; lease still held", "403 FORBIDDEN; no payout row",
		"409 NOT_IN_BOOKS not_found", "409 NOT_IN_BOOKS beneficiary", "identities on", "PASS"} {
		if !strings.Contains(out, want) {
			t.Errorf("the identity section lacks %q", want)
		}
	}
}

// Without identities (--unsafe-no-auth) rows 1–6 are made, and are on record
// in lockdb, paydb and the rail's log: that is what identities stop. Row 7 is
// still refused by the books.
func TestIdentityRowsMadeWithoutIdentities(t *testing.T) {
	t.Parallel()
	r := runIdentityColumn(t, true)
	checkRows(t, r)
	if r.Identities {
		t.Fatal("the section ran with identities under --unsafe-no-auth")
	}
	for _, row := range r.Rows {
		books := strings.HasPrefix(row.Row, "7")
		if books && !row.Refused {
			t.Errorf("row %s (%s): %s; %s — want the books' %s", row.Row, row.Attack, row.answer(), row.Written, row.Want)
		}
		if !books && !row.Made {
			t.Errorf("row %s (%s): %s; %s — want it made without identities", row.Row, row.Attack, row.answer(), row.Written)
		}
	}
	if !r.OK {
		t.Error("the section does not show the hazard")
	}
	if !identityVerdict(r) {
		t.Error("the exit status counts the identity rows without identities")
	}
	out := identityTable(r)
	t.Logf("\n%s", out)
	for _, want := range []string{"identities OFF", "lease written", "lease released", "payout row written", "rail call", "the hazard, as shown"} {
		if !strings.Contains(out, want) {
			t.Errorf("the identity section lacks %q", want)
		}
	}
}

// A section with identities on whose row was not refused fails the verdict.
func TestIdentityVerdictCountsOnlyIdentitiesOn(t *testing.T) {
	t.Parallel()
	on := &IdentityResult{Identities: true, Rows: []IdentityRow{{Row: "1", Refused: true}, {Row: "3", Made: true}}}
	on.OK = on.judge()
	if on.OK || identityVerdict(on) {
		t.Error("a row made with identities on passed")
	}
	off := &IdentityResult{Rows: []IdentityRow{{Row: "1", Made: true}, {Row: "7a", Made: true}}}
	off.OK = off.judge()
	if off.OK {
		t.Error("a books row made without identities shows the hazard as expected")
	}
	if !identityVerdict(off) || !identityVerdict(nil) {
		t.Error("the section without identities, or without the section, decides the exit status")
	}
}
