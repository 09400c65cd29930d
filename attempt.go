package txlock

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// ownTx is the acquirer of WithLock, WithLocks, TryWithLock and
// TryWithLocks: each attempt begins a transaction of its own on db and runs
// the lock statement in it; a busy attempt rolls back, which returns the
// connection to the pool, and a granted one keeps the transaction for fn.
type ownTx struct {
	c    *config
	db   DB
	pool *sql.DB // the pool behind db, if the call queues on one; else nil
	fn   func(context.Context, *sql.Tx) error
	keys []Key
	stmt string  // the polling lock statement
	h    holder  // the granted lock
	held sqlHeld // its transaction
	slot int     // for a semaphore, the slot granted
	// attemptBound, if not 0, bounds each attempt however far the wait's
	// deadline is: a term's campaign has none (see acquireTerm).
	attemptBound time.Duration
}

var _ acquirer = (*ownTx)(nil)

// maxEarlyBegin bounds how long a caller that was handed its turn before the
// previous holder's transaction ended holds its begun transaction, and so a
// connection, while that holder's COMMIT runs (see queue.go).
const maxEarlyBegin = 50 * time.Millisecond

// attempt implements attempter. Until the lock is granted, the attempt's
// transaction is bound to the wait's deadline as well as to ctx, so that a
// stalled BEGIN or statement ends with the wait.
//
// Until the wait has made its context (an uncontended call's first attempt),
// that bound is a timer, or nothing at all when ctx's own deadline comes
// first: an uncontended call of a request handler, whose context has a
// deadline, then begins the transaction with ctx itself, and fn runs under
// the caller's context. A term never takes that path: its transaction must
// have a context of its own, which the term's end cancels to cut off a
// rollback that a partition holds up (see Term.finish).
//
// With attemptBound, a timer ends the attempt's transaction if the attempt
// has not returned in time (a BEGIN or statement stuck on a partitioned
// connection), and the attempt fails with an error that says so.
func (a *ownTx) attempt(ctx context.Context, b bound) (outcome, error) {
	c := a.c
	stmt := a.stmt
	if b.window > 0 {
		stmt = quietWaitStatement(c.spec(a.keys, formOwnTx), b.window)
	}
	if b.waitCtx == nil && c.maxHold == 0 && !c.term {
		if d, ok := ctx.Deadline(); ok && !d.After(b.deadline) {
			tx, err := a.db.BeginTx(ctx, c.txOpts)
			if err != nil {
				return busy, fmt.Errorf("txlock: begin: %w", err)
			}
			out, err := a.result(tx.ExecContext(ctx, stmt))
			if err == nil && out == granted && ctx.Err() != nil {
				// ctx ended as the lock was granted: database/sql is
				// rolling the transaction back, and fn must not start.
				out, err = busy, ctx.Err()
			}
			if err != nil || out != granted {
				_ = tx.Rollback()
				return out, err
			}
			a.held = sqlHeld{tx: tx, txCtx: ctx, fn: a.fn}
			a.h = holder{tx: &a.held, txCtx: ctx, fnCtx: ctx}
			if c.ev.on() {
				a.h.grantedAt = c.clock.now()
			}
			return granted, nil
		}
	}
	txCtx, txCancel := context.WithCancelCause(ctx)
	tie := b.tie(txCancel)
	inTime := func() bool { return true }
	if a.attemptBound > 0 {
		timer := time.AfterFunc(a.attemptBound, func() { txCancel(context.DeadlineExceeded) })
		inTime = timer.Stop
	}
	tx, err := a.begin(txCtx, b.waitFor())
	if err != nil {
		tie.untie()
		if !inTime() {
			err = overran(a.attemptBound, err)
		}
		txCancel(nil)
		return busy, fmt.Errorf("txlock: begin: %w", err)
	}
	out, err := a.result(tx.ExecContext(txCtx, stmt))
	bounded := inTime()
	if err == nil && out == granted && (!tie.untie() || !bounded || txCtx.Err() != nil) {
		// The deadline or the attempt's bound fired, or ctx ended, as the
		// lock was granted; the transaction is being rolled back, and fn
		// must not start.
		out, err = busy, context.DeadlineExceeded
	}
	if err != nil && !bounded {
		err = overran(a.attemptBound, err)
	}
	if err != nil || out != granted {
		tie.untie()
		_ = tx.Rollback()
		txCancel(nil)
		return out, err
	}
	// Once the deadline is untied, txCtx ends only with ctx (or when fn is
	// done), so fn can run under ctx itself: when ctx cannot be cancelled,
	// the driver then has no context to watch around each of fn's
	// statements.
	a.held = sqlHeld{tx: tx, txCtx: txCtx, cancel: txCancel, fn: a.fn}
	a.h = holder{tx: &a.held, txCtx: txCtx, fnCtx: ctx, cancel: txCancel}
	if c.ev.on() {
		a.h.grantedAt = c.clock.now()
	}
	if c.maxHold > 0 {
		a.h.bound(c.maxHold)
	}
	return granted, nil
}

// overran explains an attempt that its bound (a term's TTL) ended.
func overran(bound time.Duration, err error) error {
	return fmt.Errorf("txlock: the attempt did not return within %v (a term's attempt is bounded by its TTL): the connection may be partitioned, or the server unreachable: %w", bound, err)
}

// begin begins an attempt's transaction. If the turn was handed on before
// the previous holder's transaction ended, it then waits for prevEnd, so
// that the lock statement finds the lock free; if that takes longer than
// maxEarlyBegin, it rolls back, waits without a connection, and begins
// again. When the pool has no idle connection, an early BEGIN would open
// one, or wait for the holder's: begin then waits first.
func (a *ownTx) begin(ctx context.Context, prevEnd <-chan struct{}) (*sql.Tx, error) {
	if prevEnd != nil && (a.pool == nil || a.pool.Stats().Idle == 0) {
		if err := awaitEnd(ctx, prevEnd); err != nil {
			return nil, err
		}
		prevEnd = nil
	}
	tx, err := a.db.BeginTx(ctx, a.c.txOpts)
	if err != nil || prevEnd == nil {
		return tx, err
	}
	t := time.NewTimer(maxEarlyBegin)
	defer t.Stop()
	select {
	case <-prevEnd:
		return tx, nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = tx.Rollback()
	if err := awaitEnd(ctx, prevEnd); err != nil {
		return nil, err
	}
	return a.db.BeginTx(ctx, a.c.txOpts)
}

// awaitEnd waits for the end of the previous holder's transaction, or for
// ctx.
func awaitEnd(ctx context.Context, end <-chan struct{}) error {
	select {
	case <-end:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// hold implements acquirer.
func (a *ownTx) hold(st *lockState, handOn func()) error {
	st.db, st.tx = a.db, a.held.tx
	if st.ev != nil {
		st.grantedAt = a.h.grantedAt // before the hold bound started
	}
	return a.h.runFn(st, handOn)
}

// holdUnlocked implements acquirer: fn runs in a transaction of its own,
// without the lock.
func (a *ownTx) holdUnlocked(ctx context.Context, st *lockState) error {
	txCtx, txCancel := context.WithCancelCause(ctx)
	tx, err := a.db.BeginTx(txCtx, a.c.txOpts)
	if err != nil {
		txCancel(nil)
		return fmt.Errorf("txlock: begin: %w", err)
	}
	h := &holder{tx: &sqlHeld{tx: tx, txCtx: txCtx, fn: a.fn}, txCtx: txCtx, fnCtx: txCtx, cancel: txCancel}
	st.db, st.tx = a.db, tx
	return h.runFn(st, nil)
}

// idleConn reports whether the pool the call queues on has an idle
// connection (see config.headWindow).
func (a *ownTx) idleConn() bool { return a.pool != nil && a.pool.Stats().Idle > 0 }

// pooled implements acquirer.
func (a *ownTx) pooled() bool { return a.pool != nil }

// deadlineTie ends an attempt's transaction when the wait's deadline passes:
// an AfterFunc on the wait's context, or, before the wait has one, a timer.
type deadlineTie struct {
	timer     *time.Timer
	stopAfter func() bool
}

// tie ties cancel to b's deadline.
func (b bound) tie(cancel context.CancelCauseFunc) deadlineTie {
	if b.waitCtx != nil {
		return deadlineTie{stopAfter: context.AfterFunc(b.waitCtx, func() { cancel(context.Cause(b.waitCtx)) })}
	}
	return deadlineTie{timer: time.AfterFunc(time.Until(b.deadline), func() { cancel(context.DeadlineExceeded) })}
}

// untie stops the deadline from ending the transaction, and reports whether
// it had not already.
func (t deadlineTie) untie() bool {
	if t.timer != nil {
		return t.timer.Stop()
	}
	return t.stopAfter()
}

// result decodes the answer of a lock statement run in a database/sql
// transaction of txlock's own. The statement's answer is carried in the row
// count of the command tag (see lockStatement), which database/sql returns
// as RowsAffected.
func (a *ownTx) result(res sql.Result, err error) (outcome, error) {
	if err != nil {
		return classifyOwn(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return busy, fmt.Errorf("txlock: lock statement result: %w", err)
	}
	return a.c.outcome(n, &a.slot)
}

func (a *ownTx) grantedSlot() int { return a.slot }

// outcome decodes the row count of c's lock statement in a transaction of
// txlock's own: rowsOutcome's, or for a semaphore slotsOutcome's, which
// sets *slot to the slot granted.
func (c *config) outcome(rows int64, slot *int) (outcome, error) {
	if c.slots == 0 {
		return rowsOutcome(rows)
	}
	out, s, err := slotsOutcome(rows, c.slots)
	*slot = s
	return out, err
}

// classifyOwn sorts the error of a lock statement run in a transaction of
// txlock's own, database/sql's or a driver's: a ServerWait window that ends in
// lock_timeout (55P03), or that the deadlock detector picks (40P01), is a
// busy lock, since the attempt rolls the transaction back, which undoes
// whatever the statement did. Everything else is classify's.
func classifyOwn(err error) (outcome, error) {
	switch SQLState(err) {
	case codeLockNotAvailable, codeDeadlock:
		return busy, nil
	}
	return classify(err)
}

// classify sorts a lock statement's error: (busy, nil) for a busy lock,
// (standby, nil) for a server in recovery, else (busy, the error,
// explained). A ServerWait window's end (55P03) and a deadlock (40P01) are
// not sorted here: in txlock's own transaction they are a busy lock
// (classifyOwn), and in a caller's, LockTx sorts them out (callerTx).
func classify(err error) (outcome, error) {
	switch {
	case isStandbyError(err):
		return standby, nil
	case isIsolationError(err):
		return busy, errServerWaitIsolation(err)
	case isTermIsolationError(err):
		return busy, errTermIsolation(err)
	}
	return busy, fmt.Errorf("txlock: lock statement: %w", err)
}

// rowsOutcome decodes the row count of a lock statement: see lockStatement.
func rowsOutcome(n int64) (outcome, error) {
	switch n {
	case 0:
		return busy, nil
	case 1:
		return granted, nil
	case 2:
		return standby, nil
	}
	return busy, fmt.Errorf("txlock: lock statement reported %d rows, want 0, 1 or 2 (the driver must report RowsAffected for SELECT)", n)
}

// sqlTx runs lock statements in a database/sql transaction.
type sqlTx struct{ tx *sql.Tx }

// ExecRows implements driver.Execer.
func (t sqlTx) ExecRows(ctx context.Context, stmt string) (int64, error) {
	res, err := t.tx.ExecContext(ctx, stmt)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("txlock: lock statement result: %w", err)
	}
	return n, nil
}
