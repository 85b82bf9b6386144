package testkit

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// iso20022SchemaFile is the file in internal/isomsg/xsd of the official schema
// for an ISO 20022 document's namespace.
func iso20022SchemaFile(namespace string) (string, bool) {
	switch namespace {
	case "urn:iso:std:iso:20022:tech:xsd:pain.001.001.09":
		return "pain.001.001.09.xsd", true
	case "urn:iso:std:iso:20022:tech:xsd:pain.002.001.10":
		return "pain.002.001.10.xsd", true
	case "urn:iso:std:iso:20022:tech:xsd:camt.053.001.08":
		return "camt.053.001.08.xsd", true
	}
	return "", false
}

// xmllintTimeout bounds one validation; the largest schema loads in well under
// a second.
const xmllintTimeout = 30 * time.Second

// ValidateISO20022 fails t unless doc validates against the official ISO 20022
// schema of its root element's namespace (pain.001.001.09, pain.002.001.10 or
// camt.053.001.08, kept in internal/isomsg/xsd), checked by xmllint from
// Debian's libxml2-utils, the document given on standard input. A missing
// xmllint fails the test, saying what to install: a schema check that is
// skipped checks nothing.
func ValidateISO20022(t testing.TB, doc []byte) {
	t.Helper()
	xsd, err := ISO20022Schema(doc)
	if err != nil {
		t.Fatalf("ISO 20022 schema: %v", err)
	}
	bin, err := exec.LookPath("xmllint")
	if err != nil {
		t.Fatal("xmllint not found: install libxml2-utils (apt-get install libxml2-utils)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), xmllintTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--noout", "--nonet", "--schema", xsd, "-")
	cmd.Stdin = bytes.NewReader(doc)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && ctx.Err() == nil {
			t.Fatalf("document does not validate against %s:\n%s\ndocument:\n%s", filepath.Base(xsd), out, doc)
		}
		t.Fatalf("xmllint against %s: %v\n%s", filepath.Base(xsd), err, out)
	}
}

// ISO20022Schema is the path of the official schema for doc's root namespace,
// or an error when doc has no root element or its namespace is none of the
// three messages the project speaks.
func ISO20022Schema(doc []byte) (string, error) {
	d := xml.NewDecoder(bytes.NewReader(doc))
	for {
		tok, err := d.Token()
		if err != nil {
			return "", fmt.Errorf("no root element: %w", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			name, ok := iso20022SchemaFile(se.Name.Space)
			if !ok {
				return "", fmt.Errorf("root element %s in namespace %q is not one of the project's ISO 20022 messages", se.Name.Local, se.Name.Space)
			}
			return filepath.Join(schemaDir(), name), nil
		}
	}
}

// schemaDir is internal/isomsg/xsd, found from this file's own location so that
// a test in any package (and any working directory) finds it.
func schemaDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "isomsg", "xsd")
}
