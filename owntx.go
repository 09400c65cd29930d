package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/txlock/txlock/driver"
)

// ownTx is database/sql's attempter and keeper, for the WithLock family
// and terms: each attempt begins a transaction of its own on db and runs
// the lock statement in it; a busy attempt rolls back, which returns the
// connection to the pool, and a granted one keeps the transaction for fn.
// Its Attempt is the driver contract's (driver.Acquirer), as a driver's is.
type ownTx struct {
	c    *config
	db   DB
	pool *sql.DB // the pool behind db, if the call queues on one; else nil
	fn   func(context.Context, *sql.Tx) error
	held sqlHeld // the last attempt's transaction

	mu    sync.Mutex
	early *earlyTx // begun by beginEarly for the next attempt, or nil
	begun func()   // see afterBegin; only the call's goroutine uses it
}

var (
	_ attempter     = (*ownTx)(nil)
	_ source        = (*ownTx)(nil)
	_ earlyBeginner = (*ownTx)(nil)
)

// maxEarlyBegin bounds how long a caller holds a transaction, and so a
// connection, once begun before its lock statement could go: handed its
// turn before the previous holder's transaction ended, while that holder's
// COMMIT runs (see queue.go), or on deck (beginEarly). It is a variable
// only so that a test can lengthen it (export_test.go).
var maxEarlyBegin = 50 * time.Millisecond

// openTx is an attempt's transaction, bound to the wait (tie) until the
// lock is granted.
type openTx struct {
	tx     *sql.Tx
	txCtx  context.Context
	cancel context.CancelCauseFunc
	tie    deadlineTie
}

// open begins an attempt's transaction, bound to r's deadline and wait (see
// beginTx for r.PrevEnd).
func (a *ownTx) open(ctx context.Context, r driver.Request) (openTx, error) {
	txCtx, cancel := context.WithCancelCause(ctx)
	tie := tieTo(r, cancel)
	tx, err := a.beginTx(txCtx, r.PrevEnd)
	if err != nil {
		tie.untie()
		cancel(nil)
		return openTx{}, err
	}
	return openTx{tx: tx, txCtx: txCtx, cancel: cancel, tie: tie}, nil
}

// drop rolls o back.
func (o openTx) drop() {
	o.tie.untie()
	_ = o.tx.Rollback()
	o.cancel(nil)
}

// earlyTx is a transaction that beginEarly began for the call's next
// attempt.
type earlyTx struct {
	openTx
	expire *time.Timer // rolls it back after maxEarlyBegin, if no attempt took it
}

// beginEarly implements earlyBeginner, when the pool shows an idle
// connection. (Another goroutine may take that one first: BeginTx then
// opens or waits for another, as any BEGIN of the pool would.)
func (a *ownTx) beginEarly(ctx context.Context, b bound) {
	if a.pool == nil || a.pool.Stats().Idle == 0 || a.hasEarly() {
		return
	}
	o, err := a.open(ctx, driver.Request{Deadline: b.deadline, WaitCtx: b.waitCtx})
	if err != nil {
		return
	}
	e := &earlyTx{openTx: o}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.early = e
	e.expire = time.AfterFunc(maxEarlyBegin, func() {
		a.mu.Lock()
		mine := a.early == e
		if mine {
			a.early = nil
		}
		a.mu.Unlock()
		if mine {
			e.drop()
		}
	})
}

// afterBegin implements earlyBeginner.
func (a *ownTx) afterBegin(f func()) { a.begun = f }

// hasEarly reports whether beginEarly's transaction is open.
func (a *ownTx) hasEarly() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.early != nil
}

// takeEarly returns the transaction that beginEarly began, if it is still
// open, for an attempt to use; nil if there is none.
func (a *ownTx) takeEarly() *earlyTx {
	a.mu.Lock()
	e := a.early
	a.early = nil
	a.mu.Unlock()
	if e == nil {
		return nil
	}
	e.expire.Stop()
	if e.txCtx.Err() != nil { // the wait ended: database/sql rolls it back
		e.drop()
		return nil
	}
	return e
}

// Attempt implements attempter. Until the lock is granted, the attempt's
// transaction is bound to r's deadline and context as well as to ctx, so
// that a stalled BEGIN or statement ends with the wait (or with the
// attempt's own bound, a term's TTL, which the request's deadline then is).
// A grant whose transaction that bound has ended is void: the attempt fails.
// Any other answer stands.
//
// Until the wait has made its context (an uncontended call's first attempt),
// that bound is a timer, or nothing at all when ctx's own deadline comes
// first: an uncontended call of a request handler, whose context has a
// deadline, then begins the transaction with ctx itself, and fn runs under
// the caller's context. A term never takes that path: its transaction must
// have a context of its own, which the term's end cancels to cut off a
// rollback that a partition holds up (see Term.finish).
func (a *ownTx) Attempt(ctx context.Context, r driver.Request) (driver.Result, error) {
	c := a.c
	if r.WaitCtx == nil && c.maxHold == 0 && !c.term {
		if d, ok := ctx.Deadline(); ok && !d.After(r.Deadline) {
			tx, err := a.db.BeginTx(ctx, c.txOpts)
			if err != nil {
				return driver.Result{}, fmt.Errorf("txlock: begin: %w", err)
			}
			a.held = sqlHeld{tx: tx, txCtx: ctx, fn: a.fn}
			return a.result(tx.ExecContext(ctx, r.Stmt))
		}
	}
	// A transaction begun on deck serves the next attempt, unless that one
	// must first wait for the previous holder's end (prevEnd: a poll after
	// a handoff), which begins its own as it always has.
	var o openTx
	if e := a.takeEarly(); e != nil && r.PrevEnd == nil {
		o = e.openTx
	} else {
		if e != nil {
			e.drop()
		}
		var err error
		if o, err = a.open(ctx, r); err != nil {
			return driver.Result{}, fmt.Errorf("txlock: begin: %w", err)
		}
	}
	if f := a.begun; f != nil && r.Window > 0 {
		// Once per turn: a head whose window ends busy makes another, and
		// an early BEGIN at each would be one more wasted transaction.
		a.begun = nil
		f()
	}
	if r.Window > 0 {
		// The window ends in the server before the deadline, and its
		// answer may come after it, across a network: the statement waits
		// for it until driver.StallGrace after the deadline, as pgxlock's
		// does, rather than end it at the deadline, which costs database/sql
		// the connection. ctx still ends it at once.
		o.tie = o.tie.until(r.Deadline.Add(driver.StallGrace), o.cancel)
	}
	a.held = sqlHeld{tx: o.tx, txCtx: o.txCtx, cancel: o.cancel, fn: a.fn}
	res, err := o.tx.ExecContext(o.txCtx, r.Stmt)
	if err == nil && (!o.tie.untie() || o.txCtx.Err() != nil) && a.grants(res) {
		// The deadline or the attempt's bound fired, or ctx ended, as the
		// lock was granted; database/sql is rolling the transaction back,
		// and fn must not start.
		a.held.abort()
		return driver.Result{}, context.DeadlineExceeded
	}
	// Once the deadline is untied, txCtx ends only with ctx (or when fn is
	// done), so fn can run under ctx itself: when ctx cannot be cancelled,
	// the driver then has no context to watch around each of fn's
	// statements.
	o.tie.untie()
	return a.result(res, err)
}

// result is the answer of the attempt's lock statement, whose outcome is
// its row count (see lockStatement), which database/sql returns as
// RowsAffected. A failed statement's transaction is rolled back.
func (a *ownTx) result(res sql.Result, err error) (driver.Result, error) {
	var n int64
	if err == nil {
		if n, err = res.RowsAffected(); err == nil {
			return driver.Result{Tx: &a.held, Rows: n}, nil
		}
		a.held.abort()
		return driver.Result{}, fmt.Errorf("txlock: lock statement result: %w", err)
	}
	a.held.abort()
	return driver.Result{Err: err}, nil
}

// grants reports whether res, a lock statement's answer, grants the lock.
func (a *ownTx) grants(res sql.Result) bool {
	n, err := res.RowsAffected()
	var slot int
	out, err2 := a.c.decodeRows(n, &slot)
	return err == nil && err2 == nil && out == granted
}

// beginTx begins an attempt's transaction. If the turn was handed on before
// the previous holder's transaction ended, it then waits for prevEnd, so
// that the lock statement finds the lock free; if that takes longer than
// maxEarlyBegin, it rolls back, waits without a connection, and begins
// again. When the pool has no idle connection, an early BEGIN would open
// one, or wait for the holder's: beginTx then waits first.
func (a *ownTx) beginTx(ctx context.Context, prevEnd <-chan struct{}) (*sql.Tx, error) {
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

// hold implements keeper.
func (a *ownTx) hold(st *lockState, pass func()) error {
	st.db, st.tx = a.db, a.held.tx
	return st.held.runFn(st, pass)
}

// holdUnlocked implements keeper: fn runs in a transaction of its own,
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

// IdleConn reports whether the pool the call queues on has an idle
// connection (see waiter.window), as driver.Acquirer's does, or whether the
// call holds one already in a transaction begun early.
func (a *ownTx) IdleConn() bool {
	return a.pool != nil && (a.hasEarly() || a.pool.Stats().Idle > 0)
}

// pooled implements keeper.
func (a *ownTx) pooled() bool { return a.pool != nil }

// check implements source: db, and a call's fn (a term has none).
func (a *ownTx) check() error {
	if nilDB(a.db) {
		return fmt.Errorf("%w: db is nil", ErrInvalidArgument)
	}
	if a.fn == nil && !a.c.term {
		return fmt.Errorf("%w: fn is nil", ErrInvalidArgument)
	}
	return nil
}

// plan implements source. database/sql's attempts begin with BeginTx, so
// the plan's statement is the lock statement alone.
func (a *ownTx) plan(p *plan, keys []Key, first int, stmt string) error {
	*p = plan{c: a.c, a: a, keys: keys, first: first, stmt: stmt}
	if stmt == "" {
		p.stmt = lockStatement(p.spec(formOwnTx), formOwnTx)
	}
	return nil
}

// queueHandle implements source: db's (see queueHandle), whose pool, if
// it is a *sql.DB, tells an early BEGIN whether it has an idle connection.
func (a *ownTx) queueHandle() any {
	h := queueHandle(a.db)
	a.pool, _ = h.(*sql.DB)
	return h
}

// deadlineTie ends an attempt's transaction when the request's deadline
// passes: an AfterFunc on its context, or, before the wait has one, a timer.
type deadlineTie struct {
	timer     *time.Timer
	stopAfter func() bool
}

// tieTo ties cancel to r's deadline.
func tieTo(r driver.Request, cancel context.CancelCauseFunc) deadlineTie {
	if ctx := r.WaitCtx; ctx != nil {
		return deadlineTie{stopAfter: context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })}
	}
	return deadlineTie{timer: time.AfterFunc(time.Until(r.Deadline), func() { cancel(context.DeadlineExceeded) })}
}

// until moves t's end to end, unless it has already ended the transaction.
func (t deadlineTie) until(end time.Time, cancel context.CancelCauseFunc) deadlineTie {
	if !t.untie() {
		return t
	}
	return deadlineTie{timer: time.AfterFunc(time.Until(end), func() { cancel(context.DeadlineExceeded) })}
}

// untie stops the deadline from ending the transaction, and reports whether
// it had not already.
func (t deadlineTie) untie() bool {
	if t.timer != nil {
		return t.timer.Stop()
	}
	return t.stopAfter()
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

// sqlHeld is a database/sql transaction as a driver.Tx, and, for a term,
// a driver.TermTx.
type sqlHeld struct {
	tx     *sql.Tx
	txCtx  context.Context         // the context tx was begun with
	cancel context.CancelCauseFunc // ends txCtx, if the transaction has a context of its own
	fn     func(context.Context, *sql.Tx) error
}

var _ driver.TermTx = (*sqlHeld)(nil)

// Fn implements driver.Tx.
func (t *sqlHeld) Fn(ctx context.Context) error { return t.fn(ctx, t.tx) }

// Commit implements driver.Tx. database/sql commits under the transaction's
// own context.
func (t *sqlHeld) Commit(context.Context) error {
	err := t.tx.Commit()
	if errors.Is(err, sql.ErrTxDone) {
		if t.txCtx.Err() != nil {
			// database/sql rolls back as the context ends; it does not
			// say whether fn had ended the transaction first.
			return errSQLRolledBack
		}
		return driver.ErrFnEndedTx
	}
	return err
}

var errSQLRolledBack = fmt.Errorf("%w, unless fn had committed or rolled it back itself before, which database/sql does not tell apart", driver.ErrRolledBack)

// Rollback implements driver.Tx.
func (t *sqlHeld) Rollback() error {
	err := t.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		if t.txCtx.Err() != nil {
			return errSQLRolledBack
		}
		return driver.ErrFnEndedTx
	}
	return err
}

// Close implements driver.Tx: an ended database/sql transaction has returned
// its connection; Close releases the transaction's own context, if it has
// one.
func (t *sqlHeld) Close() {
	if t.cancel != nil {
		t.cancel(nil)
	}
}

// txContext implements ctxTx.
func (t *sqlHeld) txContext() (context.Context, context.CancelCauseFunc) { return t.txCtx, t.cancel }

// abort rolls back the transaction of an attempt that failed, and closes it.
func (t *sqlHeld) abort() {
	_ = t.tx.Rollback()
	t.Close()
}

// Exec implements driver.TermTx: database/sql closes the connection of a
// statement whose context ends before its answer.
func (t *sqlHeld) Exec(ctx context.Context, stmt string) error {
	_, err := t.tx.ExecContext(ctx, stmt)
	return err
}

// RollbackContext implements driver.TermTx. database/sql's ROLLBACK takes no
// context: when ctx ends first, ending the transaction's own context cuts
// it off, which rolls back and closes the connection. A transaction begun
// without a context of its own (t.cancel nil) is not cut off.
func (t *sqlHeld) RollbackContext(ctx context.Context) error {
	switch {
	case t.cancel == nil:
	case ctx.Err() != nil: // before the rollback: the driver, not this call, ends the transaction
		t.cancel(context.Cause(ctx))
	default:
		stop := context.AfterFunc(ctx, func() { t.cancel(context.Cause(ctx)) })
		defer stop()
	}
	return t.Rollback()
}
