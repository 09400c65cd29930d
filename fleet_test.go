package txlock_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// TestFleetNoStarvation runs a fleet on one key with the default strategy:
// fleetPools pools (processes, as far as the lock can tell) of 2 callers,
// each holding the lock for fleetHold, which makes the server's queue
// longer than one window. A caller whose window ends busy keeps waiting in
// the server, window after window, so no call times out. (A window that
// ends busy rejoins the server's queue at its back, so a wait is bounded
// in probability only: the timeout is the whole run.) Before, such a
// caller fell back to polling and lost every release to the windows that
// other pools kept queued: in a 12 s run of this fleet, 25 calls timed
// out, and two pools acquired nothing. pgxlock's test of the same name
// runs it on pgx pools, directly and through PgBouncer.
func TestFleetNoStarvation(t *testing.T) {
	url := pgtest.Postgres(t)
	direct(t) // checks that no advisory lock is left
	key := txlock.StringKey(uniq(t))
	dbs := make([]*sql.DB, fleetPools)
	for p := range dbs {
		dbs[p] = open(t, url)
		dbs[p].SetMaxOpenConns(2)
		dbs[p].SetMaxIdleConns(2)
	}
	locktest.Fleet(t, fleetPools, 2, fleetRun, func(p int) error {
		return txlock.WithLock(context.Background(), dbs[p], key, func(context.Context, *sql.Tx) error {
			time.Sleep(fleetHold)
			return nil
		}, txlock.WithTimeout(fleetRun))
	})
}

// TestFleetNoStarvation's fleet: its holds make a queue of 16 callers 960
// ms long, past the 200 ms window, and its timeout is as long as the run.
const (
	fleetPools = 8
	fleetHold  = 60 * time.Millisecond
	fleetRun   = 8 * time.Second
)
