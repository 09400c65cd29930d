package pgxlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/pgxlock"
)

// raiseSerializationFailure fails with 40001, which the loop retries
// (WithSerializationRetries).
const raiseSerializationFailure = `DO $$ BEGIN RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001'; END $$`

// Do returns fn's value once the transaction has committed, and the zero
// value with any error; TryDo does not run fn on a busy lock.
func TestDo(t *testing.T) {
	pool, admin := direct(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))

	n, err := pgxlock.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (n int, err error) {
		assert.True(t, txlock.Held(ctx))
		err = tx.QueryRow(ctx, "SELECT 41 + 1").Scan(&n)
		return n, err
	})
	require.NoError(t, err)
	assert.Equal(t, 42, n)

	boom := errors.New("boom")
	n, err = pgxlock.Do(ctx, pool, key, func(context.Context, pgx.Tx) (int, error) { return 7, boom })
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, n, "fn's value with its error")

	n, err = pgxlock.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, _ = tx.Exec(ctx, "SELECT 1/0") // the transaction fails, and COMMIT rolls it back
		return 7, nil
	})
	assert.ErrorIs(t, err, txlock.ErrCommitFailed)
	assert.Zero(t, n, "the value of a transaction that did not commit")

	rounds := 0
	n, err = pgxlock.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (int, error) {
		rounds++
		if rounds == 1 {
			_, err := tx.Exec(ctx, raiseSerializationFailure)
			return 1, err
		}
		return rounds, nil
	}, txlock.WithSerializationRetries(2))
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the value of the round that committed")

	release := locktest.Hold(t, admin, key, false)
	s, ok, err := pgxlock.TryDo(ctx, pool, key, func(context.Context, pgx.Tx) (string, error) {
		t.Error("fn ran on a busy lock")
		return "x", nil
	})
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Empty(t, s)
	release()
	s, ok, err = pgxlock.TryDo(ctx, pool, key, func(context.Context, pgx.Tx) (string, error) { return "x", nil })
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "x", s)

	_, err = pgxlock.Do[int](ctx, pool, key, nil)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "fn is nil")
	_, err = pgxlock.Do(ctx, pool, txlock.StringKey(""), func(context.Context, pgx.Tx) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidKey)
}
