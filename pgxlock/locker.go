package pgxlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
)

// A Locker is a pool and the options its calls share: txlock.Locker, with
// a pgx.Tx. A service builds one at start-up and uses it at every call
// site instead of repeating the options; options given to a method come
// after the Locker's, and so override them. It is safe for concurrent use,
// and its methods behave exactly like the functions of the same name.
type Locker struct {
	pool *pgxpool.Pool
	opts []txlock.Option
}

// New returns a Locker on pool whose calls use opts. It validates opts and
// pool as WithLock would, and reports an error matching
// txlock.ErrInvalidArgument before anything is sent to the database.
func New(pool *pgxpool.Pool, opts ...txlock.Option) (*Locker, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", txlock.ErrInvalidArgument)
	}
	// txlock.New validates the options as every call does; the stand-in
	// database is never used.
	if _, err := txlock.New(optionsOnly{}, opts...); err != nil {
		return nil, err
	}
	// No spare capacity: with appends a call's options to a copy.
	return &Locker{pool: pool, opts: slices.Clip(slices.Clone(opts))}, nil
}

// optionsOnly is the database of the txlock.Locker that New makes only to
// validate options.
type optionsOnly struct{}

func (optionsOnly) BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error) {
	return nil, errors.New("pgxlock: optionsOnly is not a database")
}

// with returns the Locker's options followed by a call's own.
func (l *Locker) with(opts []txlock.Option) []txlock.Option {
	if len(opts) == 0 {
		return l.opts
	}
	return append(l.opts, opts...) // l.opts has no spare capacity: a copy
}

// WithLock is WithLock on the Locker's pool.
func (l *Locker) WithLock(ctx context.Context, key txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) error {
	return WithLock(ctx, l.pool, key, fn, l.with(opts)...)
}

// WithLocks is WithLocks on the Locker's pool.
func (l *Locker) WithLocks(ctx context.Context, keys []txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) error {
	return WithLocks(ctx, l.pool, keys, fn, l.with(opts)...)
}

// TryWithLock is TryWithLock on the Locker's pool.
func (l *Locker) TryWithLock(ctx context.Context, key txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	return TryWithLock(ctx, l.pool, key, fn, l.with(opts)...)
}

// TryWithLocks is TryWithLocks on the Locker's pool.
func (l *Locker) TryWithLocks(ctx context.Context, keys []txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	return TryWithLocks(ctx, l.pool, keys, fn, l.with(opts)...)
}

// WithSemaphore is WithSemaphore on the Locker's pool.
func (l *Locker) WithSemaphore(ctx context.Context, key txlock.Key, n int, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) error {
	return WithSemaphore(ctx, l.pool, key, n, fn, l.with(opts)...)
}

// TryWithSemaphore is TryWithSemaphore on the Locker's pool.
func (l *Locker) TryWithSemaphore(ctx context.Context, key txlock.Key, n int, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	return TryWithSemaphore(ctx, l.pool, key, n, fn, l.with(opts)...)
}

// LockTx is LockTx with the Locker's options, in the caller's transaction
// tx (which need not come from the Locker's pool). Options that concern a
// transaction of txlock's own are refused there, as by LockTx, whether they
// come from the Locker or the call.
func (l *Locker) LockTx(ctx context.Context, tx pgx.Tx, key txlock.Key, opts ...txlock.Option) error {
	return LockTx(ctx, tx, key, l.with(opts)...)
}

// TryLockTx is TryLockTx with the Locker's options.
func (l *Locker) TryLockTx(ctx context.Context, tx pgx.Tx, key txlock.Key, opts ...txlock.Option) (acquired bool, err error) {
	return TryLockTx(ctx, tx, key, l.with(opts)...)
}

// Pool returns the Locker's pool.
func (l *Locker) Pool() *pgxpool.Pool { return l.pool }
