package checker

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlock/txlock"
)

// Report is the result of Check.
type Report struct {
	Sections   int // committed critical sections
	Overlaps   int // sections that entered a key before the previous holder of that key left it
	Unfinished int // committed sections without an exit time

	// Lost updates.
	DupVersions   int   // history rows that repeat an (account, version): two writers read the same version
	ChainBreaks   int   // history rows whose balance before is not the previous row's balance after
	FinalMismatch int   // accounts whose balance or version disagrees with their last history row
	SumDrift      int64 // sum of balances minus the initial total

	// Against what the callers saw (only when outcomes are given).
	Phantoms  int // calls that failed before commit, yet whose writes are in the tables
	Vanished  int // calls that succeeded, yet whose writes are not in the tables
	Ambiguous int // calls whose commit failed: either way is correct
	InDoubt   int // of the ambiguous calls, those that did commit
}

// LostUpdates is the total of the lost-update checks.
func (r Report) LostUpdates() int {
	n := r.DupVersions + r.ChainBreaks + r.FinalMismatch
	if r.SumDrift != 0 {
		n++
	}
	return n
}

// Clean reports whether every invariant holds.
func (r Report) Clean() bool {
	return r.Overlaps == 0 && r.Unfinished == 0 && r.LostUpdates() == 0 && r.Phantoms == 0 && r.Vanished == 0
}

func (r Report) String() string {
	return fmt.Sprintf("%d sections: %d overlaps, %d unfinished; lost updates: %d duplicate versions, %d chain breaks, %d final mismatches, sum drift %d; %d phantom writes, %d vanished commits, %d ambiguous commits (%d committed)",
		r.Sections, r.Overlaps, r.Unfinished, r.DupVersions, r.ChainBreaks, r.FinalMismatch, r.SumDrift, r.Phantoms, r.Vanished, r.Ambiguous, r.InDoubt)
}

// Check runs the invariant checks on the current state of the tables. It may
// run while the workload runs: every committed section moved money
// atomically and recorded itself completely, so every snapshot must pass.
// With the summaries of finished runs, it also checks each call's outcome
// against the tables: a call that failed before commit left no write, and a
// call that succeeded left all of them.
func (l *Ledger) Check(ctx context.Context, runs ...Summary) (Report, error) {
	var r Report
	tx, err := l.admin.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return r, fmt.Errorf("checker: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	p := l.prefix
	for _, q := range []struct {
		dst  any
		stmt string
	}{
		{&r.Sections, `SELECT count(DISTINCT sid) FROM ` + p + `_sections`},
		{&r.Unfinished, `SELECT count(*) FROM ` + p + `_sections WHERE exit IS NULL`},
		// Sections on one key must be totally ordered: sorted by entry, each
		// enters no earlier than every previous one exited.
		{&r.Overlaps, `SELECT count(*) FROM (
			SELECT enter, max(exit) OVER (PARTITION BY key ORDER BY enter, sid
				ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_exit
			FROM ` + p + `_sections) s
			WHERE prev_exit > enter`},
		{&r.DupVersions, `SELECT count(*) - count(DISTINCT (account, version)) FROM ` + p + `_history`},
		{&r.ChainBreaks, `SELECT count(*) FROM (
			SELECT h.version, h.before, a.initial,
				lag(h.version) OVER w AS prev_version, lag(h.after) OVER w AS prev_after
			FROM ` + p + `_history h JOIN ` + p + `_accounts a ON a.id = h.account
			WINDOW w AS (PARTITION BY h.account ORDER BY h.version, h.sid)) c
			WHERE CASE WHEN prev_version IS NULL THEN version <> 1 OR before <> initial
				ELSE version <> prev_version + 1 OR before <> prev_after END`},
		{&r.FinalMismatch, `SELECT count(*) FROM ` + p + `_accounts a
			LEFT JOIN LATERAL (SELECT after, version FROM ` + p + `_history h
				WHERE h.account = a.id ORDER BY version DESC, sid DESC LIMIT 1) last ON true
			WHERE a.balance <> coalesce(last.after, a.initial) OR a.version <> coalesce(last.version, 0)`},
		{&r.SumDrift, `SELECT sum(balance) - sum(initial) FROM ` + p + `_accounts`},
	} {
		if err := tx.QueryRowContext(ctx, q.stmt).Scan(q.dst); err != nil {
			return r, fmt.Errorf("checker: %s: %w", strings.Fields(q.stmt)[1], err)
		}
	}
	if len(runs) == 0 {
		return r, nil
	}
	// Which sections committed, and are they complete (history rows for
	// both accounts)?
	rows, err := tx.QueryContext(ctx, `SELECT s.sid, count(h.sid)
		FROM (SELECT DISTINCT sid FROM `+p+`_sections) s LEFT JOIN `+p+`_history h USING (sid)
		GROUP BY s.sid`)
	if err != nil {
		return r, fmt.Errorf("checker: committed sections: %w", err)
	}
	committed := map[int64]int{}
	for rows.Next() {
		var sid int64
		var n int
		if err := rows.Scan(&sid, &n); err != nil {
			rows.Close()
			return r, fmt.Errorf("checker: committed sections: %w", err)
		}
		committed[sid] = n
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return r, fmt.Errorf("checker: committed sections: %w", err)
	}
	for _, s := range runs {
		for _, o := range s.Outcomes {
			n, ok := committed[o.SID]
			switch {
			case o.Class == "ok" && (!ok || n != 2):
				r.Vanished++
			case o.Class != "ok" && o.Commit:
				r.Ambiguous++
				if ok {
					r.InDoubt++
				}
			case o.Class != "ok" && ok:
				r.Phantoms++
			}
		}
	}
	return r, nil
}

// Classes of errors a Locker call may return, as Classify names them.
const (
	ClassLockTimeout = "lock-timeout"    // errors.Is(err, txlock.ErrLockTimeout)
	ClassHoldTimeout = "hold-timeout"    // errors.Is(err, txlock.ErrHoldTimeout)
	ClassStandby     = "standby"         // errors.Is(err, txlock.ErrStandby)
	ClassTxDone      = "tx-done"         // errors.Is(err, txlock.ErrFnEndedTx)
	ClassShutdown    = "server-shutdown" // SQLSTATE 57P01, 57P02 or 57P03: terminated, crashed, or starting up / shutting down
	ClassIdleTimeout = "idle-timeout"    // SQLSTATE 25P03: idle_in_transaction_session_timeout
	ClassDeadlock    = "deadlock"        // SQLSTATE 40P01
	ClassConnection  = "connection"      // SQLSTATE class 08, or a *pgconn.ConnectError: could not connect
	ClassNetwork     = "network"         // the connection broke: a net.Error, io.EOF, io.ErrUnexpectedEOF, ECONNRESET, EPIPE, pgconn.ErrConnClosed, driver.ErrBadConn, sql.ErrConnDone
	ClassCanceled    = "canceled"        // context.Canceled or context.DeadlineExceeded, outside a lock wait
	ClassUnexpected  = "unexpected"      // none of the above
)

// Classify names the class of err, found with errors.Is and errors.As only
// (never by message): "ok" for nil, otherwise one of the Class constants.
// A test that injects a fault asserts that every error falls in the classes
// that fault explains.
func Classify(err error) string {
	if err == nil {
		return "ok"
	}
	switch {
	case errors.Is(err, txlock.ErrHoldTimeout):
		return ClassHoldTimeout
	case errors.Is(err, txlock.ErrLockTimeout):
		return ClassLockTimeout
	case errors.Is(err, txlock.ErrStandby):
		return ClassStandby
	case errors.Is(err, txlock.ErrFnEndedTx):
		return ClassTxDone
	}
	switch state := txlock.SQLState(err); {
	case state == "57P01" || state == "57P02" || state == "57P03":
		return ClassShutdown
	case state == "25P03":
		return ClassIdleTimeout
	case state == "40P01":
		return ClassDeadlock
	case strings.HasPrefix(state, "08"):
		return ClassConnection
	case state != "":
		return ClassUnexpected + " SQLSTATE " + state
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return ClassConnection
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone):
		return ClassNetwork
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ClassCanceled
	}
	return ClassUnexpected
}

// AdvisoryLocks counts the advisory locks held or awaited in db's current
// database.
func AdvisoryLocks(ctx context.Context, db *sql.DB) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
	return n, err
}

// HeldBy returns the pids of the backends holding k in db's current
// database. Each advisory row of pg_locks is decoded with
// txlock.KeyFromPgLocks, so the encoding is the library's.
func HeldBy(ctx context.Context, db *sql.DB, k txlock.Key) ([]int, error) {
	return lockers(ctx, db, k, true)
}

// WaitingFor returns the pids of the backends waiting in the server's lock
// queue for k, in db's current database.
func WaitingFor(ctx context.Context, db *sql.DB, k txlock.Key) ([]int, error) {
	return lockers(ctx, db, k, false)
}

// lockers returns the pids of pg_locks' rows for k that are granted, or
// that wait, as granted says.
func lockers(ctx context.Context, db *sql.DB, k txlock.Key, granted bool) ([]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT pid, classid::int8, objid::int8, objsubid FROM pg_locks WHERE locktype = 'advisory' AND granted = $1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, granted)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		var classid, objid int64 // oids, unsigned 32-bit
		var objsubid int
		if err := rows.Scan(&pid, &classid, &objid, &objsubid); err != nil {
			return nil, err
		}
		held, err := txlock.KeyFromPgLocks(uint32(classid), uint32(objid), objsubid)
		if err != nil {
			return nil, err
		}
		if sameKey(held, k) {
			pids = append(pids, pid)
		}
	}
	return pids, rows.Err()
}

// sameKey reports whether a and b are the same PostgreSQL advisory key,
// whatever names they were derived from.
func sameKey(a, b txlock.Key) bool {
	if x, ok := a.Int64(); ok {
		y, ok := b.Int64()
		return ok && x == y
	}
	a1, a2, ok := a.Pair()
	b1, b2, okb := b.Pair()
	return ok && okb && a1 == b1 && a2 == b2
}
