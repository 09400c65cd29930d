package txlock

// Tests of the events and the slog adapter without a database, through the
// fake attempter and clock of wait_test.go. observe_db_test.go checks the
// events of every path against a real PostgreSQL.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an Observer that records every event.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) Observe(ctx context.Context, e Event) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	return ctx
}

func (r *recorder) kinds() []EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var k []EventKind
	for _, e := range r.events {
		k = append(k, e.Kind)
	}
	return k
}

// clockLock is a fakeLock whose lock is busy for its first busyFor
// attempts, and whose fn takes holdFor on the fake clock and returns fnErr.
type clockLock struct {
	clk     *fakeClock
	busyFor int
	holdFor time.Duration
	fnErr   error
	n       int
	fn      func(ctx context.Context)
}

func (l *clockLock) attempt(ctx context.Context, b bound) (outcome, error) {
	l.n++
	if l.n <= l.busyFor {
		l.clk.advance(time.Millisecond)
		return busy, nil
	}
	return granted, nil
}

func (l *clockLock) hold(st *lockState, pass func()) error {
	st.Context = context.Background()
	if l.fn != nil {
		l.fn(st)
	}
	l.clk.advance(l.holdFor)
	return l.fnErr
}

func (l *clockLock) holdUnlocked(ctx context.Context, st *lockState) error {
	return l.hold(st, nil)
}

func (l *clockLock) pooled() bool { return false }

func TestEventsInOrder(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name  string
		lock  clockLock
		opts  []Option
		try   bool
		kinds []EventKind
	}{
		{"uncontended", clockLock{holdFor: 5 * time.Millisecond}, nil, false,
			[]EventKind{WaitStarted, Acquired, Released}},
		{"contended", clockLock{busyFor: 2, holdFor: 5 * time.Millisecond}, []Option{WithRetry(ConstantBackoff{Interval: 10 * time.Millisecond})}, false,
			[]EventKind{WaitStarted, Busy, Busy, Acquired, Released}},
		{"fn error", clockLock{fnErr: boom}, nil, false,
			[]EventKind{WaitStarted, Acquired, Released}},
		{"timeout", clockLock{busyFor: 100}, []Option{WithRetry(ConstantBackoff{Interval: 10 * time.Millisecond}), WithTimeout(25 * time.Millisecond)}, false,
			[]EventKind{WaitStarted, Busy, Busy, Busy, TimedOut}},
		{"fail open", clockLock{busyFor: 100}, []Option{WithRetry(NoRetry), WithFailOpen(slog.New(slog.DiscardHandler))}, false,
			[]EventKind{WaitStarted, Busy, TimedOut, FailedOpen}},
		{"try busy", clockLock{busyFor: 1}, nil, true,
			[]EventKind{WaitStarted, Busy, Skipped}},
		{"hold bound", clockLock{fnErr: fmt.Errorf("fn: %w", ErrHoldTimeout)}, nil, false,
			[]EventKind{WaitStarted, Acquired, HoldTimeout, Released}},
		{"serialization retry", clockLock{fnErr: sqlStateError("40001")}, []Option{WithSerializationRetries(1)}, false,
			[]EventKind{WaitStarted, Acquired, Released, SerializationRetry, WaitStarted, Acquired, Released}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			rec := &recorder{}
			c := testConfig(t, clk, append(tc.opts, WithObserver(rec))...)
			l := tc.lock
			l.clk = clk
			_, err := loopOn(context.Background(), c, c.waitMode(tc.try), &l, testKeys, nil)
			assert.Equal(t, tc.kinds, rec.kinds())
			for _, e := range rec.events {
				assert.Equal(t, testKeys, e.Keys, "%v carries the keys", e.Kind)
			}
			last := rec.events[len(rec.events)-1]
			switch last.Kind {
			case Released:
				assert.Equal(t, err == nil, last.Committed)
				assert.Equal(t, err, last.Err)
				assert.Equal(t, tc.lock.holdFor, last.Held, "held for exactly fn's time on the fake clock")
			case TimedOut:
				var te *LockTimeoutError
				require.ErrorAs(t, last.Err, &te)
				assert.Equal(t, te.Attempts, last.Attempts)
				assert.Equal(t, te.Waited, last.Waited)
			}
		})
	}
}

// A fn that panics still reports Released, with Committed false, before
// the panic continues.
func TestEventsReleasedOnPanic(t *testing.T) {
	clk := newFakeClock()
	rec := &recorder{}
	c := testConfig(t, clk, WithObserver(rec))
	l := &clockLock{clk: clk, fn: func(context.Context) { panic("fn bug") }}
	assert.PanicsWithValue(t, "fn bug", func() {
		_, _ = loopOn(context.Background(), c, c.waitMode(false), l, testKeys, nil)
	})
	assert.Equal(t, []EventKind{WaitStarted, Acquired, Released}, rec.kinds())
	last := rec.events[2]
	assert.False(t, last.Committed)
	assert.ErrorIs(t, last.Err, errFnPanicked)
}

// SerializationRetry means fn runs again: when the context ends in the
// pause before the retry, there is none.
func TestEventsNoRetryAfterContextEnds(t *testing.T) {
	rec := &recorder{}
	c := testConfig(t, nil, WithObserver(rec), WithSerializationRetries(3), WithRetry(ConstantBackoff{Interval: time.Hour}))
	ctx, cancel := context.WithCancel(context.Background())
	l := &clockLock{clk: newFakeClock(), fnErr: sqlStateError("40001"), fn: func(context.Context) {
		go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	}}
	_, err := loopOn(ctx, c, c.waitMode(false), l, testKeys, nil)
	assert.Equal(t, "40001", SQLState(err))
	assert.Equal(t, []EventKind{WaitStarted, Acquired, Released}, rec.kinds())
}

// A wait that ends in an error that is not about the lock ends with Failed.
func TestEventsFailed(t *testing.T) {
	rec := &recorder{}
	c := testConfig(t, newFakeClock(), WithObserver(rec))
	boom := errors.New("txlock: begin: connection refused")
	lock := Lock{Keys: testKeys}
	err := waitOn(context.Background(), c, c.waitMode(false), &lock, attempterFunc(func(context.Context, bound) (outcome, error) { return busy, boom }), nil)
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, []EventKind{WaitStarted, Failed}, rec.kinds())
	assert.Equal(t, boom, rec.events[1].Err)

	// A try whose context has already ended fails without an attempt.
	rec.events = nil
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = waitOn(ctx, c, tryOnce, &lock, attempterFunc(func(context.Context, bound) (outcome, error) { panic("no attempt") }), nil)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []EventKind{WaitStarted, Canceled}, rec.kinds(), "a cancelled try is counted as a cancellation")

	// One whose deadline has passed is a try that was not attempted.
	rec.events = nil
	dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	err = waitOn(dctx, c, tryOnce, &lock, attempterFunc(func(context.Context, bound) (outcome, error) { panic("no attempt") }), nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "not attempted")
	assert.Equal(t, []EventKind{WaitStarted, Failed}, rec.kinds())
}

// Acquired carries the attempts and the time waited, which the Lock agrees
// with; busy events count up.
func TestEventsCounts(t *testing.T) {
	clk := newFakeClock()
	rec := &recorder{}
	c := testConfig(t, clk, WithRetry(ConstantBackoff{Interval: 10 * time.Millisecond}), WithObserver(rec))
	var lock Lock
	l := &clockLock{clk: clk, busyFor: 3, fn: func(ctx context.Context) { lock, _ = LockFromContext(ctx) }}
	_, err := loopOn(context.Background(), c, c.waitMode(false), l, testKeys, nil)
	require.NoError(t, err)
	var busy []int
	for _, e := range rec.events {
		if e.Kind == Busy {
			busy = append(busy, e.Attempts)
		}
	}
	assert.Equal(t, []int{1, 2, 3}, busy)
	acq := rec.events[4]
	require.Equal(t, Acquired, acq.Kind)
	assert.Equal(t, 4, acq.Attempts)
	// Three busy attempts of 1 ms and three sleeps of 10 ms.
	assert.Equal(t, 33*time.Millisecond, acq.Waited)
	assert.Equal(t, lock.Waited, acq.Waited)
	assert.Equal(t, lock.Attempts, acq.Attempts)
}

type ctxKey string

// The context an Observer returns reaches the call's later events, and
// fn's context answers its values.
func TestObserverContextThreads(t *testing.T) {
	clk := newFakeClock()
	var seen []string
	obs := ObserverFunc(func(ctx context.Context, e Event) context.Context {
		v, _ := ctx.Value(ctxKey("span")).(string)
		seen = append(seen, e.Kind.String()+"<"+v)
		switch e.Kind {
		case WaitStarted:
			return context.WithValue(ctx, ctxKey("span"), "wait")
		case Acquired:
			return context.WithValue(ctx, ctxKey("span"), "hold")
		}
		return nil // nil: keep the context
	})
	c := testConfig(t, clk, WithObserver(obs))
	var inFn any
	l := &clockLock{clk: clk, busyFor: 1, fn: func(ctx context.Context) { inFn = ctx.Value(ctxKey("span")) }}
	_, err := loopOn(context.Background(), c, c.waitMode(false), l, testKeys, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"wait_started<", "busy<wait", "acquired<wait", "released<hold"}, seen)
	assert.Equal(t, "hold", inFn, "fn's context sees the value the Observer put in at Acquired")
}

// An Observer that panics does not break the lock: the call succeeds, the
// later events still arrive, and the panic is logged once per event kind.
func TestObserverPanicRecovered(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	for i := range observerPanics {
		observerPanics[i].Store(false)
	}
	rec := &recorder{}
	obs := Observers(ObserverFunc(func(ctx context.Context, e Event) context.Context {
		if e.Kind == Acquired {
			panic("observer bug")
		}
		return ctx
	}), nil, rec)
	clk := newFakeClock()
	for range 2 {
		c := testConfig(t, clk, WithObserver(obs))
		ok, err := loopOn(context.Background(), c, c.waitMode(false), &clockLock{clk: clk}, testKeys, nil)
		require.NoError(t, err)
		assert.True(t, ok)
	}
	assert.Equal(t, []EventKind{WaitStarted, Released, WaitStarted, Released}, rec.kinds(),
		"a panic in the first observer skips the rest for that event only")
	assert.Equal(t, 1, strings.Count(buf.String(), "an Observer panicked"), "logged once: %s", buf.String())
	assert.Contains(t, buf.String(), "event=acquired")
	assert.Contains(t, buf.String(), `panic="observer bug"`)
}

// A slow Observer delays its caller, and nothing else: the lock is still
// acquired and released, in order.
func TestObserverSlow(t *testing.T) {
	rec := &recorder{}
	slow := Observers(ObserverFunc(func(ctx context.Context, e Event) context.Context {
		time.Sleep(20 * time.Millisecond)
		return ctx
	}), rec)
	c := testConfig(t, nil, WithObserver(slow))
	srv := &fakeServer{}
	ok, err := loopOn(context.Background(), c, c.waitMode(false), &fakeLock{name: "a", srv: srv}, testKeys, nil)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, []EventKind{WaitStarted, Acquired, Released}, rec.kinds())
	assert.Empty(t, srv.holder, "released")
}

// The slog adapter's output, golden, with the fake clock's exact durations.
func TestSlogObserverGolden(t *testing.T) {
	var buf bytes.Buffer
	h := slog.NewTextHandler(&buf, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	})
	obs := SlogObserver(slog.New(h))
	clk := newFakeClock()
	keys := []Key{StringKey("orders:42")}
	runOne := func(l *clockLock, opts ...Option) {
		l.clk = clk
		c := testConfig(t, clk, append(opts, WithObserver(obs))...)
		_, _ = loopOn(context.Background(), c, c.waitMode(false), l, keys, nil)
	}
	runOne(&clockLock{busyFor: 1, holdFor: 7 * time.Millisecond}, WithRetry(ConstantBackoff{Interval: 10 * time.Millisecond}))
	runOne(&clockLock{busyFor: 100}, WithRetry(NoRetry))
	runOne(&clockLock{fnErr: ErrHoldTimeout, holdFor: 50 * time.Millisecond})
	ctx := context.Background()
	obs.Observe(ctx, Event{Kind: StandbyRefused, Keys: keys, Attempts: 1})
	obs.Observe(ctx, Event{Kind: TokenIssued, Keys: keys, Token: 42, Sequence: `"public"."txlock_fence_seq"`})
	obs.Observe(ctx, Event{Kind: StaleWrite, Table: `"stock"`, Token: 41, Current: 42, Err: &StaleTokenError{Table: `"stock"`, Token: 41, Current: 42}})
	obs.Observe(ctx, Event{Kind: TermLost, Keys: keys, Held: 3 * time.Second, Token: 7, Err: fmt.Errorf("%w: heartbeat failed", ErrLockLost)})

	const golden = `level=DEBUG msg="txlock: wait_started" keys="\"orders:42\" bigint(-8476019149258318077)"
level=DEBUG msg="txlock: busy" keys="\"orders:42\" bigint(-8476019149258318077)" attempts=1 waited=1ms
level=DEBUG msg="txlock: acquired" keys="\"orders:42\" bigint(-8476019149258318077)" attempts=2 waited=11ms
level=DEBUG msg="txlock: released" keys="\"orders:42\" bigint(-8476019149258318077)" held=7ms committed=true
level=DEBUG msg="txlock: wait_started" keys="\"orders:42\" bigint(-8476019149258318077)"
level=DEBUG msg="txlock: busy" keys="\"orders:42\" bigint(-8476019149258318077)" attempts=1 waited=1ms
level=WARN msg="txlock: timed_out" keys="\"orders:42\" bigint(-8476019149258318077)" attempts=1 waited=1ms err="txlock: lock wait timed out: \"orders:42\" bigint(-8476019149258318077) not granted after 1 attempts in 1ms"
level=DEBUG msg="txlock: wait_started" keys="\"orders:42\" bigint(-8476019149258318077)"
level=DEBUG msg="txlock: acquired" keys="\"orders:42\" bigint(-8476019149258318077)" attempts=1 waited=0s
level=WARN msg="txlock: hold_timeout" keys="\"orders:42\" bigint(-8476019149258318077)" held=50ms
level=WARN msg="txlock: released" keys="\"orders:42\" bigint(-8476019149258318077)" held=50ms committed=false err="txlock: lock held past its WithMaxHold bound"
level=ERROR msg="txlock: standby_refused" keys="\"orders:42\" bigint(-8476019149258318077)" attempts=1 waited=0s
level=DEBUG msg="txlock: token_issued" keys="\"orders:42\" bigint(-8476019149258318077)" token=42 sequence="\"public\".\"txlock_fence_seq\""
level=WARN msg="txlock: stale_write" table="\"stock\"" token=41 current=42
level=WARN msg="txlock: term_lost" keys="\"orders:42\" bigint(-8476019149258318077)" held=3s token=7 err="txlock: lock lost: heartbeat failed"
`
	assert.Equal(t, golden, buf.String())

	// Below its level the adapter does not build the record.
	buf.Reset()
	quiet := SlogObserver(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	quiet.Observe(ctx, Event{Kind: Acquired, Keys: keys})
	assert.Empty(t, buf.String())
}

func TestEventKeyspace(t *testing.T) {
	billing, orders := NewKeyspace("billing"), NewKeyspace("orders")
	for _, tc := range []struct {
		keys  []Key
		name  string
		mixed bool
	}{
		{nil, "", false},
		{[]Key{billing.Key("a")}, "billing", false},
		{[]Key{billing.Key("a"), billing.ID(7)}, "billing", false},
		{[]Key{billing.Key("a"), orders.Key("a")}, "", true},
		{[]Key{StringKey("a"), billing.Key("a")}, "", true},
		{[]Key{StringKey("a"), KeyspaceID(3).ID(1)}, "", false},
	} {
		name, mixed := Event{Keys: tc.keys}.Keyspace()
		assert.Equal(t, tc.name, name, "%v", tc.keys)
		assert.Equal(t, tc.mixed, mixed, "%v", tc.keys)
	}
}
