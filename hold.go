package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// holder is a granted lock in a transaction of txlock's own: the
// transaction, and the contexts bound to it. Its run method is the commit
// semantics of WithLock.
type holder struct {
	tx       *sql.Tx
	txCtx    context.Context // the context the transaction was begun with
	fnCtx    context.Context // txCtx, with the hold bound if any
	cancel   context.CancelCauseFunc
	stopTie  func() bool        // unties the hold bound from txCtx
	stopHold context.CancelFunc // releases the hold bound's context
	// grantedAt is when the lock was granted, before the hold bound began.
	grantedAt time.Time
}

// bound gives fn's context the hold bound d, and ends the transaction when
// it passes (database/sql rolls back a transaction whose context ends).
func (h *holder) bound(d time.Duration) {
	fnCtx, stopHold := context.WithTimeoutCause(h.txCtx, d, ErrHoldTimeout)
	h.fnCtx, h.stopHold = fnCtx, stopHold
	// cancel, not h.cancel: the next round's grant overwrites *h while this
	// may still run.
	cancel := h.cancel
	h.stopTie = context.AfterFunc(fnCtx, func() { cancel(context.Cause(fnCtx)) })
}

// release frees what the holder's contexts hold, once fn is done.
func (h *holder) release() {
	if h.stopTie != nil {
		h.stopTie()
		h.stopHold()
	}
	if h.cancel != nil {
		h.cancel(nil)
	}
}

// run runs fn in the holder's transaction and commits or rolls back, as
// WithLock documents. handOn, if not nil, runs once fn has returned, before
// the commit or rollback.
func (h *holder) run(fn func(context.Context, *sql.Tx) error, st *lockState, handOn func()) error {
	defer h.release()
	defer st.ended.Store(true)
	done := false
	defer func() {
		if !done { // fn panicked: roll back, and let the panic continue.
			_ = h.tx.Rollback()
		}
	}()
	st.Context = h.fnCtx
	fnErr := fn(st, h.tx)
	done = true
	if handOn != nil {
		handOn()
	}
	if fnErr != nil {
		if err := h.tx.Rollback(); errors.Is(err, sql.ErrTxDone) && h.txCtx.Err() == nil {
			return errors.Join(fnErr, ErrFnEndedTx)
		}
		if errors.Is(fnErr, ErrHoldTimeout) {
			return fnErr
		}
		if cause := context.Cause(h.fnCtx); errors.Is(cause, ErrHoldTimeout) {
			return errors.Join(fnErr, cause)
		}
		if h.stopTie != nil && serverEndedHold(fnErr) {
			// The server's side of the bound ended the session before the
			// client's deadline fired.
			return errors.Join(fnErr, ErrHoldTimeout)
		}
		return fnErr
	}
	if h.fnCtx.Err() != nil {
		_ = h.tx.Rollback()
		return h.ended()
	}
	if err := h.tx.Commit(); err != nil {
		if h.txCtx.Err() != nil && !errors.Is(err, sql.ErrTxDone) {
			// The context ended as Commit ran: database/sql refused to
			// commit, or the driver cut the COMMIT off mid-flight.
			return fmt.Errorf("%w: interrupted as the transaction's context ended, so it may or may not have taken effect: %w: %w", ErrCommitFailed, context.Cause(h.fnCtx), err)
		}
		if errors.Is(err, sql.ErrTxDone) {
			if h.txCtx.Err() != nil {
				return h.ended()
			}
			return ErrFnEndedTx
		}
		return fmt.Errorf("%w: %w", ErrCommitFailed, err)
	}
	return nil
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

// ended explains a transaction that was rolled back because its context
// ended: the hold bound, or the caller's context.
func (h *holder) ended() error {
	cause := context.Cause(h.fnCtx)
	if errors.Is(cause, ErrHoldTimeout) {
		return cause
	}
	return fmt.Errorf("txlock: transaction rolled back: %w", cause)
}
