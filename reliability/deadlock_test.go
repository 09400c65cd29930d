package reliability_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/reliability/internal/checker"
)

// crossLock has two caller-owned transactions each take one key, then ask
// for the other's with LockTx and opts. It returns what each second LockTx
// returned, how long the pair took, and whether each transaction was still
// usable afterwards. With holdBoth, neither transaction ends before both
// LockTx calls have returned, so a loser's rollback cannot let the other
// through; without it, a loser rolls back at once.
func crossLock(t *testing.T, db *sql.DB, holdBoth bool, opts ...txlock.Option) (errs [2]error, took time.Duration, usable [2]bool) {
	t.Helper()
	ctx := context.Background()
	base := fmt.Sprintf("deadlock/%s/%d", t.Name(), time.Now().UnixNano())
	keys := [2]txlock.Key{txlock.StringKey(base + "/a"), txlock.StringKey(base + "/b")}
	var txs [2]*sql.Tx
	for i := range txs {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		txs[i] = tx
		require.NoError(t, txlock.LockTx(ctx, tx, keys[i]))
	}
	start := time.Now()
	var wg, returned sync.WaitGroup
	returned.Add(len(txs))
	for i := range txs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = txlock.LockTx(ctx, txs[i], keys[1-i], opts...)
			returned.Done()
			if holdBoth {
				returned.Wait()
			}
			if errs[i] != nil {
				// The loser's transaction must still answer, then it
				// rolls back, which lets the other through.
				var one int
				usable[i] = txs[i].QueryRowContext(ctx, `SELECT 1`).Scan(&one) == nil
				_ = txs[i].Rollback()
				return
			}
			usable[i] = true
			assert.NoError(t, txs[i].Commit())
		}()
	}
	wg.Wait()
	return errs, time.Since(start), usable
}

// TestDeadlock: two caller-owned transactions that take two keys in
// conflicting orders with LockTx. With the server-side wait strategy
// (ServerWait), PostgreSQL's deadlock detector ends one wait after
// deadlock_timeout (1s): LockTx reports SQLSTATE 40P01, the loser's
// transaction is still usable, and once it rolls back the other gets its
// lock. With the default polling strategy there is no server-side wait to
// detect: both end in ErrLockTimeout, and neither hangs. WithLocks, which
// takes all keys in one canonical order, never deadlocks, under load.
func TestDeadlock(t *testing.T) {
	for _, path := range []string{"direct", "pgbouncer"} {
		t.Run(path, func(t *testing.T) {
			pg, dsn := paths(t, path)
			leaks := newLeaks()
			admin := pool(t, pg, 2)
			db := pool(t, dsn, 4)

			t.Run("server wait reports 40P01", func(t *testing.T) {
				errs, took, usable := crossLock(t, db, false, txlock.WithServerWait(txlock.ServerWait{Window: 5 * time.Second}), txlock.WithTimeout(10*time.Second))
				t.Logf("took %v: %v / %v", took.Round(time.Millisecond), errs[0], errs[1])
				loser := 0
				if errs[0] == nil {
					loser = 1
				}
				require.Error(t, errs[loser])
				assert.NoError(t, errs[1-loser], "the winner gets its lock once the loser rolls back")
				assert.Equal(t, "40P01", txlock.SQLState(errs[loser]), "a deadlock is reported as such")
				assert.Equal(t, checker.ClassDeadlock, checker.Classify(errs[loser]))
				assert.NotErrorIs(t, errs[loser], txlock.ErrLockTimeout)
				assert.ErrorContains(t, errs[loser], "deadlock detected")
				assert.True(t, usable[loser], "the loser's transaction is still usable")
				assert.Less(t, took, 4*time.Second, "detected after deadlock_timeout, not at the 10s timeout")
				figures(t, "path=%s detected_after=%v sqlstate=%s", path, took.Round(time.Millisecond), txlock.SQLState(errs[loser]))
			})

			// Both calls must time out while both transactions still hold
			// their first key. (If the first to time out rolled back at
			// once, the other could be granted in its last attempts.)
			t.Run("polling times out", func(t *testing.T) {
				errs, took, _ := crossLock(t, db, true, txlock.WithTimeout(time.Second))
				t.Logf("took %v: %v / %v", took.Round(time.Millisecond), errs[0], errs[1])
				for _, err := range errs {
					assert.ErrorIs(t, err, txlock.ErrLockTimeout)
				}
				assert.Less(t, took, 3*time.Second, "never hangs")
			})
			require.NoError(t, checker.NoAdvisoryLocks(admin, 5*time.Second))
			finish(t, nil, leaks, admin, db)
		})
	}

	// All-or-nothing multi-key locks under load, with both wait strategies:
	// every section moves money between two keys; none may fail.
	for _, strategy := range []struct {
		name string
		opt  txlock.Option
	}{
		{"server wait", txlock.WithServerWait(txlock.ServerWait{})},
		{"polling", txlock.WithRetry(txlock.ExponentialBackoff{})},
	} {
		t.Run("WithLocks never deadlocks/"+strategy.name, func(t *testing.T) {
			pg := pgtest.Postgres(t)
			leaks := newLeaks()
			admin := pool(t, pg, 2)
			db := pool(t, pg, 32)
			l := newLedger(t, admin, checker.Config{Keys: 4, CrossKeyPct: 100,
				Lock: checker.Locked(strategy.opt, txlock.WithTimeout(30*time.Second))})
			s := l.Start(db, 32, 200).Wait()
			t.Logf("%v", s)
			requireOnly(t, s) // no deadlock, no timeout, nothing
			rep := check(t, l, "after the run", s)
			finish(t, l, leaks, admin, db)
			figures(t, "strategy=%s acquisitions=%d failures=%d overlaps=%d lost=%d", strategy.name, s.Acquisitions, s.Failures, rep.Overlaps, rep.LostUpdates())
		})
	}
}
