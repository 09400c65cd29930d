package txlock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// TestFleetNoStarvation runs a fleet on one key with the default strategy:
// fleetPools pools (processes, as far as the lock can tell) of 2 callers,
// each holding the lock for fleetHold, which makes the server's queue
// longer than one window. A caller whose window ends busy keeps waiting in
// the server, window after window, so no call times out. (A window that
// ends busy rejoins the server's queue at its back, so a wait is bounded
// in probability only: the timeout is the whole run.) Before, such a caller fell back to polling and lost every release to the
// windows that other pools kept queued: in a 12 s run of this fleet, 25
// calls timed out, and two pools acquired nothing.
func TestFleetNoStarvation(t *testing.T) {
	url := pgtest.Postgres(t)
	direct(t) // checks that no advisory lock is left
	key := txlock.StringKey(uniq(t))
	var (
		wg       sync.WaitGroup
		acquired [fleetPools]atomic.Int64
		stop     atomic.Bool
		failures = make(chan error, fleetPools*2)
	)
	for p := range fleetPools {
		db := open(t, url)
		db.SetMaxOpenConns(2)
		db.SetMaxIdleConns(2)
		for range 2 {
			wg.Go(func() {
				for !stop.Load() {
					err := txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
						time.Sleep(fleetHold)
						return nil
					}, txlock.WithTimeout(fleetTimeout))
					if err != nil {
						failures <- err
						return
					}
					acquired[p].Add(1)
				}
			})
		}
	}
	time.Sleep(fleetRun)
	stop.Store(true)
	wg.Wait()
	close(failures)
	for err := range failures {
		assert.False(t, errors.Is(err, txlock.ErrLockTimeout), "a call starved: %v", err)
		assert.NoError(t, err)
	}
	var counts [fleetPools]int64
	for p := range counts {
		counts[p] = acquired[p].Load()
		assert.Positive(t, counts[p], "pool %d acquired nothing", p)
	}
	t.Logf("acquisitions per pool in %v: %v", fleetRun, counts)
}

// TestFleetNoStarvation's fleet: its holds make a queue of 16 callers 960
// ms long, past the 200 ms window, and its timeout is as long as the run.
const (
	fleetPools   = 8
	fleetHold    = 60 * time.Millisecond
	fleetTimeout = fleetRun
	fleetRun     = 8 * time.Second
)
