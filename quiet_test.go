package txlock_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// Busy attempts leave no ERROR line in the server's log, with every
// strategy: 8 pools (a fleet of 8 processes) × 2 workers on one key, on a
// server of the test's own, whose log holds only this test's lines.
func TestQuietServerLog(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	pools := make([]*sql.DB, 8)
	for i := range pools {
		pools[i] = locktest.Open(t, c.URL(), 4)
	}
	locktest.RequireQuietLog(t, c.LogPath(), len(pools), func(ctx context.Context, pool int, key txlock.Key, fn func() error, opts ...txlock.Option) error {
		return txlock.WithLock(ctx, pools[pool], key, func(context.Context, *sql.Tx) error { return fn() }, opts...)
	})
}
