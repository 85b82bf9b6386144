package stubjson_test

import (
	"fmt"

	"lock.dev/rail"
	"lock.dev/rail/stubjson"
)

// The adapter builds the request the gate sends and reads the reply it gets;
// only a well-formed accept or decline resolves the attempt.
func ExampleNew() {
	a := stubjson.New()
	p := rail.Payment{SubmissionID: 7, PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 1250, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"}
	req, err := a.PaymentRequest(p)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(req.Method, req.Path)

	for _, r := range []rail.Reply{
		{Status: 200, ContentType: "application/json", Body: []byte(`{"status":"ACCEPTED","railReference":"RS-1"}`)},
		{Status: 422, ContentType: "application/json", Body: []byte(`{"status":"DECLINED","reason":"limit"}`)},
		{Status: 200, ContentType: "application/json", Body: []byte(`{"status":"ACCEPTED"}`)},
	} {
		switch ans := a.ReadAnswer(p, r); ans.Verdict {
		case rail.Accepted:
			fmt.Println("accepted as", ans.RailReference)
		case rail.Declined:
			fmt.Println("declined:", ans.DeclineReason)
		default:
			fmt.Println("not resolved: the payout is settled from the statement")
		}
	}
	// Output:
	// POST /rail/v1/payments
	// accepted as RS-1
	// declined: limit
	// not resolved: the payout is settled from the statement
}
