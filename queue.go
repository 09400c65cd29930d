package txlock

import (
	"context"
	"database/sql"
	"hash/maphash"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Local queues and the handoff.
//
// The WithLock calls of one process that wait for the same keys, in the
// same mode, on the same database handle, form a local queue: only the
// caller whose turn it is makes attempts (polls, or waits in the server's
// lock queue with ServerWait); the others wait in FIFO order, holding no
// connection but for the early BEGINs below, so the database sees one
// waiter per key per process instead of one per goroutine. A semaphore's
// queue (WithSemaphore) gives the turn
// to n callers at once. A caller keeps the turn while it holds the lock, and
// then passes it to the next (the handoff), which tries at once instead of
// sleeping:
//
//   - With polling, on a *sql.DB, the turn passes as soon as fn returns,
//     before the holder's COMMIT or ROLLBACK, together with a channel that is
//     closed once that call has returned (bound.prevEnd). The next caller
//     begins its transaction at once, if the pool has an idle connection,
//     waits for the channel, and only then sends its lock statement, which
//     finds the lock free and, at RepeatableRead, takes its snapshot after
//     that COMMIT (BEGIN takes none in PostgreSQL). It holds that begun
//     transaction for at most maxEarlyBegin of a slow COMMIT; then it rolls
//     back and waits without a connection (see ownTx.beginTx). With the
//     default strategy (see config.headWindow) that lock statement is the
//     cheap poll, unless such a poll found the lock taken before (queue.remote:
//     other processes wait for it in the server), or the last handoff took
//     longer than slowHandoff (a COMMIT's round trip across a network);
//     then it is the call's window in the server, sent at once without
//     waiting for the channel, which queues behind the holder. After such
//     a slow handoff the turn passes earlier still, as soon as the holder's
//     lock is granted (passAtGrant): the next caller's BEGIN and window
//     then go out during the hold, and the caller after it begins its
//     transaction early (callOnDeck).
//   - With ServerWait, on a *sql.DB, the turn passes as soon as fn returns:
//     the next caller's wait in the server is granted the moment the
//     holder's transaction ends, with no round trip in between.
//   - Otherwise (a *sql.Conn, which has room for one transaction), the turn
//     passes once the holder's transaction has ended.
//
// A caller that gives up while queued, or holding the turn, passes the turn
// on, with the channel it carries. Polling and ServerWait calls queue apart,
// as their handoffs differ. Shared locks and tries do not queue.

// queues holds this process's local queues.
var queues struct {
	sync.Mutex
	m map[queueKey]*queue
}

// queueKey names a local queue: the same keys (the same lock statement) on
// the same database handle, in the same mode.
type queueKey struct {
	handle     any // see queueHandle
	stmt       string
	serverWait bool
	// slots is a semaphore's n, of whose callers the queue lets n have the
	// turn at once; 0 for a lock, whose queue lets one.
	slots int
}

// queue is one local queue: how many callers have the turn (one, or for a
// semaphore up to its n), and the callers waiting for it, in the order they
// queued.
type queue struct {
	holders int
	waiting []*ticket
	// remote is set once a poll made right after a handoff in this queue
	// found the lock taken, by another process most likely: the default
	// strategy's queue head then waits in the server at once after a
	// handoff too (see waiter.window). Only the caller with the turn uses it.
	remote bool
	// handoff is how long the last early handoff in this queue took, from
	// the holder's fn returning to its transaction's end (its COMMIT's
	// round trip, mostly): see slowHandoff.
	handoff time.Duration
}

// slowHandoff is the handoff beyond which the default strategy's queue
// head, handed the turn early, sends its window in the server at once
// rather than polling once the holder's transaction has ended: a poll then
// costs a round trip after that end, which a window queued behind the
// holder does not (it is granted the moment the holder's transaction
// ends), and at such a round trip the window's own cost is the smaller.
// On loopback a COMMIT returns in a fraction of it.
const slowHandoff = time.Millisecond

// handoffSlow reports whether the last early handoff of t's queue took
// longer than slowHandoff.
func (t *ticket) handoffSlow() bool {
	queues.Lock()
	defer queues.Unlock()
	return t.q != nil && t.q.handoff > slowHandoff
}

// refs counts the callers in q: those with the turn, and those waiting.
func (q *queue) refs() int { return q.holders + len(q.waiting) }

// ticket is one call's place in the local queue of its keys.
type ticket struct {
	key queueKey
	q   *queue // the queue while the call is in it, waiting or holding the turn
	// turn receives the turn while the call waits for it, with what the
	// turn carries.
	turn chan chan struct{}
	// onDeck is signalled while the call waits, when it is first in line
	// (see callOnDeck).
	onDeck chan struct{}
	// prevEnd is what the turn carried: see bound.prevEnd. It is passed on
	// with the turn if the call gives up, so that the next caller, too,
	// waits for the transaction it belongs to. Once that has ended, passing
	// it on costs nothing.
	prevEnd chan struct{}
	// end is closed once this call's transaction has ended, after it handed
	// its turn on early, at handedAt, in the queue handedIn.
	end      chan struct{}
	handedAt time.Time
	handedIn *queue
}

// othersQueued reports that other callers are queued for the same keys.
func (t *ticket) othersQueued() bool {
	queues.Lock()
	defer queues.Unlock()
	return queues.m[t.key] != nil
}

// recentlyBusy records, for the local queue keys hashed into its slots,
// when a call of the default strategy last found its lock busy (see
// config.headWindow): a call whose key was busy within hotFor queues before
// its first attempt, and so waits in the server at once, instead of first
// making a poll that would most likely find the lock busy too. Keys that
// share a slot only share that hint. A queue key is the pool's as well as
// the statement's: calls on another pool of the process (a pgx pool beside
// a *sql.DB, or the benchmark's pools that stand for processes) keep hints
// of their own, as another process would.
var recentlyBusy [64]atomic.Int64

// hotFor is how long a busy lock makes its key's next calls queue first.
const hotFor = time.Second

var busySeed = maphash.MakeSeed()

func (t *ticket) busySlot() *atomic.Int64 {
	return &recentlyBusy[maphash.Comparable(busySeed, t.key)%uint64(len(recentlyBusy))]
}

// markBusy records that the call found its lock busy at now.
func (t *ticket) markBusy(now time.Time) { t.busySlot().Store(now.UnixNano()) }

// hot reports whether a call found the lock of t's keys busy within hotFor
// of now.
func (t *ticket) hot(now time.Time) bool {
	d := now.UnixNano() - t.busySlot().Load()
	return d >= 0 && d < int64(hotFor)
}

// entered reports whether the call is in its queue.
func (t *ticket) entered() bool { return t.q != nil }

// enter queues the call and waits for its turn, until waitCtx ends. It
// reports whether the turn came. Callers get the turn in the order in which
// they entered. Called on deck (callOnDeck), enter calls early, if it is
// not nil, and waits on.
func (t *ticket) enter(waitCtx context.Context, early func()) bool {
	queues.Lock()
	if queues.m == nil {
		queues.m = map[queueKey]*queue{}
	}
	q := queues.m[t.key]
	if q == nil {
		q = &queue{}
		queues.m[t.key] = q
	}
	if q.holders < max(t.key.slots, 1) {
		q.holders++
		queues.Unlock()
		t.q, t.prevEnd = q, nil
		return true
	}
	if t.turn == nil {
		t.turn, t.onDeck = make(chan chan struct{}, 1), make(chan struct{}, 1)
	}
	q.waiting = append(q.waiting, t)
	queues.Unlock()
	for {
		select {
		case t.prevEnd = <-t.turn:
			t.q = q
			select {
			case <-t.onDeck: // a call that came with the turn
			default:
			}
			return true
		case <-t.onDeck:
			if early != nil {
				t.runEarly(q, early)
			}
			continue
		case <-waitCtx.Done():
		}
		t.quit(q)
		return false
	}
}

// runEarly runs early while the call waits in q. If early panics, the call
// leaves q first, so that the turn does not go to a caller that is gone.
func (t *ticket) runEarly(q *queue, early func()) {
	defer func() {
		if r := recover(); r != nil {
			t.quit(q)
			panic(r)
		}
	}()
	early()
}

// quit takes the waiting call out of q, or, if the turn came as it gave
// up, passes the turn on.
func (t *ticket) quit(q *queue) {
	queues.Lock()
	if i := slices.Index(q.waiting, t); i >= 0 {
		q.waiting = slices.Delete(q.waiting, i, i+1)
		queues.Unlock()
		return
	}
	queues.Unlock()
	t.q, t.prevEnd = q, <-t.turn
	t.passTurn(t.prevEnd)
}

// passAtReturn passes the turn on once fn has returned, before the call's
// transaction ends, if another caller is queued: the turn carries t.end,
// which leave closes once the transaction has ended. If nobody is queued
// the call keeps its turn until then, so that a newcomer does not find the
// lock still held.
func (t *ticket) passAtReturn() {
	queues.Lock()
	defer queues.Unlock()
	if len(t.q.waiting) == 0 {
		return
	}
	t.end, t.handedAt, t.handedIn = make(chan struct{}), time.Now(), t.q
	t.passTurnLocked(t.end)
}

// passAtGrant passes the turn on as soon as the call's lock is granted,
// when the last handoff of its queue was slower than slowHandoff (a network
// between the process and the server) and another caller is queued. The
// next caller's window then goes to the server during this call's hold,
// and is granted the moment this call's transaction ends, with no round
// trip between (see also callOnDeck). The turn carries t.end, as
// passAtReturn's does, for a poll. It reports whether the turn was passed:
// fn's return then only starts the handoff's measure (markHandoff).
func (t *ticket) passAtGrant() bool {
	queues.Lock()
	defer queues.Unlock()
	if t.q.handoff <= slowHandoff || len(t.q.waiting) == 0 {
		return false
	}
	t.end, t.handedAt, t.handedIn = make(chan struct{}), time.Time{}, t.q
	t.passTurnLocked(t.end)
	return true
}

// callOnDeck follows the BEGIN of the first window of the caller with the turn,
// when the queue's handoffs are slow, so that the turn will pass at its
// grant: it tells the first caller waiting that it is on deck. On
// database/sql, where BEGIN is a round trip of its own, that caller then
// begins its transaction (ownTx.beginEarly), and its window goes out the
// moment its turn comes: else a hold shorter than a round trip would end
// before that window reached the server. Its BEGIN follows this caller's,
// so transactions still begin in the queue's order.
func (t *ticket) callOnDeck() {
	queues.Lock()
	defer queues.Unlock()
	q := t.q
	if q == nil || q.handoff <= slowHandoff || len(q.waiting) == 0 {
		return
	}
	select {
	case q.waiting[0].onDeck <- struct{}{}:
	default:
	}
}

// markHandoff starts the measure of a handoff that passAtGrant made: from
// fn's return to the transaction's end, as for passAtReturn's.
func (t *ticket) markHandoff() { t.handedAt = time.Now() }

// passNow passes the turn on at once, carrying nothing: the next caller may
// start its wait in the server while this call's transaction ends.
func (t *ticket) passNow() { t.passTurn(nil) }

// leave ends the call's part in its queue, once its transaction has ended
// (or it gave up): it closes end, and passes the turn on if it still has it,
// with what the turn carried.
func (t *ticket) leave() {
	if t == nil {
		return
	}
	if t.end != nil {
		close(t.end)
		t.end = nil
		if !t.handedAt.IsZero() { // zero: fn panicked before markHandoff
			queues.Lock()
			t.handedIn.handoff = time.Since(t.handedAt)
			queues.Unlock()
		}
		t.handedIn = nil
	}
	if t.q != nil {
		t.passTurn(t.prevEnd)
	}
}

// passTurn gives the turn, with prevEnd, to the first caller waiting for it,
// and drops the queue once nobody is in it.
func (t *ticket) passTurn(prevEnd chan struct{}) {
	queues.Lock()
	defer queues.Unlock()
	t.passTurnLocked(prevEnd)
}

// passTurnLocked is passTurn, with queues locked.
func (t *ticket) passTurnLocked(prevEnd chan struct{}) {
	q := t.q
	t.q, t.prevEnd = nil, nil
	if len(q.waiting) == 0 {
		if q.holders--; q.holders == 0 {
			delete(queues.m, t.key)
		}
		return
	}
	next := q.waiting[0]
	q.waiting = slices.Delete(q.waiting, 0, 1)
	next.turn <- prevEnd
}

// queueStmt is the statement that names the local queue of p's calls,
// given their lock statement p.stmt (without a BEGIN): p.stmt itself, or
// the same without the holder's label (WithOwner) and with the test for
// recovery of a read-write transaction (appendInRecovery), so that calls
// with and without labels, or with different ones, and READ ONLY calls
// beside the others, share a queue.
//
// A semaphore's statement asks for the slots from the call's first (see
// semaphoreStatement): its queue is named by the statement from slot 0.
func (p *plan) queueStmt() string {
	s := p.spec(formOwnTx)
	if s.owner == "" && s.first == 0 && s.readWrite {
		return p.stmt
	}
	s.owner, s.first, s.readWrite = "", 0, true
	return lockStatement(s, formOwnTx)
}

// queueHandle is the identity of db for the local queues, or nil if its
// calls do not queue. A DB that wraps another handle for one call (as
// package sqlxlock does) names the handle it wraps with a TxlockQueueHandle
// method, so that its calls share a queue with every other call on that
// handle. A pointer to a struct that embeds a *sql.DB (as *sqlx.DB does)
// is that *sql.DB. Only pointers qualify: any other value could hold
// something that panics when compared.
func queueHandle(db DB) any {
	var h any = db
	if w, ok := db.(interface{ TxlockQueueHandle() any }); ok {
		h = w.TxlockQueueHandle()
	}
	if h == nil {
		return nil
	}
	v := reflect.ValueOf(h)
	if v.Kind() != reflect.Pointer {
		return nil
	}
	if _, ok := h.(*sql.DB); !ok && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
		if f, ok := v.Elem().Type().FieldByName("DB"); ok && f.Anonymous && f.Type == sqlDBType {
			if inner := v.Elem().FieldByIndex(f.Index); !inner.IsNil() {
				return inner.Interface()
			}
		}
	}
	return h
}

var sqlDBType = reflect.TypeOf((*sql.DB)(nil))

// queuedCallers counts the callers in this process's local queues: those
// with the turn, and those waiting for it.
func queuedCallers() int {
	queues.Lock()
	defer queues.Unlock()
	n := 0
	for _, q := range queues.m {
		n += q.refs()
	}
	return n
}
