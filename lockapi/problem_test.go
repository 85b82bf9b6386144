package lockapi

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// contractStatus is the status each code is answered with, as the contract pages
// give it: docs/contracts/README.md and each service's page (rail-proxy.md,
// lock-service.md, payments.md, reconciliation.md for settle's UNAUTHORIZED,
// signed-grants.md for GRANT_REJECTED, books.md for the books' three).
var contractStatus = map[string]int{
	"INVALID_REQUEST":              400, // 413 and 415 through WriteInvalid
	"NOT_FOUND":                    404,
	"METHOD_NOT_ALLOWED":           405,
	"INTERNAL":                     500,
	"UNAVAILABLE":                  503,
	"FENCED_OUT":                   409,
	"DUPLICATE_SUBMISSION":         409,
	"RAIL_REJECTED":                422,
	"RAIL_AMBIGUOUS":               409,
	"RAIL_UNAVAILABLE":             503,
	"LOCK_HELD":                    409,
	"LEASE_LOST":                   409,
	"PAYOUT_CONFLICT":              409,
	"PAYOUT_FINAL":                 409,
	"UNAUTHORIZED":                 401,
	"GRANT_REJECTED":               401,
	"NOT_IN_BOOKS":                 409,
	"OUTCOME_NOT_RECORDED":         409,
	"SETTLE_CONTRADICTS_STATEMENT": 409,
	"FORBIDDEN":                    403,
	"NOT_LEASE_HOLDER":             403,
}

// codeConstants reads every Code* constant declared in problem.go, so that a code
// added there without a row in the table fails this test.
func codeConstants(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "problem.go", nil, 0)
	if err != nil {
		t.Fatalf("parse problem.go: %v", err)
	}
	consts := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, "Code") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s is not a string literal", n.Name)
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatalf("%s: %v", n.Name, err)
				}
				consts[n.Name] = v
			}
		}
	}
	if len(consts) == 0 {
		t.Fatal("no Code constants found in problem.go")
	}
	return consts
}

func TestCodeTable(t *testing.T) {
	consts := codeConstants(t)
	seen := map[string]bool{}
	for name, code := range consts {
		seen[code] = true
		want, ok := contractStatus[code]
		if !ok {
			t.Errorf("%s (%s): no contract status in this test", name, code)
			continue
		}
		if _, ok := codes[code]; !ok {
			t.Errorf("%s (%s): not in the code table", name, code)
		}
		if got := Status(code); got != want {
			t.Errorf("Status(%s) = %d, the contract says %d", code, got, want)
		}
		p := NewProblemCode(code, "d", map[string]any{"m": 1})
		wantType := "https://lock.dev/problems/" + strings.ToLower(strings.ReplaceAll(code, "_", "-"))
		if p.Status != want || p.Code != code || p.Type != wantType || p.Title == "" || p.Detail != "d" {
			t.Errorf("NewProblemCode(%s) = %+v", code, p)
		}
		var doc map[string]any
		b, err := json.Marshal(p)
		if err != nil || json.Unmarshal(b, &doc) != nil || doc["status"] != float64(want) || doc["m"] != float64(1) {
			t.Errorf("NewProblemCode(%s) encodes as %s (%v)", code, b, err)
		}
	}
	for code := range contractStatus {
		if !seen[code] {
			t.Errorf("%s has a contract status but no Code constant", code)
		}
	}
	if len(codes) != len(consts) {
		t.Errorf("the code table has %d rows for %d Code constants", len(codes), len(consts))
	}
}

func TestNewProblemKeepsAnExplicitStatus(t *testing.T) {
	p := NewProblem(http.StatusRequestEntityTooLarge, CodeInvalidRequest, "too large", nil)
	if p.Status != http.StatusRequestEntityTooLarge || p.Title != "Invalid request" ||
		p.Type != "https://lock.dev/problems/invalid-request" {
		t.Fatalf("NewProblem(413, INVALID_REQUEST) = %+v", p)
	}
	u := NewProblemCode("SOMETHING_ELSE", "", nil)
	if u.Status != http.StatusInternalServerError || u.Title != "" || u.Type != "https://lock.dev/problems/something-else" {
		t.Fatalf("NewProblemCode of a code outside the table = %+v", u)
	}
}
