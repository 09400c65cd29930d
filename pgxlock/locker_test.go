package pgxlock_test

import (
	"context"
	"database/sql"
	"sync"
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

// New refuses what WithLock refuses, before the database is touched.
func TestLockerBadInput(t *testing.T) {
	pool, _ := direct(t)
	var nilPool *pgxpool.Pool
	_, err := pgxlock.New(nilPool)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "pool is nil")
	for name, opt := range map[string]txlock.Option{
		"bad option": txlock.WithTimeout(-1),
	} {
		_, err := pgxlock.New(pool, opt)
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument, name)
	}
	l, err := pgxlock.New(pool)
	require.NoError(t, err)
	assert.Same(t, pool, l.Pool())
}

// A Locker's options reach every method, and a call's own come after them:
// its Observer is told of each method's events, and a call's
// WithObserver(nil) silences it. Its WithTimeout bounds a wait for a held
// key, and a call's overrides it. Directly and through PgBouncer.
func TestLocker(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			pool, admin := direct(t)
			if via == "PgBouncer" {
				pool, admin, _ = bouncer(t, "exec")
			}
			testLocker(t, pool, admin)
		})
	}
}

func testLocker(t *testing.T, pool *pgxpool.Pool, admin *sql.DB) {
	ctx := context.Background()
	var mu sync.Mutex
	var kinds []txlock.EventKind
	obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
		return ctx
	})
	took := func() []txlock.EventKind {
		mu.Lock()
		defer mu.Unlock()
		k := kinds
		kinds = nil
		return k
	}
	// The Locker's timeout is what the end of the test checks; it is long
	// enough for a loaded machine to open a connection, and the pool has
	// one open before the first call.
	l, err := pgxlock.New(pool, txlock.WithObserver(obs), txlock.WithTimeout(time.Second))
	require.NoError(t, err)
	require.NoError(t, pool.Ping(ctx))
	key, other := txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t))
	fn := func(context.Context, pgx.Tx) error { return nil }
	ownTx := []txlock.EventKind{txlock.WaitStarted, txlock.Acquired, txlock.Released}
	callerTx := []txlock.EventKind{txlock.WaitStarted, txlock.Acquired}
	inTx := func(call func(tx pgx.Tx) error) error {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		return call(tx)
	}
	for _, c := range []struct {
		name string
		want []txlock.EventKind
		call func(opts ...txlock.Option) error
	}{
		{"WithLock", ownTx, func(opts ...txlock.Option) error { return l.WithLock(ctx, key, fn, opts...) }},
		{"WithLocks", ownTx, func(opts ...txlock.Option) error {
			return l.WithLocks(ctx, []txlock.Key{key, other}, fn, opts...)
		}},
		{"TryWithLock", ownTx, func(opts ...txlock.Option) error {
			ok, err := l.TryWithLock(ctx, key, fn, opts...)
			assert.True(t, ok)
			return err
		}},
		{"TryWithLocks", ownTx, func(opts ...txlock.Option) error {
			ok, err := l.TryWithLocks(ctx, []txlock.Key{key, other}, fn, opts...)
			assert.True(t, ok)
			return err
		}},
		{"WithSemaphore", ownTx, func(opts ...txlock.Option) error { return l.WithSemaphore(ctx, key, 2, fn, opts...) }},
		{"TryWithSemaphore", ownTx, func(opts ...txlock.Option) error {
			ok, err := l.TryWithSemaphore(ctx, key, 2, fn, opts...)
			assert.True(t, ok)
			return err
		}},
		{"LockTx", callerTx, func(opts ...txlock.Option) error {
			return inTx(func(tx pgx.Tx) error { return l.LockTx(ctx, tx, key, opts...) })
		}},
		{"TryLockTx", callerTx, func(opts ...txlock.Option) error {
			return inTx(func(tx pgx.Tx) error {
				ok, err := l.TryLockTx(ctx, tx, key, opts...)
				assert.True(t, ok)
				return err
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, c.call())
			assert.Equal(t, c.want, took(), "the Locker's Observer")
			require.NoError(t, c.call(txlock.WithObserver(nil)))
			assert.Empty(t, took(), "the call's WithObserver(nil) comes after the Locker's")
		})
	}

	release := locktest.Hold(t, admin, key, false)
	err = l.WithLock(ctx, key, fn)
	assert.ErrorIs(t, err, txlock.ErrLockTimeout, "the Locker's WithTimeout")
	done := make(chan error, 1)
	go func() { done <- l.WithLock(ctx, key, fn, txlock.WithTimeout(time.Minute)) }()
	select {
	case err := <-done:
		t.Fatalf("the call's WithTimeout(time.Minute) did not override the Locker's: %v", err)
	case <-time.After(3 * time.Second):
	}
	release()
	require.NoError(t, <-done)
}
