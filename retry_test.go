package txlock_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
)

func TestExponentialBackoffBounds(t *testing.T) {
	s := txlock.ExponentialBackoff{Min: 2 * time.Millisecond, Max: 50 * time.Millisecond}
	require.NoError(t, s.Validate())
	for attempt := 1; attempt <= 80; attempt++ {
		ceil := 50 * time.Millisecond
		if attempt <= 5 {
			ceil = 2 * time.Millisecond << (attempt - 1)
		}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := s.Backoff(attempt)
			require.GreaterOrEqual(t, d, 2*time.Millisecond, "attempt %d", attempt)
			require.LessOrEqual(t, d, ceil, "attempt %d", attempt)
			seen[d] = true
		}
		if attempt > 1 {
			// Jittered: 200 draws from a range of at least 2ms of
			// nanoseconds are never all equal.
			assert.Greater(t, len(seen), 1, "attempt %d is not jittered", attempt)
		}
	}
	// Zero value: the documented defaults.
	var z txlock.ExponentialBackoff
	require.NoError(t, z.Validate())
	for range 100 {
		d := z.Backoff(100)
		require.GreaterOrEqual(t, d, time.Millisecond)
		require.LessOrEqual(t, d, 64*time.Millisecond)
	}
}

func TestBackoffValidate(t *testing.T) {
	for _, tc := range []struct {
		s    interface{ Validate() error }
		want string
	}{
		{txlock.ExponentialBackoff{Min: time.Second, Max: time.Millisecond}, "Min 1s is greater than Max 1ms"},
		{txlock.ExponentialBackoff{Min: -1}, "must not be negative"},
		{txlock.ConstantBackoff{}, "Interval must be positive"},
		{txlock.ConstantBackoff{Interval: time.Millisecond, Jitter: -1}, "Jitter must not be negative"},
		{txlock.LinearBackoff{Max: time.Second}, "Step must be positive"},
		{txlock.LinearBackoff{Step: time.Second}, "Max must be positive"},
		{txlock.LinearBackoff{Step: time.Second, Max: time.Millisecond}, "Step 1s is greater than Max 1ms"},
	} {
		assert.ErrorContains(t, tc.s.Validate(), tc.want)
	}
}

func TestConstantAndLinearBackoff(t *testing.T) {
	c := txlock.ConstantBackoff{Interval: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}
	l := txlock.LinearBackoff{Step: 3 * time.Millisecond, Max: 10 * time.Millisecond}
	for attempt := 1; attempt < 20; attempt++ {
		d := c.Backoff(attempt)
		assert.GreaterOrEqual(t, d, 10*time.Millisecond)
		assert.LessOrEqual(t, d, 15*time.Millisecond)
		assert.Equal(t, min(time.Duration(attempt)*3*time.Millisecond, 10*time.Millisecond), l.Backoff(attempt))
	}
	assert.Negative(t, txlock.NoRetry.Backoff(1))
}

// One strategy value is shared by many goroutines: run with -race.
func TestBackoffConcurrentUse(t *testing.T) {
	s := txlock.ExponentialBackoff{}
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 1000 {
				if d := s.Backoff(g + i%10); d < time.Millisecond {
					t.Errorf("backoff %v below Min", d)
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
}

// Once fn has run and failed with a real 40001, a TryWithLock whose retry
// finds the lock busy reports fn's error, with the lock acquired: never
// "not acquired".
func TestSerializationRetryFindsLockBusy(t *testing.T) {
	for _, target := range retryTargets {
		for _, level := range retryLevels {
			t.Run(target.name+"/"+level.String(), func(t *testing.T) {
				db, admin := target.open(t)
				s := locktest.NewStoppedRetry(t, admin)
				ok, err := txlock.TryWithLock(context.Background(), db, s.Key, func(ctx context.Context, tx *sql.Tx) error {
					return s.Fn(ctx, locktest.SQLTx{Tx: tx})
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
				db, admin := target.open(t)
				s := locktest.NewStoppedRetry(t, admin)
				require.NoError(t, db.Ping()) // the first round's attempt needs no new connection
				err := txlock.WithLock(context.Background(), db, s.Key, func(ctx context.Context, tx *sql.Tx) error {
					return s.Fn(ctx, locktest.SQLTx{Tx: tx})
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
// with the direct pool that sets the scene.
var retryTargets = []struct {
	name string
	open func(t *testing.T) (db, admin *sql.DB)
}{
	{"direct", func(t *testing.T) (*sql.DB, *sql.DB) { db := direct(t); return db, db }},
	{"pgbouncer/exec", func(t *testing.T) (*sql.DB, *sql.DB) { db, _ := bouncer(t, "exec"); return db, direct(t) }},
}

var retryLevels = []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable}
