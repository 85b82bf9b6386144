package lockserver

import "time"

// Clock is where the server reads local time. Nothing that decides ownership may
// read it: expiry is judged by lockdb's clock_timestamp() so that every replica
// agrees (docs/contracts/lock-service.md). This file is the only one allowed to call time.Now;
// a test enforces that.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// since is how long ago start was by c.
func since(c Clock, start time.Time) time.Duration { return c.Now().Sub(start) }
