package txlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txlock/txlock/driver"
)

// A keeper runs fn under a lock its call's attempts were granted: what
// the lock loop needs of database/sql's (ownTx, owntx.go) or a driver's
// (driverAcquirer, driver.go).
type keeper interface {
	// hold runs fn with the granted lock, st.held, with st as its
	// context, then ends the lock (commit or rollback). pass, if not
	// nil, runs once fn has returned, before the lock ends.
	hold(st *lockState, pass func()) error
	// holdUnlocked runs fn without the lock, for WithFailOpen.
	holdUnlocked(ctx context.Context, st *lockState) error
	// pooled reports whether the next caller of a local queue can begin
	// while this call's lock ends: its db is a pool, where each caller has
	// a connection of its own.
	pooled() bool
}

// limitHold gives fn's context the hold bound d and, if the holder can end
// txCtx, ends it when the bound passes (database/sql rolls back a
// transaction whose context ends; a driver whose transaction has no
// context ends fn's statements by fnCtx, and the server's side of the
// bound ends the session).
func (h *holder) limitHold(d time.Duration) {
	fnCtx, stopHold := context.WithTimeoutCause(h.txCtx, d, ErrHoldTimeout)
	h.fnCtx, h.stopHold = fnCtx, stopHold
	// cancel, not h.cancel: the closure must not read the holder, which
	// is reused for a term's or a call's later rounds.
	if cancel := h.cancel; cancel != nil {
		h.stopTie = context.AfterFunc(fnCtx, func() { cancel(context.Cause(fnCtx)) })
	}
}

// release frees what the holder's contexts and connection hold, once the
// transaction has ended.
func (h *holder) release() {
	if h.stopTie != nil {
		h.stopTie()
	}
	if h.stopHold != nil {
		h.stopHold()
	}
	if h.cancel != nil {
		h.cancel(nil)
	}
	h.tx.Close()
}

// runFn runs fn in the holder's transaction and commits or rolls back, as
// WithLock documents. pass, if not nil, runs once fn has returned, before
// the commit or rollback.
func (h *holder) runFn(st *lockState, pass func()) error {
	defer h.release()
	defer st.ended.Store(true)
	done := false
	defer func() {
		if !done { // fn panicked: roll back, and let the panic continue.
			st.ended.Store(true)
			_ = h.tx.Rollback()
		}
	}()
	st.Context = h.fnCtx
	fnErr := h.tx.Fn(st)
	done = true
	// No fencing token starts once fn has returned; one under way
	// finishes before the commit or rollback (the driver's Tx sees to it).
	st.ended.Store(true)
	if pass != nil {
		pass()
	}
	return h.end(fnErr)
}

// end commits or rolls back once fn has returned fnErr.
func (h *holder) end(fnErr error) error {
	bounded := h.stopHold != nil
	if fnErr != nil {
		if err := h.tx.Rollback(); errors.Is(err, driver.ErrFnEndedTx) {
			return errors.Join(fnErr, ErrFnEndedTx)
		}
		if errors.Is(fnErr, ErrHoldTimeout) {
			return fnErr
		}
		if cause := context.Cause(h.fnCtx); errors.Is(cause, ErrHoldTimeout) {
			return errors.Join(fnErr, errHoldRolledBack)
		}
		if bounded && serverEndedHold(fnErr) {
			// The server's side of the bound ended the session before the
			// client's deadline fired.
			return errors.Join(fnErr, errHoldRolledBack)
		}
		return fnErr
	}
	if h.fnCtx.Err() != nil {
		// fn's context ended, the hold bound's or the caller's, and fn
		// returned nil: that is the result. If fn had ended the
		// transaction itself, that is part of it, for fn may have
		// committed; and a driver that cannot tell says so.
		switch err := h.tx.Rollback(); {
		case errors.Is(err, driver.ErrFnEndedTx):
			return errors.Join(fmt.Errorf("txlock: fn's context ended: %w", context.Cause(h.fnCtx)), ErrFnEndedTx)
		case errors.Is(err, driver.ErrRolledBack):
			return fmt.Errorf("%w (%w)", h.rolledBackErr(), err)
		}
		return h.rolledBackErr()
	}
	err := h.tx.Commit(h.fnCtx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, driver.ErrFnEndedTx):
		return ErrFnEndedTx
	case errors.Is(err, driver.ErrRolledBack):
		// Not committed by txlock; the driver says why it cannot be sure
		// of more.
		return fmt.Errorf("%w (%w)", h.rolledBackErr(), err)
	case errors.Is(err, driver.ErrCommitRolledBack):
		return fmt.Errorf("%w: the transaction had failed (a statement of fn failed, and fn returned nil), so COMMIT rolled it back: %w", ErrCommitFailed, err)
	case h.fnCtx.Err() != nil:
		// The context ended as COMMIT ran: the driver refused to commit,
		// or cut the COMMIT off mid-flight.
		return fmt.Errorf("%w: interrupted as the transaction's context ended, so it may or may not have taken effect: %w: %w", ErrCommitFailed, context.Cause(h.fnCtx), err)
	case bounded && serverEndedHold(err):
		// The server's side of the bound ended the session before the
		// client's deadline fired.
		return errors.Join(fmt.Errorf("%w: %w", ErrCommitFailed, err), ErrHoldTimeout)
	}
	return fmt.Errorf("%w: %w", ErrCommitFailed, err)
}

// serverEndedHold reports the errors by which the server ends a session for
// WithMaxHold: idle_in_transaction_session_timeout (25P03) and, from
// PostgreSQL 17, transaction_timeout (25P04).
func serverEndedHold(err error) bool {
	switch SQLState(err) {
	case "25P03", "25P04":
		return true
	}
	return false
}

// rolledBackErr explains a transaction that was rolled back because its context
// ended: the hold bound, or the caller's context.
func (h *holder) rolledBackErr() error {
	cause := context.Cause(h.fnCtx)
	if errors.Is(cause, ErrHoldTimeout) {
		return errHoldRolledBack
	}
	return fmt.Errorf("txlock: transaction rolled back: %w", cause)
}

// errHoldRolledBack is ErrHoldTimeout for a transaction that was rolled
// back.
var errHoldRolledBack = fmt.Errorf("%w; transaction rolled back", ErrHoldTimeout)

// runUnlocked runs fn without the lock, through a, once the wait for st's
// lock timed out (WithFailOpen).
func (c *config) runUnlocked(ctx context.Context, a keeper, st *lockState) error {
	l := &st.lock
	c.logger.WarnContext(ctx, "txlock: lock not granted; running fn without it (fail-open)",
		"keys", keysString(l.Keys), "attempts", l.Attempts, "waited", l.Waited)
	if st.ev != nil {
		st.ev.emit(Event{Kind: FailedOpen, Keys: l.Keys, Shared: c.shared, Attempts: l.Attempts, Waited: l.Waited, Slots: l.Slots})
	}
	l.Held = false
	return a.holdUnlocked(ctx, st)
}

// retryNotRun explains why fn was not run again after a serialization
// failure: the retry's wait ended in err. It does not match the wait's
// sentinels (ErrLockTimeout), since fn did run under the lock; a context's
// end stays reachable with errors.Is.
func retryNotRun(ctx context.Context, err error) error {
	msg := "txlock: fn was not run again after its serialization failure"
	var te *LockTimeoutError
	var ce *CanceledError
	switch {
	case errors.Is(err, errBusy):
		return errors.New(msg + ": the retry found the lock busy")
	case err == ctx.Err():
		return fmt.Errorf("%s: %w", msg, err)
	case errors.As(err, &te), errors.As(err, &ce):
		// The wait's end, described but not matched: fn did run.
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%s: %v: %w", msg, err, cerr)
		}
		return fmt.Errorf("%s: %v", msg, err)
	}
	// Another error of the retry's wait (ErrStandby, a connection error)
	// stays reachable.
	return fmt.Errorf("%s: %w", msg, err)
}

// errFnPanicked is the Err of the Released event of a fn that panicked.
var errFnPanicked = errors.New("txlock: fn panicked; the transaction was rolled back")

// released reports the end of a held lock, if the call has an Observer:
// HoldTimeout first if the hold bound ended it.
func (c *config) released(st *lockState, err error) {
	ev := st.ev
	if ev == nil {
		return
	}
	e := Event{Keys: st.lock.Keys, Shared: st.lock.Shared, Attempts: st.lock.Attempts, Waited: st.lock.Waited,
		Held: c.clock.now().Sub(st.grantedAt), Slots: st.lock.Slots, Slot: st.lock.Slot}
	if errors.Is(err, ErrHoldTimeout) {
		e.Kind = HoldTimeout
		ev.emit(e)
	}
	e.Kind, e.Committed, e.Err = Released, err == nil, err
	ev.emit(e)
}
