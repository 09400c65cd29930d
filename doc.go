// Package txlock provides distributed mutual exclusion through PostgreSQL
// transaction-scoped advisory locks, over database/sql.
//
// # The lock
//
// WithLock begins a transaction, takes the lock with
// pg_try_advisory_xact_lock, and runs fn in that same transaction. The lock
// is released when the transaction commits or rolls back, and no sooner, so
// every write fn makes in the transaction is visible to the next holder:
//
//	err := txlock.WithLock(ctx, db, txlock.StringKey("orders:42"), func(ctx context.Context, tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, `UPDATE stock SET qty = qty - 1 WHERE sku = $1`, sku)
//		return err
//	})
//	if errors.Is(err, txlock.ErrLockTimeout) {
//		// another holder kept it past the deadline
//	}
//
// A busy lock is not waited for inside the server for long. The attempt's
// transaction rolls back at once, returning its connection to the pool, and
// WithLock sleeps (exponential backoff with full jitter by default; see
// RetryStrategy) before the next attempt. Waiters therefore hold no
// connection between attempts, which is what lets many of them wait behind
// a small PgBouncer pool in transaction mode. The one exception is the
// default strategy's queue head (see "Local queues"): once per call (per
// round, with serialization retries), a call for one key waits in
// PostgreSQL's lock queue for up to 200ms instead, which passes the lock
// between processes in the server's order. Behind PgBouncer that wait
// holds a server connection: with more processes contending for one key
// than PgBouncer's pool has connections, their windows can take the whole
// pool for up to 200ms, and WithRetry(ExponentialBackoff{}), which polls
// only, is the choice.
// WithServerWait has every attempt wait in PostgreSQL's lock queue, for a
// bounded window: fair between processes, at the cost of a connection while
// it waits (see ServerWait).
// The wait ends at the earlier of the context's deadline and WithTimeout
// (DefaultTimeout).
//
// TryWithLock makes one attempt and reports whether it ran fn. WithLocks and
// TryWithLocks take several keys all or nothing. Do and TryDo return fn's
// value. WithSemaphore and TryWithSemaphore let n holders of a key run at
// once. WithShared takes reader locks, and WithOwner names the holder in
// pg_stat_activity. LockTx and TryLockTx lock inside a transaction the
// caller already has. Package pgxlock offers all of these with pgx.Tx, for
// pgx used natively, and package sqlxlock the WithLock family and LockTx
// with *sqlx.Tx.
//
// # Local queues
//
// Goroutines of one process that wait for the same keys on the same db, in
// the same mode, queue behind each other in FIFO order: only the first makes
// attempts, so the database sees one waiter per key per process, and when
// the holder is done the next tries at once instead of sleeping. Waiting in
// this queue holds no connection, with one bounded exception: when a
// holder's fn returns on a *sql.DB, the next caller may begin its
// transaction while the holder's COMMIT runs, so that the lock passes with
// the round trip of one statement, and gives that connection back if the
// COMMIT is slow. A caller that gives up passes its turn on. Shared locks,
// tries and LockTx do not queue. Callers in other processes, and waiters
// with other key sets, are not ordered by this queue; the server's own
// queue orders them with WithServerWait, and mostly with the default
// strategy: the caller whose turn it is, if it locks one key, its pool has
// an idle connection and its transaction is ReadCommitted, makes one of its
// attempts a wait in the server's lock queue of up to 200ms, and polls
// after that. So a process occupies at most one connection per local
// queue, for at most that window per round of a call, waiting. After a
// handoff within the process, that window goes at once, when other
// processes wait in the server or the last handoff outlasted a
// millisecond (a network between the process and the server): the server
// then grants it the moment the holder's transaction ends. After such a
// slow handoff the turn passes earlier still, as soon as the holder's lock
// is granted, so that the next caller's BEGIN and window go out during the
// hold.
//
// # Observing locks
//
// An Observer is told of every lock event (see EventKind): for logs
// (SlogObserver), metrics and traces. New returns a Locker, a database and
// the options its calls share, such as the Observer, for a service to build
// once; WithObserver sets or clears it for one call.
//
// # Keys
//
// A Key is one advisory lock: a bigint (Int64Key, StringKey) or a pair of
// int4s (PairKey, Keyspace.Key, Keyspace.ID), which PostgreSQL keeps in two
// separate spaces. String keys are hashed with SHA-256, which SQL can
// reproduce; the doc of StringKey and NewKeyspace gives the expressions.
// KeyFromPgLocks decodes a pg_locks row back into a Key.
//
// # Standbys
//
// Every attempt also asks pg_is_in_recovery(). A lock granted on a hot
// standby would exclude nothing on the primary, so WithLock refuses with
// ErrStandby and does not run fn.
//
// # PgBouncer and pgx
//
// The package's own statements take no parameters, so pgx sends them with
// the simple protocol whatever its default_query_exec_mode: no prepared
// statement is created. Settings are made with set_config(…, true), which
// lasts only until the transaction ends; never with a plain SET, which
// PgBouncer in transaction mode would leak to other clients. Statements in
// fn are the application's: behind PgBouncer 1.18 (no prepared statement
// support) use default_query_exec_mode exec, simple_protocol or
// cache_describe.
//
// # Fencing
//
// Writes that leave the lock's transaction (another database, another
// connection) can outlive the lock: a holder that stalls can lose its
// session, and with it the lock, then wake up and write. Inside fn,
// FenceToken returns a token that only goes up, drawn durably; FencedTable
// writes a row only if the row's token is not larger than the writer's, and
// reports a refused write as ErrStaleToken.
//
// # Terms: leases and leader election
//
// A lock held for minutes or hours, by one leader among a service's
// replicas, is a term: AcquireTerm campaigns as WithLock waits, then holds
// the lock in one READ COMMITTED transaction that makes no writes, with a
// heartbeat every interval (WithHeartbeat) and a server-side bound
// (idle_in_transaction_session_timeout) that ends a frozen holder's session.
// The term's context is cancelled when a heartbeat detects the lock's loss
// (up to Interval+Timeout after the server dropped it; within the TTL for a
// frozen holder), with a cause matching ErrLockLost: two holders can
// overlap for that window, so fencing is mandatory for writes outside the
// term's transaction. Each term draws its own fencing token (Term.Token),
// which those writes carry. Lead runs fn for one term and releases it when
// fn returns.
//
// # Keyspace registry
//
// Registry records which service owns each keyspace namespace, so that two
// services whose names hash to the same namespace fail loudly at start-up
// (ErrKeyspaceClash) instead of sharing locks; the txlock command uses it to
// show locks by name. Package interop builds the keys of other tools'
// advisory locks.
//
// # Errors
//
// ErrLockTimeout (a *LockTimeoutError with the keys, attempts and time
// waited), ErrStandby, ErrFnEndedTx, ErrHoldTimeout, ErrCommitFailed,
// ErrInvalidArgument, ErrInvalidKey, ErrLockTableFull, ErrNoToken,
// ErrStaleToken (a *StaleTokenError), ErrRowNotFound, ErrLockLost,
// ErrTermReleased and ErrKeyspaceClash (a *KeyspaceClashError) are matched
// with errors.Is; a wait its context cancelled is a *CanceledError, which
// matches context.Canceled and not ErrLockTimeout (see LockTimeoutError for
// the rule). An error
// from fn is returned so that errors.Is and errors.As find it: as it is, or
// joined with ErrFnEndedTx or ErrHoldTimeout when fn also ended the transaction
// or outlived WithMaxHold (see WithLock). SQLState reads a PostgreSQL error
// code from any of them without importing a driver.
package txlock
