package txlock

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// This file holds every SQL text the lock sends. (Fencing tokens build
// theirs in token.go, fenced writes in fenced.go, semaphores in
// semaphore.go, and terms in heartbeat.go.)
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
//     In txlock's own transaction the test is appendInRecovery's, which
//     also catches a transaction begun before a promotion. The sketches
//     below write it as pg_catalog.pg_is_in_recovery().
//   - A setting that only newer servers have (transaction_timeout, from
//     PostgreSQL 17) is set only in the THEN of a CASE whose WHEN first
//     finds it with current_setting(…, true), which is NULL where the
//     setting does not exist: CASE evaluates its branches in order, while
//     AND and OR promise no order, and set_config of an unknown setting
//     fails the statement.

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
// before sending it must not keep that lock past the bound. The locks are
// then asked for in a WHEN NOT (…) that answers busy, and a branch after
// them, reached only once every lock is granted, sets transaction_timeout
// (see appendTxTimeout):
//
//	SELECT 1 WHERE CASE
//	  WHEN pg_catalog.pg_is_in_recovery() THEN ...
//	  WHEN pg_catalog.set_config('idle_in_transaction_session_timeout', '<ms>', true) IS NULL THEN false
//	  WHEN NOT (<the locks>) THEN false
//	  WHEN CASE ... pg_catalog.set_config('transaction_timeout', '<ms + margin>', true) ... END THEN false
//	  ELSE true END
//
// A prefix, if given, comes before the statement, in the same allocation.
func lockStatement(s lockSpec, f stmtForm, prefix ...string) string {
	if s.slots {
		return semaphoreStatement(s, prefix...)
	}
	keys, maxHold := s.keys, s.maxHold
	fn := "pg_catalog.pg_try_advisory_xact_lock("
	if s.shared {
		fn = "pg_catalog.pg_try_advisory_xact_lock_shared("
	}
	no, yes, elseYes := " THEN 0", " THEN 1 ELSE 0 END)", " ELSE 1 END)"
	var buf [1536]byte // one key's statement fits, with a hold bound and BEGIN too: building it costs only the string
	b := buf[:0]
	for _, x := range prefix {
		b = append(b, x...)
	}
	if f != formCallerTx {
		no, yes, elseYes = " THEN false", " THEN true ELSE false END", " ELSE true END"
		b = appendInRecovery(append(b, "SELECT 1 WHERE CASE WHEN "...), s.readWrite)
		b = append(b, " THEN CAST(pg_catalog.set_config('txlock.in_recovery', '"+standbyMarker+"', true) AS integer) IS NULL"...)
	} else {
		b = append(b, "SELECT 1 FROM pg_catalog.generate_series(1, CASE WHEN pg_catalog.pg_is_in_recovery() THEN 2"...)
	}
	b = appendHoldBound(b, maxHold, no)
	b = append(b, " WHEN "...)
	afterGrant := maxHold > 0 || s.owner != ""
	if afterGrant {
		b = append(b, "NOT ("...)
	}
	for i, k := range keys {
		if i > 0 {
			b = append(b, " AND "...)
		}
		b = append(b, fn...)
		b = appendSQLArgs(b, k)
		b = append(b, ')')
	}
	if !afterGrant {
		b = append(b, yes...)
	} else {
		b = append(b, ')')
		b = append(b, no...)
		b = appendTxTimeout(b, maxHold, no)
		b = appendOwner(b, s.owner, no)
		b = append(b, elseYes...)
	}
	return string(b)
}

// lockSpec is what a lock statement asks for, as a call's options say.
type lockSpec struct {
	keys    []Key // in canonical order
	shared  bool
	maxHold time.Duration
	owner   string // WithOwner's label, or ""
	// slots: keys are a semaphore's slots, in slot order, of which the
	// statement asks for one, from first (see semaphoreStatement).
	slots bool
	first int
	// readWrite: the transaction is txlock's own, begun without READ ONLY
	// (see appendInRecovery).
	readWrite bool
}

// specOf is c's lockSpec for keys, in a transaction of txlock's own
// (formOwnTx) or the caller's, asking a semaphore's slots from slot 0 (see
// plan.spec).
func (c *config) specOf(keys []Key, f stmtForm) lockSpec {
	return lockSpec{keys: keys, shared: c.shared, maxHold: c.maxHold, owner: c.owner, slots: c.slots > 0,
		readWrite: f == formOwnTx && (c.txOpts == nil || !c.txOpts.ReadOnly)}
}

// appendInRecovery appends the statements' test for a server in recovery.
// A transaction that began in recovery stays read-only once a promotion
// ends it, while pg_is_in_recovery() turns false in it
// (TestStandbyPromotedMidTransaction): a lock granted there would be one on the
// primary, in a transaction that cannot write. With readWrite (the
// transaction is txlock's own, begun without READ ONLY) the test is also
// true when the transaction is read-only and the session's default is
// not, which only a beginning in recovery makes so:
//
//	(pg_catalog.pg_is_in_recovery() OR (pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
//	  AND pg_catalog.current_setting('default_transaction_read_only') OPERATOR(pg_catalog.=) 'off'))
//
// A caller's transaction (LockTx), or one begun READ ONLY, may be
// read-only on purpose, and gets pg_is_in_recovery() alone. (So would a
// transaction that a DB's own BeginTx made read-only without
// WithTxOptions: it is refused as a standby's.)
func appendInRecovery(b []byte, readWrite bool) []byte {
	if !readWrite {
		return append(b, "pg_catalog.pg_is_in_recovery()"...)
	}
	return append(b, "(pg_catalog.pg_is_in_recovery() OR (pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'"+
		" AND pg_catalog.current_setting('default_transaction_read_only') OPERATOR(pg_catalog.=) 'off'))"...)
}

// appendOwner appends, for a holder's label (WithOwner), a CASE branch that
// sets application_name for the transaction, reached only once every lock
// is granted: a busy attempt leaves the session's name as it was. The
// server reports the name in pg_stat_activity at once, and sets it back
// when the transaction ends. set_config returns the value, never NULL, so
// the branch's result (then) is never taken.
func appendOwner(b []byte, owner, then string) []byte {
	if owner == "" {
		return b
	}
	b = append(b, " WHEN pg_catalog.set_config('application_name', "...)
	b = append(b, quoteLiteral(owner)...)
	b = append(b, ", true) IS NULL"...)
	return append(b, then...)
}

// stmtForm is how a lock statement reports its outcome: see lockStatement.
type stmtForm uint8

const (
	formOwnTx    stmtForm = iota // txlock's own transaction: a row if granted, none if busy, an error on a standby
	formCallerTx                 // a caller's transaction (LockTx): 1 row if granted, 0 if busy, 2 on a standby
)

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
//
// With a hold bound, idle_in_transaction_session_timeout is set before the
// waits, as in lockStatement, and transaction_timeout after them, once every
// lock is granted (see appendTxTimeout): the wait does not count against the
// bound, and a window longer than the bound cannot end the session.
func waitStatement(s lockSpec, window time.Duration) string {
	keys, maxHold := s.keys, s.maxHold
	fn := "pg_catalog.pg_advisory_xact_lock("
	if s.shared {
		fn = "pg_catalog.pg_advisory_xact_lock_shared("
	}
	n := 768 + len(keys)*(len(fn)+80)
	if maxHold > 0 {
		n += 800
	}
	n += len(s.owner) * 2
	b := make([]byte, 0, n)
	b = appendInRecovery(append(b, "SELECT 1 FROM pg_catalog.generate_series(1, CASE WHEN "...), s.readWrite)
	b = append(b, " THEN 2"+
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
	b = appendTxTimeout(b, maxHold, " THEN 0")
	b = appendOwner(b, s.owner, " THEN 0")
	b = append(b, " WHEN pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('txlock.lock_timeout', true), true) IS NULL THEN 0 ELSE 1 END)"...)
	return string(b)
}

// quietWaitStatement is waitStatement for a transaction of txlock's own,
// in a form whose end of window the server does not log: a DO block runs
// the wait, and its exception handler catches the window's end
// (lock_timeout, 55P03) and a deadlock among the waits (40P01), which roll
// back only the block's subtransaction, the set_config calls and any lock
// it was granted with them. An error that a handler catches is not written
// to the server's log, whereas one that ends a statement is, with the
// statement's whole text: on a hot key, one per window. The block's
// outcome, the row count of waitStatement, is kept in a setting of the
// transaction, which the statement after it turns back into rows:
//
//	DO $txlock$BEGIN PERFORM pg_catalog.set_config('txlock.outcome', CAST((SELECT pg_catalog.count(*) FROM (<waitStatement>) AS w) AS pg_catalog.text), true);
//	EXCEPTION WHEN lock_not_available OR deadlock_detected THEN PERFORM pg_catalog.set_config('txlock.outcome', '0', true); END$txlock$;
//	SELECT 1 FROM pg_catalog.generate_series(1, CAST(pg_catalog.current_setting('txlock.outcome') AS integer))
//
// A block whose wait is granted commits its subtransaction, which hands the
// locks to the transaction, until it ends; a subtransaction that writes
// nothing is given no transaction id. The statement is sent with the simple
// protocol, as all of them are, which runs its parts in one round trip.
// The isolation level's refusal is not caught: it ends the statement as
// waitStatement's does.
func quietWaitStatement(s lockSpec, window time.Duration) string {
	return quietWait(s, window, "lock_not_available OR deadlock_detected")
}

// quietWait is quietWaitStatement's statement, whose handler catches the
// conditions named in catch.
func quietWait(s lockSpec, window time.Duration, catch string) string {
	return "DO $txlock$BEGIN PERFORM pg_catalog.set_config('txlock.outcome', CAST((SELECT pg_catalog.count(*) FROM (" +
		waitStatement(s, window) +
		") AS w) AS pg_catalog.text), true); EXCEPTION WHEN " + catch + " THEN PERFORM pg_catalog.set_config('txlock.outcome', '0', true); END$txlock$;" +
		" SELECT 1 FROM pg_catalog.generate_series(1, CAST(pg_catalog.current_setting('txlock.outcome') AS integer))"
}

// The statements around a ServerWait attempt in a caller's transaction
// (LockTx): the wait runs in a savepoint, so that a deadlock (40P01), or a
// refused isolation level, aborts only what follows the savepoint. The
// wait itself is quietWait's, which catches the window's end (55P03), so
// that it leaves no error in the server's log, but not a deadlock, which
// LockTx reports to the caller.
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
	b = strconv.AppendInt(b, settingMillis(maxHold), 10)
	b = append(b, "', true) IS NULL"...)
	return append(b, then...)
}

// appendTxTimeout appends, for a hold bound, a CASE branch that sets
// transaction_timeout (PostgreSQL 17 and later) for the transaction, so that
// a statement that runs past the bound, which
// idle_in_transaction_session_timeout does not cover, ends the session and
// the lock too (FATAL, SQLSTATE 25P04). Like appendHoldBound's, the branch's
// result (then) is never taken:
//
//	WHEN CASE
//	  WHEN pg_catalog.current_setting('transaction_timeout', true) IS NULL THEN false
//	  WHEN pg_catalog.current_setting('transaction_timeout', true) OPERATOR(pg_catalog.=) '0'
//	    THEN pg_catalog.set_config('transaction_timeout', '<ms>', true) IS NULL
//	  WHEN (pg_catalog.transaction_timestamp() OPERATOR(pg_catalog.+) CAST(<the setting> AS interval))
//	    OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) CAST('<ms>ms' AS interval))
//	    THEN CASE WHEN pg_catalog.set_config('transaction_timeout', '0', true) IS NULL THEN false
//	      ELSE pg_catalog.set_config('transaction_timeout', '<ms>', true) IS NULL END
//	  ELSE false END THEN <then>
//
// What the branches rest on, seen on PostgreSQL 17.10 and 18.4:
//   - Set inside a transaction, transaction_timeout counts from the
//     set_config, not from BEGIN: PostgreSQL starts its timer when the
//     setting is made. So the branch comes after the locks: it counts from
//     the grant, as the client's bound does, and a ServerWait wait, which
//     happens inside the statement before it, does not count; a busy
//     attempt never reaches it, which matters in LockTx, where a busy
//     attempt does not roll back.
//   - A timer already running (a transaction_timeout in force at BEGIN, from
//     the server, role, database or connection, or one the caller of LockTx
//     set) is not restarted by a new value: merely setting ours would leave
//     that timer in charge. So a bound in force that ends later than ours
//     (counted from BEGIN, as a default's timer is) is stopped (set to 0)
//     and restarted with ours, and one that ends no later is left alone:
//     the earlier of the two ends the transaction.
//   - PostgreSQL arms idle_in_transaction_session_timeout only while it is
//     below transaction_timeout. Ours is the hold bound plus a margin, so
//     the idle bound stays armed; a bound in force that is left alone and is
//     not above the idle bound ends before the idle bound would.
//   - Where the server has no transaction_timeout (16 and earlier),
//     current_setting(…, true) is NULL and nothing is set.
//
// The value is the hold bound plus txTimeoutMargin (see settingMillis).
func appendTxTimeout(b []byte, maxHold time.Duration, then string) []byte {
	if maxHold <= 0 {
		return b
	}
	var msBuf [24]byte
	ms := strconv.AppendInt(msBuf[:0], settingMillis(maxHold+txTimeoutMargin(maxHold)), 10)
	b = append(b, " WHEN CASE WHEN pg_catalog.current_setting('transaction_timeout', true) IS NULL THEN false"+
		" WHEN pg_catalog.current_setting('transaction_timeout', true) OPERATOR(pg_catalog.=) '0'"+
		" THEN pg_catalog.set_config('transaction_timeout', '"...)
	b = append(b, ms...)
	b = append(b, "', true) IS NULL"+
		" WHEN (pg_catalog.transaction_timestamp() OPERATOR(pg_catalog.+) CAST(pg_catalog.current_setting('transaction_timeout', true) AS interval))"+
		" OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) CAST('"...)
	b = append(b, ms...)
	b = append(b, "ms' AS interval))"+
		" THEN CASE WHEN pg_catalog.set_config('transaction_timeout', '0', true) IS NULL THEN false"+
		" ELSE pg_catalog.set_config('transaction_timeout', '"...)
	b = append(b, ms...)
	b = append(b, "', true) IS NULL END ELSE false END"...)
	return append(b, then...)
}

// txTimeoutMargin is how much later than the hold bound d the server's
// transaction_timeout ends the session: a tenth of d, at least 20ms and at
// most 1s. fn's context gets its deadline when the grant reaches the client,
// a little after the server has started its timer, while the error of a
// statement that the server ends reaches fn at once. Without the margin,
// that error often reached fn before fn's context had ended (in 5 of 10
// tries on PostgreSQL 17), and WithLock returned it without ErrHoldTimeout.
// With it, fn's context has ended first unless the client runs late by more
// than the margin: the client's own deadline decides while the client is
// alive, and the server's is the backstop for one that is not.
func txTimeoutMargin(d time.Duration) time.Duration {
	return min(max(d/10, 20*time.Millisecond), time.Second)
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

// settingMillis is d as the value of a timeout setting: whole milliseconds,
// rounded up, and at most the largest value the settings accept (about 24.8
// days), beyond which set_config would fail the statement.
func settingMillis(d time.Duration) int64 {
	return min(ceilMillis(d), math.MaxInt32)
}

// The statements report what is not a lock result through errors whose
// text carries a marker: a standby (lockStatement in txlock's own
// transaction) and a refused isolation level (waitStatement,
// termStatement).
const (
	standbyMarker       = "txlock: the server is in recovery, no lock was attempted"
	isolationMarker     = "txlock: ServerWait refused, the transaction is "
	termIsolationMarker = "txlock: a term needs read committed, the transaction is "
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

// isTermIsolationError reports termStatement's refusal of the transaction's
// isolation level.
func isTermIsolationError(err error) bool {
	return SQLState(err) == "22P02" && strings.Contains(err.Error(), termIsolationMarker)
}
