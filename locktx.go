package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/txlock/txlock/driver"
)

// LockTx takes the transaction-scoped advisory lock key inside the caller's
// transaction tx, for repository methods that already run in one. The lock
// lasts until tx commits or rolls back. Options as for WithLock, except that
// WithTxOptions, WithFailOpen and WithSerializationRetries, which concern
// a transaction of txlock's own, are refused (ErrInvalidArgument).
//
// LockTx polls with pg_try_advisory_xact_lock, sleeping between attempts as
// WithLock does, but it cannot release the connection between attempts: the
// caller's transaction keeps it. Prefer WithLock where the lock can be the
// first thing a transaction does. LockTx calls do not queue locally.
//
// With WithServerWait, LockTx waits in the server's lock queue instead, one
// window at a time, inside a SAVEPOINT: a window that passes (lock_timeout,
// 55P03) is rolled back, leaving the caller's transaction and its
// lock_timeout as they were, and no error in the server's log, and a
// granted lock lasts until the transaction ends. Two transactions that take keys in conflicting orders
// then deadlock in the server, and PostgreSQL's deadlock detector ends one
// wait after deadlock_timeout: LockTx returns that error, whose SQLState is
// 40P01, at once, with the caller's transaction still usable (roll it back,
// and retry the whole transaction if you like).
//
// A context cancelled while a statement runs makes pgx close the connection,
// which ends tx. Taking several keys one by one in different orders in
// different transactions can livelock until the timeout; use WithLocks.
func LockTx(ctx context.Context, tx *sql.Tx, key Key, opts ...Option) error {
	_, err := lockTx(ctx, execerOf(tx), key, false, opts)
	return err
}

// TryLockTx makes one attempt at key inside the caller's transaction tx and
// reports whether the lock was granted.
func TryLockTx(ctx context.Context, tx *sql.Tx, key Key, opts ...Option) (acquired bool, err error) {
	return lockTx(ctx, execerOf(tx), key, true, opts)
}

// execerOf is tx as the LockTx family's Execer; nil if tx is.
func execerOf(tx *sql.Tx) driver.Execer {
	if tx == nil {
		return nil
	}
	return sqlTx{tx}
}

// lockTx is the LockTx family's call, database/sql's or a driver's
// (DriverLockTx): it validates the arguments, then runs the lock loop with
// tx's attempts.
func lockTx(ctx context.Context, tx driver.Execer, key Key, try bool, opts []Option) (bool, error) {
	a := &callerTx{tx: tx}
	c := &a.c
	if err := c.init(opts, true); err != nil {
		return false, err
	}
	if isNil(tx) {
		return false, fmt.Errorf("%w: tx is nil", ErrInvalidArgument)
	}
	if err := key.Err(); err != nil {
		return false, err
	}
	a.one[0] = key
	a.st.lock = Lock{Keys: a.one[:], Shared: c.shared, Held: true}
	a.p = plan{c: c, a: a, keys: a.st.lock.Keys, stmt: lockStatement(c.specOf(a.st.lock.Keys, formCallerTx), formCallerTx)}
	a.ev.start(c.obs, ctx)
	a.st.ev = a.ev.orNil()
	return lockLoop(ctx, c, c.waitMode(try), &a.p, nil, nil, &a.st)
}

// callerTx is the attempter of LockTx: each attempt is a statement in the
// caller's transaction.
type callerTx struct {
	c   config
	ev  events
	tx  driver.Execer
	p   plan
	st  lockState // what the lock is, for the loop
	one [1]Key
}

// Attempt implements attempter: r.Stmt, or for a window (r.Window) a wait
// of its own. Statements run under ctx, not the wait's context: cancelling
// a statement closes the connection, which would end the caller's
// transaction. A server-side wait is bounded by lock_timeout instead, whose
// end the statement catches (quietWait), and runs in a savepoint, so that a
// deadlock or a refused isolation level leaves the caller's transaction
// usable: ROLLBACK TO SAVEPOINT undoes the failed wait (and its
// set_config), RELEASE SAVEPOINT keeps a granted lock until the
// transaction ends. Its result has no transaction: the lock is the
// caller's.
func (a *callerTx) Attempt(ctx context.Context, r driver.Request) (driver.Result, error) {
	if r.Window <= 0 {
		return execRows(ctx, a.tx, r.Stmt), nil
	}
	res := execRows(ctx, a.tx, savepoint+quietWait(a.c.specOf(a.st.lock.Keys, formCallerTx), r.Window, "lock_not_available"))
	if res.Err == nil {
		if _, err := a.tx.ExecRows(ctx, releaseSavepoint); err != nil {
			return driver.Result{}, fmt.Errorf("txlock: release savepoint: %w", err)
		}
		return res, nil
	}
	// The failed wait aborted the savepoint, not the caller's
	// transaction: roll back to it, and the loop sorts the error
	// (plan.classify).
	if _, rerr := a.tx.ExecRows(ctx, rollbackToSavepoint); rerr != nil {
		_, err := a.p.classify(res.Err) // explained
		return driver.Result{}, errors.Join(err, fmt.Errorf("txlock: rollback to savepoint: %w", rerr))
	}
	return res, nil
}

// execRows runs a lock statement in tx, and returns its answer: its row
// count, or its error.
func execRows(ctx context.Context, tx driver.Execer, stmt string) driver.Result {
	n, err := tx.ExecRows(ctx, stmt)
	return driver.Result{Rows: n, Err: err}
}
