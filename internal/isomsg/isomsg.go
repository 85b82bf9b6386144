// Package isomsg is the project's codec for the three ISO 20022 messages its
// iso20022 rail speaks: pain.001.001.09 (a credit transfer initiation, one
// payment per message), pain.002.001.10 (the bank's status report on it) and
// camt.053.001.08 (the bank's account statement). The iso20022 rail adapter,
// rail-stub in its ISO mode and the reconciler's statement files all read and
// write through it, so there is one mapping (docs/contracts/iso20022.md).
//
// Messages are encoded and decoded with encoding/xml through types of the
// package's own that name exactly the elements the project writes or reads; a
// reader ignores elements it does not know, so a bank's richer documents are
// read, but refuses a document whose elements it needs are missing or malformed.
// Amounts are written by the currency's ISO 4217 exponent (lock.dev/internal/iso4217).
// The official schemas are kept beside the package in xsd/.
package isomsg

import (
	"errors"
	"time"

	"lock.dev/lockapi"
)

var errNotYet = errors.New("isomsg: not implemented yet")

// Initiation is one pain.001.001.09 credit transfer initiation with one payment
// information block and one transaction.
type Initiation struct {
	MsgID           string // GrpHdr/MsgId
	PmtInfID        string // PmtInf/PmtInfId
	EndToEndID      string // CdtTrfTxInf/PmtId/EndToEndId
	DebtorAccount   string // PmtInf/DbtrAcct: an IBAN, else Othr/Id
	CreditorAccount string // CdtTrfTxInf/CdtrAcct: an IBAN, else Othr/Id
	AmountMinor     int64  // CdtTrfTxInf/Amt/InstdAmt in minor units
	Currency        string // InstdAmt/@Ccy
	CreatedAt       time.Time
}

// WriteInitiation encodes in as a pain.001.001.09 document.
func WriteInitiation(in Initiation) ([]byte, error) { return nil, errNotYet }

// ReadInitiation decodes a pain.001.001.09 document with exactly one PmtInf
// holding exactly one CdtTrfTxInf.
func ReadInitiation(b []byte) (Initiation, error) { return Initiation{}, errNotYet }

// StatusReport is one pain.002.001.10 status report on one transaction.
type StatusReport struct {
	MsgID          string // GrpHdr/MsgId
	OrgnlMsgID     string // OrgnlGrpInfAndSts/OrgnlMsgId
	EndToEndID     string // TxInfAndSts/OrgnlEndToEndId
	Status         string // TxInfAndSts/TxSts (ACSC, RJCT, PDNG …)
	AcctSvcrRef    string // TxInfAndSts/AcctSvcrRef
	ReasonCode     string // TxInfAndSts/StsRsnInf/Rsn/Cd
	AdditionalInfo string // TxInfAndSts/StsRsnInf/AddtlInf
	CreatedAt      time.Time
}

// WriteStatusReport encodes r as a pain.002.001.10 document.
func WriteStatusReport(r StatusReport) ([]byte, error) { return nil, errNotYet }

// ReadStatusReport decodes a pain.002.001.10 document reporting on exactly one
// transaction.
func ReadStatusReport(b []byte) (StatusReport, error) { return StatusReport{}, errNotYet }

// Statement is one camt.053.001.08 Stmt.
type Statement struct {
	ID           string
	Account      string     // Acct/Id: IBAN or Othr/Id
	From, To     *time.Time // FrToDt; nil when the statement has none
	Currency     string     // the balances' currency
	OpeningMinor int64      // OPBD, signed: credit +, debit −
	ClosingMinor int64      // CLBD, signed
	Entries      []Entry
}

// Entry is one Ntry of a statement.
type Entry struct {
	Ref                string // NtryRef
	AcctSvcrRef        string // TxDtls/Refs/AcctSvcrRef, else the entry's
	EndToEndID         string // TxDtls/Refs/EndToEndId
	CreditorAccount    string // TxDtls/RltdPties/CdtrAcct: IBAN or Othr/Id
	Currency           string // Amt/@Ccy
	AmountMinor        int64  // Amt, unsigned
	Debit              bool   // CdtDbtInd DBIT
	Status             string // Sts/Cd (BOOK, PDNG, INFO …)
	BookedAt           time.Time
	InstructedMinor    *int64 // TxDtls/AmtDtls/InstdAmt/Amt; nil when absent
	InstructedCurrency string
}

// WriteStatements encodes stmts as one camt.053.001.08 document, one Stmt each.
func WriteStatements(msgID string, createdAt time.Time, stmts []Statement) ([]byte, error) {
	return nil, errNotYet
}

// ReadStatements decodes a camt.053.001.08 document's statements.
func ReadStatements(b []byte) ([]Statement, error) { return nil, errNotYet }

// Balanced checks that the closing balance minus the opening one is the sum of
// the entries, credits positive and debits negative.
func (s Statement) Balanced() error { return errNotYet }

// Lines are the statement's booked debit entries as ACCEPTED statement lines.
func (s Statement) Lines() ([]lockapi.StatementLine, error) { return nil, errNotYet }
