package txlock_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// LockTx's windows (WithServerWait in the caller's transaction) end
// without an error in the server's log too, and leave the caller's
// transaction usable: 4 callers in transactions of their own contend for
// one key with windows far shorter than the waits they meet.
func TestQuietLockTxWindows(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	db := locktest.Open(t, c.URL(), 8)
	key := txlock.StringKey(locktest.Uniq(t))
	from := locktest.LogSize(t, c.LogPath())
	var busy atomic.Int64
	obs := txlock.WithObserver(txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		if e.Kind == txlock.Busy {
			busy.Add(1)
		}
		return ctx
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				tx, err := db.Begin()
				if !assert.NoError(t, err) {
					return
				}
				err = txlock.LockTx(context.Background(), tx, key, obs, txlock.WithServerWait(txlock.ServerWait{Window: 5 * time.Millisecond}), txlock.WithTimeout(10*time.Second))
				if assert.NoError(t, err) {
					var one int
					assert.NoError(t, tx.QueryRow("SELECT 1").Scan(&one), "the caller's transaction is usable")
					time.Sleep(2 * time.Millisecond)
				}
				assert.NoError(t, tx.Commit())
			}
		})
	}
	wg.Wait()
	errs := locktest.ErrorLines(t, c.LogPath(), from)
	t.Logf("%d busy windows, %d ERROR lines in the server's log", busy.Load(), len(errs))
	assert.Positive(t, busy.Load(), "no window ended: the run shows nothing")
	assert.Empty(t, errs, "the server logged errors")
}
