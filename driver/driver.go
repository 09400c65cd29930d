// Package driver is the contract between txlock's lock loop and a driver
// package: the code that says how one attempt, and the transaction fn runs
// in, reach the server through a database library other than database/sql.
// Package pgxlock is such a driver, for pgx used natively. Users call a
// driver package's functions; only a driver's author needs this package.
//
// The lock loop (txlock.DriverLock) decides everything else, as it does for
// database/sql: the options, the local queues, the retry and the time
// bounds, what the server's answer means (granted, busy, a server in
// recovery, a failure), the commit rules, the hold bound's client side, the
// events and fencing tokens. A driver sends the statements it is given and
// reports what came back. The contract uses standard library types only.
//
// Before txlock v1 the contract may change in a minor version.
package driver

import (
	"context"
	"errors"
	"time"
	"unsafe"
)

// An Acquirer makes one call's attempts, on a pool or on one session. An
// Acquirer on a pool that is also a Drawer supports txlock.WithFencing.
type Acquirer interface {
	// Attempt makes one attempt within r: it begins a transaction with
	// r.Begin and runs the lock statement r.Stmt in it (both at once: the
	// query r.Query), and returns what the server answered. An error means
	// the statement's answer never came (no connection, a failed BEGIN,
	// the wait's context): the attempt has then let go of every connection
	// it took, and left none in a transaction. An attempt must not outlast
	// r.Deadline by more than it takes a server that answers to do so, and
	// never by more than StallGrace.
	Attempt(ctx context.Context, r Request) (Result, error)
	// BeginUnlocked begins a transaction with the statement begin,
	// without the lock (txlock.WithFailOpen).
	BeginUnlocked(ctx context.Context, begin string) (Tx, error)
	// Pool returns the key of the pool the attempts take connections
	// from, or the zero PoolKey when the call was given one session.
	Pool() PoolKey
	// IdleConn reports whether the pool has an idle connection, which a
	// wait in the server takes without opening one or waiting for one.
	IdleConn() bool
}

// StallGrace is how long after a request's Deadline an attempt waits for
// its lock statement's answer before it cuts the connection off, which
// closes it. A window (Request.Window) ends in the server before the
// deadline, and an attempt begun just before it ends an instant after: the
// answer of a server that answers arrives within a network round trip, on
// a connection still usable, which the grace keeps; only a connection
// whose server does not answer is closed.
const StallGrace = time.Second

// Request is what one attempt sends, and what bounds it.
type Request struct {
	// Begin is the statement that begins the call's transaction (BEGIN,
	// with the options of txlock.WithTxOptions).
	Begin string
	// Stmt is the lock statement, to run in the begun transaction. It
	// reports its outcome in its row count, and fails only for another
	// cause than a busy lock: a busy attempt is no error, and the server
	// logs none.
	Stmt string
	// Query is Begin and Stmt in one string, for a driver that sends
	// them as one query with the simple protocol (one round trip). The
	// transaction it leaves is the attempt's: on a busy lock the lock loop
	// rolls it back.
	Query string
	// Window is how long Stmt may wait in the server's lock queue; 0 when
	// it does not wait.
	Window time.Duration
	// Deadline is the wait's, or a term's attempt's (its TTL after the
	// attempt began), whichever comes first: an attempt's I/O must end by
	// it, give or take the time a server that answers takes to do so.
	Deadline time.Time
	// WaitCtx ends at Deadline or with the caller's context; nil until
	// the wait has needed it (an uncontended call's first attempt goes
	// without). Waits for a connection end with it.
	WaitCtx context.Context
	// PrevEnd, if not nil, is closed once the transaction of the caller
	// that handed this call its turn has ended: the lock statement must
	// not be sent before.
	PrevEnd <-chan struct{}
}

// Result is what the server answered an attempt's lock statement.
type Result struct {
	// Err is the lock statement's error, if it failed. The attempt has
	// then let go of its connection, in no transaction.
	Err error
	// Tx is the attempt's transaction, if the statement succeeded: the
	// lock's, if it was granted; the lock loop ends it otherwise.
	Tx Tx
	// Rows is the row count of Stmt, which says whether the lock was
	// granted.
	Rows int64
}

// A Tx is a transaction that fn runs in: the lock's, or WithFailOpen's.
// The lock loop runs fn and ends the transaction by WithLock's commit
// rules; a Tx only says how each step reaches the server. A Tx that is
// also a Session is where fencing tokens are drawn; without one,
// txlock.FenceToken fails with txlock.ErrNoToken.
type Tx interface {
	// Fn runs the call's fn with the transaction, and ctx as fn's context.
	Fn(ctx context.Context) error
	// Commit commits, under ctx. It returns an error matching ErrFnEndedTx if
	// fn had ended the transaction itself, one matching ErrRolledBack if
	// the driver rolled it back, without a COMMIT, as its context ended,
	// and one matching ErrCommitRolledBack if the server rolled it back
	// (the transaction had failed).
	Commit(ctx context.Context) error
	// Rollback rolls back, with a bound of its own: an error matching
	// ErrFnEndedTx means fn had ended the transaction itself, and one
	// matching ErrRolledBack that the driver had rolled it back as its
	// context ended (which a driver that cannot tell the two apart says
	// in the error's text).
	Rollback() error
	// Close lets go of the transaction's connection. The lock loop calls
	// it once, after Commit or Rollback, whatever they returned.
	Close()
}

// A TermTx is the transaction of a term (txlock.DriverTerm): a Tx whose
// statements, the heartbeats, and whose rollback a context bounds. A
// driver whose attempts return no TermTx supports no terms.
type TermTx interface {
	Tx
	// Exec runs stmt, a heartbeat that takes no arguments, in the
	// transaction. If ctx ends before the answer, the driver closes the
	// connection, which ends the session and its lock: a term never
	// outlives a heartbeat that timed out.
	Exec(ctx context.Context, stmt string) error
	// RollbackContext rolls back under ctx, or if ctx ends first, closes
	// the connection. It returns an error matching ErrFnEndedTx if the
	// transaction had already ended, and one matching ErrRolledBack if
	// the driver had rolled it back as its context ended.
	RollbackContext(ctx context.Context) error
}

// The errors by which a Tx says how its transaction had ended, or how
// COMMIT ended it. A driver that cannot tell ErrFnEndedTx from ErrRolledBack
// (database/sql cannot) says so in ErrRolledBack's text.
var (
	ErrFnEndedTx        = errors.New("the transaction had already ended: fn ended it")
	ErrRolledBack       = errors.New("the transaction was rolled back as its context ended")
	ErrCommitRolledBack = errors.New("the server answered COMMIT with ROLLBACK")
)

// A PoolKey identifies a pool. Calls of one process that wait for the same
// keys on equal PoolKeys queue behind each other, and WithFencing calls on
// equal PoolKeys share one connection set aside for draws. The zero PoolKey
// is none: one session, which neither queues nor sets a connection aside.
type PoolKey struct{ p unsafe.Pointer }

// PoolKeyOf returns the key of the pool pool points to: pass the pool
// value itself, whose connections the attempts take (a *pgxpool.Pool,
// say), and not a field of it or a wrapper. Keys of one pointer are equal.
// A nil pool's key is the zero PoolKey. (A PoolKey is one pointer, which an interface holds without an
// allocation: the lock loop keys its queues by it on every call.)
func PoolKeyOf[T any](pool *T) PoolKey { return PoolKey{unsafe.Pointer(pool)} }

// A Drawer is an Acquirer on a pool in which a call can set a connection
// aside for fencing-token draws (txlock.WithFencing).
type Drawer interface {
	// OpenDraw returns how to take a draw connection of the pool, or an
	// error matching txlock.ErrInvalidArgument that says why the pool
	// cannot spare one (it has one connection in all, say).
	OpenDraw() (func(context.Context) (DrawConn, error), error)
}

// A DrawConn is a connection set aside for draws. While it is set aside,
// txlock keeps it in a transaction of its own, so that a transaction-mode
// pooler keeps its server connection linked to it: every draw runs in that
// transaction, and Exec ends it and begins the next in one message.
type DrawConn interface {
	// DrawRow runs query, a draw, and scans its row into dest.
	DrawRow(ctx context.Context, query string, dest ...any) error
	// Exec runs query, statements without arguments, as one simple query
	// (one message, answered with one ReadyForQuery).
	Exec(ctx context.Context, query string) error
	// Close gives the connection back to its pool: closed, rather than
	// kept, if it is not idle (in a transaction, or broken).
	Close()
}

// A Session is the lock's transaction as fencing tokens need it.
type Session interface {
	// DrawRow runs query on another connection than the lock's and scans
	// its row into dest, or returns an error matching txlock.ErrNoToken
	// when there is no other connection.
	DrawRow(ctx context.Context, query string, dest ...any) error
	// LockRow runs query in the lock's transaction and scans its row.
	LockRow(ctx context.Context, query string, dest ...any) error
}

// An Execer runs a statement in a caller's transaction (txlock.DriverLockTx)
// and returns its row count, which for the lock's statements, SELECTs, is
// the number of rows they returned.
type Execer interface {
	ExecRows(ctx context.Context, stmt string) (int64, error)
}

// A Querier runs a statement with args and scans its one row into dest:
// where fenced writes run (txlock.FencedTable.On), on a connection or
// transaction of the driver's library.
type Querier interface {
	QueryRow(ctx context.Context, query string, args []any, dest ...any) error
}
