package txlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txlock/txlock/driver"
)

// This file is the lock loop's side of one attempt, the same for every
// attempter: what the attempt sends (plan.request), and what the server's
// answer means (plan.settle). An attempter (database/sql's in owntx.go,
// a driver's, LockTx's in locktx.go) only carries the request to the
// server and the answer back.

// An attempter makes lock attempts for one call: the driver contract's
// Attempt (driver.Acquirer), which database/sql's attempts (ownTx,
// owntx.go), a driver's, and LockTx's (callerTx) all implement. The loop
// sends each attempt's request (plan.request) and decides what its answer
// means (plan.settle) itself.
type attempter interface {
	// Attempt makes one attempt within r. Unless it returns a transaction,
	// it has let go of every connection it took before it returns. An
	// attempt must not outlast r.Deadline.
	Attempt(ctx context.Context, r driver.Request) (driver.Result, error)
}

// earlyBeginner is an attempter whose transactions begin with a round trip
// of their own (database/sql's ownTx), which a call on deck begins before
// its turn (see ticket.callOnDeck): beginEarly begins the next attempt's
// transaction within b, and afterBegin sets what the turn's first window
// calls once its transaction has begun.
type earlyBeginner interface {
	beginEarly(ctx context.Context, b bound)
	afterBegin(f func())
}

// A source is where a call's attempts are made, and its keeper: what a
// call's setup needs (call.prepare, Term.campaign), the same for database/sql
// and for a driver.
type source interface {
	keeper
	// check reports what is wrong with the call's arguments, other than
	// its options and keys: a nil database or fn.
	check() error
	// plan makes p the plan of the call's attempts on keys, whose lock
	// statement is stmt (a term's) or, if stmt is "", the WithLock
	// family's, asking a semaphore's slots from first.
	plan(p *plan, keys []Key, first int, stmt string) error
	// queueHandle returns the identity of the pool the attempts take
	// connections from, which names the call's local queue, or nil if
	// its calls do not queue. It is called only for a call that may.
	queueHandle() any
	// termTx returns a term's granted transaction, st.held's, and makes
	// it where st's tokens are confirmed.
	termTx(st *lockState) (driver.TermTx, error)
}

// outcome is what one attempt found, as the loop decides it.
type outcome uint8

const (
	busy    outcome = iota // another session holds a key; nothing is held
	granted                // every key is held, until the attempt's transaction ends
	standby                // the server is in recovery; nothing was locked
	again                  // attempt again at once (waiter.sort)
)

// bound is what limits one attempt.
type bound struct {
	deadline time.Time
	// waitCtx ends at deadline or with the caller's context. The wait makes
	// it only once it is needed, for the first sleep or queue: nil until
	// then, which lets an uncontended call go without it.
	waitCtx context.Context
	// window is how long the attempt may wait in the server's lock queue
	// (ServerWait), never past deadline; 0: it must not wait there.
	window time.Duration
	// prevEnd is not nil when the caller ahead in the local queue handed
	// this call its turn before that caller's transaction ended (see
	// queue.go): it is closed once that transaction has ended, and a
	// polling lock statement must not be sent before (see waitFor).
	prevEnd <-chan struct{}
}

// waitFor returns the channel an attempt within b waits on before its lock
// statement: prevEnd for a poll, which must find the lock free; none for a
// window, which queues behind the holder in the server whenever it is
// sent, and is granted the moment the holder's transaction ends.
func (b bound) waitFor() <-chan struct{} {
	if b.window > 0 {
		return nil
	}
	return b.prevEnd
}

// plan is how a call's attempts are made, fixed before the first.
type plan struct {
	c     *config
	a     attempter
	keys  []Key  // the keys the statements lock: for a semaphore, its slots
	first int    // a semaphore's slot that the statements ask for first
	begin string // the BEGIN of a driver's attempts; "" for database/sql's, which begin with BeginTx
	stmt  string // a polling attempt's lock statement
	query string // begin and stmt in one string, for a driver
	// bound, if not 0, bounds each attempt however far the wait's deadline
	// is: a term's TTL (see acquireTerm).
	bound time.Duration
}

// spec is the lockSpec of p's statements in form f.
func (p *plan) spec(f stmtForm) lockSpec {
	s := p.c.specOf(p.keys, f)
	s.first = p.first
	return s
}

// attemptBound is an attempt's own bound, p.bound, when it ends the attempt
// before the wait's deadline: its end, and what releases its context. The
// zero attemptBound is none.
type attemptBound struct {
	end  time.Time
	stop context.CancelFunc
}

// request is the next attempt's, within b: the polling statement, or the
// window's (b.window), and the attempt's bounds. With p.bound, the request's
// deadline and context end at that bound if it comes first (ab); settle
// releases that context.
func (p *plan) request(ctx context.Context, b bound) (r driver.Request, ab attemptBound) {
	r = driver.Request{Begin: p.begin, Stmt: p.stmt, Query: p.query, Deadline: b.deadline, WaitCtx: b.waitCtx, PrevEnd: b.waitFor()}
	if b.window > 0 {
		r.Window = b.window
		if !p.c.inTx { // LockTx builds its own: see callerTx.Attempt
			r.Stmt = quietWaitStatement(p.spec(formOwnTx), b.window)
			if p.begin != "" {
				r.Query = p.begin + "; " + r.Stmt
			}
		}
	}
	if p.bound > 0 {
		if end := time.Now().Add(p.bound); end.Before(r.Deadline) {
			parent := r.WaitCtx
			if parent == nil {
				parent = ctx
			}
			r.WaitCtx, ab.stop = context.WithDeadline(parent, end)
			r.Deadline, ab.end = end, end
		}
	}
	return r, ab
}

// settle decides what an attempt's answer, r or err, means: granted, busy
// or standby, or an error that ends the wait. It ends the attempt's
// transaction unless the lock was granted, which then becomes st.held, with
// the hold bound, if any, started; a semaphore's slot granted is
// st.lock.Slot.
func (p *plan) settle(ctx context.Context, st *lockState, ab attemptBound, r driver.Result, err error) (outcome, error) {
	c := p.c
	if ab.stop != nil {
		ab.stop()
	}
	overran := !ab.end.IsZero() && !time.Now().Before(ab.end)
	tx, out := r.Tx, busy
	switch {
	case err != nil:
	case r.Err != nil:
		endTx(tx) // the contract says it has none; end it anyway
		out, err = p.classify(r.Err)
	case c.inTx: // LockTx: the lock is the caller's transaction's
		return rowsOutcome(r.Rows)
	case isNil(tx):
		err = errors.New("txlock: the attempt returned neither a transaction nor an error")
	default:
		var slot int
		out, err = c.decodeRows(r.Rows, &slot)
		switch {
		case out != granted || err != nil:
		case ctx.Err() != nil:
			// ctx ended as the lock was granted: fn must not start.
			out, err = busy, ctx.Err()
		case overran:
			// The grant came after the attempt's bound (a driver cuts the
			// connection off only a little later): the attempt has failed.
			out, err = busy, context.DeadlineExceeded
		}
		if out != granted || err != nil {
			endTx(tx)
		} else {
			st.lock.Slot = slot
		}
	}
	if err != nil && overran {
		err = fmt.Errorf("txlock: the attempt did not return within %v (a term's attempt is bounded by its TTL): the connection may be partitioned, or the server unreachable: %w", p.bound, err)
	}
	if out != granted || err != nil {
		return out, err
	}
	st.held = newHolder(ctx, tx)
	if st.ev != nil {
		st.grantedAt = c.clock.now() // before the hold bound starts
	}
	if c.maxHold > 0 {
		st.held.limitHold(c.maxHold)
	}
	return granted, nil
}

// endTx ends the transaction of an attempt that was not granted, if it
// has one.
func endTx(tx driver.Tx) {
	if !isNil(tx) {
		_ = tx.Rollback()
		tx.Close()
	}
}

// A ctxTx is a transaction that a context of its own ends: database/sql's
// (sqlHeld), whose context's cancel ends it.
type ctxTx interface {
	txContext() (context.Context, context.CancelCauseFunc)
}

// newHolder is the holder of tx, granted under ctx: fn runs under ctx. A
// database/sql transaction with a context of its own (sqlHeld) is ended
// by it; a driver's transaction has no context, and its statements end with
// fn's (which the hold bound, if any, ends, and the server's side of the
// bound ends the session).
func newHolder(ctx context.Context, tx driver.Tx) holder {
	if t, ok := tx.(ctxTx); ok {
		txCtx, cancel := t.txContext()
		return holder{tx: tx, txCtx: txCtx, fnCtx: ctx, cancel: cancel}
	}
	return holder{tx: tx, txCtx: ctx, fnCtx: ctx}
}

// decodeRows decodes the row count of c's lock statement: rowsOutcome's, or
// for a semaphore slotsOutcome's, which sets *slot to the slot granted.
func (c *config) decodeRows(rows int64, slot *int) (outcome, error) {
	if c.slots == 0 {
		return rowsOutcome(rows)
	}
	out, s, err := slotsOutcome(rows, c.slots)
	*slot = s
	return out, err
}

// classify sorts the error of a lock statement: (busy, nil) for a busy
// lock, (standby, nil) for a server in recovery, else (busy, the error,
// explained). A ServerWait window that ends in lock_timeout (55P03) is a
// busy lock. So is one that the deadlock detector picks (40P01) in a
// transaction of the call's own, which the attempt rolls back, undoing
// whatever the statement did; in a caller's (LockTx, whose attempter has
// rolled back to its savepoint), the deadlock is between the caller's
// transactions, and waiting again would deadlock again: it is an error.
func (p *plan) classify(err error) (outcome, error) {
	switch code := SQLState(err); {
	case code == codeLockNotAvailable, code == codeDeadlock && !p.c.inTx:
		return busy, nil
	case code == codeDeadlock:
		return busy, fmt.Errorf("txlock: lock %s: lock statement: %w", keysString(p.keys), err)
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

// slotsOutcome decodes the row count of a semaphore's lock statement (see
// semaphoreStatement) of n slots: busy, or granted with the slot held.
func slotsOutcome(rows int64, n int) (outcome, int, error) {
	switch {
	case rows == 0:
		return busy, 0, nil
	case rows < 0 || rows > int64(n):
		return busy, 0, fmt.Errorf("txlock: a semaphore's lock statement reported %d rows, want 0 to %d (the driver must report RowsAffected for SELECT)", rows, n)
	}
	return granted, int(rows - 1), nil
}
