package txlock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// RetryStrategy decides how long to sleep before the next lock attempt.
//
// Backoff receives the number of attempts made so far (1 after the first
// failed attempt) and returns the sleep before the next one. A negative
// duration means "stop trying". Implementations must be stateless, so that
// one value can be shared by any number of goroutines and calls; every
// strategy in this package is.
//
// A strategy that also has a Validate() error method is validated before the
// first attempt, and a non-nil error is returned without touching the database.
type RetryStrategy interface {
	Backoff(attempt int) time.Duration
}

// Defaults of ExponentialBackoff fields left zero.
const (
	backoffMin = 1 * time.Millisecond
	backoffMax = 64 * time.Millisecond
)

// ExponentialBackoff sleeps for a random duration, uniformly distributed
// between Min and Min·2^(attempt-1) capped at Max ("full jitter" above a
// floor). Jitter matters here: when a lock is released, every waiter that
// slept the same fixed time would wake together.
//
// A zero Min is 1ms, and a zero Max 64ms. DefaultRetry sleeps as the zero
// ExponentialBackoff does.
type ExponentialBackoff struct {
	Min time.Duration
	Max time.Duration
}

func (e ExponentialBackoff) bounds() (lo, hi time.Duration) {
	lo, hi = e.Min, e.Max
	if lo == 0 {
		lo = backoffMin
	}
	if hi == 0 {
		hi = max(backoffMax, lo)
	}
	return lo, hi
}

// Backoff implements RetryStrategy.
func (e ExponentialBackoff) Backoff(attempt int) time.Duration {
	lo, hi := e.bounds()
	ceil := hi
	// lo<<(attempt-1), computed without overflow.
	if shift := attempt - 1; shift < 62 && lo <= hi>>max(shift, 0) {
		ceil = lo << max(shift, 0)
	}
	return lo + jitter(ceil-lo)
}

// Validate reports nonsensical bounds.
func (e ExponentialBackoff) Validate() error {
	if e.Min < 0 || e.Max < 0 {
		return fmt.Errorf("txlock: ExponentialBackoff bounds must not be negative (Min %v, Max %v)", e.Min, e.Max)
	}
	if lo, hi := e.bounds(); lo > hi {
		return fmt.Errorf("txlock: ExponentialBackoff Min %v is greater than Max %v", lo, hi)
	}
	return nil
}

// ConstantBackoff sleeps Interval plus a random duration in [0, Jitter].
// Interval must be positive.
type ConstantBackoff struct {
	Interval time.Duration
	Jitter   time.Duration
}

// Backoff implements RetryStrategy.
func (c ConstantBackoff) Backoff(int) time.Duration {
	return c.Interval + jitter(c.Jitter)
}

// Validate reports a non-positive Interval or a negative Jitter.
func (c ConstantBackoff) Validate() error {
	if c.Interval <= 0 {
		return fmt.Errorf("txlock: ConstantBackoff Interval must be positive, got %v", c.Interval)
	}
	if c.Jitter < 0 {
		return fmt.Errorf("txlock: ConstantBackoff Jitter must not be negative, got %v", c.Jitter)
	}
	return nil
}

// LinearBackoff sleeps attempt·Step, capped at Max, plus a random duration
// in [0, Jitter]. Step and Max must be positive and Step must not exceed Max.
type LinearBackoff struct {
	Step   time.Duration
	Max    time.Duration
	Jitter time.Duration
}

// Backoff implements RetryStrategy.
func (l LinearBackoff) Backoff(attempt int) time.Duration {
	d := l.Max
	if attempt >= 1 && l.Step > 0 && time.Duration(attempt) <= l.Max/l.Step {
		d = time.Duration(attempt) * l.Step
	}
	return d + jitter(l.Jitter)
}

// Validate reports nonsensical fields.
func (l LinearBackoff) Validate() error {
	switch {
	case l.Step <= 0:
		return fmt.Errorf("txlock: LinearBackoff Step must be positive, got %v", l.Step)
	case l.Max <= 0:
		return fmt.Errorf("txlock: LinearBackoff Max must be positive, got %v", l.Max)
	case l.Step > l.Max:
		return fmt.Errorf("txlock: LinearBackoff Step %v is greater than Max %v", l.Step, l.Max)
	case l.Jitter < 0:
		return fmt.Errorf("txlock: LinearBackoff Jitter must not be negative, got %v", l.Jitter)
	}
	return nil
}

// DefaultServerWaitWindow is the window of a ServerWait whose Window is zero.
const DefaultServerWaitWindow = 200 * time.Millisecond

// ServerWait configures WithServerWait: each attempt waits for the lock in
// PostgreSQL's own lock queue, for at most Window, instead of sleeping
// between attempts.
//
// Each attempt begins a transaction and, in one statement, sets lock_timeout
// to Window for that transaction only (set_config(…, true)) and waits with
// pg_advisory_xact_lock. The server grants the lock the moment it is
// released, in queue order, so there is no handoff gap and no starvation.
// If Window passes first, the statement fails with lock_timeout (55P03), the
// attempt rolls back, and the next one starts after a random pause in
// [0, Pause]. A deadlock reported by the server (40P01) also ends the
// attempt. With several keys (WithLocks), lock_timeout bounds the wait for
// each key, so one attempt can wait up to Window per key; the wait's
// deadline still ends it. The last window ends before the deadline, by
// 25ms plus the least time that an attempt of the call has taken beyond
// its wait (its round trips), so that the server's answer, not the
// deadline, ends it, and the connection stays usable.
//
// Callers of one process queue locally first, so at most one waiter per
// key per pool waits in the server, holding a connection (behind PgBouncer,
// a server connection) for at most Window at a time: what that costs a
// pool, and when to poll instead, is told in "How waiting works":
// https://github.com/txlock/txlock/blob/main/docs/waiting.md
//
// In LockTx the wait runs inside a SAVEPOINT, so a timed-out window leaves
// the caller's transaction usable, and a deadlock between caller
// transactions that take keys in conflicting orders is reported as an
// error whose SQLState is 40P01 after PostgreSQL's deadlock_timeout (1s by
// default), rather than by both waiting out their timeouts.
//
// ServerWait needs a ReadCommitted transaction: under RepeatableRead or
// Serializable the transaction's snapshot would be taken by the waiting
// statement, before the previous holder commits, and fn would not see that
// holder's writes. A WithTxOptions isolation above ReadCommitted is refused
// before the database is touched, and the waiting statement itself refuses
// a transaction above it before it waits, whatever set the level (the
// server's default_transaction_isolation, or the caller's transaction in
// LockTx, which stays usable). Both refusals match ErrInvalidArgument.
//
// The zero ServerWait is valid: Window DefaultServerWaitWindow, no pause.
type ServerWait struct {
	Window time.Duration // longest wait in the server per attempt; at least 1ms, rounded up to whole milliseconds
	Pause  time.Duration // random pause in [0, Pause] between windows
}

// Validate reports a Window below 1ms (other than zero) or a negative Pause.
func (s ServerWait) Validate() error {
	if s.Window < 0 || (s.Window > 0 && s.Window < time.Millisecond) {
		return fmt.Errorf("txlock: ServerWait Window must be zero (the default) or at least 1ms, got %v", s.Window)
	}
	if s.Pause < 0 {
		return fmt.Errorf("txlock: ServerWait Pause must not be negative, got %v", s.Pause)
	}
	return nil
}

// window is how long an attempt waits in the server.
func (s ServerWait) window() time.Duration {
	if s.Window == 0 {
		return DefaultServerWaitWindow
	}
	return s.Window
}

// DefaultRetry is the strategy of a call given neither WithRetry nor
// WithServerWait, and WithRetry(DefaultRetry) is the same as no WithRetry.
// It sleeps as ExponentialBackoff{} does between attempts, and the first
// caller of a process's local queue for one key makes its attempts
// ServerWait windows of DefaultServerWaitWindow, when its pool has an idle
// connection and the transaction is ReadCommitted: what makes the default
// fair between processes. That waiter holds a connection, behind PgBouncer
// a server connection, so many processes on one hot key can take a shared
// PgBouncer pool from its other clients. To poll only, pass
// WithRetry(ExponentialBackoff{}), or any other strategy, in every process
// on that key. "How waiting works" tells the trade-off, with its numbers:
// https://github.com/txlock/txlock/blob/main/docs/waiting.md#the-default-strategy
// (A call without WithRetry uses the default whatever the variable holds:
// the library knows the default by its type.)
var DefaultRetry RetryStrategy = defaultRetry{}

type defaultRetry struct{ ExponentialBackoff }

// NoRetry makes exactly one attempt. With WithLock, a busy lock then ends in
// ErrLockTimeout at once; TryWithLock reports it as not acquired.
var NoRetry RetryStrategy = noRetry{}

type noRetry struct{}

func (noRetry) Backoff(int) time.Duration { return -1 }

// jitter returns a uniformly random duration in [0, d]; 0 when d <= 0.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// sleep waits for d or until ctx is done, whichever is first, and reports
// whether the full duration elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
