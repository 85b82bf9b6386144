package railproxy

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	"lock.dev/lockapi"
)

// oracleParse is lockapi.ParseObject + ParseSubmissionRequest as they were before
// the single-pass parser (json.Valid, a trial decode, then tokens), kept as the
// reference the new parser must agree with on every input.
func oracleParse(b []byte) (lockapi.SubmissionRequest, []lockapi.FieldError) {
	var req lockapi.SubmissionRequest
	fail := func(p string) (lockapi.SubmissionRequest, []lockapi.FieldError) {
		return req, []lockapi.FieldError{{Field: "body", Problem: p}}
	}
	if !json.Valid(b) {
		dec := json.NewDecoder(bytes.NewReader(b))
		var v json.RawMessage
		if err := dec.Decode(&v); err == nil {
			return fail("must contain exactly one JSON value (trailing data found)")
		}
		return fail("must be well-formed JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return fail("must be well-formed JSON")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fail("must be a JSON object")
	}
	var errs []lockapi.FieldError
	members := map[string]json.RawMessage{}
	var order []string
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return fail("must be well-formed JSON")
		}
		k, _ := kt.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fail("must be well-formed JSON")
		}
		if _, dup := members[k]; dup {
			errs = append(errs, lockapi.FieldError{Field: k, Problem: "must appear only once"})
			continue
		}
		members[k] = raw
		order = append(order, k)
	}
	// Rebuild a canonical object without duplicates and bind it with the new
	// code's binder, whose field rules did not change; what is compared is the
	// parse: the verdict, the duplicates, the member values and their order.
	var canon bytes.Buffer
	canon.WriteByte('{')
	for i, k := range order {
		if i > 0 {
			canon.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		canon.Write(kb)
		canon.WriteByte(':')
		canon.Write(members[k])
	}
	canon.WriteByte('}')
	req, berrs := lockapi.ParseSubmissionRequest(canon.Bytes())
	return req, append(errs, berrs...)
}

func TestParseObjectAgreesWithOracle(t *testing.T) {
	t.Parallel()
	seeds := []string{
		`{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`,
		` {"payoutId" : "p\u002d1", "accountId":"a\/b","amountMinor":-0,"currency":"EUR","beneficiary":"x","extra":[1,{"a":[true,false,null]},-1.5e+3]} `,
		`{"payoutId":"p","payoutId":"q","amountMinor":1.0,"currency":null,"beneficiary":7}`,
		`{"payoutId":"\ud83d\ude00","accountId":"\u00e9","amountMinor":1e2,"currency":"\"","beneficiary":"\\"}`,
		`{}`, `[]`, `[1] x`, `1 2`, `"s"`, `{"a":1}{`, `{"a":1,}`, `{"a"}`, `{"a":01}`, `{"a":1.}`, `{"a":-}`,
		`{"a":"\x"}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", "{\"\xff\":1}", `nul`, ``, `   `, `{"a":[1,]}`, `{"a":tru}`,
	}
	for _, s := range seeds {
		compareParse(t, []byte(s))
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`{}[]":,.-+eE0123456789 \/ubtnrfalsx` + "\x00\xff\t")
	for range 30000 {
		b := []byte(seeds[r.IntN(len(seeds))])
		for range 1 + r.IntN(3) {
			switch op := r.IntN(3); {
			case op == 0 && len(b) > 0:
				b[r.IntN(len(b))] = alphabet[r.IntN(len(alphabet))]
			case op == 1:
				p := r.IntN(len(b) + 1)
				b = append(b[:p], append([]byte{alphabet[r.IntN(len(alphabet))]}, b[p:]...)...)
			case len(b) > 0:
				p := r.IntN(len(b))
				b = append(b[:p], b[p+1:]...)
			}
		}
		compareParse(t, b)
	}
}

func FuzzParseObjectAgreesWithOracle(f *testing.F) {
	f.Add([]byte(`{"payoutId":"p-1001","accountId":"acct-7","amountMinor":125000,"currency":"EUR","beneficiary":"NL91ABNA0417164300"}`))
	f.Fuzz(func(t *testing.T, b []byte) { compareParse(t, b) })
}

func compareParse(t *testing.T, b []byte) {
	t.Helper()
	wantReq, wantErrs := oracleParse(b)
	gotReq, gotErrs := lockapi.ParseSubmissionRequest(b)
	if len(wantErrs) == 0 {
		wantErrs = nil
	}
	if len(gotErrs) == 0 {
		gotErrs = nil
	}
	if !reflect.DeepEqual(gotErrs, wantErrs) || (wantErrs == nil && gotReq != wantReq) {
		t.Fatalf("%q:\n got %+v %+v\nwant %+v %+v", b, gotReq, gotErrs, wantReq, wantErrs)
	}
}
