package txlock

import (
	"strconv"
	"strings"
	"time"

	"github.com/txlock/txlock/internal/lockstmt"
)

// This file holds every SQL text the lock sends. (Fencing tokens and fenced
// writes build theirs in fenced.go.)
//
// Rules every statement here follows:
//   - It takes no parameters, so pgx sends it with the simple protocol
//     whatever default_query_exec_mode the application chose: no prepared
//     statement is created, which is what PgBouncer in transaction mode
//     needs. Keys are integers rendered by strconv, so the text is always
//     safe SQL.
//   - Settings are made with set_config(…, true), which lasts until the
//     transaction ends; never with a plain SET, which PgBouncer in
//     transaction mode would leak to other clients.
//   - Every function, operator and type name that is not an SQL keyword is
//     qualified with pg_catalog: a connection whose search_path puts another
//     schema first must not be able to put its own pg_try_advisory_xact_lock
//     (one that always returns true) in the lock's place.
//   - pg_is_in_recovery() is evaluated once, before any lock: a promotion
//     during the statement cannot make a standby's answer read as a grant.

func init() {
	lockstmt.Exclusive = func(key int64) string {
		return lockStatement([]Key{Int64Key(key)}, false, 0, true)
	}
}

// lockStatement builds the statement of a polling attempt: one round trip
// that asks for every key, all or nothing.
//
// With ownTx (the attempt's transaction is txlock's own, which a failed
// attempt rolls back) it returns no row if a lock is busy and one row if all
// are granted, and it fails on a server in recovery with an error (22P02)
// that carries standbyMarker:
//
//	SELECT 1 WHERE CASE
//	  WHEN pg_catalog.pg_is_in_recovery() THEN CAST(pg_catalog.set_config('txlock.in_recovery', '<standbyMarker>', true) AS integer) IS NULL
//	  WHEN pg_catalog.pg_try_advisory_xact_lock('k1'::bigint) AND pg_catalog.pg_try_advisory_xact_lock('a'::integer,'b'::integer) ... THEN true
//	  ELSE false END
//
// In a caller's transaction (LockTx), where an error would abort that
// transaction, it reports a standby with a second row instead:
//
//	SELECT 1 FROM pg_catalog.generate_series(1, CASE
//	  WHEN pg_catalog.pg_is_in_recovery() THEN 2
//	  WHEN <the locks> THEN 1
//	  ELSE 0 END)
//
// The set-returning function costs the server about as much again as the
// lock itself, which is why txlock's own transactions use the first form.
//
// With a hold bound, a branch before the locks sets
// idle_in_transaction_session_timeout for the transaction. It comes first so
// that it covers every attempt: a partial grant of several keys, too, holds a
// lock until the attempt's rollback arrives, and a client frozen or cut off
// before sending it must not keep that lock past the bound.
func lockStatement(keys []Key, shared bool, maxHold time.Duration, ownTx bool) string {
	fn := "pg_catalog.pg_try_advisory_xact_lock("
	if shared {
		fn = "pg_catalog.pg_try_advisory_xact_lock_shared("
	}
	no, yes := " THEN 0", " THEN 1 ELSE 0 END)"
	var buf [448]byte // one key's statement fits: building it costs only the string
	b := buf[:0]
	if ownTx {
		no, yes = " THEN false", " THEN true ELSE false END"
		b = append(b, "SELECT 1 WHERE CASE WHEN pg_catalog.pg_is_in_recovery() THEN CAST(pg_catalog.set_config('txlock.in_recovery', '"+standbyMarker+"', true) AS integer) IS NULL"...)
	} else {
		b = append(b, "SELECT 1 FROM pg_catalog.generate_series(1, CASE WHEN pg_catalog.pg_is_in_recovery() THEN 2"...)
	}
	b = appendHoldBound(b, maxHold, no)
	b = append(b, " WHEN "...)
	for i, k := range keys {
		if i > 0 {
			b = append(b, " AND "...)
		}
		b = append(b, fn...)
		b = appendSQLArgs(b, k)
		b = append(b, ')')
	}
	b = append(b, yes...)
	return string(b)
}

// waitStatement builds the statement of a ServerWait attempt, which waits
// for the locks in the server's queue for at most window. Its rows mean what
// those of lockStatement's second form mean:
//
//	SELECT 1 FROM pg_catalog.generate_series(1, CASE
//	  WHEN pg_catalog.pg_is_in_recovery() THEN 2
//	  WHEN pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) ANY (ARRAY['repeatable read', 'serializable'])
//	    THEN CAST(pg_catalog.set_config('txlock.isolation', pg_catalog.concat('<isolationMarker>', <the level>), true) AS integer)
//	  WHEN pg_catalog.set_config('txlock.lock_timeout', pg_catalog.current_setting('lock_timeout'), true) IS NULL THEN 0
//	  WHEN pg_catalog.set_config('lock_timeout', '<window ms>', true) IS NULL THEN 0
//	  WHEN pg_catalog.pg_advisory_xact_lock('k1'::bigint)::pg_catalog.text IS NULL THEN 0 ...
//	  WHEN pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('txlock.lock_timeout', true), true) IS NULL THEN 0
//	  ELSE 1 END)
//
// A transaction above ReadCommitted is refused before any wait, with an
// error (22P02) that carries isolationMarker: its snapshot, taken by this
// statement, would predate the previous holder's commit. (Read uncommitted,
// which PostgreSQL runs as read committed, is not refused.) This catches a
// level that comes from the server's default_transaction_isolation or, in
// LockTx, from the caller; WithTxOptions is checked before the database is
// touched.
//
// CASE evaluates its branches in order, so lock_timeout is set before the
// waits and, once every lock is granted, set back to what it was: fn's own
// statements see the transaction's lock_timeout unchanged. The keys are
// taken one by one in canonical order, so two WithLocks calls cannot
// deadlock each other. When the window passes, the wait fails with
// lock_timeout (55P03), which aborts the transaction: the attempt rolls back
// (releasing any lock it was granted) and counts as busy. If lock_timeout
// fires as the lock is granted, PostgreSQL either reports the grant or
// reports the error and, with the rollback, releases the lock: never both.
func waitStatement(keys []Key, shared bool, maxHold, window time.Duration) string {
	fn := "pg_catalog.pg_advisory_xact_lock("
	if shared {
		fn = "pg_catalog.pg_advisory_xact_lock_shared("
	}
	b := make([]byte, 0, 640+len(keys)*(len(fn)+64))
	b = append(b, "SELECT 1 FROM pg_catalog.generate_series(1, CASE WHEN pg_catalog.pg_is_in_recovery() THEN 2"+
		" WHEN pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) ANY (ARRAY['repeatable read', 'serializable'])"+
		" THEN CAST(pg_catalog.set_config('txlock.isolation', pg_catalog.concat('"+isolationMarker+"', pg_catalog.current_setting('transaction_isolation')), true) AS integer)"...)
	b = appendHoldBound(b, maxHold, " THEN 0")
	b = append(b, " WHEN pg_catalog.set_config('txlock.lock_timeout', pg_catalog.current_setting('lock_timeout'), true) IS NULL THEN 0"+
		" WHEN pg_catalog.set_config('lock_timeout', '"...)
	b = strconv.AppendInt(b, ceilMillis(window), 10)
	b = append(b, "', true) IS NULL THEN 0"...)
	for _, k := range keys {
		b = append(b, " WHEN "...)
		b = append(b, fn...)
		b = appendSQLArgs(b, k)
		b = append(b, ")::pg_catalog.text IS NULL THEN 0"...)
	}
	b = append(b, " WHEN pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('txlock.lock_timeout', true), true) IS NULL THEN 0 ELSE 1 END)"...)
	return string(b)
}

// The statements around a ServerWait attempt in a caller's transaction
// (LockTx): the wait runs in a savepoint, so that a window that passes
// (55P03) or a deadlock (40P01) aborts only what follows the savepoint.
const (
	savepoint           = "SAVEPOINT txlock_wait; "
	releaseSavepoint    = "RELEASE SAVEPOINT txlock_wait"
	rollbackToSavepoint = "ROLLBACK TO SAVEPOINT txlock_wait; RELEASE SAVEPOINT txlock_wait"
)

// appendHoldBound appends, for a hold bound, a CASE branch that sets
// idle_in_transaction_session_timeout for the transaction. set_config
// returns the value, never NULL, so the branch's result (then) is never
// taken.
func appendHoldBound(b []byte, maxHold time.Duration, then string) []byte {
	if maxHold <= 0 {
		return b
	}
	b = append(b, " WHEN pg_catalog.set_config('idle_in_transaction_session_timeout', '"...)
	b = strconv.AppendInt(b, ceilMillis(maxHold), 10)
	b = append(b, "', true) IS NULL"...)
	return append(b, then...)
}

// appendSQLArgs appends k as the arguments of an advisory lock function.
// Quoting with a cast also covers math.MinInt64, whose magnitude does not
// fit a bigint literal. bigint and integer are SQL keywords: no search_path
// can give them another meaning.
func appendSQLArgs(b []byte, k Key) []byte {
	if k.kind == kindPair {
		b = append(b, '\'')
		b = strconv.AppendInt(b, int64(k.a), 10)
		b = append(b, "'::integer,'"...)
		b = strconv.AppendInt(b, int64(k.b), 10)
		return append(b, "'::integer"...)
	}
	b = append(b, '\'')
	b = strconv.AppendInt(b, k.v, 10)
	return append(b, "'::bigint"...)
}

// ceilMillis is d in whole milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// The statements report what is not a lock result through errors whose
// text carries a marker: a standby (lockStatement in txlock's own
// transaction) and a refused isolation level (waitStatement).
const (
	standbyMarker   = "txlock: the server is in recovery, no lock was attempted"
	isolationMarker = "txlock: ServerWait refused, the transaction is "
)

// isStandbyError reports lockStatement's error on a server in recovery.
func isStandbyError(err error) bool {
	return SQLState(err) == "22P02" && strings.Contains(err.Error(), standbyMarker)
}

// isIsolationError reports waitStatement's refusal of the transaction's
// isolation level.
func isIsolationError(err error) bool {
	return SQLState(err) == "22P02" && strings.Contains(err.Error(), isolationMarker)
}
