package api_test

import (
	"encoding/json"
	"fmt"

	"lock.dev/api"
)

// Each service serves its own OpenAPI 3.1 document at /openapi.json; the same
// bytes are here, for a client generator or a contract test of a team's own.
func ExampleDocument() {
	for _, s := range api.Services() {
		b, err := api.Document(s)
		if err != nil {
			fmt.Println(s, err)
			continue
		}
		var doc struct {
			OpenAPI string `json:"openapi"`
			Paths   map[string]any
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			fmt.Println(s, err)
			continue
		}
		fmt.Println(s, doc.OpenAPI, len(doc.Paths) > 0)
	}
	// Output:
	// lock-server 3.1.0 true
	// payment-resource 3.1.0 true
	// rail-proxy 3.1.0 true
	// rail-stub 3.1.0 true
}
