package iso20022_test

import (
	"net/http"
	"testing"

	"lock.dev/rail"
	"lock.dev/rail/iso20022"
)

// BenchmarkAdapterPayment is the adapter's share of one submission: encode the
// pain.001 and decode the bank's accepting pain.002.
func BenchmarkAdapterPayment(b *testing.B) {
	a := iso20022.New()
	reply := harness{}.Accept(pay, "BANK-TX-0000000001")
	b.ReportAllocs()
	for b.Loop() {
		req, err := a.PaymentRequest(pay)
		if err != nil || len(req.Body) == 0 {
			b.Fatal(err)
		}
		if ans := a.ReadAnswer(pay, rail.Reply{Status: http.StatusOK, ContentType: reply.ContentType, Body: reply.Body}); ans.Verdict != rail.Accepted {
			b.Fatalf("%+v", ans)
		}
	}
}
