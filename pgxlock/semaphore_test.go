package pgxlock_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// The semaphore checks of the database/sql suite, on pgx, directly and
// through PgBouncer (in exec mode, which the checks' own parameterized
// queries need there); then the semaphore's statements alone through
// PgBouncer in pgx's default exec mode, cache_statement.
func TestSemaphore(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			pool, admin := direct(t)
			if via == "PgBouncer" {
				pool, _, _ = bouncer(t, "exec")
			}
			with, try := pgxSemaphore(pool)
			locktest.RequireSemaphore(t, admin, with, try)
		})
	}
	t.Run("cache_statement", func(t *testing.T) {
		pool, _, _ := bouncer(t, "")
		key := txlock.StringKey(uniq(t))
		errs := locktest.Hammer(16, 20, func() error {
			return pgxlock.WithSemaphore(context.Background(), pool, key, 3, func(context.Context, pgx.Tx) error { return nil },
				txlock.WithOwner("cached"), txlock.WithMaxHold(time.Minute))
		})
		assert.Empty(t, errs)
	})

	pool, _ := direct(t)
	ctx, key := context.Background(), txlock.StringKey(uniq(t))
	fn := func(context.Context, pgx.Tx) error {
		t.Error("fn ran")
		return nil
	}
	err := pgxlock.WithSemaphore(ctx, pool, key, 0, fn)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "between 1 and MaxKeys")
	_, err = pgxlock.TryWithSemaphore(ctx, pool, key, 2, fn, txlock.WithShared())
	assert.ErrorContains(t, err, "WithShared does not apply to a semaphore")
	assert.ErrorIs(t, pgxlock.WithSemaphore(ctx, pool, key, 2, nil), txlock.ErrInvalidArgument)
}

// pgxSemaphore is pgxlock's WithSemaphore and TryWithSemaphore on pool,
// for locktest's semaphore checks.
func pgxSemaphore(pool *pgxpool.Pool) (locktest.SemaphoreFunc, locktest.TrySemaphoreFunc) {
	pgxFn := func(fn func(context.Context, locktest.Tx) error) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, pgxTx{tx}) }
	}
	return func(ctx context.Context, key txlock.Key, n int, fn func(context.Context, locktest.Tx) error, opts ...txlock.Option) error {
			return pgxlock.WithSemaphore(ctx, pool, key, n, pgxFn(fn), opts...)
		}, func(ctx context.Context, key txlock.Key, n int, fn func(context.Context, locktest.Tx) error, opts ...txlock.Option) (bool, error) {
			return pgxlock.TryWithSemaphore(ctx, pool, key, n, pgxFn(fn), opts...)
		}
}

// An operator's psql takes two of three slots by hand, directly and
// through PgBouncer (locktest's SemaphoreByHand says what it checks).
func TestSemaphoreByHand(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			pool, admin := direct(t)
			url := pgtest.Postgres(t)
			if via == "PgBouncer" {
				pool, _, _ = bouncer(t, "exec")
				url = bouncerURL(t)
			}
			with, try := pgxSemaphore(pool)
			locktest.SemaphoreByHand(t, admin, url, with, try)
		})
	}
}

// Semaphores across processes: the test binary re-executes itself as
// holder processes, which get the server's URL from their environment.
// init runs before TestMain, so they start no servers of their own.
func init() {
	if os.Getenv(locktest.SemaphoreChildEnv) != "" {
		os.Exit(locktest.SemaphoreChild(func(url string, workers int) (locktest.SemaphoreFunc, func(), error) {
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				return nil, nil, err
			}
			cfg.MaxConns = int32(workers)
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				return nil, nil, err
			}
			with, _ := pgxSemaphore(pool)
			return with, pool.Close, nil
		}))
	}
}

// Five processes of three workers each share a semaphore of 3 slots for
// two seconds, directly and through PgBouncer (in exec mode, which the
// checks' own parameterized statements need there).
func TestSemaphoreAcrossProcesses(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			_, admin := direct(t)
			url := pgtest.Postgres(t)
			if via == "PgBouncer" {
				url = bouncerURL(t) + "&default_query_exec_mode=exec"
			}
			locktest.SemaphoresAcrossProcesses(t, admin, url)
		})
	}
}
