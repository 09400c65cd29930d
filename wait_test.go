package txlock

// Tests of the wait loop and the local queues without a database: a fake
// attempter stands for the server's lock, and a fake clock, where a test
// needs one, makes the timing exact. The integration tests against a real
// PostgreSQL (txlock_test.go, serverwait_test.go) prove the same behaviour
// end to end; these pin the loop's own rules, fast and deterministically.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock/driver"
)

// fakeServer is the server's side of one key: who holds it.
type fakeServer struct {
	mu     sync.Mutex
	holder string // "" when free
	order  []string
}

func (s *fakeServer) take(who string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holder != "" {
		return false
	}
	s.holder = who
	s.order = append(s.order, who)
	return true
}

func (s *fakeServer) release(who string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holder != who {
		panic("fakeServer: " + who + " releases a lock held by " + s.holder)
	}
	s.holder = ""
}

func (s *fakeServer) grants() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.order...)
}

// fakeLock is a keeper over a fakeServer. Like ownTx, an attempt waits
// for bound.prevEnd before it tries.
type fakeLock struct {
	name     string
	srv      *fakeServer
	clock    *fakeClock // if not nil, a ServerWait attempt waits out its window on it
	isPooled bool

	attempting chan bound // if not nil, receives the first attempt's bound as it starts
	onBusy     func()     // if not nil, runs after each busy attempt
	inFn       chan struct{}
	finishFn   chan struct{} // if not nil, fn returns once it is closed
	commit     chan struct{} // if not nil, the lock is released once it is closed

	mu     sync.Mutex
	bounds []bound
	handed bool // hold was given a pass
}

func (f *fakeLock) attempt(ctx context.Context, b bound) (outcome, error) {
	f.mu.Lock()
	f.bounds = append(f.bounds, b)
	first := len(f.bounds) == 1
	f.mu.Unlock()
	if f.attempting != nil && first {
		f.attempting <- b
	}
	if b.prevEnd != nil {
		if err := awaitEnd(ctx, b.prevEnd); err != nil {
			return busy, err
		}
	}
	if f.srv.take(f.name) {
		return granted, nil
	}
	if b.window > 0 && f.clock != nil {
		f.clock.advance(b.window) // waited in the server for the whole window
	}
	if f.onBusy != nil {
		f.onBusy()
	}
	return busy, nil
}

func (f *fakeLock) hold(st *lockState, pass func()) error {
	if f.inFn != nil {
		close(f.inFn)
	}
	if f.finishFn != nil {
		<-f.finishFn
	}
	if pass != nil {
		f.mu.Lock()
		f.handed = true
		f.mu.Unlock()
		pass()
	}
	if f.commit != nil {
		<-f.commit
	}
	f.srv.release(f.name)
	return nil
}

func (f *fakeLock) holdUnlocked(context.Context, *lockState) error { return nil }
func (f *fakeLock) pooled() bool                                   { return f.isPooled }

func (f *fakeLock) attempts() []bound {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bound(nil), f.bounds...)
}

// fakeClock's time moves only when a sleep or a test moves it. Its epoch is
// an hour ahead, so that contexts with its deadlines never end by
// themselves during a test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now().Add(time.Hour)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	c.advance(d)
	return true
}

// A busy lock makes the next calls of its own local queue queue first
// (ticket.hot), not those of another pool's queue for the same statement.
func TestHotIsPerQueue(t *testing.T) {
	testConfig(t, nil)
	now := time.Now()
	stmt := "SELECT pg_catalog.pg_try_advisory_xact_lock(1)"
	pools := make([]int, 9)
	busy := &ticket{key: queueKey{handle: &pools[0], stmt: stmt}}
	busy.markBusy(now)
	assert.True(t, busy.hot(now))
	assert.True(t, (&ticket{key: queueKey{handle: &pools[0], stmt: stmt}}).hot(now), "the same queue")
	others := 0
	for i := 1; i < len(pools); i++ { // a slot of 64 may be shared: not all 8 others
		if (&ticket{key: queueKey{handle: &pools[i], stmt: stmt}}).hot(now) {
			others++
		}
	}
	assert.Less(t, others, len(pools)-1, "other pools' queues for the same statement")
	testConfig(t, nil)
}

// testConfig returns a config from opts, on clk if it is not nil. It
// forgets which keys were busy recently, so that a test's calls do not
// queue first because of an earlier test's (see ticket.hot).
func testConfig(t *testing.T, clk clock, opts ...Option) *config {
	t.Helper()
	for i := range recentlyBusy {
		recentlyBusy[i].Store(0)
	}
	c := &config{}
	require.NoError(t, c.init(opts, false))
	if clk != nil {
		c.clock = clk
	}
	return c
}

var testKeys = []Key{Int64Key(1)}

// newTicket returns a ticket for a queue of its own: handle stands for the
// database handle.
func newTicket(handle *int, serverWait bool) *ticket {
	return &ticket{key: queueKey{handle: handle, stmt: "k", serverWait: serverWait}}
}

// eventually waits for cond, polling, for at most 10 s of real time.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 100*time.Microsecond, msg)
}

// recv receives from ch, or fails the test if nothing arrives within 10 s
// of real time: a lost turn must fail the test, not hang it.
func recv[T any](t *testing.T, ch <-chan T, msg string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("still waiting after 10s: %s", msg)
	}
	var zero T
	return zero
}

type result struct {
	acquired bool
	err      error
}

// start runs a call of run in a goroutine.
func start(ctx context.Context, c *config, a fakeAcquirer, t *ticket) <-chan result {
	done := make(chan result, 1)
	go func() {
		ok, err := loopOn(ctx, c, c.waitMode(false), a, testKeys, t)
		done <- result{ok, err}
	}()
	return done
}

// FIFO order and the polling handoff: callers queued behind a busy lock are
// granted in the order they queued, each on its first attempt, and each
// successor is handed its turn while its predecessor still holds the lock
// (it begins early), then waits for that lock's end before trying.
func TestWaitQueueFIFOAndHandoff(t *testing.T) {
	srv := &fakeServer{}
	require.True(t, srv.take("outsider"))
	c := testConfig(t, nil, WithRetry(ConstantBackoff{Interval: time.Millisecond}), WithTimeout(time.Minute))
	handle := new(int)
	const n = 5
	locks := make([]*fakeLock, n)
	done := make([]<-chan result, n)
	for i := range n {
		locks[i] = &fakeLock{name: string(rune('a' + i)), srv: srv, isPooled: true,
			attempting: make(chan bound, 1), commit: make(chan struct{})}
		done[i] = start(context.Background(), c, locks[i], newTicket(handle, false))
		eventually(t, func() bool { return QueueRefs() == i+1 }, "every caller queues in turn")
	}
	// Only the head polls: the others wait in the queue without attempting.
	for i := 1; i < n; i++ {
		assert.Empty(t, locks[i].attempts(), "caller %d attempted before its turn", i)
	}
	srv.release("outsider")
	for i := range n {
		if i+1 < n {
			// The successor's attempt starts while this caller still
			// holds the lock: the turn was handed on early.
			b := recv(t, locks[i+1].attempting, "the next caller is handed its turn when fn returns")
			assert.NotNil(t, b.prevEnd, "the turn carries the holder's end")
			srv.mu.Lock()
			assert.Equal(t, locks[i].name, srv.holder, "handed on before the lock ended")
			srv.mu.Unlock()
		}
		close(locks[i].commit)
		r := recv(t, done[i], "the holder returns")
		require.NoError(t, r.err)
		assert.True(t, r.acquired)
	}
	assert.Equal(t, []string{"outsider", "a", "b", "c", "d", "e"}, srv.grants(), "FIFO")
	for i := 1; i < n; i++ {
		assert.Len(t, locks[i].attempts(), 1, "caller %d is granted on its first attempt", i)
	}
	assert.Zero(t, QueueRefs())
	assert.Empty(t, queues.m, "queues are removed when empty")
}

// A caller that gives up while queued leaves the queue, and one that gives
// up holding the turn passes it on, with the end of the transaction that
// the turn carries: the next caller still waits for it.
func TestWaitQueueGiveUpPassesTurn(t *testing.T) {
	srv := &fakeServer{}
	require.True(t, srv.take("outsider"))
	c := testConfig(t, nil, WithRetry(ConstantBackoff{Interval: time.Millisecond}), WithTimeout(time.Minute))
	handle := new(int)
	a := &fakeLock{name: "a", srv: srv, isPooled: true, finishFn: make(chan struct{}), commit: make(chan struct{})}
	b := &fakeLock{name: "b", srv: srv, isPooled: true, attempting: make(chan bound, 10)}
	q := &fakeLock{name: "quitter", srv: srv, isPooled: true}
	cc := &fakeLock{name: "c", srv: srv, isPooled: true, attempting: make(chan bound, 10)}

	doneA := start(context.Background(), c, a, newTicket(handle, false))
	eventually(t, func() bool { return QueueRefs() == 1 }, "a queues")
	ctxQ, cancelQ := context.WithCancel(context.Background())
	doneQ := start(ctxQ, c, q, newTicket(handle, false))
	eventually(t, func() bool { return QueueRefs() == 2 }, "quitter queues")
	ctxB, cancelB := context.WithCancel(context.Background())
	doneB := start(ctxB, c, b, newTicket(handle, false))
	eventually(t, func() bool { return QueueRefs() == 3 }, "b queues")
	doneC := start(context.Background(), c, cc, newTicket(handle, false))
	eventually(t, func() bool { return QueueRefs() == 4 }, "c queues")

	// Giving up while queued: the quitter leaves, without an attempt.
	cancelQ()
	r := recv(t, doneQ, "the quitter returns")
	var ce *CanceledError
	require.ErrorAs(t, r.err, &ce)
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.Zero(t, ce.Attempts)
	assert.Empty(t, q.attempts())
	eventually(t, func() bool { return QueueRefs() == 3 }, "the quitter left")

	// a is granted; when its fn returns, b is handed the turn and waits
	// for a's end in its attempt. b gives up there.
	srv.release("outsider")
	close(a.finishFn)
	gotB := recv(t, b.attempting, "b is handed the turn")
	require.NotNil(t, gotB.prevEnd)
	cancelB()
	r = recv(t, doneB, "b returns")
	require.ErrorIs(t, r.err, context.Canceled)
	assert.NotErrorIs(t, r.err, ErrLockTimeout)

	// c gets the turn with the same end, and waits for it too.
	gotC := recv(t, cc.attempting, "c is handed the turn")
	assert.Equal(t, gotB.prevEnd, gotC.prevEnd, "the end of a's transaction is passed on with the turn")
	select {
	case <-doneC:
		t.Fatal("c finished before a's transaction ended")
	default:
	}
	close(a.commit)
	require.NoError(t, recv(t, doneA, "a returns").err)
	r = recv(t, doneC, "c returns")
	require.NoError(t, r.err)
	assert.True(t, r.acquired)
	assert.Len(t, cc.attempts(), 1, "c is granted on its first attempt")
	assert.Equal(t, []string{"outsider", "a", "c"}, srv.grants())
	assert.Zero(t, QueueRefs())
}

// A context cancelled while the loop sleeps between attempts ends the wait
// at once, however long the sleep was to be.
func TestWaitCancelMidSleep(t *testing.T) {
	srv := &fakeServer{}
	require.True(t, srv.take("outsider"))
	c := testConfig(t, nil, WithRetry(ConstantBackoff{Interval: time.Hour}), WithTimeout(2*time.Hour))
	a := &fakeLock{name: "a", srv: srv, attempting: make(chan bound, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := start(ctx, c, a, nil)
	<-a.attempting
	began := time.Now()
	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end when its context was cancelled")
	}
	t.Logf("returned %v after the cancel", time.Since(began))
	var ce *CanceledError
	require.ErrorAs(t, r.err, &ce)
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.NotErrorIs(t, r.err, ErrLockTimeout)
	assert.Equal(t, 1, ce.Attempts)
	assert.False(t, r.acquired)
}

// The deadline ends the wait at exactly the timeout, with every attempt
// that fitted before it counted.
func TestWaitDeadlineAttempts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []Option
		attempts int
		waited   time.Duration
	}{
		// Attempts at 0, 10, 20, 30 and 40 ms; the next sleep would cross
		// the deadline, so the wait sleeps to it and gives up.
		{"constant", []Option{WithRetry(ConstantBackoff{Interval: 10 * time.Millisecond}), WithTimeout(45 * time.Millisecond)}, 5, 45 * time.Millisecond},
		// Linear: sleeps of 10, 20, 30 ms, attempts at 0, 10, 30, 60 ms.
		{"linear", []Option{WithRetry(LinearBackoff{Step: 10 * time.Millisecond, Max: time.Second}), WithTimeout(100 * time.Millisecond)}, 4, 100 * time.Millisecond},
		{"no retry", []Option{WithRetry(NoRetry), WithTimeout(time.Second)}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &fakeServer{}
			require.True(t, srv.take("outsider"))
			clk := newFakeClock()
			c := testConfig(t, clk, tc.opts...)
			a := &deadlineGuard{fakeLock: &fakeLock{name: "a", srv: srv}, clk: clk}
			ok, err := loopOn(context.Background(), c, c.waitMode(false), a, testKeys, nil)
			assert.Zero(t, a.late.Load(), "an attempt started at or after the deadline")
			assert.False(t, ok)
			var te *LockTimeoutError
			require.ErrorAs(t, err, &te)
			assert.Nil(t, te.Err, "the timeout option ran out, not the context")
			assert.Equal(t, tc.attempts, te.Attempts)
			assert.Equal(t, tc.waited, te.Waited)
			assert.Len(t, a.attempts(), tc.attempts)
		})
	}
}

// deadlineGuard is a fakeLock whose attempts, like ownTx's, are cut off by
// the wait's deadline: one that starts at or after it fails with
// context.DeadlineExceeded (as the deadline tie makes it), and is counted.
type deadlineGuard struct {
	*fakeLock
	clk  *fakeClock
	late atomic.Int32
}

func (g *deadlineGuard) attempt(ctx context.Context, b bound) (outcome, error) {
	if !g.clk.now().Before(b.deadline) {
		g.late.Add(1)
		return busy, context.DeadlineExceeded
	}
	return g.fakeLock.attempt(ctx, b)
}

// An attempt that fails with a context error after the deadline is a
// timeout; any other error is returned as it is, deadline or not.
func TestWaitAttemptErrors(t *testing.T) {
	clk := newFakeClock()
	c := testConfig(t, clk, WithTimeout(time.Second))
	boom := errors.New("connection refused")
	for _, tc := range []struct {
		name    string
		err     error
		timeout bool
	}{
		{"context error at the deadline", context.DeadlineExceeded, true},
		{"other error at the deadline", boom, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := attempterFunc(func(context.Context, bound) (outcome, error) {
				clk.advance(time.Second)
				return busy, tc.err
			})
			lock := Lock{Keys: testKeys}
			err := waitOn(context.Background(), c, c.waitMode(false), &lock, a, nil)
			assert.Equal(t, tc.timeout, errors.Is(err, ErrLockTimeout), "%v", err)
			if !tc.timeout {
				assert.ErrorIs(t, err, tc.err)
			}
		})
	}
}

type attempterFunc func(context.Context, bound) (outcome, error)

func (f attempterFunc) attempt(ctx context.Context, b bound) (outcome, error) { return f(ctx, b) }

// A try makes one attempt, never queues, never waits in the server, and
// reports a busy lock as not acquired; with its context already ended it
// makes none.
func TestWaitTryOnce(t *testing.T) {
	srv := &fakeServer{}
	require.True(t, srv.take("outsider"))
	c := testConfig(t, newFakeClock(), WithServerWait(ServerWait{}))
	a := &fakeLock{name: "a", srv: srv}
	ok, err := loopOn(context.Background(), c, tryOnce, a, testKeys, nil)
	require.NoError(t, err)
	assert.False(t, ok)
	require.Len(t, a.attempts(), 1)
	assert.Zero(t, a.attempts()[0].window, "a try never waits in the server")
	assert.Zero(t, QueueRefs())

	srv.release("outsider")
	ok, err = loopOn(context.Background(), c, tryOnce, a, testKeys, nil)
	require.NoError(t, err)
	assert.True(t, ok)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ok, err = loopOn(ctx, c, tryOnce, a, testKeys, nil)
	assert.False(t, ok)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrLockTimeout)
	var ce *CanceledError
	assert.ErrorAs(t, err, &ce, "a cancelled try is a cancellation, as any wait's")
	assert.Len(t, a.attempts(), 2, "no attempt with an ended context")
}

// ServerWait: a call queues before its first attempt, even alone; each
// attempt waits in the server for its window, never past the deadline; the
// Pause spaces the windows; and the next caller's wait starts as soon as
// the holder's fn returns, carrying no end to wait for.
func TestWaitServerWaitQueueing(t *testing.T) {
	t.Run("windows", func(t *testing.T) {
		srv := &fakeServer{}
		require.True(t, srv.take("outsider"))
		clk := newFakeClock()
		c := testConfig(t, clk, WithServerWait(ServerWait{}), WithTimeout(250*time.Millisecond))
		var refs []int
		a := attempterFunc(func(_ context.Context, b bound) (outcome, error) {
			refs = append(refs, QueueRefs())
			clk.advance(b.window)
			return busy, nil
		})
		lock := Lock{Keys: testKeys}
		rec := &recordingAttempter{a: a}
		tk := newTicket(new(int), true)
		err := waitOn(context.Background(), c, c.waitMode(false), &lock, rec, tk)
		tk.leave()
		var te *LockTimeoutError
		require.ErrorAs(t, err, &te)
		assert.Equal(t, 2, te.Attempts)
		assert.Equal(t, []time.Duration{DefaultServerWaitWindow, 50*time.Millisecond - windowMargin}, rec.windows,
			"the last window ends windowMargin before the deadline")
		assert.Equal(t, []int{1, 1}, refs, "the call is queued from its first attempt")
	})

	t.Run("handoff", func(t *testing.T) {
		srv := &fakeServer{}
		c := testConfig(t, newFakeClock(), WithServerWait(ServerWait{Window: 20 * time.Millisecond}), WithTimeout(time.Minute))
		handle := new(int)
		a := &fakeLock{name: "a", srv: srv, isPooled: true, inFn: make(chan struct{}), finishFn: make(chan struct{}), commit: make(chan struct{})}
		b := &fakeLock{name: "b", srv: srv, isPooled: true, attempting: make(chan bound, 10)}
		doneA := start(context.Background(), c, a, newTicket(handle, true))
		<-a.inFn
		doneB := start(context.Background(), c, b, newTicket(handle, true))
		eventually(t, func() bool { return QueueRefs() == 2 }, "b queues")
		assert.Empty(t, b.attempts(), "b waits for its turn before it waits in the server")
		close(a.finishFn)
		got := <-b.attempting
		assert.Nil(t, got.prevEnd, "a ServerWait turn carries no end: the server grants the lock when it ends")
		assert.Equal(t, 20*time.Millisecond, got.window)
		close(a.commit)
		require.NoError(t, (<-doneA).err)
		r := <-doneB
		require.NoError(t, r.err)
		assert.True(t, r.acquired)
		assert.Equal(t, []string{"a", "b"}, srv.grants())
	})

	t.Run("not pooled", func(t *testing.T) {
		// On a single connection the turn passes only once the holder's
		// transaction has ended.
		srv := &fakeServer{}
		c := testConfig(t, newFakeClock(), WithServerWait(ServerWait{}), WithTimeout(time.Minute))
		handle := new(int)
		a := &fakeLock{name: "a", srv: srv, inFn: make(chan struct{}), finishFn: make(chan struct{})}
		b := &fakeLock{name: "b", srv: srv}
		doneA := start(context.Background(), c, a, newTicket(handle, true))
		<-a.inFn
		doneB := start(context.Background(), c, b, newTicket(handle, true))
		eventually(t, func() bool { return QueueRefs() == 2 }, "b queues")
		close(a.finishFn)
		require.NoError(t, (<-doneA).err)
		require.NoError(t, (<-doneB).err)
		assert.False(t, a.handed)
		assert.Len(t, b.attempts(), 1)
	})
}

type recordingAttempter struct {
	a       fake
	windows []time.Duration
}

func (r *recordingAttempter) attempt(ctx context.Context, b bound) (outcome, error) {
	r.windows = append(r.windows, b.window)
	return r.a.attempt(ctx, b)
}

// Serialization failures re-run the whole round, lock included, as many
// times as WithSerializationRetries says, each with a fresh fn context.
func TestRunSerializationRetries(t *testing.T) {
	srv := &fakeServer{}
	c := testConfig(t, newFakeClock(), WithSerializationRetries(2))
	var rounds atomic.Int32
	var states []*lockState
	a := &retryLock{fakeLock: fakeLock{name: "a", srv: srv}, fail: func(st *lockState) error {
		rounds.Add(1)
		states = append(states, st)
		return sqlStateError("40001")
	}}
	ok, err := loopOn(context.Background(), c, c.waitMode(false), a, testKeys, nil)
	assert.True(t, ok)
	assert.Equal(t, "40001", SQLState(err))
	assert.Equal(t, int32(3), rounds.Load(), "one round and two retries")
	assert.Len(t, a.attempts(), 3, "each round takes the lock again")
	assert.NotSame(t, states[0], states[1], "each round has its own fn context")
}

// Once fn has run and failed with a serialization failure, the call reports
// that failure whatever stops the retry: a try whose retry finds the lock
// busy is not "not acquired", and a wait that times out does not replace
// fn's error with ErrLockTimeout.
func TestRunRetryStoppedReportsFnError(t *testing.T) {
	for _, tc := range []struct {
		name string
		try  bool
		opts []Option
		want string
	}{
		{name: "try finds the lock busy", try: true, want: "the retry found the lock busy"},
		{name: "wait times out", opts: []Option{WithRetry(ConstantBackoff{Interval: time.Second}), WithTimeout(3 * time.Second)}, want: "lock wait timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &fakeServer{}
			c := testConfig(t, newFakeClock(), append([]Option{WithSerializationRetries(1)}, tc.opts...)...)
			rounds := 0
			a := &retryLock{fakeLock: fakeLock{name: "a", srv: srv}, fail: func(*lockState) error {
				rounds++
				return sqlStateError("40001")
			}}
			a.afterRelease = func() { require.True(t, srv.take("outsider")) }
			ok, err := loopOn(context.Background(), c, c.waitMode(tc.try), a, testKeys, nil)
			assert.True(t, ok, "fn ran under the lock")
			assert.Equal(t, 1, rounds)
			assert.Equal(t, "40001", SQLState(err), "fn's error is reachable: %v", err)
			assert.NotErrorIs(t, err, ErrLockTimeout)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

type retryLock struct {
	fakeLock
	fail         func(*lockState) error
	afterRelease func() // if not nil, runs once the round's lock is released
}

func (r *retryLock) hold(st *lockState, pass func()) error {
	err := r.fail(st)
	r.srv.release(r.name)
	if r.afterRelease != nil {
		r.afterRelease()
	}
	return err
}

type sqlStateError string

func (e sqlStateError) Error() string    { return "sqlstate " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

// raceCtx is a waiter's context that has ended, and whose Done hands the
// turn to the waiter first: the turn then arrives exactly as the context
// ends, and enter's select finds both ready.
type raceCtx struct {
	context.Context // already cancelled
	once            sync.Once
	hand            func()
}

func (r *raceCtx) Done() <-chan struct{} {
	r.once.Do(r.hand)
	return r.Context.Done()
}

// A waiter whose context ends just as the turn reaches it either takes the
// turn or passes it on, with the end of the transaction it carries: the
// turn is never lost, and the caller behind gets it. The select between
// the two chooses at random, so the test runs at least 100 rounds, and
// until each way has been taken.
func TestWaitQueueTurnAsContextEnds(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	gaveUp, took := 0, 0
	for i := 0; i < 100 || gaveUp == 0 || took == 0; i++ {
		require.Less(t, i, 10000, "the select never chose one of its ways")
		handle := new(int)
		holder := newTicket(handle, false)
		require.True(t, holder.enter(context.Background(), nil))
		end := make(chan struct{})
		w := newTicket(handle, false)
		next := newTicket(handle, false)
		nextIn := make(chan bool, 1)
		ctx := &raceCtx{Context: cancelled, hand: func() {
			// w is queued and about to select: queue next behind it, then
			// hand the turn on, early, as passAtReturn does.
			go func() { nextIn <- next.enter(context.Background(), nil) }()
			eventually(t, func() bool { return QueueRefs() == 3 }, "next queues behind w")
			holder.passTurn(end)
		}}
		if w.enter(ctx, nil) {
			took++
			assert.Equal(t, end, w.prevEnd, "the turn carries the holder's end")
			w.leave()
		} else {
			gaveUp++
			assert.False(t, w.entered(), "a waiter that gave up holds no turn")
		}
		require.True(t, recv(t, (<-chan bool)(nextIn), "the caller behind gets the turn"))
		assert.Equal(t, end, next.prevEnd, "the holder's end is passed on with the turn")
		next.leave()
		require.Zero(t, QueueRefs())
		require.Empty(t, queues.m, "queues are removed when empty")
	}
	t.Logf("%d waiters took the turn, %d passed it on", took, gaveUp)
}

// A serialization retry leaves the local queue between rounds and joins it
// again like any caller: it does not wait behind its own turn. A polling
// call's retries, uncontended, do not queue; with the default strategy they
// do, as the first round found the key busy (see ticket.hot), and take the
// turn at once.
func TestRunSerializationRetriesRequeue(t *testing.T) {
	t.Run("polling", func(t *testing.T) {
		testRetriesRequeue(t, []int{1, 0, 0}, WithRetry(ExponentialBackoff{}))
	})
	t.Run("default", func(t *testing.T) { testRetriesRequeue(t, []int{1, 1, 1}) })
}

func testRetriesRequeue(t *testing.T, wantRefs []int, opts ...Option) {
	srv := &fakeServer{}
	require.True(t, srv.take("outsider"))
	c := testConfig(t, newFakeClock(), append([]Option{WithSerializationRetries(2), WithTimeout(time.Minute)}, opts...)...)
	var refs []int
	a := &retryLock{fakeLock: fakeLock{name: "a", srv: srv}, fail: func(*lockState) error {
		refs = append(refs, QueueRefs())
		return sqlStateError("40001")
	}}
	// The first attempt finds the lock busy, so the call queues (and has
	// the turn at once); the outsider then lets go.
	a.onBusy = sync.OnceFunc(func() { srv.release("outsider") })
	// A guard, not a timing assertion: the rounds take microseconds.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := loopOn(ctx, c, c.waitMode(false), a, testKeys, newTicket(new(int), false))
	assert.True(t, ok)
	assert.Equal(t, "40001", SQLState(err), "%v", err)
	assert.Equal(t, wantRefs, refs, "the first round holds the turn; the retries, uncontended, need none unless the key was busy recently")
	assert.Len(t, a.attempts(), 4, "a busy attempt, then one per round")
	assert.Zero(t, QueueRefs())
}

// A caller that finds the lock busy and then gets its turn tries again at
// once, without sleeping first: the holder of this process, if any, has
// just let go.
func TestWaitTurnThenAttemptAtOnce(t *testing.T) {
	srv := &fakeServer{}
	require.True(t, srv.take("outsider"))
	clk := newFakeClock()
	c := testConfig(t, clk, WithRetry(ConstantBackoff{Interval: time.Hour}), WithTimeout(2*time.Hour))
	a := &fakeLock{name: "a", srv: srv, onBusy: sync.OnceFunc(func() { srv.release("outsider") })}
	tk := newTicket(new(int), false)
	lock := Lock{Keys: testKeys}
	err := waitOn(context.Background(), c, c.waitMode(false), &lock, a, tk)
	tk.leave()
	require.NoError(t, err)
	assert.Equal(t, 2, lock.Attempts)
	assert.Zero(t, lock.Waited, "no sleep between the turn and the attempt")
	assert.Zero(t, QueueRefs())
}

// WithFailOpen runs fn without the lock only after the call has left its
// local queue: fn does not hold up the callers behind it.
func TestWaitFailOpenLeavesQueue(t *testing.T) {
	srv := &fakeServer{}
	require.True(t, srv.take("outsider"))
	clk := newFakeClock()
	c := testConfig(t, clk, WithRetry(ConstantBackoff{Interval: 10 * time.Millisecond}), WithTimeout(50*time.Millisecond),
		WithFailOpen(slog.New(slog.NewTextHandler(io.Discard, nil))))
	a := &failOpenLock{fakeLock: &fakeLock{name: "a", srv: srv}}
	ok, err := loopOn(context.Background(), c, c.waitMode(false), a, testKeys, newTicket(new(int), false))
	require.NoError(t, err)
	assert.False(t, ok)
	require.Equal(t, []int{0}, a.refs, "fn ran once, after the call left its queue")
	assert.False(t, a.held)
	assert.Zero(t, QueueRefs())
}

type failOpenLock struct {
	*fakeLock
	refs []int
	held bool
}

func (f *failOpenLock) holdUnlocked(_ context.Context, st *lockState) error {
	f.refs = append(f.refs, QueueRefs())
	f.held = st.lock.Held
	return nil
}

// idleLock is a fakeLock whose pool has an idle connection, or not.
type idleLock struct {
	*fakeLock
	idle bool
}

func (f *idleLock) idleConn() bool { return f.idle }

// The default strategy: a polling call that has its local queue's turn, on
// a pool with an idle connection, makes its attempts windows in the
// server, every one of them. Its first attempt, before it queued, is a
// poll, unless its key was found busy within hotFor: then it queues first,
// and that attempt is the first window. It makes no window with a RetryStrategy other than
// DefaultRetry, above ReadCommitted, or without an idle connection.
func TestWaitHeadWindow(t *testing.T) {
	rr := WithTxOptions(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	const w = DefaultServerWaitWindow
	for _, tc := range []struct {
		name    string
		opts    []Option
		idle    bool
		hot     bool
		windows []time.Duration // of the attempts: the last is granted
		keys    []Key           // testKeys if nil
	}{
		{"default", nil, true, false, []time.Duration{0, w, w, w}, nil},
		{"recently busy", nil, true, true, []time.Duration{w, w, w, w}, nil},
		{"no idle connection", nil, false, false, []time.Duration{0, 0, 0, 0}, nil},
		{"WithRetry(DefaultRetry)", []Option{WithRetry(DefaultRetry)}, true, true, []time.Duration{w, w, w, w}, nil},
		{"WithRetry", []Option{WithRetry(ExponentialBackoff{})}, true, true, []time.Duration{0, 0, 0, 0}, nil},
		{"RepeatableRead", []Option{rr}, true, true, []time.Duration{0, 0, 0, 0}, nil},
		// lock_timeout bounds each key's wait: a window over two keys
		// could last two windows, holding the first key.
		{"two keys", nil, true, true, []time.Duration{0, 0, 0, 0}, []Key{Int64Key(1), Int64Key(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			c := testConfig(t, clk, tc.opts...)
			pool := new(int)
			if tc.hot { // an earlier call of the same queue
				newTicket(pool, false).markBusy(clk.now().Add(-hotFor / 2))
			}
			srv := &fakeServer{}
			require.True(t, srv.take("outsider"))
			busy := 0
			a := &idleLock{idle: tc.idle, fakeLock: &fakeLock{name: "a", srv: srv, clock: clk, onBusy: func() {
				if busy++; busy == len(tc.windows)-1 {
					srv.release("outsider")
				}
			}}}
			tk := newTicket(pool, false)
			lock := Lock{Keys: testKeys}
			if tc.keys != nil {
				lock.Keys = tc.keys
			}
			err := waitOn(context.Background(), c, c.waitMode(false), &lock, a, tk)
			tk.leave()
			require.NoError(t, err)
			var windows []time.Duration
			for _, b := range a.attempts() {
				windows = append(windows, b.window)
			}
			assert.Equal(t, tc.windows, windows)
			assert.Zero(t, QueueRefs())
		})
	}
}

// queueBehind has next enter the queue of holder, which has the turn, and
// returns once next waits there: the channel receives whether next got the
// turn.
func queueBehind(t *testing.T, holder, next *ticket) <-chan bool {
	t.Helper()
	entered := make(chan bool, 1)
	go func() { entered <- next.enter(context.Background(), nil) }()
	eventually(t, func() bool {
		queues.Lock()
		defer queues.Unlock()
		return len(queues.m[holder.key].waiting) == 1
	}, "the next caller queues")
	return entered
}

// A queue measures its early handoffs, from passAtReturn to the holder's
// leave (its transaction's end): the next head finds the handoff slow past
// slowHandoff (a COMMIT across a network), and fast again after a quick
// one.
func TestSlowHandoff(t *testing.T) {
	h := new(int)
	tickets := []*ticket{newTicket(h, false), newTicket(h, false), newTicket(h, false)}
	require.True(t, tickets[0].enter(context.Background(), nil))
	for i, took := range []time.Duration{2 * slowHandoff, 0} {
		holder, next := tickets[i], tickets[i+1]
		entered := queueBehind(t, holder, next)
		start := time.Now()
		holder.passAtReturn()
		time.Sleep(took)
		holder.leave()
		elapsed := time.Since(start) // the queue's measure lies within it
		require.True(t, <-entered)
		switch {
		case took > 0:
			assert.True(t, next.handoffSlow(), "after a handoff of %v", took)
		case elapsed < slowHandoff:
			assert.False(t, next.handoffSlow(), "after a handoff of less than %v", elapsed)
		default:
			t.Logf("the quick handoff took %v, past %v (a loaded machine): not judged", elapsed, slowHandoff)
		}
	}
	tickets[2].leave()
	assert.Zero(t, QueueRefs())
}

// A fake makes a test's attempts: each finds an outcome, given the bound
// the loop gave it. fakeAttempts makes it an attempter.
type fake interface {
	attempt(ctx context.Context, b bound) (outcome, error)
}

// A fakeAcquirer is a fake that runs fn.
type fakeAcquirer interface {
	fake
	keeper
}

// fakeAttempts is a fake as an attempter: its outcomes are answers of the
// lock statement, in a transaction that ends without a server. The fake's
// bound is the loop's: prevEnd is the ticket's, which the loop keeps equal
// to its bound's, even for a window, whose request carries none.
type fakeAttempts struct {
	f fake
	t *ticket
}

func (a fakeAttempts) Attempt(ctx context.Context, r driver.Request) (driver.Result, error) {
	b := bound{deadline: r.Deadline, waitCtx: r.WaitCtx, window: r.Window, prevEnd: r.PrevEnd}
	if a.t != nil {
		b.prevEnd = a.t.prevEnd
	}
	out, err := a.f.attempt(ctx, b)
	if err != nil {
		return driver.Result{}, err
	}
	switch out {
	case busy:
		return driver.Result{Tx: fakeTx{}}, nil
	case granted:
		return driver.Result{Tx: fakeTx{}, Rows: 1}, nil
	case standby:
		return driver.Result{Tx: fakeTx{}, Rows: 2}, nil
	}
	panic(fmt.Sprintf("a fake's attempt found outcome %d", out))
}

// IdleConn is the fake's idleConn, if it has one.
func (a fakeAttempts) IdleConn() bool {
	p, ok := a.f.(interface{ idleConn() bool })
	return ok && p.idleConn()
}

// fakeTx is a fake's transaction: the fake's hold runs fn.
type fakeTx struct{}

func (fakeTx) Fn(context.Context) error     { return nil }
func (fakeTx) Commit(context.Context) error { return nil }
func (fakeTx) Rollback() error              { return nil }
func (fakeTx) Close()                       {}

// loopOn runs lockLoop for keys, from a first round's state of its own: a
// runs fn if it is a keeper.
func loopOn(ctx context.Context, c *config, mode waitMode, a fake, keys []Key, t *ticket) (bool, error) {
	h, _ := a.(keeper)
	ev := &events{}
	ev.start(c.obs, ctx)
	return lockLoop(ctx, c, mode, &plan{c: c, a: fakeAttempts{a, t}, keys: keys}, h, t, &lockState{lock: Lock{Keys: keys, Shared: c.shared, Held: true}, ev: ev.orNil()})
}

// waitOn runs lockLoop's wait alone for lock, whose counts it updates, as
// LockTx does: the granted lock is kept, and runs no fn. A busy try is
// errBusy.
func waitOn(ctx context.Context, c *config, mode waitMode, lock *Lock, a fake, t *ticket) error {
	ev := &events{}
	ev.start(c.obs, ctx)
	st := &lockState{lock: *lock, ev: ev.orNil()}
	ok, err := lockLoop(ctx, c, mode, &plan{c: c, a: fakeAttempts{a, t}, keys: lock.Keys}, nil, t, st)
	*lock = st.lock
	if !ok && err == nil {
		return errBusy
	}
	return err
}

// A fn that panics in a call without an Observer goes on panicking as fn's
// own panic, and no event is reported: the loop reports the lock's end only
// to an Observer.
func TestLoopPanicWithoutObserver(t *testing.T) {
	c := testConfig(t, newFakeClock())
	observerPanics[Released].Store(false)
	a := &retryLock{fakeLock: fakeLock{name: "a", srv: &fakeServer{}}, fail: func(*lockState) error { panic("fn") }}
	assert.PanicsWithValue(t, "fn", func() { _, _ = loopOn(context.Background(), c, c.waitMode(false), a, testKeys, nil) })
	assert.False(t, observerPanics[Released].Load(), "an event was reported without an Observer")
}

// After a slow handoff, the turn passes as soon as the holder's lock is
// granted, with a channel that the holder's leave closes; the handoff is
// measured from markHandoff (fn's return). After a quick handoff, or with
// nobody queued, the holder keeps the turn.
func TestHandOnAtGrant(t *testing.T) {
	h := new(int)
	holder, next := newTicket(h, false), newTicket(h, false)
	require.True(t, holder.enter(context.Background(), nil))
	assert.False(t, holder.passAtGrant(), "nobody is queued")

	entered := queueBehind(t, holder, next)
	assert.False(t, holder.passAtGrant(), "no handoff was slow yet")

	queues.Lock()
	holder.q.handoff = 2 * slowHandoff
	queues.Unlock()
	require.True(t, holder.passAtGrant())
	require.True(t, <-entered, "the turn passed at the grant")
	require.NotNil(t, next.prevEnd)
	select {
	case <-next.prevEnd:
		t.Fatal("the turn's channel is closed before the holder's transaction ended")
	default:
	}
	start := time.Now()
	holder.markHandoff()
	holder.leave()
	elapsed := time.Since(start)
	<-next.prevEnd // closed by leave
	if elapsed < slowHandoff {
		assert.False(t, next.handoffSlow(), "measured from fn's return: %v", elapsed)
	}
	next.leave()
	assert.Zero(t, QueueRefs())
}

// Calls with and without a holder's label, or with different ones, share a
// local queue: its name is the lock statement without the label.
func TestQueueStmtIgnoresOwner(t *testing.T) {
	keys := []Key{Int64Key(7)}
	var plain, labelled, other config
	require.NoError(t, plain.init(nil, false))
	require.NoError(t, labelled.init([]Option{WithOwner("a $txlock$ label")}, false))
	require.NoError(t, other.init([]Option{WithOwner("another")}, false))
	var readOnly config
	require.NoError(t, readOnly.init([]Option{WithTxOptions(&sql.TxOptions{ReadOnly: true})}, false))
	p := lockStatement(plain.specOf(keys, formOwnTx), formOwnTx)
	l := lockStatement(labelled.specOf(keys, formOwnTx), formOwnTx)
	o := lockStatement(other.specOf(keys, formOwnTx), formOwnTx)
	require.NotEqual(t, p, l)
	assert.Equal(t, p, (&plan{c: &plain, keys: keys, stmt: p}).queueStmt())
	assert.Equal(t, p, (&plan{c: &labelled, keys: keys, stmt: l}).queueStmt())
	assert.Equal(t, p, (&plan{c: &other, keys: keys, stmt: o}).queueStmt())
	r := lockStatement(readOnly.specOf(keys, formOwnTx), formOwnTx)
	require.NotEqual(t, p, r, "a READ ONLY call's test for recovery")
	assert.Equal(t, p, (&plan{c: &readOnly, keys: keys, stmt: r}).queueStmt())
}
