package stack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/internal/pgcluster"
)

// A replicated stack (Options.Replicated) runs paydb and lockdb on one primary
// and its streaming standby. The services, the stack's own pools and the
// reconcilers are given the pair's multi-host URLs, so a promotion is followed
// without a restart: that is what a failover test exercises.
//
// The pair runs with fsync off, like every throwaway cluster (the services get
// UNSAFE_NON_DURABLE_DB=true). That does not weaken the proof: KillPrimary ends
// the primary's processes, not the machine, so nothing a commit wrote is lost to
// the operating system (its page cache survives), and the killed primary is
// never started again anyway. What a failover can lose is what never reached
// the standby — the replication, which runs exactly as with fsync on: a
// synchronous commit still waits for the standby's flush acknowledgement.

// Pair is the replicated cluster of Options.Replicated, nil otherwise.
func (s *Stack) Pair() *pgcluster.Pair { return s.pair }

func (s *Stack) needPair() (*pgcluster.Pair, error) {
	if s.pair == nil {
		return nil, errors.New("stack: no replicated cluster (Options.Replicated)")
	}
	return s.pair, nil
}

// HoldStandby makes the standby fall behind (pgcluster.Pair.HoldStandby): with a
// synchronous standby every COMMIT now waits; with an asynchronous one commits go
// on and exist on the primary alone.
func (s *Stack) HoldStandby() error {
	p, err := s.needPair()
	if err != nil {
		return err
	}
	return p.HoldStandby()
}

// ReleaseStandby lets a held standby catch up.
func (s *Stack) ReleaseStandby() {
	if s.pair != nil {
		s.pair.ReleaseStandby()
	}
}

// WaitCommitHeld waits until at least one COMMIT on the primary waits for the
// held synchronous standby (wait_event SyncRep): a commit is in flight, neither
// acknowledged nor refused, which is the moment a failover must not lose.
func (s *Stack) WaitCommitHeld(ctx context.Context) error {
	p, err := s.needPair()
	if err != nil {
		return err
	}
	url := p.Primary().URL("postgres")
	for {
		n, err := countSyncRepWaiters(ctx, url)
		if err == nil && n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: no commit waits for the standby: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func countSyncRepWaiters(ctx context.Context, url string) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	err = conn.QueryRow(cctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
	return n, err
}

// KillPrimary ends every process of the primary with SIGKILL and waits for them;
// what a held relay had not passed on dies with it.
func (s *Stack) KillPrimary() error {
	p, err := s.needPair()
	if err != nil {
		return err
	}
	return p.KillPrimary()
}

// Promote promotes the standby (released first if held) and returns once it
// accepts writes.
func (s *Stack) Promote(ctx context.Context) error {
	p, err := s.needPair()
	if err != nil {
		return err
	}
	p.ReleaseStandby()
	return p.Promote(ctx)
}

// Failover is what Stack.Failover did, and when.
type Failover struct {
	KilledAt   time.Time // the primary was gone (SIGKILL, every process waited for)
	PromotedAt time.Time // the standby accepted writes
}

// Failover kills the primary with SIGKILL (every process: no shutdown, no WAL
// sent after it), lets a held standby go — what the relay held dies with the
// primary, so the standby gets none of it — and promotes the standby. The
// services keep running throughout: requests answer 503 until the promotion,
// then the same processes serve from the new primary.
func (s *Stack) Failover(ctx context.Context) (Failover, error) {
	p, err := s.needPair()
	if err != nil {
		return Failover{}, err
	}
	var f Failover
	if err := p.KillPrimary(); err != nil {
		return f, err
	}
	f.KilledAt = time.Now()
	if err := s.Promote(ctx); err != nil {
		return f, err
	}
	f.PromotedAt = time.Now()
	return f, nil
}
