package deploytest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The binaries the image carries: every process of docs/contracts/configuration.md
// and docs/contracts/reconciliation.md, and the probe compose's health checks run.
// lockdemo is not a deployable process.
var imageBinaries = []string{"lock-server", "payment-resource", "rail-proxy", "rail-stub", "executor", "reconciler", "healthcheck"}

// dockerfile returns the Dockerfile with continuation lines joined.
func dockerfile(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(raw), "\\\n", " ")
}

// buildLine is the Dockerfile's go build command.
func buildLine(t *testing.T, df string) string {
	t.Helper()
	for _, line := range strings.Split(df, "\n") {
		if strings.Contains(line, "go build") {
			return line
		}
	}
	t.Fatal("the Dockerfile has no go build")
	return ""
}

// The static part (no container engine runs here): the image is
// multi-stage, builds static binaries (CGO_ENABLED=0) of every deployable
// command with the version linked in, runs on distroless static as the
// nonroot user, and lets the command choose the binary (no ENTRYPOINT).
func TestDockerfile(t *testing.T) {
	df := dockerfile(t)
	line := buildLine(t, df)
	var built []string
	for _, m := range regexp.MustCompile(`\./cmd/([a-z-]+)`).FindAllStringSubmatch(line, -1) {
		built = append(built, m[1])
	}
	slices.Sort(built)
	want := slices.Clone(imageBinaries)
	slices.Sort(want)
	if !slices.Equal(built, want) {
		t.Errorf("the image builds %v, want %v", built, want)
	}
	entries, err := os.ReadDir(filepath.Join(root(t), "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != "lockdemo" && !slices.Contains(built, e.Name()) {
			t.Errorf("cmd/%s is not in the image", e.Name())
		}
	}
	for _, must := range []string{
		"CGO_ENABLED=0",
		"-X lock.dev/internal/version.version=${VERSION}",
		"ARG VERSION=dev",
		"FROM gcr.io/distroless/static-debian12:nonroot",
		"USER 65532:65532",
		"-trimpath",
	} {
		if !strings.Contains(df, must) {
			t.Errorf("the Dockerfile lacks %q", must)
		}
	}
	if n := strings.Count(df, "\nFROM "); n < 2 {
		t.Errorf("%d stages; the image is multi-stage (build, then distroless)", n)
	}
	if regexp.MustCompile(`(?m)^ENTRYPOINT`).MatchString(df) {
		t.Error("an ENTRYPOINT would fix the binary; the command chooses it")
	}
	ignore, err := os.ReadFile(filepath.Join(root(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, embedded := range []string{"api", "internal"} {
		if slices.Contains(strings.Fields(string(ignore)), embedded) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", embedded)
		}
	}
}

// Every binary of the image, with the version linked in the way the Dockerfile
// links it (-X), answers --version with that version on one line and exits 0.
// (Built with this machine's defaults rather than the image's CGO_ENABLED=0
// and -trimpath, which would recompile every package — over a minute of CI —
// for no difference in what is checked; TestDockerfile holds the Dockerfile to
// those flags.)
func TestImageBinariesAnswerVersion(t *testing.T) {
	dir := root(t)
	out := t.TempDir()
	var pkgs []string
	for _, b := range imageBinaries {
		if _, err := os.Stat(filepath.Join(dir, "cmd", b)); err != nil {
			continue // the reconciler lands beside this change; TestDockerfile checks the list
		}
		pkgs = append(pkgs, "./cmd/"+b)
	}
	const v = "9.8.7-deploytest"
	build := exec.Command("go", append([]string{"build", "-ldflags", "-s -w -X lock.dev/internal/version.version=" + v, "-o", out + string(filepath.Separator)}, pkgs...)...)
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}
	for _, p := range pkgs {
		bin := filepath.Join(out, filepath.Base(p))
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, "--version")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("%s --version: %v (stderr %q)", p, err, stderr.String())
			continue
		}
		if stdout.String() != v+"\n" || stderr.Len() != 0 {
			t.Errorf("%s --version printed %q (stderr %q), want %q", p, stdout.String(), stderr.String(), v+"\n")
		}
	}
}
