// Command apivalidate checks HTTP exchanges against an OpenAPI document with
// pb33f/libopenapi-validator, for lock.dev's conformance tests. It is the half
// of internal/apitest that needs libopenapi: the test kit runs it as a child
// process, so that lock.dev's go.mod does not require libopenapi and a module
// that takes lock.dev's client never meets it in its module graph.
//
// It reads requests as JSON lines on standard input and answers each with one
// JSON line on standard output, carrying the request's id (answers may come in
// any order: each request is handled on its own goroutine):
//
//   - {"id":1,"op":"load","document":"<base64>"} loads a document and answers
//     the (method, path template, status) keys it documents, in document order;
//   - {"id":2,"op":"check","doc":1,"method":…,"url":…,"header":…,"body":…,
//     "status":…,"respHeader":…,"respBody":…} checks one exchange against the
//     document loaded by request 1, and answers the key it matched (path
//     "(no route)" when none) and its findings, each a kind and a detail.
//
// It exits when its standard input ends.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

func main() {
	if err := serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "apivalidate:", err)
		os.Exit(1)
	}
}

// request is one line of input: the fields of op "load", then those of "check".
type request struct {
	ID       uint64 `json:"id"`
	Op       string `json:"op"`
	Document []byte `json:"document,omitempty"`
	exchange
}

// answer is one line of output.
type answer struct {
	ID         uint64    `json:"id"`
	Error      string    `json:"error,omitempty"`
	Documented []key     `json:"documented,omitempty"`
	Key        *key      `json:"key,omitempty"`
	Findings   []finding `json:"findings,omitempty"`
}

// serve answers the requests of in on out until in ends, then waits for the
// requests still running.
func serve(in io.Reader, out io.Writer) error {
	var (
		wmu  sync.Mutex
		enc  = json.NewEncoder(out)
		wg   sync.WaitGroup
		docs = newCatalog()
	)
	reply := func(a answer) {
		wmu.Lock()
		defer wmu.Unlock()
		_ = enc.Encode(a) // a closed output means the caller left: nothing to tell
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 256<<20)
	for sc.Scan() {
		var r request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("a request that is not JSON: %w", err)
		}
		switch r.Op {
		case "load":
			// Loads run in line: a check names a document loaded before it.
			reply(docs.load(r.ID, r.Document))
		case "check":
			wg.Add(1)
			go func() {
				defer wg.Done()
				reply(docs.check(r.ID, r.Doc, &r.exchange))
			}()
		default:
			reply(answer{ID: r.ID, Error: fmt.Sprintf("unknown op %q", r.Op)})
		}
	}
	wg.Wait()
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading requests: %w", err)
	}
	return nil
}
