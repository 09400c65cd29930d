package pgxlock

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/txlock/txlock"
)

// WithSemaphore runs fn in a transaction that holds one of n slots of key:
// txlock.WithSemaphore, with a pgx.Tx.
func WithSemaphore[D DB](ctx context.Context, db D, key txlock.Key, n int, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) error {
	cl, err := newCall(db, fn, key, nil)
	if err != nil {
		return err
	}
	_, err = txlock.DriverSemaphore(ctx, &cl.a, key, n, false, opts...)
	return err
}

// TryWithSemaphore is WithSemaphore with a single attempt:
// txlock.TryWithSemaphore.
func TryWithSemaphore[D DB](ctx context.Context, db D, key txlock.Key, n int, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	cl, err := newCall(db, fn, key, nil)
	if err != nil {
		return false, err
	}
	return txlock.DriverSemaphore(ctx, &cl.a, key, n, true, opts...)
}
