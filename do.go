package txlock

import (
	"context"
	"database/sql"
)

// Do is WithLock for a fn that returns a value: it takes the exclusive lock
// key (or the shared one, WithShared), runs fn in the lock's transaction,
// commits, and returns fn's value. The value is returned only with a nil
// error, when the transaction has committed (or, with WithFailOpen, when fn
// ran without the lock and succeeded: see LockFromContext); with any error,
// Do returns the zero T, whatever fn returned. After a serialization retry
// (WithSerializationRetries) the value is that of the round that committed.
// Its errors and options are WithLock's.
func Do[T any](ctx context.Context, db DB, key Key, fn func(ctx context.Context, tx *sql.Tx) (T, error), opts ...Option) (T, error) {
	v, _, err := do(ctx, db, key, fn, false, opts)
	return v, err
}

// TryDo is TryWithLock for a fn that returns a value: one attempt at key;
// if the lock is busy it returns (zero, false, nil) without running fn.
// Otherwise it runs fn as Do does, and returns its value, true, and the
// call's error; the value is fn's only with a nil error.
func TryDo[T any](ctx context.Context, db DB, key Key, fn func(ctx context.Context, tx *sql.Tx) (T, error), opts ...Option) (v T, acquired bool, err error) {
	return do(ctx, db, key, fn, true, opts)
}

func do[T any](ctx context.Context, db DB, key Key, fn func(context.Context, *sql.Tx) (T, error), try bool, opts []Option) (T, bool, error) {
	var v, zero T
	var run func(context.Context, *sql.Tx) error // nil for a nil fn, which ownTx.check refuses
	if fn != nil {
		run = func(ctx context.Context, tx *sql.Tx) (err error) {
			v, err = fn(ctx, tx)
			return err
		}
	}
	acquired, err := startCall(ctx, db, run, []Key{key}, try, opts)
	if err != nil {
		return zero, acquired, err
	}
	return v, acquired, nil
}
