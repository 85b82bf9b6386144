package lockserver

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// rfc3339NanoUTC is how every timestamp must look on the wire.
var rfc3339NanoUTC = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$`)

// The whole life of one lock through the API: shapes, times from lockdb, the
// holder answer, renewal moving both rows, release, a second grant.
func TestLeaseLifecycle(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.LockdbURL(t)
	pool := pgtest.Pool(t, dbURL)
	s := startServer(t, testConfig(dbURL))
	ctx := context.Background()
	const name = "account:acct-7"

	before := dbNow(t, pool)
	a, l, err := acquireCall(s.URL, name, "worker-1", 15000)
	after := dbNow(t, pool)
	if err != nil || a.Status != http.StatusOK {
		t.Fatalf("acquire: %v %v", a, err)
	}
	if ct := a.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var raw map[string]any
	if err := json.Unmarshal(a.Body, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"lockName", "ownerId", "token", "acquiredAt", "expiresAt", "ttlMs"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("acquire answer lacks %s: %s", k, a.Body)
		}
	}
	if len(raw) != 6 {
		t.Errorf("acquire answer has %d members, want 6: %s", len(raw), a.Body)
	}
	for _, k := range []string{"acquiredAt", "expiresAt"} {
		if s, _ := raw[k].(string); !rfc3339NanoUTC.MatchString(s) {
			t.Errorf("%s = %q, want RFC 3339 UTC", k, raw[k])
		}
	}
	if l.LockName != name || l.OwnerID != "worker-1" || l.Token != 1 || l.TTLMs != 15000 {
		t.Errorf("acquire answer %+v", l)
	}
	// Lease time is lockdb's time.
	if l.AcquiredAt.Before(before) || l.AcquiredAt.After(after) {
		t.Errorf("acquiredAt %s not within lockdb's clock [%s, %s]", l.AcquiredAt, before, after)
	}
	if d := l.ExpiresAt.Sub(l.AcquiredAt); d < 15*time.Second || d > 15*time.Second+time.Millisecond {
		t.Errorf("expiresAt - acquiredAt = %s, want 15s", d)
	}

	var st lockapi.LockState
	getJSON(t, lockURL(s.URL, name, ""), &st)
	if !st.Held || st.OwnerID == nil || *st.OwnerID != "worker-1" || st.Token != 1 || st.ExpiresAt == nil || !st.ExpiresAt.Equal(l.ExpiresAt) {
		t.Errorf("GET held lock: %+v", st)
	}

	// Another owner, and the holder itself, are told who holds it; no token moves.
	for _, owner := range []string{"worker-2", "worker-1"} {
		a, _, _ := acquireCall(s.URL, name, owner, 15000)
		p := wantProblem(t, "acquire by "+owner, a, http.StatusConflict, lockapi.CodeLockHeld)
		var holder string
		var exp time.Time
		if ok, err := p.Member("holder", &holder); !ok || err != nil || holder != "worker-1" {
			t.Errorf("holder member = %q (%v %v)", holder, ok, err)
		}
		if ok, err := p.Member("expiresAt", &exp); !ok || err != nil || !exp.Equal(l.ExpiresAt) {
			t.Errorf("expiresAt member = %s, want %s (%v %v)", exp, l.ExpiresAt, ok, err)
		}
	}
	var tokens, grants int
	if err := pool.QueryRow(ctx, "SELECT token, (SELECT count(*) FROM lock_grant) FROM lock_lease WHERE lock_name = $1", name).Scan(&tokens, &grants); err != nil {
		t.Fatal(err)
	}
	if tokens != 1 || grants != 1 {
		t.Errorf("after refused acquires: token %d, %d grants; want 1, 1", tokens, grants)
	}

	// Renewal moves expires_at in both tables, to the answer's value.
	r := mustRenew(t, s.URL, name, "worker-1", 1, 20000)
	if r.Token != 1 || r.TTLMs != 20000 || !r.AcquiredAt.Equal(l.AcquiredAt) || !r.ExpiresAt.After(l.ExpiresAt) {
		t.Errorf("renew answer %+v after %+v", r, l)
	}
	var leaseExp, grantExp time.Time
	if err := pool.QueryRow(ctx, `SELECT l.expires_at, g.expires_at FROM lock_lease l JOIN lock_grant g USING (lock_name, token) WHERE lock_name = $1`, name).Scan(&leaseExp, &grantExp); err != nil {
		t.Fatal(err)
	}
	if !leaseExp.Equal(r.ExpiresAt) || !grantExp.Equal(r.ExpiresAt) {
		t.Errorf("after renew: lock_lease %s, lock_grant %s, answer %s", leaseExp, grantExp, r.ExpiresAt)
	}

	mustRelease(t, s.URL, name, "worker-1", 1)
	getJSON(t, lockURL(s.URL, name, ""), &st)
	if st.Held || st.OwnerID != nil || st.Token != 1 {
		t.Errorf("GET released lock: %+v", st)
	}
	a, err = send(http.MethodGet, lockURL(s.URL, name, ""), nil, nil)
	if err != nil || !strings.Contains(string(a.Body), `"ownerId":null`) {
		t.Errorf("released lock must show ownerId null: %v %v", a, err)
	}

	l2 := mustAcquire(t, s.URL, name, "worker-2", 15000)
	if l2.Token != 2 {
		t.Errorf("second grant token %d, want 2", l2.Token)
	}
	var gl lockapi.GrantList
	getJSON(t, lockURL(s.URL, name, "/grants"), &gl)
	if len(gl.Grants) != 2 || gl.Grants[0].Token != 2 || gl.Grants[1].Token != 1 {
		t.Fatalf("grants: %+v", gl)
	}
	g1 := gl.Grants[1]
	if g1.OwnerID != "worker-1" || g1.TTLMs != 15000 || !g1.AcquiredAt.Equal(l.AcquiredAt) || g1.ReleasedAt == nil {
		t.Errorf("first grant in history: %+v", g1)
	}
	if gl.Grants[0].ReleasedAt != nil || gl.Grants[0].OwnerID != "worker-2" {
		t.Errorf("second grant in history: %+v", gl.Grants[0])
	}
	if !l2.AcquiredAt.After(*g1.ReleasedAt) {
		t.Errorf("grant 2 acquired %s, not after release of grant 1 at %s", l2.AcquiredAt, *g1.ReleasedAt)
	}
}

// A renewal or release that is not the current grant of its owner
// is LEASE_LOST; releasing the same grant twice is 204 both times; a name never
// granted is NOT_FOUND.
func TestLeaseLostAndIdempotentRelease(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.LockdbURL(t)
	pool := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL)
	cfg.MinTTL = 100 * time.Millisecond
	s := startServer(t, cfg)
	ctx := context.Background()

	// Grant 1 to a, released; grant 2 to b, held.
	mustAcquire(t, s.URL, "L", "a", 60000)
	mustRelease(t, s.URL, "L", "a", 1)
	mustAcquire(t, s.URL, "L", "b", 60000)

	lost := []struct {
		what  string
		owner string
		token int64
	}{
		{"old token, its own owner", "a", 1},
		{"old token, current owner", "b", 1},
		{"current token, another owner", "a", 2},
		{"a token never issued", "b", 3},
	}
	for _, c := range lost {
		a, _, _ := renewCall(s.URL, "L", c.owner, c.token, 60000)
		wantProblem(t, "renew: "+c.what, a, http.StatusConflict, lockapi.CodeLeaseLost)
		if c.what == "old token, its own owner" {
			continue // that grant was released: releasing it again is success (below)
		}
		a, _ = releaseCall(s.URL, "L", c.owner, c.token)
		wantProblem(t, "release: "+c.what, a, http.StatusConflict, lockapi.CodeLeaseLost)
	}
	// The current grant is untouched by all of that.
	var owner string
	var token int64
	if err := pool.QueryRow(ctx, "SELECT owner_id, token FROM lock_lease WHERE lock_name = 'L'").Scan(&owner, &token); err != nil || owner != "b" || token != 2 {
		t.Fatalf("after refused calls: owner %q token %d (%v)", owner, token, err)
	}

	// Released grant 1 released again, after a newer grant exists: still 204.
	mustRelease(t, s.URL, "L", "a", 1)

	// The same grant twice: 204, 204; released_at written once.
	mustRelease(t, s.URL, "L", "b", 2)
	var rel1 time.Time
	if err := pool.QueryRow(ctx, "SELECT released_at FROM lock_grant WHERE lock_name = 'L' AND token = 2").Scan(&rel1); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, s.URL, "L", "b", 2)
	var rel2 time.Time
	if err := pool.QueryRow(ctx, "SELECT released_at FROM lock_grant WHERE lock_name = 'L' AND token = 2").Scan(&rel2); err != nil || !rel2.Equal(rel1) {
		t.Errorf("second release moved released_at %s → %s (%v)", rel1, rel2, err)
	}
	// A released grant cannot be renewed.
	a, _, _ := renewCall(s.URL, "L", "b", 2, 60000)
	wantProblem(t, "renew after release", a, http.StatusConflict, lockapi.CodeLeaseLost)

	// Expired, not replaced: renew is LEASE_LOST, release is 204 with a late
	// released_at; GET shows the past expiry with no owner.
	e := mustAcquire(t, s.URL, "E", "c", 100)
	waitDBPast(t, pool, e.ExpiresAt)
	var st lockapi.LockState
	getJSON(t, lockURL(s.URL, "E", ""), &st)
	if st.Held || st.OwnerID != nil || st.ExpiresAt == nil || !st.ExpiresAt.Equal(e.ExpiresAt) {
		t.Errorf("GET expired lease: %+v, want held false, ownerId null, expiresAt %s", st, e.ExpiresAt)
	}
	a, _, _ = renewCall(s.URL, "E", "c", 1, 100)
	wantProblem(t, "renew after expiry", a, http.StatusConflict, lockapi.CodeLeaseLost)
	mustRelease(t, s.URL, "E", "c", 1)
	var late time.Time
	if err := pool.QueryRow(ctx, "SELECT released_at FROM lock_grant WHERE lock_name = 'E' AND token = 1").Scan(&late); err != nil || !late.After(e.ExpiresAt) {
		t.Errorf("late release: released_at %s, expires_at %s (%v)", late, e.ExpiresAt, err)
	}
	mustRelease(t, s.URL, "E", "c", 1)

	// Expired and replaced: the old grant's release is LEASE_LOST, and its
	// released_at stays NULL (it simply expired).
	f := mustAcquire(t, s.URL, "F", "d", 100)
	waitDBPast(t, pool, f.ExpiresAt)
	mustAcquire(t, s.URL, "F", "e", 60000)
	a, _ = releaseCall(s.URL, "F", "d", 1)
	wantProblem(t, "release of a replaced grant", a, http.StatusConflict, lockapi.CodeLeaseLost)
	var relF *time.Time
	if err := pool.QueryRow(ctx, "SELECT released_at FROM lock_grant WHERE lock_name = 'F' AND token = 1").Scan(&relF); err != nil || relF != nil {
		t.Errorf("replaced grant released_at %v (%v), want NULL", relF, err)
	}

	// Never granted.
	a, _, _ = renewCall(s.URL, "nope", "a", 1, 1000)
	wantProblem(t, "renew of unknown lock", a, http.StatusNotFound, lockapi.CodeNotFound)
	a, _ = releaseCall(s.URL, "nope", "a", 1)
	wantProblem(t, "release of unknown lock", a, http.StatusNotFound, lockapi.CodeNotFound)
	a = getJSON(t, lockURL(s.URL, "nope", ""), nil)
	wantProblem(t, "GET unknown lock", a, http.StatusNotFound, lockapi.CodeNotFound)
	a = getJSON(t, lockURL(s.URL, "nope", "/grants"), nil)
	wantProblem(t, "GET grants of unknown lock", a, http.StatusNotFound, lockapi.CodeNotFound)
}

// Release takes no body: its Content-Type and body are not looked at.
func TestReleaseIgnoresBody(t *testing.T) {
	t.Parallel()
	s := startServer(t, testConfig(pgtest.LockdbURL(t)))
	mustAcquire(t, s.URL, "R", "a", 5000)
	h := leaseHeaders("a", 1)
	h.Set("Content-Type", "text/plain")
	a, err := send(http.MethodPost, lockURL(s.URL, "R", "/release"), h, []byte("not json"))
	if err != nil || a.Status != http.StatusNoContent {
		t.Fatalf("release with a stray body: %v %v", a, err)
	}
}

// The grant history pages newest first: 100 by default, up to 1000.
func TestGrantHistoryLimit(t *testing.T) {
	t.Parallel()
	s := startServer(t, testConfig(pgtest.LockdbURL(t)))
	for i := int64(1); i <= 102; i++ {
		mustAcquire(t, s.URL, "H", "o", 1000)
		mustRelease(t, s.URL, "H", "o", i)
	}
	for _, c := range []struct {
		query string
		want  int
	}{{"", 100}, {"?limit=1", 1}, {"?limit=1000", 102}, {"?limit=7", 7}} {
		var gl lockapi.GrantList
		a := getJSON(t, lockURL(s.URL, "H", "/grants"+c.query), &gl)
		if a.Status != http.StatusOK || len(gl.Grants) != c.want {
			t.Fatalf("grants%s: %d grants (%v), want %d", c.query, len(gl.Grants), a.Status, c.want)
		}
		for i, g := range gl.Grants {
			if g.Token != int64(102-i) {
				t.Fatalf("grants%s[%d].token = %d, want %d (newest first)", c.query, i, g.Token, 102-i)
			}
		}
	}
}
