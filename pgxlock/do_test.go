package pgxlock_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/pgxlock"
)

// Do returns fn's value once the transaction has committed, and the zero
// value with any error; TryDo does not run fn on a busy lock.
func TestDo(t *testing.T) {
	pool, admin := direct(t)
	pgxFn := func(fn func(context.Context, locktest.Tx) (int, error)) func(context.Context, pgx.Tx) (int, error) {
		return func(ctx context.Context, tx pgx.Tx) (int, error) { return fn(ctx, pgxTx{tx}) }
	}
	locktest.RequireDo(t, admin,
		func(ctx context.Context, key txlock.Key, fn func(context.Context, locktest.Tx) (int, error), opts ...txlock.Option) (int, error) {
			return pgxlock.Do(ctx, pool, key, pgxFn(fn), opts...)
		},
		func(ctx context.Context, key txlock.Key, fn func(context.Context, locktest.Tx) (int, error)) (int, bool, error) {
			return pgxlock.TryDo(ctx, pool, key, pgxFn(fn))
		})

	ctx := context.Background()
	_, err := pgxlock.Do[int](ctx, pool, txlock.StringKey(uniq(t)), nil)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "fn is nil")
	_, err = pgxlock.Do(ctx, pool, txlock.StringKey(""), func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidKey)
}
