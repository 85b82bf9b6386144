package railproxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"lock.dev/internal/pgtest"
	"lock.dev/internal/serve"
)

// A password in RAIL_BASE_URL or PAYDB_URL never appears in an exit message, a
// log line or an answer, and readiness says DOWN without the database's or the
// rail's details (those go to the log, passwords redacted).
func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pw"
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for name, value := range map[string]string{
		"RAIL_BASE_URL": "http://rail-user:" + secret + "@127.0.0.1:1/?x=1",
		"PAYDB_URL":     "postgres://postgres:" + secret + "@[::1",
	} {
		_, _, err := ParseConfigTo(nil, env(map[string]string{name: value}), io.Discard)
		var stderr strings.Builder
		if code := serve.ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), name) || strings.Contains(stderr.String(), secret) {
			t.Errorf("%s with a password: exit %d, %q", name, code, stderr.String())
		}
	}

	dbURL := pgtest.PaydbURL(t)
	fwd, viaURL := newPGForwarder(t, dbURL)
	u, err := url.Parse(viaURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), secret) // the test cluster trusts: any password will do
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	railURL := "http://rail-user:" + secret + "@" + dead.Addr().String()
	_ = dead.Close()
	p := startProxy(t, testConfig(u.String(), railURL))

	var answers []string
	record := func(resp *http.Response, err error) {
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answers = append(answers, string(b))
	}
	a := submit(t, p.URL, 1, newPayout("p-secret", "acct-secret"))
	if a.str("stage") != "dial" {
		t.Fatalf("answer: %+v", a)
	}
	answers = append(answers, fmt.Sprint(a.Body))
	record(testHTTP.Get(p.URL + "/readyz"))
	fwd.setDown(true)
	record(testHTTP.Get(p.URL + "/readyz"))
	record(testHTTP.Get(p.URL + "/v1/rail/submissions?payoutId=p-secret"))
	a = submit(t, p.URL, 2, newPayout("p-secret-2", "acct-secret"))
	answers = append(answers, fmt.Sprint(a.Body))

	for _, ans := range answers {
		for _, leak := range []string{secret, "rail-user", "postgres", u.Host, "dial tcp"} {
			if strings.Contains(ans, leak) {
				t.Errorf("an answer shows %q: %s", leak, ans)
			}
		}
	}
	var r struct {
		Components map[string]struct{ Status, Detail string }
	}
	_ = json.Unmarshal([]byte(answers[len(answers)-3]), &r)
	if r.Components["db"].Status != "DOWN" || r.Components["railStub"].Status != "DOWN" {
		t.Fatalf("readiness: %s", answers[len(answers)-3])
	}
	logs := p.Logs.String()
	if strings.Contains(logs, secret) {
		t.Errorf("the log shows the password:\n%s", logs)
	}
	// The reasons are in the log, for the operator.
	for _, comp := range []string{"db", "railStub"} {
		ev := p.Logs.filter(func(m map[string]any) bool { return m["event"] == "readiness_down" && m["component"] == comp })
		if len(ev) == 0 || ev[0]["error"] == "" {
			t.Errorf("no readiness_down log line for %s with its reason", comp)
		}
	}
}
