package txlock

import (
	"context"
	"database/sql"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txlock/txlock/driver"
)

// This file is the vocabulary the call's files share: the database a call
// takes (DB), what fn's context says of the lock (Lock, lockState) and the
// holder of a granted lock, whose commit rules are hold.go's.

// DB is what WithLock needs of a database: *sql.DB, *sql.Conn and
// *sqlx.DB all satisfy it. A *sql.Conn is one session, with room for one
// transaction: it must not be shared by WithLock calls that run at the same
// time (database/sql lets a second transaction begin on it, inside the
// first, where it would be granted the first one's locks).
type DB interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

var (
	_ DB = (*sql.DB)(nil)
	_ DB = (*sql.Conn)(nil)
)

// Lock describes, inside fn, the lock fn runs under. Get it with
// LockFromContext.
type Lock struct {
	Keys     []Key         // the locked keys, in canonical order; a semaphore's key
	Shared   bool          // shared (WithShared) rather than exclusive
	Held     bool          // false only when WithFailOpen ran fn without the lock
	Attempts int           // lock statements run before the grant
	Waited   time.Duration // time from the call to the grant
	// Slots is a semaphore's n (WithSemaphore), 0 for a lock. Slot is the
	// slot held, from 0 to Slots-1, whose key is SlotKey(Keys[0], Slot).
	Slots, Slot int
}

// LockFromContext returns the Lock of the WithLock call whose fn received
// ctx (or a context derived from it).
func LockFromContext(ctx context.Context) (Lock, bool) {
	st, ok := stateFrom(ctx)
	if !ok {
		return Lock{}, false
	}
	return st.lock, true
}

// Held reports whether ctx belongs to a fn that holds its lock. It is false
// outside fn, inside fn when WithFailOpen ran it without the lock, once the
// context has ended (the transaction, and with it the lock, is then being
// rolled back), and after fn has returned. It is advisory: a lock can also
// be lost to a dead session without the client knowing; guard writes that
// leave the transaction with fencing tokens. On a term's context, or one
// derived from it, Held also checks the term's local expiry (see
// Heartbeat), which a derived context's own Err does not.
func Held(ctx context.Context) bool {
	st, ok := stateFrom(ctx)
	if !ok || !st.lock.Held || st.ended.Load() {
		return false
	}
	if t, ok := st.Context.(ownTerm); ok && t.Err() != nil {
		return false
	}
	return ctx.Err() == nil
}

// ownTerm is fn's context when its lock is a term's (termContext, see
// term.go): its Err checks the term's local expiry, and its fencing token
// is the term's own.
type ownTerm interface {
	context.Context
	fenceToken(seq string) (int64, error)
}

// lockState is what fn's context carries: the Lock, and what fencing
// tokens need. It is fn's context itself, wrapping the context fn runs
// under, so that handing it to fn costs no allocation.
type lockState struct {
	context.Context
	lock Lock
	db   DB      // where the lock was taken: tokens are drawn there
	tx   *sql.Tx // the lock's transaction
	// sess, for a driver's lock (see driver.go), stands for db and tx.
	sess driver.Session
	// draw is the connection WithFencing set aside for draws, or nil, and
	// reserved how long setting it aside took, which counts against each
	// round's wait (see reserveFor).
	draw     *drawer
	reserved time.Duration

	ended atomic.Bool // fn has returned: the lock is gone, or going
	ev    *events     // the call's events, if it has an observer
	// obsCtx is the context the Observer returned for Acquired, if it is
	// not the caller's own: fn's Value lookups see it first.
	obsCtx context.Context
	// grantedAt is when the lock was granted, for the events' Held: set
	// only for a call with an Observer.
	grantedAt time.Time
	// held is the granted lock and its transaction (see plan.settle).
	held holder

	mu     sync.Mutex
	tokens map[string]int64 // drawn fencing tokens, by sequence
}

type lockStateKey struct{}

// String implements fmt.Stringer, so that printing fn's context neither
// walks the state's fields nor races with FenceToken.
func (st *lockState) String() string { return "txlock.fnContext" }

// Value implements context.Context: the lockState answers for its own key,
// then the context the call's Observer last returned (see Observer), then
// the context fn runs under.
func (st *lockState) Value(key any) any {
	if key == (lockStateKey{}) {
		return st
	}
	if st.obsCtx != nil {
		if v := st.obsCtx.Value(key); v != nil {
			return v
		}
	}
	return st.Context.Value(key)
}

func stateFrom(ctx context.Context) (*lockState, bool) {
	st, ok := ctx.Value(lockStateKey{}).(*lockState)
	return st, ok
}

// holder is a transaction that fn runs in, the lock's or WithFailOpen's,
// with the contexts bound to it. Its runFn method is the commit rules of
// WithLock, for every driver: a driver.Tx says only how each step reaches
// the server.
type holder struct {
	tx       driver.Tx
	txCtx    context.Context         // the context the transaction was begun with
	fnCtx    context.Context         // txCtx, with the hold bound if any
	cancel   context.CancelCauseFunc // ends txCtx, if the holder made it; else nil
	stopTie  func() bool             // unties the hold bound from txCtx
	stopHold context.CancelFunc      // releases the hold bound's context
}

// nilDB reports a nil db, or one that wraps a nil handle (TxlockQueueHandle,
// see queueHandle).
func nilDB(db DB) bool {
	if isNil(db) {
		return true
	}
	w, ok := db.(interface{ TxlockQueueHandle() any })
	return ok && isNil(w.TxlockQueueHandle())
}

// isNil reports a nil interface, or one that holds a nil pointer, map,
// func, slice or channel.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
