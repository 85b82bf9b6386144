package railtest_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"unsafe"

	"lock.dev/lockapi"
	"lock.dev/rail"
	"lock.dev/rail/internal/stubharness"
	"lock.dev/rail/railtest"
	"lock.dev/rail/stubjson"
)

// broken is rail-stub's adapter with one reading replaced: each replacement is
// a mistake an adapter could make, and the suite must catch every one.
type broken struct {
	rail.Adapter
	answer    func(inner rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer
	statement func(inner rail.Adapter, r rail.Reply, after int64, limit int) ([]lockapi.StatementLine, error)
}

func (b broken) ReadAnswer(p rail.Payment, r rail.Reply) rail.Answer {
	if b.answer == nil {
		return b.Adapter.ReadAnswer(p, r)
	}
	return b.answer(b.Adapter, p, r)
}

func (b broken) ReadStatement(r rail.Reply, after int64, limit int) ([]lockapi.StatementLine, error) {
	if b.statement == nil {
		return b.Adapter.ReadStatement(r, after, limit)
	}
	return b.statement(b.Adapter, r, after, limit)
}

// lenientAccept finds an accept's reference by scanning for it, as a reader
// that does not parse the reply would.
func lenientAccept(r rail.Reply) (string, bool) {
	const key = `"railReference":"`
	i := bytes.Index(r.Body, []byte(key))
	if i < 0 || !bytes.Contains(r.Body, []byte(`"ACCEPTED"`)) {
		return "", false
	}
	rest := r.Body[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 {
		return "", false
	}
	return string(rest[:j]), true
}

// The control: the stub adapter itself conforms, so each failure below is its
// breakage's.
func TestStubAdapterConforms(t *testing.T) {
	if fs := railtest.Check(stubjson.New(), stubharness.Harness{}); len(fs) != 0 {
		t.Fatalf("the stub adapter fails the suite: %+v", fs)
	}
}

// Every broken adapter fails the suite, on the check its breakage breaks.
func TestBrokenAdaptersFail(t *testing.T) {
	for _, c := range []struct {
		name    string
		adapter broken
		check   string // a check that must fail
	}{
		{"not understood and pending read as accepted", broken{answer: func(in rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
			ans := in.ReadAnswer(p, r)
			if ans.Verdict == rail.NotUnderstood || ans.Verdict == rail.Pending {
				return rail.Answer{Verdict: rail.Accepted, RailReference: "RS-guess"}
			}
			return ans
		}}, "garbage-200"},
		{"not understood read as accepted, truncations", broken{answer: func(in rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
			ans := in.ReadAnswer(p, r)
			if ans.Verdict == rail.NotUnderstood {
				return rail.Answer{Verdict: rail.Accepted, RailReference: "RS-guess"}
			}
			return ans
		}}, "truncated-accept"},
		{"a decline read as an accept", broken{answer: func(in rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
			ans := in.ReadAnswer(p, r)
			if ans.Verdict == rail.Declined {
				return rail.Answer{Verdict: rail.Accepted, RailReference: "RS-" + ans.DeclineReason}
			}
			return ans
		}}, "decline"},
		{"the status ignored", broken{answer: func(in rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
			var rep struct{ Status, RailReference string }
			if json.Unmarshal(r.Body, &rep) == nil && rep.Status == "ACCEPTED" && rep.RailReference != "" {
				return rail.Answer{Verdict: rail.Accepted, RailReference: rep.RailReference}
			}
			return in.ReadAnswer(p, r)
		}}, "accept-under-other-status"},
		{"a reference scanned for, not parsed", broken{answer: func(in rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
			if ref, ok := lenientAccept(r); ok && r.Status == http.StatusOK {
				return rail.Answer{Verdict: rail.Accepted, RailReference: ref}
			}
			return in.ReadAnswer(p, r)
		}}, "reference-control-characters"},
		{"a reference scanned for, truncations", broken{answer: func(in rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
			if ref, ok := lenientAccept(r); ok && r.Status == http.StatusOK {
				return rail.Answer{Verdict: rail.Accepted, RailReference: ref}
			}
			return in.ReadAnswer(p, r)
		}}, "truncated-accept"},
		{"a page that does not parse read as empty", broken{statement: func(in rail.Adapter, r rail.Reply, after int64, limit int) ([]lockapi.StatementLine, error) {
			lines, err := in.ReadStatement(r, after, limit)
			if err != nil {
				return nil, nil
			}
			return lines, nil
		}}, "statement-truncated"},
		{"a line without its reference left out", broken{statement: func(in rail.Adapter, r rail.Reply, after int64, limit int) ([]lockapi.StatementLine, error) {
			lines, err := in.ReadStatement(r, after, limit)
			if err == nil {
				return lines, nil
			}
			var page struct{ Calls []lockapi.RailCall }
			if json.Unmarshal(r.Body, &page) != nil {
				return nil, err
			}
			lines = nil
			for _, c := range page.Calls {
				if c.Reference != "" {
					lines = append(lines, c.Line())
				}
			}
			return lines, nil
		}}, "statement-line-without-reference"},
		{"a page under any status read", broken{statement: func(in rail.Adapter, r rail.Reply, after int64, limit int) ([]lockapi.StatementLine, error) {
			r.Status = http.StatusOK
			return in.ReadStatement(r, after, limit)
		}}, "statement-under-other-status"},
		{"a reference kept in the reply's bytes", broken{answer: func(in rail.Adapter, p rail.Payment, r rail.Reply) rail.Answer {
			ans := in.ReadAnswer(p, r)
			if i := bytes.Index(r.Body, []byte(ans.RailReference)); ans.Verdict == rail.Accepted && i >= 0 {
				// A string that shares the reply's bytes, as an unsafe
				// conversion makes: it changes when the gate reuses them.
				ans.RailReference = unsafe.String(&r.Body[i], len(ans.RailReference))
			}
			return ans
		}}, "accept"},
		{"a statement line kept in the reply's bytes", broken{statement: func(in rail.Adapter, r rail.Reply, after int64, limit int) ([]lockapi.StatementLine, error) {
			lines, err := in.ReadStatement(r, after, limit)
			for k, l := range lines {
				if i := bytes.Index(r.Body, []byte(l.Reference)); i >= 0 {
					lines[k].Reference = unsafe.String(&r.Body[i], len(l.Reference))
				}
			}
			return lines, err
		}}, "statement-page"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.adapter.Adapter = stubjson.New()
			fs := railtest.Check(c.adapter, stubharness.Harness{})
			for _, f := range fs {
				if f.Check == c.check {
					return
				}
			}
			t.Fatalf("the suite did not fail check %q; its failures: %+v", c.check, fs)
		})
	}
}

// named is rail-stub's language with the payout id added to each answer, as a
// language whose answers name their payment writes it.
type named struct{ stubharness.Harness }

func (h named) Accept(p rail.Payment, ref string) rail.Reply {
	return nameIn(h.Harness.Accept(p, ref), p)
}

func (h named) Decline(p rail.Payment, reason string) rail.Reply {
	return nameIn(h.Harness.Decline(p, reason), p)
}

func nameIn(r rail.Reply, p rail.Payment) rail.Reply {
	body := bytes.TrimRight(r.Body, "}\n")
	r.Body = append(append(append([]byte{}, body...), `,"reference":"`+p.PayoutID+`"}`...), '\n')
	return r
}

// namedAdapter reads named's answers; careless, it does not compare the
// payout id the answer names with the payment's.
type namedAdapter struct {
	rail.Adapter
	careless bool
}

func (a namedAdapter) ReadAnswer(p rail.Payment, r rail.Reply) rail.Answer {
	var rep struct{ Reference string }
	if err := json.Unmarshal(r.Body, &rep); err != nil || (!a.careless && rep.Reference != p.PayoutID) {
		return rail.Answer{Verdict: rail.NotUnderstood, Why: "the answer names another payment"}
	}
	return a.Adapter.ReadAnswer(p, r)
}

// In a language whose answers name their payment, an answer for another
// payment taken for this one's fails the suite; compared, it passes.
func TestAnswerForAnotherPaymentFails(t *testing.T) {
	if fs := railtest.Check(namedAdapter{Adapter: stubjson.New()}, named{}); len(fs) != 0 {
		t.Fatalf("the careful adapter fails the suite: %+v", fs)
	}
	fs := railtest.Check(namedAdapter{Adapter: stubjson.New(), careless: true}, named{})
	for _, f := range fs {
		if f.Check == "answer-for-another-payment" {
			return
		}
	}
	t.Fatalf("the careless adapter did not fail answer-for-another-payment: %+v", fs)
}
