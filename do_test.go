package txlock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
)

// raiseSerializationFailure fails with 40001, which the loop retries
// (WithSerializationRetries).
const raiseSerializationFailure = `DO $$ BEGIN RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001'; END $$`

// Do returns fn's value once the transaction has committed, and the zero
// value with any error; TryDo does not run fn on a busy lock.
func TestDo(t *testing.T) {
	db := direct(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))

	n, err := txlock.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (n int, err error) {
		assert.True(t, txlock.Held(ctx))
		err = tx.QueryRowContext(ctx, "SELECT 41 + 1").Scan(&n)
		return n, err
	})
	require.NoError(t, err)
	assert.Equal(t, 42, n)

	boom := errors.New("boom")
	n, err = txlock.Do(ctx, db, key, func(context.Context, *sql.Tx) (int, error) { return 7, boom })
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, n, "fn's value with its error")

	n, err = txlock.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
		_, _ = tx.ExecContext(ctx, "SELECT 1/0") // the transaction fails, and COMMIT rolls it back
		return 7, nil
	})
	assert.ErrorIs(t, err, txlock.ErrCommitFailed)
	assert.Zero(t, n, "the value of a transaction that did not commit")

	rounds := 0
	n, err = txlock.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
		rounds++
		if rounds == 1 {
			_, err := tx.ExecContext(ctx, raiseSerializationFailure)
			return 1, err
		}
		return rounds, nil
	}, txlock.WithSerializationRetries(2))
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the value of the round that committed")

	release := locktest.Hold(t, db, key, false)
	s, ok, err := txlock.TryDo(ctx, db, key, func(context.Context, *sql.Tx) (string, error) {
		t.Error("fn ran on a busy lock")
		return "x", nil
	})
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Empty(t, s)
	release()
	s, ok, err = txlock.TryDo(ctx, db, key, func(context.Context, *sql.Tx) (string, error) { return "x", nil })
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "x", s)

	_, err = txlock.Do[int](ctx, db, key, nil)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "fn is nil")
	_, _, err = txlock.TryDo(ctx, nil, key, func(context.Context, *sql.Tx) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "db is nil")
	_, err = txlock.Do(ctx, db, txlock.StringKey(""), func(context.Context, *sql.Tx) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidKey)
}
