// Package seam lets txlock's driver packages (pgxlock) plug a way of
// acquiring the lock into the library's lock loop. It exists only for them;
// it is not part of txlock's API.
//
// Its types mirror the lock loop's own (see wait.go and txlock.go in package
// txlock), in exported form and with standard types only: package txlock
// imports this package and sets Run and LockTx at init, and a driver
// package imports both. Values of txlock's own types (Key, Option) travel
// as any, and package txlock checks them.
package seam

import (
	"context"
	"errors"
	"time"
)

// Outcome is what one attempt found, as package txlock decides it.
type Outcome int

const (
	Busy    Outcome = iota // another session holds a key; nothing is held
	Granted                // every key is held, until the attempt's transaction ends
	Standby                // the server is in recovery; nothing was locked
)

// Bound is what limits one attempt: see txlock's bound.
type Bound struct {
	Deadline time.Time
	// WaitCtx ends at Deadline or with the caller's context; nil until
	// the wait has needed it.
	WaitCtx context.Context
	// Window, if not 0, is how long the attempt may wait in the server's
	// lock queue (ServerWait).
	Window time.Duration
	// PrevEnd, if not nil, is closed once the transaction of the caller
	// that handed this call its turn has ended: the lock statement must not
	// be sent before.
	PrevEnd <-chan struct{}
	// WaitStmt is the statement of a ServerWait window, when Window is
	// set: it waits in the server's lock queue, and its row count is the
	// outcome.
	WaitStmt string
}

// Result is what the server answered an attempt's lock statement. Package
// txlock decides the outcome from it: granted, busy, or a server in
// recovery.
type Result struct {
	// Err is the lock statement's error, if it failed (a busy lock fails
	// the polling query, Plan.Query, on purpose). The attempt has then
	// let go of its connection, in no transaction.
	Err error
	// Tx is the attempt's transaction, if the statement succeeded: the
	// lock's, if it was granted; package txlock ends it otherwise.
	Tx Tx
	// Rows is the row count of a window's statement (WaitStmt). A
	// polling query that succeeds is a grant, whatever its rows.
	Rows int64
}

// An Acquirer makes a call's attempts.
type Acquirer interface {
	// Attempt makes one attempt within b: it begins a transaction and
	// runs the lock statement in it (Plan.Query, or with b.Window,
	// Plan.Begin then b.WaitStmt), and returns what the server answered.
	// An error means the statement's answer never came (no connection, a
	// failed BEGIN, the wait's context): the attempt has then let go of
	// every connection it took, and left none in a transaction.
	Attempt(ctx context.Context, b Bound) (Result, error)
	// BeginUnlocked begins a transaction without the lock, for
	// WithFailOpen.
	BeginUnlocked(ctx context.Context) (Tx, error)
	// Pooled reports whether the next caller of a local queue can begin
	// while this call's lock ends.
	Pooled() bool
	// IdleConn reports whether the pool has an idle connection, which a
	// wait in the server takes without opening one or waiting for one.
	IdleConn() bool
}

// A Tx is a transaction that fn runs in: the lock's, or WithFailOpen's.
// Package txlock runs fn and ends the transaction by WithLock's commit
// rules; a Tx only says how each step reaches the server. It may also be a
// Session, for fencing tokens.
type Tx interface {
	// Fn runs the call's fn with the transaction, and ctx as fn's context.
	Fn(ctx context.Context) error
	// Commit commits, under ctx. It returns an error matching ErrTxDone
	// if fn had ended the transaction itself, and one matching
	// ErrRolledBack if the driver rolled it back, without a COMMIT, as
	// its context ended.
	Commit(ctx context.Context) error
	// Rollback rolls back, with a bound of its own: an error matching
	// ErrTxDone means fn had ended the transaction itself. A transaction
	// the driver rolled back as its context ended is no error.
	Rollback() error
	// Close lets go of the transaction's connection, once it has ended.
	Close()
}

// The errors by which a Tx says how its transaction had ended.
var (
	ErrTxDone     = errors.New("the transaction had already ended: fn ended it")
	ErrRolledBack = errors.New("the transaction was rolled back as its context ended")
)

// A DrawPool is an Acquirer whose db is a pool in which a call can set a
// connection aside for fencing-token draws (txlock.WithFencing).
type DrawPool interface {
	// DrawPool returns the pool's queue handle and how to open a draw
	// connection of it, or an error matching txlock.ErrInvalidArgument.
	DrawPool() (handle any, open func(context.Context) (DrawConn, error), err error)
}

// A DrawConn is a connection set aside for draws.
type DrawConn interface {
	// DrawRow runs query, a draw, and scans its row into dest.
	DrawRow(ctx context.Context, query string, dest ...any) error
	Close()
}

// Session is the lock's transaction, as fencing tokens need it.
type Session interface {
	// DrawRow runs query on another connection than the lock's and scans
	// its row into dest, or returns an error matching txlock.ErrNoToken
	// when there is no other connection.
	DrawRow(ctx context.Context, query string, dest ...any) error
	// LockRow runs query in the lock's transaction and scans its row.
	LockRow(ctx context.Context, query string, dest ...any) error
}

// Plan is what package txlock decided about a call, once its arguments
// were valid: what the acquirer sends.
type Plan struct {
	// Begin is the BEGIN of the call's transaction, with the options of
	// WithTxOptions.
	Begin string
	// Query is a polling attempt's query: the lock statement, in the form
	// that fails (SQLSTATE 22P02, which package txlock sorts out) when a key is
	// busy, and Begin, in one string. The lock statement comes first
	// unless BeginFirst.
	Query string
	// BeginFirst: Begin comes first in Query (the transaction has an
	// explicit isolation level, which cannot be set after a query), and a
	// busy attempt leaves the transaction aborted, to be rolled back.
	BeginFirst bool
}

// Request is one WithLock-family call.
type Request struct {
	// Key is a *txlock.Key (a pointer, so that passing it costs no
	// allocation); or, with Multi, Keys is a []txlock.Key.
	Key   any
	Keys  any // a []txlock.Key
	Multi bool
	Try   bool
	Opts  any // a []txlock.Option
	// Queue is the handle callers of this process queue on for the same
	// keys (the pool), or nil for no local queue.
	Queue any
	// Plan is set by Run once the call's arguments are valid, before the
	// first attempt: A reads it from there.
	Plan Plan
	A    Acquirer
}

// Run runs a WithLock-family call with r.A. Package txlock sets it.
var Run func(ctx context.Context, r *Request) (acquired bool, err error)

// Execer runs a statement in a caller's transaction and returns its row
// count.
type Execer interface {
	ExecRows(ctx context.Context, stmt string) (int64, error)
}

// TxRequest is one LockTx-family call.
type TxRequest struct {
	Key  any // a *txlock.Key
	Try  bool
	Opts any // a []txlock.Option
	Tx   Execer
}

// LockTx runs a LockTx-family call. Package txlock sets it.
var LockTx func(ctx context.Context, r *TxRequest) (acquired bool, err error)
