package txlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors returned by this package. Match them with errors.Is.
var (
	// ErrLockTimeout: the lock was not granted before the deadline: the
	// one WithTimeout (or DefaultTimeout) sets, or the context's own. The
	// error is a *LockTimeoutError. A wait whose context was cancelled
	// instead is not a timeout: see LockTimeoutError for the rule.
	ErrLockTimeout = errors.New("txlock: lock wait timed out")

	// ErrStandby: the server is a hot standby (pg_is_in_recovery() is true).
	// An advisory lock taken there excludes nothing on the primary, so it is
	// refused and fn does not run. So is, in a transaction of txlock's own
	// not begun READ ONLY, a transaction that began while the server was a
	// standby that has been promoted since: it stays read-only, and fn could
	// not write in it. The next call, in a new transaction, finds the
	// primary.
	ErrStandby = errors.New("txlock: server is a hot standby; a lock there would exclude nothing on the primary")

	// ErrFnEndedTx: fn committed or rolled back the lock's transaction itself.
	// The lock ended with that transaction. WithLock does not commit again.
	ErrFnEndedTx = errors.New("txlock: fn ended the lock's transaction itself (Commit or Rollback); the lock ended with it")

	// ErrHoldTimeout: the lock was held past the WithMaxHold bound. Its
	// transaction was rolled back, unless the bound ended it during COMMIT:
	// then the error also matches ErrCommitFailed, and says that the
	// outcome is unknown. (A COMMIT that waits for a synchronous standby
	// and is cancelled has committed on the server, though no standby may
	// have it.)
	ErrHoldTimeout = errors.New("txlock: lock held past its WithMaxHold bound")

	// ErrCommitFailed: fn succeeded, but committing its transaction failed.
	// A server error (a deferred constraint, a serialization failure) means
	// nothing was committed; a broken connection or an ended context during
	// COMMIT leaves the outcome unknown. The cause stays reachable with
	// errors.Is and errors.As.
	ErrCommitFailed = errors.New("txlock: commit failed")

	// ErrInvalidArgument: a nil db, tx or fn, an empty key list, too many
	// keys (MaxKeys), an invalid Option, or an invalid key (which matches
	// ErrInvalidKey too). A locking function that returns it sent nothing
	// to the database.
	ErrInvalidArgument = errors.New("txlock: invalid argument")

	// ErrLockLost: a term (AcquireTerm, Lead) lost its lock: a heartbeat
	// failed, or none succeeded for the Heartbeat's TTL, after which the
	// server ends the session. When that is detected (up to
	// Interval+Timeout after the server dropped the lock), the term's
	// context is cancelled with an error that matches it (context.Cause),
	// and Term.Err returns it. AcquireTerm returns it, too, for a term whose
	// start did not complete within the TTL.
	ErrLockLost = errors.New("txlock: lock lost")

	// ErrLockTableFull: the lock statement failed with SQLSTATE 53200
	// (out_of_memory), which from a lock statement means that the server's
	// shared lock table is full ("out of shared memory"):
	// too many locks are held at once across all sessions. The table is
	// sized by max_locks_per_transaction; see MaxKeys. The server's error
	// stays reachable with errors.As.
	ErrLockTableFull = errors.New("txlock: the server's lock table is full")

	// ErrTermReleased: the term was ended by Term.Release (or by Lead, once
	// fn returned). It is the cause of the term's context then.
	ErrTermReleased = errors.New("txlock: term released")
)

// LockTimeoutError reports a lock that was not granted in time. It matches
// ErrLockTimeout, and, when the context's deadline passed,
// context.DeadlineExceeded too.
//
// This is the rule for every wait, on every path (database/sql, pgxlock,
// sqlxlock, terms): a wait ends without the lock either because time ran out
// or because the caller gave up.
//   - Time ran out (WithTimeout, DefaultTimeout, or the context's deadline):
//     a *LockTimeoutError, which matches ErrLockTimeout; the event is
//     TimedOut.
//   - The context was cancelled (context.Canceled: a shutdown, an abandoned
//     request): a *CanceledError, which matches context.Canceled, and not
//     ErrLockTimeout, and carries the context's cause; the event is
//     Canceled, and metrics count it apart from timeouts.
type LockTimeoutError struct {
	Keys     []Key         // the keys asked for, in canonical order; a semaphore's key
	Slots    int           // a semaphore's n (its slots are SlotKey(Keys[0], i)), 0 for a lock
	Attempts int           // lock statements run
	Waited   time.Duration // time from the call to giving up
	Err      error         // the caller's context error, or nil if the timeout option ran out
}

func (e *LockTimeoutError) Error() string {
	var sb strings.Builder
	sb.WriteString("txlock: lock wait timed out: ")
	writeKeys(&sb, e.Keys, e.Slots)
	fmt.Fprintf(&sb, " not granted after %d attempts in %v", e.Attempts, e.Waited.Round(time.Microsecond))
	if e.Err != nil {
		sb.WriteString(": ")
		sb.WriteString(e.Err.Error())
	}
	return sb.String()
}

// Is reports whether target is ErrLockTimeout.
func (e *LockTimeoutError) Is(target error) bool { return target == ErrLockTimeout }

// Unwrap returns the caller's context error, if any.
func (e *LockTimeoutError) Unwrap() error { return e.Err }

// CanceledError reports a lock wait that its caller's context cancelled
// (context.Canceled): not a timeout, and not matching ErrLockTimeout (see
// LockTimeoutError for the rule). It matches context.Canceled, and the
// context's cause when the context was cancelled with one.
type CanceledError struct {
	Keys     []Key         // the keys asked for, in canonical order; a semaphore's key
	Slots    int           // a semaphore's n, 0 for a lock
	Attempts int           // lock statements run
	Waited   time.Duration // time from the call to giving up
	Cause    error         // context.Cause of the caller's context: context.Canceled, or the cause it was cancelled with
}

func (e *CanceledError) Error() string {
	var sb strings.Builder
	sb.WriteString("txlock: lock wait canceled: ")
	writeKeys(&sb, e.Keys, e.Slots)
	fmt.Fprintf(&sb, " not granted after %d attempts in %v: %v", e.Attempts, e.Waited.Round(time.Microsecond), e.Cause)
	return sb.String()
}

// Unwrap returns context.Canceled and the cause, if it is another error.
func (e *CanceledError) Unwrap() []error {
	if e.Cause == nil || e.Cause == context.Canceled {
		return []error{context.Canceled}
	}
	return []error{context.Canceled, e.Cause}
}

// waitEnded is the error, and the event kind, of a wait that ended without
// the lock after attempts in waited: the rule LockTimeoutError documents.
func waitEnded(ctx context.Context, keys []Key, slots, attempts int, waited time.Duration) (EventKind, error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		return Canceled, &CanceledError{Keys: keys, Slots: slots, Attempts: attempts, Waited: waited, Cause: context.Cause(ctx)}
	}
	return TimedOut, &LockTimeoutError{Keys: keys, Slots: slots, Attempts: attempts, Waited: waited, Err: ctx.Err()}
}

// reachedDeadline reports a wait that ended at its own deadline, the
// timeout's, while the caller's context went on (WithFailOpen runs fn then).
func reachedDeadline(err error) bool {
	var te *LockTimeoutError
	return errors.As(err, &te) && te.Err == nil
}

// SQLState returns the SQLSTATE code of the first PostgreSQL error in err's
// chain, or "" if there is none. It works with any driver whose errors have
// a SQLState() string method, as pgx's *pgconn.PgError does.
func SQLState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// PostgreSQL error codes the lock acts on.
const (
	codeLockNotAvailable = "55P03" // lock_timeout ended a ServerWait window
	codeDeadlock         = "40P01" // deadlock_detected
	codeSerialization    = "40001" // serialization_failure
	codeOutOfMemory      = "53200" // out_of_memory: the shared lock table is full
)

// retryable reports a serialization failure or a deadlock: WithLock re-runs
// fn after it (WithSerializationRetries).
func retryable(err error) bool {
	switch SQLState(err) {
	case codeSerialization, codeDeadlock:
		return true
	}
	return false
}

// isContextErr reports an error caused by a context ending: how an attempt
// cut off by the wait's deadline fails.
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// errServerWaitIsolation explains waitStatement's refusal of the
// transaction's isolation level (isIsolationError).
func errServerWaitIsolation(err error) error {
	return fmt.Errorf("%w: ServerWait needs ReadCommitted: the snapshot of a transaction above it would be taken before the wait, so fn would not see the previous holder's writes (the level may come from the server's default_transaction_isolation): %w", ErrInvalidArgument, err)
}

// errTermIsolation explains termStatement's refusal of the transaction's
// isolation level (isTermIsolationError).
func errTermIsolation(err error) error {
	return fmt.Errorf("%w: a term needs ReadCommitted: a transaction above it keeps its snapshot, and holds back vacuum, for the whole term (the level came from the server's default_transaction_isolation, which the DB let apply): %w", ErrInvalidArgument, err)
}

// errBusy is the internal result of a try that found the lock held.
var errBusy = errors.New("txlock: busy")

func keysString(keys []Key) string {
	var sb strings.Builder
	writeKeys(&sb, keys, 0)
	return sb.String()
}

// keysSummary is keysString for a few keys, and a count with the first for
// more.
func keysSummary(keys []Key) string {
	if len(keys) <= 3 {
		return keysString(keys)
	}
	return fmt.Sprintf("%d keys (%s, …)", len(keys), keys[0])
}

func writeKeys(sb *strings.Builder, keys []Key, slots int) {
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(k.String())
	}
	switch {
	case slots == 1:
		sb.WriteString(", a semaphore of 1 slot (SlotKey(key, 0)),")
	case slots > 1:
		fmt.Fprintf(sb, ", a semaphore of %d slots (SlotKey(key, 0 to %d)),", slots, slots-1)
	}
}
