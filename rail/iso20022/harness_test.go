package iso20022_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"lock.dev/internal/isomsg"
	"lock.dev/lockapi"
	"lock.dev/rail"
)

// harness writes a bank's ISO 20022 replies with isomsg's writers, as
// railtest.Harness asks: byte for byte, control characters and NUL included.
type harness struct{}

// replyAt is when the harness's documents are dated.
var replyAt = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// placeholder maps each ASCII control character of s to a private-use
// character, which XML carries, so that a writer takes it; unplace puts the
// raw bytes back into the written document.
func placeholder(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return 0xE000 + r
		}
		return r
	}, s)
}

func unplace(doc []byte) []byte {
	for c := rune(0); c < 0x80; c++ {
		if c >= 0x20 && c != 0x7f {
			continue
		}
		doc = bytes.ReplaceAll(doc, utf8.AppendRune(nil, 0xE000+c), []byte{byte(c)})
	}
	return doc
}

func msgID(p rail.Payment) string { return "submission-" + strconv.FormatInt(p.SubmissionID, 10) }

// statusReport is the bank's pain.002 on p with status and what else r sets.
func statusReport(p rail.Payment, r isomsg.StatusReport) rail.Reply {
	r.MsgID, r.OrgnlMsgID, r.EndToEndID, r.CreatedAt = "BANK-RPT-1", msgID(p), p.PayoutID, replyAt
	r.AcctSvcrRef, r.ReasonCode = placeholder(r.AcctSvcrRef), placeholder(r.ReasonCode)
	doc, err := isomsg.WriteStatusReport(r)
	if err != nil {
		panic(fmt.Sprintf("harness: pain.002 %+v: %v", r, err))
	}
	return rail.Reply{Status: http.StatusOK, ContentType: "application/xml", Body: unplace(doc)}
}

func (harness) Accept(p rail.Payment, railReference string) rail.Reply {
	return statusReport(p, isomsg.StatusReport{Status: "ACSC", AcctSvcrRef: railReference})
}

func (harness) Decline(p rail.Payment, reason string) rail.Reply {
	return statusReport(p, isomsg.StatusReport{Status: "RJCT", ReasonCode: reason})
}

func (harness) Pending(p rail.Payment) (rail.Reply, bool) {
	return statusReport(p, isomsg.StatusReport{Status: "PDNG"}), true
}

// Statement writes lines as booked debit entries of a camt.053, a statement
// for each run of lines of one account and currency, balances opening at 0.
func (harness) Statement(lines []lockapi.StatementLine, after int64, limit int) rail.Reply {
	var stmts []isomsg.Statement
	for _, l := range lines {
		if n := len(stmts); n == 0 || stmts[n-1].Account != l.AccountID || stmts[n-1].Currency != l.Currency {
			stmts = append(stmts, isomsg.Statement{ID: fmt.Sprintf("STMT-%d-%d", after, len(stmts)+1),
				Account: l.AccountID, Currency: l.Currency})
		}
		s := &stmts[len(stmts)-1]
		var ref string
		if l.RailReference != nil {
			ref = *l.RailReference
		}
		s.Entries = append(s.Entries, isomsg.Entry{Ref: strconv.FormatInt(l.Seq, 10), AcctSvcrRef: ref,
			EndToEndID: l.Reference, CreditorAccount: l.Beneficiary, Currency: l.Currency,
			AmountMinor: l.AmountMinor, Debit: true, Status: isomsg.Booked, BookedAt: l.ReceivedAt})
		s.ClosingMinor -= l.AmountMinor
	}
	if len(stmts) == 0 {
		stmts = []isomsg.Statement{{ID: fmt.Sprintf("STMT-%d-empty", after), Account: "DE89370400440532013000", Currency: "EUR"}}
	}
	doc, err := isomsg.WriteStatements(fmt.Sprintf("CAMT-%d-%d", after, limit), replyAt, stmts)
	if err != nil {
		panic(fmt.Sprintf("harness: camt.053: %v", err))
	}
	return rail.Reply{Status: http.StatusOK, ContentType: "application/xml", Body: doc}
}

// DeclinesInStatement: a bank statement lists what moved.
func (harness) DeclinesInStatement() bool { return false }
