package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pb33f/go-yaml"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/pb33f/libopenapi/orderedmap"

	"lock.dev/api"
)

// The documents of lock.dev/api are tested here rather than in api's own
// tests because libopenapi is a requirement of this module only.

// Each document is an OpenAPI 3.1 document by the specification's own schema,
// every reference resolves, and every example it gives is valid against the
// schema it illustrates — an example that drifts from its schema is a document
// that lies to its reader.
func TestDocumentsAreValidOpenAPI31(t *testing.T) {
	for _, s := range api.Services() {
		t.Run(string(s), func(t *testing.T) {
			raw, err := api.Document(s)
			if err != nil {
				t.Fatalf("no document: %v", err)
			}
			if !json.Valid(raw) {
				t.Fatal("the document is not JSON")
			}
			doc, err := libopenapi.NewDocument(raw)
			if err != nil {
				t.Fatalf("libopenapi cannot read it: %v", err)
			}
			if v := doc.GetVersion(); !strings.HasPrefix(v, "3.1.") {
				t.Fatalf("openapi %q, want 3.1.x", v)
			}
			model, err := doc.BuildV3Model()
			if err != nil {
				t.Fatalf("model: %v", err)
			}
			v, errs := validator.NewValidator(doc)
			if len(errs) > 0 {
				t.Fatalf("validator: %v", errs)
			}
			if ok, verrs := v.ValidateDocument(); !ok {
				for _, e := range verrs {
					t.Errorf("not a valid OpenAPI 3.1 document: %s: %s", e.Message, e.Reason)
					for _, f := range e.SchemaValidationErrors {
						t.Errorf("  at %s (%s): %s", f.FieldPath, f.KeywordLocation, f.Reason)
					}
				}
			}
			checkExamples(t, &model.Model)
			checkHouseRules(t, &model.Model)
		})
	}
}

// checkExamples validates every example of every parameter, request body and
// response against its schema.
func checkExamples(t *testing.T, m *v3.Document) {
	t.Helper()
	sv := schema_validation.NewSchemaValidator()
	n := 0
	check := func(where string, proxy *base.SchemaProxy, node *yaml.Node) {
		if proxy == nil || node == nil {
			return
		}
		n++
		var value any
		if err := node.Decode(&value); err != nil {
			t.Errorf("%s: example does not decode: %v", where, err)
			return
		}
		b, err := json.Marshal(value)
		if err != nil {
			t.Errorf("%s: example does not encode: %v", where, err)
			return
		}
		if ok, errs := sv.ValidateSchemaBytes(proxy.Schema(), b); !ok {
			for _, e := range errs {
				t.Errorf("%s: example %s does not match its schema: %s %s", where, b, e.Message, e.Reason)
				for _, f := range e.SchemaValidationErrors {
					t.Errorf("  at %s (%s): %s", f.FieldPath, f.KeywordLocation, f.Reason)
				}
			}
		}
	}
	media := func(where string, content *orderedmap.Map[string, *v3.MediaType]) {
		for ct, mt := range content.FromOldest() {
			if !strings.Contains(ct, "json") {
				continue
			}
			check(where+" "+ct, mt.Schema, mt.Example)
			for name, e := range mt.Examples.FromOldest() {
				check(where+" "+ct+" example "+name, mt.Schema, e.Value)
			}
		}
	}
	params := func(where string, ps []*v3.Parameter) {
		for _, p := range ps {
			check(fmt.Sprintf("%s parameter %s", where, p.Name), p.Schema, p.Example)
			for name, e := range p.Examples.FromOldest() {
				check(fmt.Sprintf("%s parameter %s example %s", where, p.Name, name), p.Schema, e.Value)
			}
		}
	}
	for path, item := range m.Paths.PathItems.FromOldest() {
		params(path, item.Parameters)
		for method, op := range item.GetOperations().FromOldest() {
			where := strings.ToUpper(method) + " " + path
			params(where, op.Parameters)
			if op.RequestBody != nil {
				media(where+" request", op.RequestBody.Content)
			}
			for code, r := range op.Responses.Codes.FromOldest() {
				media(where+" "+code, r.Content)
			}
		}
	}
	if n == 0 {
		t.Error("the document has no examples at all")
	}
}

// checkHouseRules holds the documents to what makes them checkable: every
// operation has a unique operationId and lists its statuses one by one (no
// "default", no "4XX"), so an answer with an undocumented status fails
// validation; every problem answer is application/problem+json.
func checkHouseRules(t *testing.T, m *v3.Document) {
	t.Helper()
	ids := map[string]string{}
	for path, item := range m.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			where := strings.ToUpper(method) + " " + path
			if op.OperationId == "" {
				t.Errorf("%s has no operationId", where)
			} else if other, dup := ids[op.OperationId]; dup {
				t.Errorf("%s and %s share operationId %s", where, other, op.OperationId)
			}
			ids[op.OperationId] = where
			if op.Responses.Default != nil {
				t.Errorf("%s has a default response: undocumented statuses would pass", where)
			}
			for code, r := range op.Responses.Codes.FromOldest() {
				if len(code) != 3 || strings.ContainsAny(code, "Xx") {
					t.Errorf("%s documents status %q: list each status", where, code)
				}
				if code >= "400" && !ownFormat(path, code, op) && r.Content.GetOrZero("application/problem+json") == nil {
					t.Errorf("%s %s is not documented as application/problem+json", where, code)
				}
			}
		}
	}
}

// ownFormat tells the error answers that are not problems: readiness DOWN (the
// health body of docs/contracts/observability.md) and the rail's own decline and
// health (docs/contracts/rail-stub.md: rail-stub speaks as a rail, not as a
// lock.dev service).
func ownFormat(path, code string, op *v3.Operation) bool {
	switch {
	case code == "503" && len(op.Tags) == 1 && op.Tags[0] == "health":
		return true
	case code == "422" && path == "/rail/v1/payments", code == "503" && (path == "/rail/v1/health" || path == "/iso20022/health"):
		return true
	}
	return false
}
