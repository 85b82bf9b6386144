package apitest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

const (
	// buildTimeout bounds building the validator: a cold build cache compiles
	// libopenapi and its dependencies.
	buildTimeout = 5 * time.Minute
	// checkTimeout bounds one answer of the validator (loading a document or
	// checking an exchange), which takes milliseconds.
	checkTimeout = 2 * time.Minute
)

// shared is the validator of this test binary. It is package state, against
// the project's habit, because a process per Checker would build and start
// one per test; the Once makes the first Checker pay for it, and a failure is
// every Checker's error.
var shared struct {
	once sync.Once
	p    *process
	err  error
}

func sharedProcess() (*process, error) {
	shared.once.Do(func() { shared.p, shared.err = startProcess() })
	return shared.p, shared.err
}

// The wire format of checks/cmd/apivalidate: one JSON line per request and per
// answer.
type (
	request struct {
		ID       uint64 `json:"id"`
		Op       string `json:"op"`
		Document []byte `json:"document,omitempty"`
		exchange
	}
	exchange struct {
		Doc        uint64      `json:"doc,omitempty"`
		Method     string      `json:"method,omitempty"`
		URL        string      `json:"url,omitempty"`
		Host       string      `json:"host,omitempty"`
		Header     http.Header `json:"header,omitempty"`
		Body       []byte      `json:"body,omitempty"`
		Status     int         `json:"status,omitempty"`
		RespHeader http.Header `json:"respHeader,omitempty"`
		RespBody   []byte      `json:"respBody,omitempty"`
	}
	answer struct {
		ID         uint64        `json:"id"`
		Error      string        `json:"error,omitempty"`
		Documented []wireKey     `json:"documented,omitempty"`
		Key        *wireKey      `json:"key,omitempty"`
		Findings   []wireFinding `json:"findings,omitempty"`
	}
	wireKey struct {
		Method string `json:"method"`
		Path   string `json:"path"`
		Status int    `json:"status"`
	}
	wireFinding struct {
		Kind   string `json:"kind"`
		Detail string `json:"detail"`
	}
)

// process is a running validator. Requests carry ids, so callers on many
// goroutines share it; the validator answers each as soon as it is done.
type process struct {
	cmd *exec.Cmd
	wmu sync.Mutex // one request line at a time
	enc *json.Encoder

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan answer
	err     error // set once the validator stops answering
}

// checksDir finds checks/ (the module lock.dev/checks) at the root of this tree:
// two levels above this file, or where the go command says lock.dev's go.mod is.
func checksDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(file), "..", "..", "checks")
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("locating lock.dev's go.mod: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	dir := filepath.Join(filepath.Dir(gomod), "checks")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("the validator's module lock.dev/checks is not beside %q: %w", gomod, err)
	}
	return dir, nil
}

// startProcess builds checks/cmd/apivalidate into a temporary directory and
// starts it. The binary is removed as soon as it runs; the process ends when
// its standard input does, that is when this test binary exits.
func startProcess() (*process, error) {
	dir, err := checksDir()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "apivalidate-")
	if err != nil {
		return nil, fmt.Errorf("building the validator: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	bin := filepath.Join(tmp, "apivalidate")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	// go test puts its own go command first on PATH.
	build := exec.CommandContext(ctx, "go", "build", "-C", dir, "-o", bin, "./cmd/apivalidate")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the validator (go build -C %s -o %s ./cmd/apivalidate): %w\n%s", dir, bin, err, out)
	}

	cmd := exec.Command(bin)
	cmd.Stderr = os.Stderr // a crash of the validator shows in the test's output
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("starting the validator: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("starting the validator: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the validator: %w", err)
	}
	p := &process{cmd: cmd, enc: json.NewEncoder(stdin), waiting: map[uint64]chan answer{}}
	go p.read(stdout)
	return p, nil
}

// read hands each answer to its caller until the validator stops.
func (p *process) read(stdout io.Reader) {
	dec := json.NewDecoder(stdout)
	var err error
	for {
		var a answer
		if err = dec.Decode(&a); err != nil {
			break
		}
		p.mu.Lock()
		ch := p.waiting[a.ID]
		delete(p.waiting, a.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- a // buffered: the caller may have given up
		}
	}
	if werr := p.cmd.Wait(); werr != nil {
		err = fmt.Errorf("%w (%w)", err, werr)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = fmt.Errorf("the validator stopped answering: %w", err)
	for id, ch := range p.waiting {
		close(ch)
		delete(p.waiting, id)
	}
}

// call sends r and waits for its answer.
func (p *process) call(ctx context.Context, r request) (answer, error) {
	ch := make(chan answer, 1)
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return answer{}, p.err
	}
	p.next++
	r.ID = p.next
	p.waiting[r.ID] = ch
	p.mu.Unlock()
	forget := func() {
		p.mu.Lock()
		delete(p.waiting, r.ID)
		p.mu.Unlock()
	}

	p.wmu.Lock()
	err := p.enc.Encode(r)
	p.wmu.Unlock()
	if err != nil {
		forget()
		return answer{}, fmt.Errorf("sending to the validator: %w", err)
	}
	select {
	case a, ok := <-ch:
		if !ok {
			p.mu.Lock()
			defer p.mu.Unlock()
			return answer{}, p.err
		}
		if a.Error != "" {
			return a, errors.New(a.Error)
		}
		return a, nil
	case <-ctx.Done():
		forget()
		return answer{}, fmt.Errorf("waiting for the validator: %w", ctx.Err())
	}
}

// load has the validator load a document, and returns the id to check
// exchanges against it and the keys it documents.
func (p *process) load(raw []byte) (uint64, []Key, error) {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	a, err := p.call(ctx, request{Op: "load", Document: raw})
	if err != nil {
		return 0, nil, err
	}
	keys := make([]Key, len(a.Documented))
	for i, k := range a.Documented {
		keys[i] = Key(k)
	}
	return a.ID, keys, nil
}

// check has the validator check one exchange against document doc.
func (p *process) check(ctx context.Context, doc uint64, x exchange) (wireKey, []wireFinding, error) {
	x.Doc = doc
	a, err := p.call(ctx, request{Op: "check", exchange: x})
	if err != nil {
		return wireKey{}, nil, err
	}
	if a.Key == nil {
		return wireKey{}, nil, errors.New("the validator answered no key")
	}
	return *a.Key, a.Findings, nil
}
