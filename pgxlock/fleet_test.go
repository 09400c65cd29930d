package pgxlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// TestFleetNoStarvation is txlock's TestFleetNoStarvation on pgx pools,
// directly and through PgBouncer (its pool of 5 server connections: 4
// pools' heads and the holder), where a head that fell back to polling
// after one window was first seen to starve: pools of 2 callers on one key
// with the default strategy, holding it for 60 ms, which makes the
// server's queue longer than one window. No call may time out, and every
// pool acquires.
func TestFleetNoStarvation(t *testing.T) {
	const (
		hold = 60 * time.Millisecond
		run  = 6 * time.Second
	)
	for _, tc := range []struct {
		path  string
		pools int
	}{{"direct", 8}, {"pgbouncer", 4}} {
		t.Run(tc.path, func(t *testing.T) {
			direct(t) // checks that no advisory lock is left
			url := pgtest.Postgres(t)
			if tc.path == "pgbouncer" {
				url, _ = pgtest.PgBouncer(t)
			}
			key := txlock.StringKey(uniq(t))
			var (
				wg       sync.WaitGroup
				acquired = make([]atomic.Int64, tc.pools)
				stop     atomic.Bool
				failures = make(chan error, tc.pools*2)
			)
			for p := range tc.pools {
				pool := newPool(t, url, "exec", 2)
				for range 2 {
					wg.Go(func() {
						for !stop.Load() {
							err := pgxlock.WithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error {
								time.Sleep(hold)
								return nil
							}, txlock.WithTimeout(run))
							if err != nil {
								failures <- err
								return
							}
							acquired[p].Add(1)
						}
					})
				}
			}
			time.Sleep(run)
			stop.Store(true)
			wg.Wait()
			close(failures)
			for err := range failures {
				assert.False(t, errors.Is(err, txlock.ErrLockTimeout), "a call starved: %v", err)
				assert.NoError(t, err)
			}
			counts := make([]int64, tc.pools)
			for p := range counts {
				counts[p] = acquired[p].Load()
				assert.Positive(t, counts[p], "pool %d acquired nothing", p)
			}
			t.Logf("acquisitions per pool in %v: %v", run, counts)
		})
	}
}
