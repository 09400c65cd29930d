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
// A busy attempt rolls back at once, returning its connection to the pool,
// and the call waits before the next. The wait ends at the earlier of the
// context's deadline and WithTimeout (DefaultTimeout). How a call waits (the
// local queue, the default strategy's wait in the server, polling,
// WithServerWait) is told in [How waiting works].
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
// the same mode, queue behind each other in FIFO order, and only the first
// makes attempts; between processes, the default strategy orders callers
// mostly in the server's own lock queue: see [How waiting works].
//
// # Guides
//
// The [README] is the overview. Each topic has one guide, the one place
// where its facts are told: [How waiting works], [PgBouncer and pools],
// [pgx and sqlc], [Keys and keyspaces], [Fencing],
// [Terms and leader election], [Observability], [Operators] (the txlock
// command), [Reliability], [High availability], [Testing] and
// [Architecture].
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
// Every attempt also asks pg_is_in_recovery(): a lock granted on a hot
// standby would exclude nothing on the primary, so WithLock refuses it with
// ErrStandby and does not run fn. [PgBouncer and pools] tells the cases, a
// standby promoted during the transaction among them.
//
// # PgBouncer and pgx
//
// The package's own statements work behind PgBouncer in transaction mode,
// in every pgx exec mode, and never use a plain SET; the statements of fn
// are the application's, and need an exec mode that [PgBouncer and pools]
// names.
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
// the lock in one transaction that makes no writes, kept by heartbeats
// (WithHeartbeat), and Lead runs fn for one term. Two holders can overlap
// until a heartbeat detects the loss (ErrLockLost), so writes outside the
// term's transaction carry its fencing token (Term.Token): see
// [Terms and leader election].
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
//
// [README]: https://github.com/txlock/txlock#readme
// [How waiting works]: https://github.com/txlock/txlock/blob/main/docs/waiting.md
// [PgBouncer and pools]: https://github.com/txlock/txlock/blob/main/docs/pgbouncer.md
// [pgx and sqlc]: https://github.com/txlock/txlock/blob/main/docs/pgx.md
// [Keys and keyspaces]: https://github.com/txlock/txlock/blob/main/docs/keys.md
// [Fencing]: https://github.com/txlock/txlock/blob/main/docs/fencing.md
// [Terms and leader election]: https://github.com/txlock/txlock/blob/main/docs/terms.md
// [Observability]: https://github.com/txlock/txlock/blob/main/docs/observability.md
// [Operators]: https://github.com/txlock/txlock/blob/main/docs/operators.md
// [Reliability]: https://github.com/txlock/txlock/blob/main/docs/reliability.md
// [High availability]: https://github.com/txlock/txlock/blob/main/docs/ha.md
// [Testing]: https://github.com/txlock/txlock/blob/main/docs/testing.md
// [Architecture]: https://github.com/txlock/txlock/blob/main/docs/architecture.md
package txlock
