package txlock_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
)

// Do returns fn's value once the transaction has committed, and the zero
// value with any error; TryDo does not run fn on a busy lock.
func TestDo(t *testing.T) {
	db := direct(t)
	sqlFn := func(fn func(context.Context, locktest.Tx) (int, error)) func(context.Context, *sql.Tx) (int, error) {
		return func(ctx context.Context, tx *sql.Tx) (int, error) { return fn(ctx, locktest.SQLTx{Tx: tx}) }
	}
	locktest.RequireDo(t, db,
		func(ctx context.Context, key txlock.Key, fn func(context.Context, locktest.Tx) (int, error), opts ...txlock.Option) (int, error) {
			return txlock.Do(ctx, db, key, sqlFn(fn), opts...)
		},
		func(ctx context.Context, key txlock.Key, fn func(context.Context, locktest.Tx) (int, error)) (int, bool, error) {
			return txlock.TryDo(ctx, db, key, sqlFn(fn))
		})

	ctx, key := context.Background(), txlock.StringKey(uniq(t))
	_, err := txlock.Do[int](ctx, db, key, nil)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "fn is nil")
	_, _, err = txlock.TryDo(ctx, nil, key, func(context.Context, *sql.Tx) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "db is nil")
	_, err = txlock.Do(ctx, db, txlock.StringKey(""), func(context.Context, *sql.Tx) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidKey)
}
