package pgxlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
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
			pools := make([]*pgxpool.Pool, tc.pools)
			for p := range pools {
				pools[p] = newPool(t, url, "exec", 2)
			}
			locktest.Fleet(t, tc.pools, 2, run, func(p int) error {
				return pgxlock.WithLock(context.Background(), pools[p], key, func(context.Context, pgx.Tx) error {
					time.Sleep(hold)
					return nil
				}, txlock.WithTimeout(run))
			})
		})
	}
}
