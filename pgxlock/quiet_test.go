package pgxlock_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// Busy attempts leave no ERROR line in the server's log, with every
// strategy, on pgx as on database/sql (the root's TestQuietServerLog).
func TestQuietServerLog(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	pools := make([]*pgxpool.Pool, 8)
	for i := range pools {
		pools[i] = newPool(t, c.URL(), "", 4)
	}
	locktest.RequireQuietLog(t, c.LogPath(), len(pools), func(ctx context.Context, pool int, key txlock.Key, fn func() error, opts ...txlock.Option) error {
		return pgxlock.WithLock(ctx, pools[pool], key, func(context.Context, pgx.Tx) error { return fn() }, opts...)
	})
}
