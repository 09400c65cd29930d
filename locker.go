package txlock

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
)

// A Locker is a database and the options its calls share: a service builds
// one at start-up, with its Observer, timeout and retry strategy, and uses
// it at every call site instead of repeating the options. Its methods are
// the package's functions with the db and the options filled in; options
// given to a method come after the Locker's, and so override them. A Locker
// is safe for concurrent use, and its methods behave exactly like the
// functions of the same name.
type Locker struct {
	db   DB
	opts []Option
}

// New returns a Locker on db whose calls use opts. It validates opts and db
// as WithLock would, and reports an error matching ErrInvalidArgument
// before anything is sent to the database.
func New(db DB, opts ...Option) (*Locker, error) {
	var c config
	if err := c.init(opts, false); err != nil {
		return nil, err
	}
	if nilDB(db) {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidArgument)
	}
	// No spare capacity: with appends a call's options to a copy.
	return &Locker{db: db, opts: slices.Clip(slices.Clone(opts))}, nil
}

// with returns the Locker's options followed by a call's own.
func (l *Locker) with(opts []Option) []Option {
	if len(opts) == 0 {
		return l.opts
	}
	return append(l.opts, opts...) // l.opts has no spare capacity: a copy
}

// WithLock is WithLock on the Locker's db.
func (l *Locker) WithLock(ctx context.Context, key Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	return WithLock(ctx, l.db, key, fn, l.with(opts)...)
}

// WithLocks is WithLocks on the Locker's db.
func (l *Locker) WithLocks(ctx context.Context, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	return WithLocks(ctx, l.db, keys, fn, l.with(opts)...)
}

// TryWithLock is TryWithLock on the Locker's db.
func (l *Locker) TryWithLock(ctx context.Context, key Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return TryWithLock(ctx, l.db, key, fn, l.with(opts)...)
}

// TryWithLocks is TryWithLocks on the Locker's db.
func (l *Locker) TryWithLocks(ctx context.Context, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return TryWithLocks(ctx, l.db, keys, fn, l.with(opts)...)
}

// WithSemaphore is WithSemaphore on the Locker's db.
func (l *Locker) WithSemaphore(ctx context.Context, key Key, n int, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	return WithSemaphore(ctx, l.db, key, n, fn, l.with(opts)...)
}

// TryWithSemaphore is TryWithSemaphore on the Locker's db.
func (l *Locker) TryWithSemaphore(ctx context.Context, key Key, n int, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return TryWithSemaphore(ctx, l.db, key, n, fn, l.with(opts)...)
}

// LockTx is LockTx with the Locker's options, in the caller's transaction
// tx (which need not come from the Locker's db). Options that concern a
// transaction of txlock's own are refused there, as by LockTx, whether they
// come from the Locker or the call.
func (l *Locker) LockTx(ctx context.Context, tx *sql.Tx, key Key, opts ...Option) error {
	return LockTx(ctx, tx, key, l.with(opts)...)
}

// TryLockTx is TryLockTx with the Locker's options.
func (l *Locker) TryLockTx(ctx context.Context, tx *sql.Tx, key Key, opts ...Option) (acquired bool, err error) {
	return TryLockTx(ctx, tx, key, l.with(opts)...)
}

// DB returns the Locker's database.
func (l *Locker) DB() DB { return l.db }
