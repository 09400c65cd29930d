// Package lockstmt hands the library's lock statements to the repository's
// own programs, which send them by hand: cmd/txlock-bench measures the
// server's share of txlock's cost without the client-side work around it.
// It is not part of txlock's API.
//
// It asks the library itself, as a user's call would: each function makes
// one call whose database only records what it is asked to send, and
// fails, so the statement is exactly the library's, and nothing reaches a
// server.
package lockstmt

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/driver"
)

// errRecorded ends a recorded call once its statement is known.
var errRecorded = errors.New("lockstmt: recorded")

// Exclusive returns the statement that txlock.WithLock sends, in its own
// transaction, to try the exclusive lock of txlock.Int64Key(key). It is
// recorded once, for a key of its own, and each call puts key in its
// place: a benchmark's loop pays only for building the string, as the
// library does.
func Exclusive(key int64) string {
	t := exclusive()
	return t.before + strconv.FormatInt(key, 10) + t.after
}

// exclusive is the statement of Exclusive around its key's digits.
var exclusive = sync.OnceValue(func() (t struct{ before, after string }) {
	const mark = 7777777777777777777
	r := &sqlRecorder{}
	db := sql.OpenDB(r)
	defer db.Close()
	_, err := txlock.TryWithLock(context.Background(), db, txlock.Int64Key(mark),
		func(context.Context, *sql.Tx) error { return nil })
	stmt := recorded(r.stmt, err)
	digits := "'" + strconv.FormatInt(mark, 10) + "'"
	if strings.Count(stmt, digits) != 1 {
		panic("lockstmt: the recorded statement does not name its key once: " + stmt)
	}
	i := strings.Index(stmt, digits)
	t.before, t.after = stmt[:i+1], stmt[i+len(digits)-1:]
	return t
})

// Begin returns the query of pgxlock's polling attempt for
// txlock.Int64Key(key), with WithMaxHold(maxHold) if maxHold > 0: BEGIN,
// then the lock statement.
func Begin(key int64, maxHold time.Duration) string {
	var opts []txlock.Option
	if maxHold > 0 {
		opts = append(opts, txlock.WithMaxHold(maxHold))
	}
	r := &attemptRecorder{}
	_, err := txlock.DriverLock(context.Background(), r, []txlock.Key{txlock.Int64Key(key)}, true, opts...)
	return recorded(r.query, err)
}

// recorded returns a recorded statement, or panics if the call did not get
// as far as sending one: the library's calls have changed, and so must
// this package.
func recorded(stmt string, err error) string {
	if stmt == "" || !errors.Is(err, errRecorded) {
		panic(fmt.Sprintf("lockstmt: no statement recorded (%v)", err))
	}
	return stmt
}

// attemptRecorder is a driver whose attempts record their query.
type attemptRecorder struct{ query string }

func (r *attemptRecorder) Attempt(_ context.Context, a driver.Request) (driver.Result, error) {
	r.query = a.Query
	return driver.Result{}, errRecorded
}

func (r *attemptRecorder) BeginUnlocked(context.Context, string) (driver.Tx, error) {
	return nil, errRecorded
}

func (r *attemptRecorder) Pool() driver.PoolKey { return driver.PoolKey{} }

func (r *attemptRecorder) IdleConn() bool { return false }

// sqlRecorder is a database/sql connector whose one connection records
// the statement it is asked to run in a transaction.
type sqlRecorder struct{ stmt string }

func (r *sqlRecorder) Connect(context.Context) (sqldriver.Conn, error) { return recordingConn{r}, nil }

func (r *sqlRecorder) Driver() sqldriver.Driver { return nil }

type recordingConn struct{ r *sqlRecorder }

func (c recordingConn) Prepare(string) (sqldriver.Stmt, error) { return nil, errRecorded }

func (c recordingConn) Close() error { return nil }

func (c recordingConn) Begin() (sqldriver.Tx, error) { return recordingTx{}, nil }

func (c recordingConn) ExecContext(_ context.Context, query string, _ []sqldriver.NamedValue) (sqldriver.Result, error) {
	c.r.stmt = query
	return nil, errRecorded
}

type recordingTx struct{}

func (recordingTx) Commit() error   { return nil }
func (recordingTx) Rollback() error { return nil }
