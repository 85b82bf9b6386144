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
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// The namespaces of the three messages: a document in any other is refused.
const (
	NamespacePain001 = "urn:iso:std:iso:20022:tech:xsd:pain.001.001.09"
	NamespacePain002 = "urn:iso:std:iso:20022:tech:xsd:pain.002.001.10"
	NamespaceCamt053 = "urn:iso:std:iso:20022:tech:xsd:camt.053.001.08"
)

// notProvided is what the schema's mandatory elements hold where the project
// has nothing to say: the debtor's agent (the bank the rail is) and the names
// of parties the payout does not name. It is the value banks' implementation
// guides ask for in that case, rather than an invented identifier.
const notProvided = "NOTPROVIDED"

// marshal writes doc as an XML document with its declaration.
func marshal(doc any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(xml.Header)
	if err := xml.NewEncoder(&b).Encode(doc); err != nil {
		return nil, err
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// unmarshal reads b, one XML document, into doc. Unlike xml.Unmarshal it
// refuses anything after the root element but white space, comments and
// processing instructions: a second root or trailing bytes make the whole
// document not understood, rather than silently half-read.
func unmarshal(b []byte, doc any) error {
	d := xml.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(doc); err != nil {
		return err
	}
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch t := tok.(type) {
		case xml.Comment, xml.ProcInst:
		case xml.CharData:
			if len(bytes.TrimSpace(t)) != 0 {
				return errors.New("text after the document's root element")
			}
		default:
			return errors.New("more after the document's root element")
		}
	}
}

// xmlSpace is XML's white space, which the schema types built on xs:decimal,
// xs:date and xs:dateTime collapse: "<Amt> 1.00 </Amt>" is valid there.
const xmlSpace = " \t\r\n"

// formatDateTime writes t as an ISO 20022 ISODateTime, in UTC.
func formatDateTime(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}

// formatDate writes t's UTC date as an ISO 20022 ISODate.
func formatDate(t time.Time) string {
	return t.UTC().Format(time.DateOnly)
}

// parseDateTime reads an ISODateTime (xs:dateTime). A time without a zone
// offset is read as UTC: the schema allows it, and a file gives no other zone
// to read it in.
func parseDateTime(s string) (time.Time, error) {
	s = strings.Trim(s, xmlSpace)
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an ISO date and time", s)
}

// parseDate reads an ISODate (xs:date, which may carry a zone) as the date's
// 00:00 UTC.
func parseDate(s string) (time.Time, error) {
	s = strings.Trim(s, xmlSpace)
	for _, layout := range []string{time.DateOnly, "2006-01-02Z07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an ISO date", s)
}

// amount is an ISO 20022 amount with its currency attribute.
type amount struct {
	Ccy   string `xml:"Ccy,attr"`
	Value string `xml:",chardata"`
}

func newAmount(minor int64, currency string) (amount, error) {
	v, err := FormatAmount(minor, currency)
	if err != nil {
		return amount{}, err
	}
	return amount{Ccy: currency, Value: v}, nil
}

// minor reads a into minor units of its currency.
func (a amount) minor() (int64, error) {
	return ParseAmount(strings.Trim(a.Value, xmlSpace), a.Ccy)
}

// accountID is AccountIdentification4Choice: an IBAN, or another
// identification in Othr/Id.
type accountID struct {
	IBAN string     `xml:"IBAN,omitempty"`
	Othr *otherAcct `xml:"Othr,omitempty"`
}

type otherAcct struct {
	ID string `xml:"Id"`
}

// cashAccount is CashAccount38 (and CashAccount39's part the project uses):
// only the identification.
type cashAccount struct {
	ID accountID `xml:"Id"`
}

// newAccount identifies account as an IBAN when it is one (ISO 13616's form and
// check digits, written without spaces), and by Othr/Id otherwise — exactly as
// given either way, so what comes back is what was sent.
func newAccount(account string) cashAccount {
	if IsIBAN(account) {
		return cashAccount{ID: accountID{IBAN: account}}
	}
	return cashAccount{ID: accountID{Othr: &otherAcct{ID: account}}}
}

// id is the account's identification, or an error when it has none.
func (c *cashAccount) id() (string, error) {
	if c == nil {
		return "", errors.New("no account")
	}
	switch {
	case c.ID.IBAN != "" && c.ID.Othr != nil:
		return "", errors.New("account has both IBAN and Othr")
	case c.ID.IBAN != "":
		return c.ID.IBAN, nil
	case c.ID.Othr != nil && c.ID.Othr.ID != "":
		return c.ID.Othr.ID, nil
	}
	return "", errors.New("account has no IBAN or Othr/Id")
}

// IsIBAN reports whether s is an IBAN in its electronic form: two capital
// letters, two check digits and up to 30 letters or digits (the schemas'
// IBAN2007Identifier), whose ISO 7064 mod 97-10 check holds. Anything else —
// an IBAN written with spaces included — is an account the project writes as
// Othr/Id.
func IsIBAN(s string) bool {
	if len(s) < 5 || len(s) > 34 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i < 2 && (c < 'A' || c > 'Z'):
			return false
		case i >= 2 && i < 4 && (c < '0' || c > '9'):
			return false
		case !(c >= '0' && c <= '9') && !(c >= 'A' && c <= 'Z') && !(c >= 'a' && c <= 'z'):
			return false
		}
	}
	rem := 0
	for _, c := range s[4:] + s[:4] {
		switch {
		case c >= '0' && c <= '9':
			rem = (rem*10 + int(c-'0')) % 97
		case c >= 'A' && c <= 'Z':
			rem = (rem*100 + int(c-'A') + 10) % 97
		default: // a–z: the schema admits lower case after the check digits
			rem = (rem*100 + int(c-'a') + 10) % 97
		}
	}
	return rem == 1
}

func trimSpace(s string) string { return strings.Trim(s, xmlSpace) }
