package leasepause_test

import (
	"testing"

	"lock.dev/internal/leasepause"
)

// A pauser reaches a lease from Attach until detach, and a nil pauser none.
func TestAttachFreezeThawDetach(t *testing.T) {
	t.Parallel()
	type lease struct{ frozen bool }
	p := leasepause.New[*lease]()
	l, other := &lease{}, &lease{}
	detach := p.Attach(l, leasepause.Hooks{Freeze: func() { l.frozen = true }, Thaw: func() { l.frozen = false }})
	if !p.Freeze(l) || !l.frozen {
		t.Fatal("Freeze did not reach an attached lease")
	}
	if !p.Thaw(l) || l.frozen {
		t.Fatal("Thaw did not reach an attached lease")
	}
	if p.Freeze(other) {
		t.Error("Freeze reached a lease never attached")
	}
	detach()
	if p.Freeze(l) || l.frozen {
		t.Error("Freeze reached a detached lease")
	}
	var none *leasepause.Pauser[*lease]
	none.Attach(l, leasepause.Hooks{Freeze: func() { l.frozen = true }})()
	if none.Freeze(l) || l.frozen {
		t.Error("a nil pauser froze a lease")
	}
}
