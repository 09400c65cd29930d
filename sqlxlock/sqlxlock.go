// Package sqlxlock is txlock for sqlx: fn receives a *sqlx.Tx. Locking,
// waiting, errors and options are exactly those of package txlock; only the
// transaction type differs. It lives in its own package so that programs that
// do not use sqlx never compile it.
package sqlxlock

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/txlock/txlock"
)

// DB is what WithLock needs of a database: *sqlx.DB and *sqlx.Conn
// satisfy it.
type DB interface {
	BeginTxx(ctx context.Context, opts *sql.TxOptions) (*sqlx.Tx, error)
}

var (
	_ DB = (*sqlx.DB)(nil)
	_ DB = (*sqlx.Conn)(nil)
)

// WithLock is txlock.WithLock with a *sqlx.Tx.
func WithLock(ctx context.Context, db DB, key txlock.Key, fn func(ctx context.Context, tx *sqlx.Tx) error, opts ...txlock.Option) error {
	a, f, err := adapt(db, fn)
	if err != nil {
		return err
	}
	return txlock.WithLock(ctx, a, key, f, opts...)
}

// WithLocks is txlock.WithLocks with a *sqlx.Tx.
func WithLocks(ctx context.Context, db DB, keys []txlock.Key, fn func(ctx context.Context, tx *sqlx.Tx) error, opts ...txlock.Option) error {
	a, f, err := adapt(db, fn)
	if err != nil {
		return err
	}
	return txlock.WithLocks(ctx, a, keys, f, opts...)
}

// TryWithLock is txlock.TryWithLock with a *sqlx.Tx.
func TryWithLock(ctx context.Context, db DB, key txlock.Key, fn func(ctx context.Context, tx *sqlx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	a, f, err := adapt(db, fn)
	if err != nil {
		return false, err
	}
	return txlock.TryWithLock(ctx, a, key, f, opts...)
}

// TryWithLocks is txlock.TryWithLocks with a *sqlx.Tx.
func TryWithLocks(ctx context.Context, db DB, keys []txlock.Key, fn func(ctx context.Context, tx *sqlx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	a, f, err := adapt(db, fn)
	if err != nil {
		return false, err
	}
	return txlock.TryWithLocks(ctx, a, keys, f, opts...)
}

// LockTx is txlock.LockTx on a caller's *sqlx.Tx.
func LockTx(ctx context.Context, tx *sqlx.Tx, key txlock.Key, opts ...txlock.Option) error {
	if tx == nil {
		return fmt.Errorf("%w: tx is nil", txlock.ErrInvalidArgument)
	}
	return txlock.LockTx(ctx, tx.Tx, key, opts...)
}

// TryLockTx is txlock.TryLockTx on a caller's *sqlx.Tx.
func TryLockTx(ctx context.Context, tx *sqlx.Tx, key txlock.Key, opts ...txlock.Option) (acquired bool, err error) {
	if tx == nil {
		return false, fmt.Errorf("%w: tx is nil", txlock.ErrInvalidArgument)
	}
	return txlock.TryLockTx(ctx, tx.Tx, key, opts...)
}

// adapter lets txlock begin sqlx transactions. txlock makes one attempt at a
// time within a call, so the transaction it hands to fn is the last one begun.
type adapter struct {
	db   DB
	last *sqlx.Tx
}

func (a *adapter) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	tx, err := a.db.BeginTxx(ctx, opts)
	if err != nil {
		return nil, err
	}
	a.last = tx
	return tx.Tx, nil
}

// TxlockQueueHandle names the handle the adapter wraps, so that the calls of
// this process that wait for the same keys on it queue behind each other
// (see txlock's "Local queues"), sqlx ones and database/sql ones alike. It
// is also how txlock sees a nil db behind the adapter.
func (a *adapter) TxlockQueueHandle() any {
	switch db := a.db.(type) {
	case *sqlx.DB:
		if db != nil {
			return db.DB
		}
	case *sqlx.Conn:
		if db != nil {
			return db.Conn
		}
	}
	return a.db
}

// poolAdapter is the adapter of a *sqlx.DB. It also exposes the pool's
// QueryRowContext and Stats, which txlock.FenceToken uses to draw tokens on a
// connection of their own.
type poolAdapter struct {
	*adapter
	pool *sqlx.DB
}

func (p poolAdapter) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return p.pool.QueryRowContext(ctx, query, args...)
}

func (p poolAdapter) Stats() sql.DBStats { return p.pool.Stats() }

func adapt(db DB, fn func(context.Context, *sqlx.Tx) error) (txlock.DB, func(context.Context, *sql.Tx) error, error) {
	// txlock reports a nil db, through TxlockQueueHandle.
	if fn == nil {
		return nil, nil, fmt.Errorf("%w: fn is nil", txlock.ErrInvalidArgument)
	}
	a := &adapter{db: db}
	f := func(ctx context.Context, tx *sql.Tx) error {
		if a.last == nil || a.last.Tx != tx {
			return fmt.Errorf("txlock/sqlxlock: internal error: transaction mismatch")
		}
		return fn(ctx, a.last)
	}
	if pool, ok := db.(*sqlx.DB); ok {
		return poolAdapter{adapter: a, pool: pool}, f, nil
	}
	return a, f, nil
}
