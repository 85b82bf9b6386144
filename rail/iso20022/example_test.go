package iso20022_test

import (
	"encoding/xml"
	"fmt"
	"time"

	"lock.dev/rail"
	"lock.dev/rail/iso20022"
)

// The request the adapter builds for a payment: one pain.001 posted to the
// bank, whose EndToEndId is the payoutId the bank's answer and statement carry
// back.
func Example() {
	a := iso20022.NewWithClock(func() time.Time { return time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC) })
	req, err := a.PaymentRequest(rail.Payment{SubmissionID: 42, PayoutID: "p-1001", AccountID: "DE89370400440532013000",
		AmountMinor: 125000, Currency: "EUR", Beneficiary: "NL91ABNA0417164300"})
	if err != nil {
		fmt.Println(err)
		return
	}
	var doc struct {
		EndToEndID string `xml:"CstmrCdtTrfInitn>PmtInf>CdtTrfTxInf>PmtId>EndToEndId"`
		Amount     string `xml:"CstmrCdtTrfInitn>PmtInf>CdtTrfTxInf>Amt>InstdAmt"`
	}
	if err := xml.Unmarshal(req.Body, &doc); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(req.Method, req.Path, req.ContentType)
	fmt.Println("EndToEndId:", doc.EndToEndID)
	fmt.Println("InstdAmt:", doc.Amount)
	// Output:
	// POST /iso20022/pain.001 application/xml
	// EndToEndId: p-1001
	// InstdAmt: 1250.00
}
