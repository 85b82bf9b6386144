package service

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"lock.dev/internal/identity"
	"lock.dev/internal/logcapture"
	"lock.dev/internal/serve"
)

// A service with no identity files, or without other auth material, refuses
// to start naming the setting, unless UNSAFE_NO_AUTH lifts the refusal.
func TestStartFailsClosedWithoutAuthMaterial(t *testing.T) {
	for _, c := range []struct {
		name string
		spec Spec
		want string // "" means it starts
	}{
		{"no identity", Spec{}, "invalid TLS_CERT_FILE"},
		{"no CA", Spec{Identity: identity.Settings{CertFile: "c", KeyFile: "k"}}, "invalid TLS_CA_FILE"},
		{"no grant keys", Spec{Identity: identity.Settings{UnsafeNoAuth: false, CertFile: "c", KeyFile: "k", CAFile: "a"},
			AuthMaterial: []Material{{Env: "DEMO_GRANT_KEYS_FILE", What: "grants are verified with it"}}}, "invalid DEMO_GRANT_KEYS_FILE"},
		{"unsafe", Spec{Identity: noAuth, AuthMaterial: []Material{{Env: "DEMO_GRANT_KEYS_FILE"}}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			spec.Name, spec.LogLevel, spec.LogOutput = "demo-svc", "info", io.Discard
			spec.Validate = func() error { return nil }
			_, err := Start(spec)
			var ue *serve.UsageError
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Start = %v, want it to start", err)
			case c.want != "" && (!errors.As(err, &ue) || !strings.HasPrefix(ue.Msg, c.want)):
				t.Fatalf("Start = %v, want an exit-2 refusal starting %q", err, c.want)
			}
		})
	}
}

// With identity files a service serves mutual TLS only: a plaintext caller and
// a caller without a certificate get no answer, a workload of the bundle gets
// one; auth_enabled reads 1; HEALTH_ADDR serves the three probe paths plaintext
// and nothing else.
func TestServeMutualTLSAndThePlaintextHealthListener(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := identity.WriteCerts(identity.CertsOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ln, health := listen(t), listen(t)
	var log logcapture.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan *Service, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(Spec{Name: "demo-svc", Identity: identity.Files(dir, identity.NameLockServer), LogLevel: "info", LogOutput: &log,
			Listener: ln, HealthListener: health, Validate: func() error { return nil }},
			func(sv *Service) error {
				mux := http.NewServeMux()
				serve.Mount(mux, sv.Health, sv.Registry)
				mux.HandleFunc("GET /who", func(w http.ResponseWriter, r *http.Request) {
					id, err := identity.PeerID(r)
					if err != nil {
						http.Error(w, err.Error(), 500)
						return
					}
					_, _ = io.WriteString(w, id.String())
				})
				return sv.Serve(ctx, serve.Handler(mux, sv.Logger), serve.Serve, func(string) { started <- sv })
			})
	}()
	var sv *Service
	select {
	case sv = <-started:
	case err := <-done:
		t.Fatalf("Run ended before serving: %v", err)
	}
	addr := ln.Addr().String()

	if res, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/livez"); err == nil {
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Fatal("a plaintext caller was answered 200 on the mutual-TLS listener")
		}
	}
	exec, err := identity.Load(identity.Files(dir, identity.NameExecutor), sv.Logger)
	if err != nil {
		t.Fatal(err)
	}
	noCert := exec.ClientConfig(sv.Identity.ID())
	noCert.GetClientCertificate = nil
	if _, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: noCert}}).Get("https://" + addr + "/livez"); err == nil {
		t.Fatal("a caller without a client certificate was answered")
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: exec.ClientConfig(spiffeid.RequireFromString(identity.DefaultID(identity.NameLockServer)))}}
	res, err := c.Get("https://" + addr + "/who")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != identity.DefaultID(identity.NameExecutor) {
		t.Fatalf("the handler saw the caller as %q, want the executor", body)
	}
	if got := gaugeValue(t, sv, "auth_enabled"); got != 1 {
		t.Errorf("auth_enabled = %v, want 1", got)
	}

	for path, want := range map[string]int{"/livez": 200, "/readyz": 200, "/metrics": 200, "/who": 404, "/openapi.json": 404} {
		res, err := http.Get("http://" + health.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("HEALTH_ADDR %s: %d, want %d", path, res.StatusCode, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
	for _, l := range log.Lines() {
		if l["event"] == "auth_disabled" {
			t.Errorf("auth_disabled logged by a service with identity: %v", l)
		}
	}
}

func gaugeValue(t *testing.T, sv *Service, name string) float64 {
	t.Helper()
	mfs, err := sv.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}
