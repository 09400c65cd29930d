package pgxlock_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/pgxlock"
)

// Once fn has run and failed with a real 40001, a TryWithLock whose retry
// finds the lock busy reports fn's error, with the lock acquired: never
// "not acquired".
func TestSerializationRetryFindsLockBusy(t *testing.T) {
	for _, target := range retryTargets {
		for _, level := range retryLevels {
			t.Run(target.name+"/"+level.String(), func(t *testing.T) {
				pool, admin := target.open(t)
				s := locktest.NewStoppedRetry(t, admin)
				ok, err := pgxlock.TryWithLock(context.Background(), pool, s.Key, func(ctx context.Context, tx pgx.Tx) error {
					return s.Fn(ctx, pgxTx{tx})
				}, txlock.WithTxOptions(&sql.TxOptions{Isolation: level}), txlock.WithSerializationRetries(2))
				assert.True(t, ok, "fn ran under the lock: %v", err)
				s.Check(err)
				assert.ErrorContains(t, err, "the retry found the lock busy")
			})
		}
	}
}

// Once fn has run and failed with a real 40001, a WithLock whose retry's
// wait times out reports fn's error, joined with the timeout: described,
// and not matched, since fn did run.
func TestSerializationRetryTimesOut(t *testing.T) {
	for _, target := range retryTargets {
		for _, level := range retryLevels {
			t.Run(target.name+"/"+level.String(), func(t *testing.T) {
				pool, admin := target.open(t)
				s := locktest.NewStoppedRetry(t, admin)
				require.NoError(t, pool.Ping(context.Background())) // the first round's attempt needs no new connection
				err := pgxlock.WithLock(context.Background(), pool, s.Key, func(ctx context.Context, tx pgx.Tx) error {
					return s.Fn(ctx, pgxTx{tx})
				}, txlock.WithTxOptions(&sql.TxOptions{Isolation: level}), txlock.WithSerializationRetries(2),
					txlock.WithTimeout(time.Second))
				s.Check(err)
				assert.ErrorContains(t, err, "lock wait timed out")
				assert.NotErrorIs(t, err, txlock.ErrLockTimeout, "fn ran: its error is the result")
			})
		}
	}
}

// retryTargets are the pools the stopped-retry tests run fn through, each
// with the direct database/sql pool that sets the scene.
var retryTargets = []struct {
	name string
	open func(t *testing.T) (*pgxpool.Pool, *sql.DB)
}{
	{"direct", func(t *testing.T) (*pgxpool.Pool, *sql.DB) { return direct(t) }},
	{"pgbouncer/exec", func(t *testing.T) (*pgxpool.Pool, *sql.DB) {
		pool, admin, _ := bouncer(t, "exec")
		return pool, admin
	}},
}

var retryLevels = []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable}
