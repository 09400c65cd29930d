// Package pgxlock is txlock for pgx used natively: fn receives a pgx.Tx, on
// a *pgxpool.Pool, a *pgxpool.Conn or a *pgx.Conn, and the lock rides in
// the round trip of its transaction's BEGIN.
//
// Its functions are txlock's, with the same options, local queues, events,
// fencing tokens (txlock.FenceToken on fn's context) and errors: read
// txlock's documentation of WithLock, LockTx and the options for what they
// do. What differs is how an attempt reaches the server:
//
//   - An attempt is one query, sent with the simple protocol whatever the
//     connection's default_query_exec_mode: BEGIN (with WithTxOptions'
//     level, if any), then the lock statement, or the statement that waits
//     in the server's lock queue (each window of txlock.WithServerWait,
//     and the default strategy's windows: see txlock's "How waiting
//     works"). A grant keeps the transaction that BEGIN began, and fn runs
//     in it: the lock costs no round trip of its own. A busy lock answers
//     with no row, and a ROLLBACK, a second round trip, hands the
//     connection back to the pool idle. No busy attempt is an error, so the
//     server's log shows none.
//
// The application's own queries in fn use the connection's exec mode,
// which behind PgBouncer must be one that [PgBouncer and pools] names; the
// lock's own statements, and the draw of a fencing token, work in every
// mode. [pgx and sqlc] is the guide to this package.
//
// An attempt's statements run under the caller's context, and its
// connection gets a deadline of its own a second after the wait's
// (txlock.WithTimeout, or the context's): an attempt begun just before the
// deadline is answered an instant after it, on a connection still usable,
// while a connection whose server does not answer is closed then.
//
// fn's context carries the lock for txlock.FenceToken, and fenced writes
// run on pgx through QuerierOf: txlock.FencedTable.On(pgxlock.QuerierOf(tx)),
// as does the keyspace registry: txlock.Registry.On. AcquireTerm,
// TryAcquireTerm and Lead are txlock's terms, on pgx. New returns a Locker,
// a pool and the options its calls share. A pgx
// connection serves one statement at a time: a goroutine of fn may draw a
// token while fn waits, but fn must not run statements on tx while it does.
//
// Unlike database/sql, pgx does not roll a transaction back when its
// context ends. When fn's context ends (the caller's context, or the hold
// bound of txlock.WithMaxHold), fn's next statement fails, and once fn
// returns the transaction rolls back. A fn that keeps running without
// sending anything keeps the lock until it returns, or until the server's
// side of that bound ends the session, as txlock.WithMaxHold tells.
//
// [PgBouncer and pools]: https://github.com/txlock/txlock/blob/main/docs/pgbouncer.md
// [pgx and sqlc]: https://github.com/txlock/txlock/blob/main/docs/pgx.md
package pgxlock

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
)

// DB is where a lock is taken: a *pgxpool.Pool, a *pgxpool.Conn or a
// *pgx.Conn, and no other type. The set is closed at compile time, because
// pgxlock drives the connection itself (the lock rides in BEGIN's query,
// with a deadline on the socket, and a busy attempt hands the connection
// back idle): a type that merely has a BeginTx method could not be driven
// so. A wrapper of a pool (for tracing, say) passes the pool it wraps; pgx's
// own QueryTracer is the way to trace pgxlock's statements.
//
// A connection (*pgxpool.Conn, *pgx.Conn) is one session, with room for
// one transaction: it must not be shared by calls that run at the same
// time, and fencing tokens, which are drawn on a second connection, need
// the pool.
type DB interface {
	*pgxpool.Pool | *pgxpool.Conn | *pgx.Conn
}

// WithLock takes the exclusive transaction-scoped advisory lock key, then
// runs fn in the same transaction, and commits: txlock.WithLock, with a
// pgx.Tx.
func WithLock[D DB](ctx context.Context, db D, key txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) error {
	cl, err := newCall(db, fn, key, nil)
	if err != nil {
		return err
	}
	_, err = txlock.DriverLock(ctx, &cl.a, cl.keys, false, opts...)
	return err
}

// WithLocks is WithLock for several keys, taken all or nothing:
// txlock.WithLocks.
func WithLocks[D DB](ctx context.Context, db D, keys []txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) error {
	cl, err := newCall(db, fn, txlock.Key{}, nonNil(keys))
	if err != nil {
		return err
	}
	_, err = txlock.DriverLock(ctx, &cl.a, cl.keys, false, opts...)
	return err
}

// TryWithLock makes one attempt at key; if the lock is busy it returns
// (false, nil) without running fn: txlock.TryWithLock.
func TryWithLock[D DB](ctx context.Context, db D, key txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	cl, err := newCall(db, fn, key, nil)
	if err != nil {
		return false, err
	}
	return txlock.DriverLock(ctx, &cl.a, cl.keys, true, opts...)
}

// TryWithLocks is TryWithLock for several keys, all or nothing.
func TryWithLocks[D DB](ctx context.Context, db D, keys []txlock.Key, fn func(ctx context.Context, tx pgx.Tx) error, opts ...txlock.Option) (acquired bool, err error) {
	cl, err := newCall(db, fn, txlock.Key{}, nonNil(keys))
	if err != nil {
		return false, err
	}
	return txlock.DriverLock(ctx, &cl.a, cl.keys, true, opts...)
}

// Do is WithLock for a fn that returns a value: txlock.Do, with a pgx.Tx.
// The value is returned only with a nil error.
func Do[T any, D DB](ctx context.Context, db D, key txlock.Key, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...txlock.Option) (T, error) {
	v, _, err := do(ctx, db, key, fn, false, opts)
	return v, err
}

// TryDo is TryWithLock for a fn that returns a value: txlock.TryDo, with a
// pgx.Tx.
func TryDo[T any, D DB](ctx context.Context, db D, key txlock.Key, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...txlock.Option) (v T, acquired bool, err error) {
	return do(ctx, db, key, fn, true, opts)
}

func do[T any, D DB](ctx context.Context, db D, key txlock.Key, fn func(context.Context, pgx.Tx) (T, error), try bool, opts []txlock.Option) (T, bool, error) {
	var v, zero T
	var run func(context.Context, pgx.Tx) error // nil for a nil fn, which newCall refuses
	if fn != nil {
		run = func(ctx context.Context, tx pgx.Tx) (err error) {
			v, err = fn(ctx, tx)
			return err
		}
	}
	cl, err := newCall(db, run, key, nil)
	if err != nil {
		return zero, false, err
	}
	acquired, err := txlock.DriverLock(ctx, &cl.a, cl.keys, try, opts...)
	if err != nil {
		return zero, acquired, err
	}
	return v, acquired, nil
}

// LockTx takes the transaction-scoped advisory lock key inside the caller's
// transaction tx: txlock.LockTx. Its statements take no arguments, so pgx
// sends them with the simple protocol in every exec mode.
func LockTx(ctx context.Context, tx pgx.Tx, key txlock.Key, opts ...txlock.Option) error {
	_, err := lockTx(ctx, tx, key, false, opts)
	return err
}

// TryLockTx makes one attempt at key inside the caller's transaction tx and
// reports whether the lock was granted: txlock.TryLockTx.
func TryLockTx(ctx context.Context, tx pgx.Tx, key txlock.Key, opts ...txlock.Option) (acquired bool, err error) {
	return lockTx(ctx, tx, key, true, opts)
}

func lockTx(ctx context.Context, tx pgx.Tx, key txlock.Key, try bool, opts []txlock.Option) (bool, error) {
	if tx == nil {
		return false, fmt.Errorf("%w: tx is nil", txlock.ErrInvalidArgument)
	}
	return txlock.DriverLockTx(ctx, execer{tx}, key, try, opts...)
}

// execer runs LockTx's statements in the caller's transaction.
type execer struct{ tx pgx.Tx }

func (e execer) ExecRows(ctx context.Context, stmt string) (int64, error) {
	tag, err := e.tx.Exec(ctx, stmt)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// call is a call's state, in one allocation.
type call struct {
	a    acquirer
	keys []txlock.Key
	one  [1]txlock.Key
}

// newCall readies a call of the WithLock family on db, for keys, or if keys
// is nil, key; txlock.DriverLock checks the keys and options.
func newCall[D DB](db D, fn func(context.Context, pgx.Tx) error, key txlock.Key, keys []txlock.Key) (*call, error) {
	cl := &call{keys: keys}
	if err := cl.a.on(any(db)); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: fn is nil", txlock.ErrInvalidArgument)
	}
	cl.a.fn = fn
	if keys == nil {
		cl.one[0] = key
		cl.keys = cl.one[:]
	}
	return cl, nil
}

// on makes db the acquirer's, or says why it cannot be.
func (a *acquirer) on(db any) error {
	switch db := db.(type) {
	case *pgxpool.Pool:
		a.pool = db
	case *pgxpool.Conn:
		if db != nil {
			a.conn = db.Conn()
		}
	case *pgx.Conn:
		a.conn = db
	}
	if a.pool == nil && a.conn == nil {
		return fmt.Errorf("%w: db is nil", txlock.ErrInvalidArgument)
	}
	if a.conn != nil && a.conn.PgConn().TxStatus() != 'I' {
		// A busy attempt would abort the caller's transaction, and a grant
		// would commit it with fn's.
		return fmt.Errorf("%w: db is a connection in a transaction; lock inside it with LockTx", txlock.ErrInvalidArgument)
	}
	return nil
}

// nonNil returns keys, or an empty slice for nil: WithLocks with no keys is
// refused as such, not taken for WithLock.
func nonNil(keys []txlock.Key) []txlock.Key {
	if keys == nil {
		return []txlock.Key{}
	}
	return keys
}
