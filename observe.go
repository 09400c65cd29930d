package txlock

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// An Observer is told of every lock event: how long callers wait, how often
// they time out, fail open or hit a stale fence. Set one for many calls with
// New, or for one call with WithObserver.
//
// Observe is called synchronously, in the order the events happen, on the
// caller's goroutine (TokenIssued: on the goroutine that drew the token;
// StaleWrite: on the writer's). The context it returns is passed to the
// call's later events, and the Acquired event's context also answers Value
// lookups from inside fn: so an observer can start a span at WaitStarted
// and end it at Acquired, or carry a hold span into fn. Return ctx itself
// to pass nothing on; a nil return is treated as ctx. The contexts returned
// for TokenIssued and StaleWrite are not used.
//
// Observers must be quick: a slow one delays its caller, and while the lock
// is held (Acquired, TokenIssued) it holds the lock longer. An observer that
// panics does not break the lock: the panic is recovered, logged once per
// event kind through slog.Default at Error level, and the call goes on as if
// the observer had returned ctx.
type Observer interface {
	Observe(ctx context.Context, e Event) context.Context
}

// ObserverFunc is an Observer that is a function.
type ObserverFunc func(ctx context.Context, e Event) context.Context

// Observe implements Observer.
func (f ObserverFunc) Observe(ctx context.Context, e Event) context.Context { return f(ctx, e) }

// Observers returns an Observer that passes each event to every one of obs
// in turn, each with the context the one before it returned. Nil entries are
// skipped.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) context.Context {
	for _, o := range m {
		if next := o.Observe(ctx, e); next != nil {
			ctx = next
		}
	}
	return ctx
}

// EventKind says what happened.
type EventKind uint8

// The events, in the order a call can meet them. Every wait begins with
// WaitStarted, reports Busy after each attempt that found a key held, and
// ends with exactly one of Acquired, TimedOut (followed by FailedOpen under
// WithFailOpen), Canceled (the caller's context was cancelled),
// StandbyRefused, Skipped (a try that found the lock busy) or Failed. An acquired lock reports TokenIssued for each fencing token fn
// draws, HoldTimeout if fn outlives WithMaxHold, then Released once its
// transaction has ended, also when fn panics; SerializationRetry then
// precedes a new round's WaitStarted. LockTx reports the events of the
// wait only, marked CallerTx: the caller's transaction ends the lock. FencedTable reports
// StaleWrite. A term (AcquireTerm, Lead) reports the events of a wait, then
// TokenIssued for the token drawn at its start, then, when it ends, TermLost
// if it lost its lock, and Released (never Committed: the term's transaction
// makes no writes, and rolls back).
const (
	WaitStarted        EventKind = iota + 1 // a call begins to acquire
	Busy                                    // an attempt found a key held by another session
	Acquired                                // the lock was granted: Waited, Attempts
	Released                                // the lock's transaction ended: Held, Committed, Err
	TimedOut                                // the wait ended without the lock: Err is the *LockTimeoutError
	FailedOpen                              // WithFailOpen runs fn without the lock
	StandbyRefused                          // the server is a hot standby: nothing was locked
	SerializationRetry                      // the round failed with 40001/40P01, and fn runs again in a new one: Err
	TokenIssued                             // FenceToken drew a token: Token, Sequence
	StaleWrite                              // a fenced write was refused: Table, Token, Current, Err
	HoldTimeout                             // the lock was held past WithMaxHold: Held
	Skipped                                 // a try found the lock busy, and fn does not run
	Failed                                  // the wait ended in an error that is not about the lock (a connection error, a refused option, a deadlock in LockTx): Err
	TermLost                                // a term lost its lock (a heartbeat failed, or none succeeded for its TTL): Held, Token, Err matches ErrLockLost
	Canceled                                // the caller's context was cancelled while waiting: Err matches context.Canceled (see LockTimeoutError)
)

var eventNames = [...]string{
	WaitStarted:        "wait_started",
	Busy:               "busy",
	Acquired:           "acquired",
	Released:           "released",
	TimedOut:           "timed_out",
	FailedOpen:         "failed_open",
	StandbyRefused:     "standby_refused",
	SerializationRetry: "serialization_retry",
	TokenIssued:        "token_issued",
	StaleWrite:         "stale_write",
	HoldTimeout:        "hold_timeout",
	Skipped:            "skipped",
	Failed:             "failed",
	TermLost:           "term_lost",
	Canceled:           "canceled",
}

// String returns the event's name in snake case, such as "timed_out".
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", k)
}

// Event is one lock event. Fields that do not apply to its Kind are zero.
type Event struct {
	Kind   EventKind
	Keys   []Key // the keys of the call, in canonical order; do not modify
	Shared bool
	// Slots is a semaphore's n (WithSemaphore), whose key is Keys[0]; 0 for
	// a lock. Slot is the slot held, from Acquired on (see Lock).
	Slots, Slot int
	// CallerTx marks the events of LockTx and TryLockTx: the lock lives in
	// the caller's transaction, and no Released follows Acquired.
	CallerTx bool

	Attempts int           // lock statements run so far in this round
	Waited   time.Duration // from the start of the wait to this event, or to the grant once acquired
	Held     time.Duration // Released, HoldTimeout, TermLost: from the grant to this event

	Committed bool  // Released: txlock committed the transaction (false if fn ended it itself)
	Err       error // Released: what the round returned (for the last round, what the call returns; for a fn that panicked, an error saying so; for a term, nil after Release, else why it ended); TimedOut, Canceled, Failed, SerializationRetry, StaleWrite, TermLost: the error

	Token    int64  // TokenIssued, StaleWrite, TermLost: the token drawn, carried by the refused write, or of the lost term
	Sequence string // TokenIssued: the sequence the token came from
	Table    string // StaleWrite: the table, as quoted in the statement
	Current  int64  // StaleWrite: the token the row holds; 0 if unknown
}

// Keyspace returns the name of the keyspace all of e's keys were made in
// (Key.Keyspace), "" when none of them was made in a named one or e has no
// keys, and mixed true when they come from more than one: a value as
// bounded as a service's keyspaces, for a metric label.
func (e Event) Keyspace() (name string, mixed bool) {
	if len(e.Keys) == 0 {
		return "", false
	}
	name = e.Keys[0].Keyspace()
	for _, k := range e.Keys[1:] {
		if k.Keyspace() != name {
			return "", true
		}
	}
	return name, false
}

// events emits one call's events to its observer, threading the context
// each observation returns. The zero events emits nothing, at no cost.
type events struct {
	o   Observer
	ctx context.Context
}

// on reports whether there is an observer to emit to.
func (ev *events) on() bool { return ev.o != nil }

// start begins a call's events, to o, with the caller's context. The call
// keeps them beside its config, which does not change during the call; its
// lockState points to them (lockState.ev, see orNil).
func (ev *events) start(o Observer, ctx context.Context) {
	*ev = events{o: o}
	if o != nil {
		ev.ctx = ctx
	}
}

// orNil returns ev if it has an observer, else nil: what lockState.ev holds.
func (ev *events) orNil() *events {
	if ev.o == nil {
		return nil
	}
	return ev
}

// emit reports e. Only call it when on() is true, so that building e costs
// nothing otherwise.
func (ev *events) emit(e Event) {
	defer func() {
		if r := recover(); r != nil {
			reportObserverPanic(e.Kind, r)
		}
	}()
	if next := ev.o.Observe(ev.ctx, e); next != nil {
		ev.ctx = next
	}
}

// report reports e without taking the context the observer returns: for
// events while fn runs, whose context must not change under fn.
func (ev *events) report(e Event) {
	defer func() {
		if r := recover(); r != nil {
			reportObserverPanic(e.Kind, r)
		}
	}()
	ev.o.Observe(ev.ctx, e)
}

// observerPanics records the event kinds whose observer panic was logged.
var observerPanics [len(eventNames)]atomic.Bool

func reportObserverPanic(k EventKind, r any) {
	if int(k) < len(observerPanics) && !observerPanics[k].CompareAndSwap(false, true) {
		return
	}
	slog.Default().Error("txlock: an Observer panicked; the panic was recovered and the lock is unaffected (logged once per event kind)",
		"event", k.String(), "panic", fmt.Sprint(r))
}
