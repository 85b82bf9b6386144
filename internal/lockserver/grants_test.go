package lockserver

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/grant"
	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
)

// keyDir makes a key pair with keygen and returns its directory.
func keyDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "keys")
	if _, err := grant.Keygen(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// signingServer is a lock-server signing with a fresh key, and the key set
// verifiers would be given.
func signingServer(t *testing.T, configure func(*Config)) (*testServer, *grant.KeySet) {
	t.Helper()
	dir := keyDir(t)
	cfg := testConfig(pgtest.LockdbURL(t))
	cfg.SigningKeyFile = filepath.Join(dir, grant.SigningKeyFile)
	if configure != nil {
		configure(&cfg)
	}
	set, _, err := grant.ReadKeySet(filepath.Join(dir, grant.KeySetFile))
	if err != nil {
		t.Fatal(err)
	}
	return startServer(t, cfg), set
}

// docs/contracts/signed-grants.md: the acquire answers a grant of its token to its owner; the
// renewal answers the same bytes; GET never answers one
// (docs/contracts/workload-identity.md: only the holder is handed its grant).
func TestAcquireAnswersASignedGrant(t *testing.T) {
	t.Parallel()
	s, set := signingServer(t, nil)
	v, err := grant.NewVerifier(set, 0)
	if err != nil {
		t.Fatal(err)
	}
	const name = "account:acct-7"
	l := mustAcquire(t, s.URL, name, "executor-1", 60_000)
	if l.Grant == "" {
		t.Fatal("the acquire answered no grant")
	}
	if _, r := v.Verify(l.Grant, grant.Presented{Lock: name, Token: l.Token, Owner: "executor-1"}); r != nil {
		t.Fatalf("the grant does not verify with keygen's key set: %v", r)
	}
	if _, r := v.Verify(l.Grant, grant.Presented{Lock: name, Token: l.Token + 1, Owner: "executor-1"}); r == nil {
		t.Fatal("the grant also verifies for the next token")
	}

	time.Sleep(1100 * time.Millisecond) // iat has whole seconds: a renewal a second later must not change it
	r := mustRenew(t, s.URL, name, "executor-1", l.Token, 60_000)
	if r.Grant != l.Grant {
		t.Errorf("renewal answered another grant:\n%s\n%s", r.Grant, l.Grant)
	}
	var st struct {
		Grant *string `json:"grant"`
		Held  bool    `json:"held"`
	}
	getJSON(t, lockURL(s.URL, name, ""), &st)
	if !st.Held || st.Grant != nil {
		t.Errorf("GET of the live lease: held %v grant %v, want held and no grant", st.Held, st.Grant)
	}

	mustRelease(t, s.URL, name, "executor-1", l.Token)
	st.Grant = nil
	getJSON(t, lockURL(s.URL, name, ""), &st)
	if st.Held || st.Grant != nil {
		t.Errorf("GET of a released lock: held %v grant %v, want no grant", st.Held, st.Grant)
	}
	l2 := mustAcquire(t, s.URL, name, "executor-2", 60_000)
	if _, r := v.Verify(l2.Grant, grant.Presented{Lock: name, Token: l2.Token, Owner: "executor-2"}); l2.Grant == l.Grant || r != nil {
		t.Error("the next grant is not a fresh, valid grant of the next token")
	}
}

// Without a signing key nothing changes: no grant member anywhere, and the key
// set is empty.
func TestNoSigningKeyNoGrant(t *testing.T) {
	t.Parallel()
	s := startServer(t, testConfig(pgtest.LockdbURL(t)))
	a, _, err := acquireCall(s.URL, "account:a", "o", 5000)
	if err != nil || a.Status != 200 || bytes.Contains(a.Body, []byte(`"grant"`)) {
		t.Fatalf("acquire: %v %v", a, err)
	}
	g := getJSON(t, lockURL(s.URL, "account:a", ""), nil)
	if bytes.Contains(g.Body, []byte(`"grant"`)) {
		t.Errorf("GET answers a grant member without a signing key: %s", g.Body)
	}
	k := getJSON(t, s.URL+"/v1/keys", nil)
	if k.Status != 200 || strings.TrimSpace(string(k.Body)) != `{"keys":[]}` {
		t.Errorf("GET /v1/keys without keys: %d %s", k.Status, k.Body)
	}
	if ev := s.logs.Events("grants_not_signed"); len(ev) != 1 {
		t.Errorf("start-up does not say grants are not signed")
	}
}

// GET /v1/keys publishes the current key and the announced previous ones, and a
// verifier built from that answer verifies the server's grants.
func TestKeysPublishesCurrentAndPreviousKeys(t *testing.T) {
	t.Parallel()
	prev := keyDir(t)
	prevSet, _, _ := grant.ReadKeySet(filepath.Join(prev, grant.KeySetFile))
	s, cur := signingServer(t, func(c *Config) {
		c.PreviousPublicKeysFile = filepath.Join(prev, grant.KeySetFile)
	})
	k := getJSON(t, s.URL+"/v1/keys", nil)
	served, ignored, err := grant.ParseKeySet(k.Body)
	if err != nil || ignored != 0 {
		t.Fatalf("GET /v1/keys is not a usable JWK Set: %v (%s)", err, k.Body)
	}
	want := append(cur.IDs(), prevSet.IDs()...)
	if strings.Join(served.IDs(), ",") != strings.Join(want, ",") {
		t.Errorf("served keys %v, want the current then the previous %v", served.IDs(), want)
	}
	for _, m := range []string{`"kty":"OKP"`, `"crv":"Ed25519"`, `"use":"sig"`, `"alg":"EdDSA"`} {
		if !bytes.Contains(k.Body, []byte(m)) {
			t.Errorf("GET /v1/keys lacks %s: %s", m, k.Body)
		}
	}
	v, _ := grant.NewVerifier(served, 0)
	l := mustAcquire(t, s.URL, "account:b", "o", 5000)
	if _, r := v.Verify(l.Grant, grant.Presented{Lock: "account:b", Token: l.Token, Owner: "o"}); r != nil {
		t.Error(r)
	}
}

// A key file that cannot be read or is not what the setting says is a bad
// setting: Run refuses to start with an error naming it (exit 2).
func TestBadKeyFilesAreBadSettings(t *testing.T) {
	t.Parallel()
	dir := keyDir(t)
	notPEM := filepath.Join(t.TempDir(), "x.pem")
	_ = os.WriteFile(notPEM, []byte("nope"), 0o600)
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.SigningKeyFile = filepath.Join(dir, "absent.pem") }, "LOCK_SERVER_SIGNING_KEY_FILE"},
		{func(c *Config) { c.SigningKeyFile = filepath.Join(dir, grant.KeySetFile) }, "LOCK_SERVER_SIGNING_KEY_FILE"},
		{func(c *Config) { c.SigningKeyFile = notPEM }, "LOCK_SERVER_SIGNING_KEY_FILE"},
		{func(c *Config) { c.PreviousPublicKeysFile = filepath.Join(dir, grant.SigningKeyFile) }, "LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE"},
		{func(c *Config) { c.PreviousPublicKeysFile = filepath.Join(dir, "absent.json") }, "LOCK_SERVER_PREVIOUS_PUBLIC_KEYS_FILE"},
	} {
		cfg := testConfig("postgres://nobody@127.0.0.1:1/none")
		cfg.LogOutput = &syncBuffer{}
		c.set(&cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := Run(ctx, cfg)
		cancel()
		var ue *serve.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Msg, c.want) {
			t.Errorf("Run = %v, want a usage error naming %s", err, c.want)
		}
		if code := serve.ExitCode(err, &bytes.Buffer{}); code != 2 {
			t.Errorf("exit code %d, want 2", code)
		}
	}
}

func TestKeygenCommand(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "new")
	cmd, _, err := ParseConfig([]string{"keygen", "--out", dir}, env(map[string]string{"LOCK_MAX_TTL": "bad"}))
	if err != nil || cmd != CmdKeygen {
		t.Fatalf("ParseConfig(keygen) = %q, %v: keygen needs none of the service's settings", cmd, err)
	}
	var out bytes.Buffer
	if err := Keygen([]string{"--out", dir}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "key id ") {
		t.Errorf("keygen says %q", out.String())
	}
	if err := Keygen([]string{"--out", dir}, &out); err == nil {
		t.Error("a second keygen into the same directory overwrote the pair")
	}
	var ue *serve.UsageError
	if err := Keygen(nil, &out); !errors.As(err, &ue) {
		t.Errorf("keygen without --out: %v, want a usage error", err)
	}
}
