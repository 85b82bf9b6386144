package lockserver

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/internal/pgtest"
	"lock.dev/lockapi"
)

// skewedClock is a server clock off by a fixed amount.
type skewedClock struct{ by time.Duration }

func (c skewedClock) Now() time.Time { return time.Now().Add(c.by) }

// lock-servers whose own clocks are an hour fast and an hour slow
// grant and expire exactly as lockdb's clock says. Each step is one a server
// judging by its own clock would answer differently: the fast one would think
// the lease expired, the slow one that it still runs.
func TestSkewedServerClock(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.LockdbURL(t)
	pool := pgtest.Pool(t, dbURL)
	cfg := testConfig(dbURL)
	cfg.MinTTL = 100 * time.Millisecond
	fastCfg, slowCfg := cfg, cfg
	fastCfg.Clock = skewedClock{time.Hour}
	slowCfg.Clock = skewedClock{-time.Hour}
	fast, slow := startServer(t, fastCfg), startServer(t, slowCfg)
	const name, ttl = "account:skew", 300

	// Granted at lockdb's time, for exactly the TTL, by either server.
	for i, s := range []*testServer{fast, slow} {
		n := fmt.Sprintf("account:skew-%d", i)
		before := dbNow(t, pool)
		l := mustAcquire(t, s.URL, n, "o", ttl)
		after := dbNow(t, pool)
		if l.AcquiredAt.Before(before) || l.AcquiredAt.After(after) {
			t.Errorf("acquiredAt %s outside lockdb's [%s, %s]", l.AcquiredAt, before, after)
		}
		if d := l.ExpiresAt.Sub(l.AcquiredAt); d < ttl*time.Millisecond || d > ttl*time.Millisecond+time.Millisecond {
			t.Errorf("lease length %s, want %dms", d, ttl)
		}
	}

	l := mustAcquire(t, fast.URL, name, "first", ttl)
	// The fast server would think the lease long gone.
	a, _, _ := acquireCall(fast.URL, name, "second", ttl)
	wantProblem(t, "fast server, acquire while held", a, http.StatusConflict, lockapi.CodeLockHeld)
	l = mustRenew(t, fast.URL, name, "first", l.Token, ttl)
	var st lockapi.LockState
	if getJSON(t, lockURL(fast.URL, name, ""), &st); !st.Held {
		t.Errorf("fast server: GET says not held while held: %+v", st)
	}

	waitDBPast(t, pool, l.ExpiresAt)
	// The slow server would think the lease has an hour left.
	if getJSON(t, lockURL(slow.URL, name, ""), &st); st.Held || st.OwnerID != nil {
		t.Errorf("slow server: GET says held after expiry: %+v", st)
	}
	a, _, _ = renewCall(slow.URL, name, "first", l.Token, ttl)
	wantProblem(t, "slow server, renew after expiry", a, http.StatusConflict, lockapi.CodeLeaseLost)
	l2 := mustAcquire(t, slow.URL, name, "second", ttl)
	if l2.Token != l.Token+1 || l2.AcquiredAt.Before(l.ExpiresAt) {
		t.Errorf("slow server grant after expiry: %+v, previous expired %s", l2, l.ExpiresAt)
	}
}

// The server's own clock may be read in clock.go only: time.Now, time.Since and
// time.Until anywhere else in the package's code would be a local clock that
// could start deciding ownership. (The skew test shows the injected clock has no
// say; this shows no other clock is read.)
func TestLocalClockReadOnlyInClockFile(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "clock.go" {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "time" {
				switch sel.Sel.Name {
				case "Now", "Since", "Until", "After", "Tick", "NewTimer", "NewTicker", "AfterFunc":
					t.Errorf("%s: time.%s outside clock.go", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
