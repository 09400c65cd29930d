package txlock_test

// The lock events (observe.go) of every path, against a real PostgreSQL, and
// through PgBouncer where the path's statements differ there: each event
// fires, in the documented order, with durations no shorter than what
// really happened (a holder on another connection that kept the key, a fn
// that slept) and with counts of the attempts really made. observe_test.go
// checks the same against a fake clock, to the nanosecond; here only lower
// bounds are asserted, as this machine is shared and loaded.

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// obsLog is an Observer that records every event it is told of, and when it
// was told. If on is set, it is called with each event after it is
// recorded, on the observing goroutine.
type obsLog struct {
	mu     sync.Mutex
	events []txlock.Event
	at     []time.Time
	on     func(e txlock.Event)
}

func (l *obsLog) Observe(ctx context.Context, e txlock.Event) context.Context {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.at = append(l.at, time.Now())
	on := l.on
	l.mu.Unlock()
	if on != nil {
		on(e)
	}
	return ctx
}

// take returns the events recorded so far, and forgets them.
func (l *obsLog) take() []txlock.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	evs := l.events
	l.events, l.at = nil, nil
	return evs
}

// seenAt returns when the first event of kind k was observed.
func (l *obsLog) seenAt(t *testing.T, k txlock.EventKind) time.Time {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range l.events {
		if e.Kind == k {
			return l.at[i]
		}
	}
	t.Fatalf("no %v event", k)
	return time.Time{}
}

func kindsOf(evs []txlock.Event) []txlock.EventKind {
	k := make([]txlock.EventKind, len(evs))
	for i, e := range evs {
		k[i] = e.Kind
	}
	return k
}

// namesOf names kinds, for readable failures.
func namesOf(kinds []txlock.EventKind) []string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.String()
	}
	return names
}

// waitRound checks that evs is one wait as the Observer documents it:
// WaitStarted, then at least minBusy Busy events, then exactly the kinds of
// tail. The Busy events must count the attempts 1..n, with Waited never
// going down. It returns the Busy events and the tail's events.
func waitRound(t *testing.T, evs []txlock.Event, minBusy int, tail ...txlock.EventKind) (busy, rest []txlock.Event) {
	t.Helper()
	require.NotEmpty(t, evs)
	require.Equal(t, txlock.WaitStarted, evs[0].Kind, "the first event: %v", kindsOf(evs))
	assert.Zero(t, evs[0].Attempts, "nothing attempted yet at WaitStarted")
	i := 1
	for i < len(evs) && evs[i].Kind == txlock.Busy {
		i++
	}
	busy, rest = evs[1:i], evs[i:]
	require.GreaterOrEqual(t, len(busy), minBusy, "busy events: %v", kindsOf(evs))
	require.Equal(t, namesOf(tail), namesOf(kindsOf(rest)), "the events after the busy ones: %v", kindsOf(evs))
	var last time.Duration
	for n, e := range busy {
		assert.Equal(t, n+1, e.Attempts, "busy event %d counts its attempt", n+1)
		assert.GreaterOrEqual(t, e.Waited, last, "busy event %d: Waited went down", n+1)
		last = e.Waited
	}
	return busy, rest
}

// assertKeys checks that every event carries the call's keys.
func assertKeys(t *testing.T, evs []txlock.Event, keys []txlock.Key, shared bool) {
	t.Helper()
	for _, e := range evs {
		assert.Equal(t, keys, e.Keys, "%v carries the call's keys", e.Kind)
		assert.Equal(t, shared, e.Shared, "%v: Shared", e.Kind)
	}
}

// sameErr checks that got is the very error want (the same value), as an
// event's Err must be what the call returned.
func sameErr(t *testing.T, want, got error, what string) {
	t.Helper()
	assert.Truef(t, want == got, "%s: the event's Err is %v, the call returned %v", what, got, want)
}

// delayedRelease holds a key from another connection and lets it go d
// after the observed call's wait began (its first WaitStarted event), so
// that the call cannot be granted the key sooner than d after the start of
// its wait, and not before the call has reported minBusy Busy events, so
// that a call slowed down by a loaded machine still finds the key busy as
// often as the test expects. (Should those events never come, it lets go
// 10s later, and the test fails on their absence.)
type delayedRelease struct {
	d        time.Duration
	minBusy  int
	release  func()
	once     sync.Once
	started  time.Time      // when the observer was told of WaitStarted
	busy     int            // Busy events seen, on the observing goroutine
	busied   chan struct{}  // closed at the minBusy-th Busy event
	released chan time.Time // when the holder began to let go
}

func newDelayedRelease(t *testing.T, db *sql.DB, key txlock.Key, d time.Duration, minBusy int) *delayedRelease {
	r := &delayedRelease{d: d, minBusy: minBusy, release: hold(t, db, key, false), busied: make(chan struct{}), released: make(chan time.Time, 1)}
	if minBusy == 0 {
		close(r.busied)
	}
	return r
}

// observe is the obsLog hook that starts the countdown, and counts the
// Busy events.
func (r *delayedRelease) observe(e txlock.Event) {
	switch e.Kind {
	case txlock.WaitStarted:
		r.once.Do(func() {
			r.started = time.Now()
			time.AfterFunc(r.d, func() {
				select {
				case <-r.busied:
				case <-time.After(10 * time.Second):
				}
				r.released <- time.Now()
				r.release()
			})
		})
	case txlock.Busy:
		if r.busy++; r.busy == r.minBusy {
			close(r.busied)
		}
	}
}

// kept returns how long, from the start of the wait, the holder kept the
// key: at least d.
func (r *delayedRelease) kept(t *testing.T) time.Duration {
	t.Helper()
	select {
	case at := <-r.released:
		k := at.Sub(r.started)
		require.GreaterOrEqual(t, k, r.d)
		return k
	case <-time.After(30 * time.Second):
		t.Fatal("the holder never let go")
		return 0
	}
}

// obsHeld is heldBy for an Observer, where a failed require would end the
// goroutine in the middle of the library's call: -1 on an error.
func obsHeld(db *sql.DB, k txlock.Key) int {
	classid, objid, objsubid := txlock.PgLocksOf(k)
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1 AND objid = $2 AND objsubid = $3
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(classid), int64(objid), objsubid).Scan(&n); err != nil {
		return -1
	}
	return n
}

// obsDBs are the ways to reach the server for paths whose statements
// PgBouncer could treat differently.
var obsDBs = []struct {
	name string
	db   func(t testing.TB) *sql.DB
}{
	{"direct", direct},
	{"pgbouncer/exec", func(t testing.TB) *sql.DB { db, _ := bouncer(t, "exec"); return db }},
}

// Polling: a holder on another connection keeps the key for 200ms of the
// wait. WaitStarted, then Busy for attempts 1..n, then Acquired with n+1
// attempts and a Waited no shorter than the hold, then Released after fn,
// with Held no shorter than fn's sleep.
func TestObservePolling(t *testing.T) {
	for _, tc := range obsDBs {
		t.Run(tc.name, func(t *testing.T) {
			admin := direct(t)
			db := tc.db(t)
			key := txlock.StringKey(uniq(t))
			r := newDelayedRelease(t, db, key, 200*time.Millisecond, 1)
			const interval = 20 * time.Millisecond
			const sleep = 50 * time.Millisecond
			var heldAtAcquired, heldAtReleased int
			log := &obsLog{on: func(e txlock.Event) {
				r.observe(e)
				switch e.Kind {
				case txlock.Acquired:
					heldAtAcquired = obsHeld(admin, key)
				case txlock.Released:
					heldAtReleased = obsHeld(admin, key)
				}
			}}
			var lock txlock.Lock
			var fnStart, fnEnd time.Time
			err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
				fnStart = time.Now()
				lock, _ = txlock.LockFromContext(ctx)
				time.Sleep(sleep)
				fnEnd = time.Now()
				return nil
			}, txlock.WithObserver(log), txlock.WithRetry(txlock.ConstantBackoff{Interval: interval}), txlock.WithTimeout(20*time.Second))
			require.NoError(t, err)
			kept := r.kept(t)

			acquiredAt, releasedAt := log.seenAt(t, txlock.Acquired), log.seenAt(t, txlock.Released)
			evs := log.take()
			assertKeys(t, evs, []txlock.Key{key}, false)
			busy, rest := waitRound(t, evs, 1, txlock.Acquired, txlock.Released)
			acq, rel := rest[0], rest[1]
			n := len(busy)
			t.Logf("%d busy attempts; waited %v, the holder kept the key %v; held %v", n, acq.Waited, kept, rel.Held)
			assert.Equal(t, n+1, acq.Attempts, "Acquired counts the busy attempts and the granted one")
			assert.GreaterOrEqual(t, acq.Waited, kept, "Acquired.Waited covers the time the holder kept the key")
			assert.GreaterOrEqual(t, acq.Waited, busy[n-1].Waited)
			assert.Less(t, acq.Waited, 20*time.Second)
			// After the first busy attempt the call joins its local queue
			// and tries again at once; every later one sleeps interval.
			assert.LessOrEqual(t, time.Duration(n-2)*interval, acq.Waited, "%d busy attempts cannot fit in %v with %v sleeps", n, acq.Waited, interval)
			assert.Equal(t, lock.Attempts, acq.Attempts, "the Lock agrees")
			assert.Equal(t, lock.Waited, acq.Waited, "the Lock agrees")
			assert.Equal(t, 1, heldAtAcquired, "Acquired fires once the key is granted")

			assert.True(t, rel.Committed)
			assert.NoError(t, rel.Err)
			assert.GreaterOrEqual(t, rel.Held, sleep, "Released.Held covers fn's sleep")
			assert.Equal(t, acq.Attempts, rel.Attempts)
			assert.Equal(t, acq.Waited, rel.Waited)
			assert.Zero(t, heldAtReleased, "Released fires once the transaction, and the lock, have ended")
			assert.False(t, acquiredAt.After(fnStart), "Acquired is told before fn runs")
			assert.False(t, releasedAt.Before(fnEnd), "Released is told after fn returns")
		})
	}
}

// Released after fn's error, after a commit that fails, and after a commit:
// Committed says whether the transaction committed, and Err is what the
// call returned.
func TestObserveReleased(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	log := &obsLog{}
	opt := txlock.WithObserver(log)
	const sleep = 30 * time.Millisecond

	released := func(t *testing.T, err error) txlock.Event {
		t.Helper()
		evs := log.take()
		assertKeys(t, evs, []txlock.Key{key}, false)
		_, rest := waitRound(t, evs, 0, txlock.Acquired, txlock.Released)
		rel := rest[1]
		sameErr(t, err, rel.Err, "Released")
		assert.Equal(t, 1, rel.Attempts)
		return rel
	}

	t.Run("commit", func(t *testing.T) {
		err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			time.Sleep(sleep)
			return nil
		}, opt)
		require.NoError(t, err)
		rel := released(t, err)
		assert.True(t, rel.Committed)
		assert.GreaterOrEqual(t, rel.Held, sleep)
	})

	t.Run("fn error", func(t *testing.T) {
		boom := errors.New("boom")
		err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			time.Sleep(sleep)
			return boom
		}, opt)
		require.ErrorIs(t, err, boom)
		rel := released(t, err)
		assert.False(t, rel.Committed)
		assert.ErrorIs(t, rel.Err, boom)
		assert.GreaterOrEqual(t, rel.Held, sleep)
	})

	t.Run("commit fails", func(t *testing.T) {
		// A deferred unique constraint is checked by COMMIT: fn returns nil,
		// and the transaction still does not commit.
		table := "obs_deferred_" + strconv.FormatInt(time.Now().UnixNano(), 10)
		_, err := db.Exec(`CREATE TABLE ` + table + ` (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
		err = txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES (1), (1)`)
			return err
		}, opt)
		require.ErrorIs(t, err, txlock.ErrCommitFailed)
		rel := released(t, err)
		assert.False(t, rel.Committed, "the commit failed")
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&n))
		assert.Zero(t, n)
	})
}

// A fn that panics: its transaction is rolled back, and that ends the lock
// as any other end does, with Released (not committed).
func TestObserveReleasedAfterPanic(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	log := &obsLog{}
	func() {
		defer func() { assert.Equal(t, "fn bug", recover(), "the panic continues") }()
		_ = txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
			panic("fn bug")
		}, txlock.WithObserver(log))
	}()
	assert.Zero(t, heldBy(t, db, key), "the transaction was rolled back")
	evs := log.take()
	assertKeys(t, evs, []txlock.Key{key}, false)
	_, rest := waitRound(t, evs, 0, txlock.Acquired, txlock.Released)
	assert.False(t, rest[1].Committed)
}

// ServerWait: each window that passes while another connection holds the
// key is one Busy event, and each lasted at least the window.
func TestObserveServerWait(t *testing.T) {
	const window = 50 * time.Millisecond
	const holdFor = 400 * time.Millisecond
	for _, tc := range obsDBs {
		t.Run(tc.name, func(t *testing.T) {
			db := tc.db(t)
			key := txlock.StringKey(uniq(t))
			r := newDelayedRelease(t, db, key, holdFor, 2)
			log := &obsLog{on: r.observe}
			const sleep = 20 * time.Millisecond
			err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
				time.Sleep(sleep)
				return nil
			}, txlock.WithObserver(log), txlock.WithServerWait(txlock.ServerWait{Window: window}), txlock.WithTimeout(20*time.Second))
			require.NoError(t, err)
			kept := r.kept(t)

			evs := log.take()
			assertKeys(t, evs, []txlock.Key{key}, false)
			// The holder kept the key for 8 windows, and until the first two
			// had passed.
			busy, rest := waitRound(t, evs, 2, txlock.Acquired, txlock.Released)
			for i, e := range busy {
				assert.GreaterOrEqual(t, e.Waited, time.Duration(i+1)*window, "busy event %d comes after %d whole windows", i+1, i+1)
			}
			acq := rest[0]
			t.Logf("%d windows passed; waited %v, the holder kept the key %v", len(busy), acq.Waited, kept)
			assert.Equal(t, len(busy)+1, acq.Attempts)
			assert.GreaterOrEqual(t, acq.Waited, kept)
			assert.True(t, rest[1].Committed)
			assert.GreaterOrEqual(t, rest[1].Held, sleep)
		})
	}
}

// Try: one attempt. A busy lock is WaitStarted, Busy and Skipped: no
// TimedOut, with any option.
func TestObserveTry(t *testing.T) {
	db := direct(t)
	key, other := txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t))
	log := &obsLog{}
	opt := txlock.WithObserver(log)
	ctx := context.Background()
	ran := false
	fn := func(context.Context, *sql.Tx) error { ran = true; return nil }

	release := hold(t, db, key, false)
	ok, err := txlock.TryWithLock(ctx, db, key, fn, opt)
	require.NoError(t, err)
	assert.False(t, ok)
	busy, _ := waitRound(t, log.take(), 1, txlock.Skipped)
	assert.Len(t, busy, 1)

	// A ServerWait window does not make a try wait.
	ok, err = txlock.TryWithLock(ctx, db, key, fn, opt, txlock.WithServerWait(txlock.ServerWait{Window: 10 * time.Second}))
	require.NoError(t, err)
	assert.False(t, ok)
	busy, _ = waitRound(t, log.take(), 1, txlock.Skipped)
	require.Len(t, busy, 1)
	assert.Less(t, busy[0].Waited, 10*time.Second, "the try did not wait out the window")

	ok, err = txlock.TryWithLocks(ctx, db, []txlock.Key{other, key}, fn, opt)
	require.NoError(t, err)
	assert.False(t, ok)
	evs := log.take()
	busy, _ = waitRound(t, evs, 1, txlock.Skipped)
	assert.Len(t, busy, 1)
	assert.Len(t, evs[0].Keys, 2)

	tx, err := db.Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	ok, err = txlock.TryLockTx(ctx, tx, key, opt)
	require.NoError(t, err)
	assert.False(t, ok)
	busy, _ = waitRound(t, log.take(), 1, txlock.Skipped)
	assert.Len(t, busy, 1)
	assert.False(t, ran)

	release()
	ok, err = txlock.TryWithLock(ctx, db, key, fn, opt)
	require.NoError(t, err)
	assert.True(t, ok)
	_, rest := waitRound(t, log.take(), 0, txlock.Acquired, txlock.Released)
	assert.Equal(t, 1, rest[0].Attempts)
	assert.True(t, rest[1].Committed)

	ok, err = txlock.TryLockTx(ctx, tx, key, opt)
	require.NoError(t, err)
	assert.True(t, ok)
	_, rest = waitRound(t, log.take(), 0, txlock.Acquired)
	assert.Equal(t, 1, rest[0].Attempts)
	require.NoError(t, tx.Commit())
	assert.Empty(t, log.take(), "the caller's commit ends a TryLockTx lock: no event")
}

// Multi-key: every event carries the keys in canonical order, whatever
// order the call gave them in, without duplicates.
func TestObserveMultiKey(t *testing.T) {
	db := direct(t)
	a, b := txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t))
	r := newDelayedRelease(t, db, b, 200*time.Millisecond, 1)
	log := &obsLog{on: r.observe}
	var lock txlock.Lock
	err := txlock.WithLocks(context.Background(), db, []txlock.Key{b, a, b}, func(ctx context.Context, tx *sql.Tx) error {
		lock, _ = txlock.LockFromContext(ctx)
		return nil
	}, txlock.WithObserver(log), txlock.WithRetry(txlock.ConstantBackoff{Interval: 20 * time.Millisecond}), txlock.WithTimeout(20*time.Second))
	require.NoError(t, err)
	kept := r.kept(t)
	evs := log.take()
	require.Len(t, lock.Keys, 2, "the duplicate is dropped")
	assert.ElementsMatch(t, []txlock.Key{a, b}, lock.Keys)
	assertKeys(t, evs, lock.Keys, false)
	busy, rest := waitRound(t, evs, 1, txlock.Acquired, txlock.Released)
	assert.Equal(t, len(busy)+1, rest[0].Attempts)
	assert.GreaterOrEqual(t, rest[0].Waited, kept)
	assert.True(t, rest[1].Committed)

	// The other order gives the same keys, in the same order.
	require.NoError(t, txlock.WithLocks(context.Background(), db, []txlock.Key{a, b}, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(log)))
	evs = log.take()
	assertKeys(t, evs, lock.Keys, false)
	waitRound(t, evs, 0, txlock.Acquired, txlock.Released)

	// Shared locks say so.
	require.NoError(t, txlock.WithLocks(context.Background(), db, []txlock.Key{b, a}, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(log), txlock.WithShared()))
	evs = log.take()
	assertKeys(t, evs, lock.Keys, true)
	waitRound(t, evs, 0, txlock.Acquired, txlock.Released)
}

// LockTx reports the events up to Acquired, polling or in the server's
// queue: the caller's transaction ends the lock, with no event.
func TestObserveLockTx(t *testing.T) {
	for _, tc := range obsDBs {
		t.Run(tc.name, func(t *testing.T) {
			admin := direct(t)
			db := tc.db(t)
			for _, mode := range []struct {
				name    string
				opt     txlock.Option
				window  time.Duration
				minBusy int
			}{
				{"polling", txlock.WithRetry(txlock.ConstantBackoff{Interval: 20 * time.Millisecond}), 0, 1},
				{"serverwait", txlock.WithServerWait(txlock.ServerWait{Window: 50 * time.Millisecond}), 50 * time.Millisecond, 2},
			} {
				t.Run(mode.name, func(t *testing.T) {
					key := txlock.StringKey(uniq(t))
					r := newDelayedRelease(t, db, key, 400*time.Millisecond, mode.minBusy)
					log := &obsLog{on: r.observe}
					tx, err := db.Begin()
					require.NoError(t, err)
					defer tx.Rollback()
					require.NoError(t, txlock.LockTx(context.Background(), tx, key, txlock.WithObserver(log), mode.opt, txlock.WithTimeout(20*time.Second)))
					kept := r.kept(t)
					assert.Equal(t, 1, heldBy(t, admin, key))
					require.NoError(t, tx.Commit())
					assert.Zero(t, heldBy(t, admin, key))

					evs := log.take()
					assertKeys(t, evs, []txlock.Key{key}, false)
					busy, rest := waitRound(t, evs, mode.minBusy, txlock.Acquired)
					for i, e := range busy {
						assert.GreaterOrEqual(t, e.Waited, time.Duration(i+1)*mode.window)
					}
					assert.Equal(t, len(busy)+1, rest[0].Attempts)
					assert.GreaterOrEqual(t, rest[0].Waited, kept)
					for _, e := range evs {
						assert.True(t, e.CallerTx, "%v of LockTx is marked CallerTx", e.Kind)
					}
				})
			}
		})
	}
}

// Timeout: Busy events, then TimedOut, whose Attempts are the busy ones,
// whose Waited is at least the timeout, and whose Err is the call's error.
func TestObserveTimeout(t *testing.T) {
	const timeout = time.Second // room for two attempts on a loaded machine
	timedOut := func(t *testing.T, log *obsLog, key txlock.Key, err error, minBusy int, minWaited time.Duration) []txlock.Event {
		t.Helper()
		evs := log.take()
		assertKeys(t, evs, []txlock.Key{key}, false)
		busy, rest := waitRound(t, evs, minBusy, txlock.TimedOut)
		e := rest[0]
		sameErr(t, err, e.Err, "TimedOut")
		var te *txlock.LockTimeoutError
		require.ErrorAs(t, e.Err, &te)
		assert.Equal(t, len(busy), e.Attempts, "every attempt was busy")
		assert.Equal(t, te.Attempts, e.Attempts)
		assert.Equal(t, te.Waited, e.Waited)
		assert.GreaterOrEqual(t, e.Waited, minWaited)
		if len(busy) > 0 {
			assert.GreaterOrEqual(t, e.Waited, busy[len(busy)-1].Waited)
		}
		return busy
	}
	canceled := func(t *testing.T, log *obsLog, key txlock.Key, err error) {
		t.Helper()
		evs := log.take()
		assertKeys(t, evs, []txlock.Key{key}, false)
		busy, rest := waitRound(t, evs, 0, txlock.Canceled)
		assert.Empty(t, busy, "nothing attempted")
		e := rest[0]
		sameErr(t, err, e.Err, "Canceled")
		var ce *txlock.CanceledError
		require.ErrorAs(t, e.Err, &ce)
		assert.Zero(t, e.Attempts)
		assert.NotErrorIs(t, e.Err, txlock.ErrLockTimeout)
	}
	fn := func(context.Context, *sql.Tx) error {
		t.Error("fn ran without the lock")
		return nil
	}
	for _, tc := range obsDBs {
		t.Run(tc.name, func(t *testing.T) {
			db := tc.db(t)
			key := txlock.StringKey(uniq(t))
			hold(t, db, key, false)
			log := &obsLog{}
			opt := txlock.WithObserver(log)

			t.Run("polling", func(t *testing.T) {
				err := txlock.WithLock(context.Background(), db, key, fn, opt, txlock.WithTimeout(timeout),
					txlock.WithRetry(txlock.ConstantBackoff{Interval: 20 * time.Millisecond}))
				require.ErrorIs(t, err, txlock.ErrLockTimeout)
				timedOut(t, log, key, err, 2, timeout)
			})
			t.Run("serverwait", func(t *testing.T) {
				// A whole window, then the start of the next, must fit in
				// the timeout: twice timeout leaves a loaded machine room.
				const window, longer = 50 * time.Millisecond, 2 * timeout
				err := txlock.WithLock(context.Background(), db, key, fn, opt, txlock.WithTimeout(longer),
					txlock.WithServerWait(txlock.ServerWait{Window: window}))
				require.ErrorIs(t, err, txlock.ErrLockTimeout)
				busy := timedOut(t, log, key, err, 2, longer)
				for i, e := range busy[:len(busy)-1] { // the last window is cut to the deadline
					assert.GreaterOrEqual(t, e.Waited, time.Duration(i+1)*window)
				}
			})
			t.Run("context deadline", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				err := txlock.WithLock(ctx, db, key, fn, opt)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				timedOut(t, log, key, err, 1, 0)
			})
			t.Run("no retry", func(t *testing.T) {
				err := txlock.WithLock(context.Background(), db, key, fn, opt, txlock.WithRetry(txlock.NoRetry))
				require.ErrorIs(t, err, txlock.ErrLockTimeout)
				busy := timedOut(t, log, key, err, 1, 0)
				assert.Len(t, busy, 1)
			})
			t.Run("cancelled before", func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				err := txlock.WithLock(ctx, db, key, fn, opt)
				require.ErrorIs(t, err, context.Canceled)
				canceled(t, log, key, err)
			})
			t.Run("LockTx", func(t *testing.T) {
				tx, err := db.Begin()
				require.NoError(t, err)
				defer tx.Rollback()
				err = txlock.LockTx(context.Background(), tx, key, opt, txlock.WithTimeout(timeout))
				require.ErrorIs(t, err, txlock.ErrLockTimeout)
				timedOut(t, log, key, err, 1, timeout)
			})
		})
	}
}

// Fail-open: TimedOut, then FailedOpen with the same counts, then fn runs
// without the lock, and no Released follows: no lock was held.
func TestObserveFailOpen(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	hold(t, db, key, false)
	log := &obsLog{}
	const timeout = time.Second // long enough for an attempt to complete on a loaded machine
	var fnStart time.Time
	held := true
	err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		fnStart, held = time.Now(), txlock.Held(ctx)
		return nil
	}, txlock.WithObserver(log), txlock.WithTimeout(timeout), txlock.WithFailOpen(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	assert.False(t, held)
	assert.False(t, log.seenAt(t, txlock.FailedOpen).After(fnStart), "FailedOpen is told before fn runs")
	evs := log.take()
	assertKeys(t, evs, []txlock.Key{key}, false)
	busy, rest := waitRound(t, evs, 1, txlock.TimedOut, txlock.FailedOpen)
	to, fo := rest[0], rest[1]
	assert.Equal(t, len(busy), to.Attempts)
	assert.GreaterOrEqual(t, to.Waited, timeout)
	assert.Equal(t, to.Attempts, fo.Attempts)
	assert.Equal(t, to.Waited, fo.Waited)
	var te *txlock.LockTimeoutError
	require.ErrorAs(t, to.Err, &te)
	assert.Equal(t, to.Attempts, te.Attempts)
}

// A hot standby: WaitStarted, then StandbyRefused after the one attempt,
// on every path, and nothing else.
func TestObserveStandby(t *testing.T) {
	db := open(t, pgtest.Standby(t))
	var inRecovery bool
	require.NoError(t, db.QueryRow(`SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery)
	key, other := txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t))
	log := &obsLog{}
	opt := txlock.WithObserver(log)
	ctx := context.Background()
	fn := func(context.Context, *sql.Tx) error {
		t.Error("fn ran on a standby")
		return nil
	}
	refused := func(t *testing.T, err error, keys ...txlock.Key) {
		t.Helper()
		require.ErrorIs(t, err, txlock.ErrStandby)
		evs := log.take()
		for _, e := range evs {
			assert.ElementsMatch(t, keys, e.Keys, "%v carries the call's keys", e.Kind)
			assert.Equal(t, evs[0].Keys, e.Keys, "%v: the keys in the same order", e.Kind)
		}
		_, rest := waitRound(t, evs, 0, txlock.StandbyRefused)
		assert.Equal(t, 1, rest[0].Attempts)
	}

	refused(t, txlock.WithLock(ctx, db, key, fn, opt), key)
	refused(t, txlock.WithLock(ctx, db, key, fn, opt, txlock.WithServerWait(txlock.ServerWait{})), key)
	refused(t, txlock.WithLock(ctx, db, key, fn, opt, txlock.WithFailOpen(nil), txlock.WithMaxHold(time.Second)), key)
	_, err := txlock.TryWithLocks(ctx, db, []txlock.Key{key, other}, fn, opt)
	refused(t, err, key, other)

	tx, err := db.Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	refused(t, txlock.LockTx(ctx, tx, key, opt), key)
	_, err = txlock.TryLockTx(ctx, tx, key, opt)
	refused(t, err, key)
}

// The hold bound: HoldTimeout, then Released, both with a Held of at least
// the bound, and Released's Err the call's error. A fn within the bound
// reports no HoldTimeout.
func TestObserveHoldBound(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	log := &obsLog{}
	const maxHold = 200 * time.Millisecond

	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, tx *sql.Tx) error
	}{
		{"fn returns ctx.Err", func(ctx context.Context, tx *sql.Tx) error {
			<-ctx.Done()
			return ctx.Err()
		}},
		{"fn returns nil late", func(ctx context.Context, tx *sql.Tx) error {
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond)
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := txlock.WithLock(context.Background(), db, key, tc.fn, txlock.WithObserver(log), txlock.WithMaxHold(maxHold))
			require.ErrorIs(t, err, txlock.ErrHoldTimeout)
			evs := log.take()
			assertKeys(t, evs, []txlock.Key{key}, false)
			_, rest := waitRound(t, evs, 0, txlock.Acquired, txlock.HoldTimeout, txlock.Released)
			ht, rel := rest[1], rest[2]
			assert.GreaterOrEqual(t, ht.Held, maxHold)
			assert.GreaterOrEqual(t, rel.Held, ht.Held)
			assert.False(t, rel.Committed)
			sameErr(t, err, rel.Err, "Released")
		})
	}

	require.NoError(t, txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(log), txlock.WithMaxHold(5*time.Second)))
	waitRound(t, log.take(), 0, txlock.Acquired, txlock.Released)
}

// A serialization failure: the round's Released, SerializationRetry with
// the same error, then a new round from WaitStarted.
func TestObserveSerializationRetry(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	table := "obs_serial_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	_, err := db.Exec(`CREATE TABLE ` + table + ` (n int NOT NULL); INSERT INTO ` + table + ` VALUES (0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
	log := &obsLog{}
	runs := 0
	err = txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		runs++
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT n FROM `+table).Scan(&n); err != nil {
			return err
		}
		if runs == 1 { // another writer commits after fn's snapshot
			if _, err := db.ExecContext(ctx, `UPDATE `+table+` SET n = n + 100`); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `UPDATE `+table+` SET n = $1`, n+1)
		return err
	}, txlock.WithObserver(log), txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelRepeatableRead}))
	require.NoError(t, err)
	require.Equal(t, 2, runs)

	evs := log.take()
	assertKeys(t, evs, []txlock.Key{key}, false)
	_, rest := waitRound(t, evs, 0, txlock.Acquired, txlock.Released, txlock.SerializationRetry,
		txlock.WaitStarted, txlock.Acquired, txlock.Released)
	first, retry, last := rest[1], rest[2], rest[5]
	assert.False(t, first.Committed)
	assert.Equal(t, "40001", txlock.SQLState(first.Err), "%v", first.Err)
	sameErr(t, first.Err, retry.Err, "SerializationRetry")
	assert.Equal(t, 1, rest[4].Attempts, "the new round counts its own attempts")
	assert.True(t, last.Committed)
	assert.NoError(t, last.Err)
}

// SerializationRetry means that fn runs again (observe.go): when the
// caller's context ends before the retry, fn does not run again, and no
// SerializationRetry may be reported.
func TestObserveSerializationRetryRunsAgain(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	log := &obsLog{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runs := 0
	err := txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		runs++
		_, err := tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001'; END $$`)
		cancel() // the caller gives up before the retry
		return err
	}, txlock.WithObserver(log), txlock.WithSerializationRetries(3))
	require.Equal(t, "40001", txlock.SQLState(err), "%v", err)
	require.Equal(t, 1, runs, "fn did not run again")
	evs := log.take()
	retries := 0
	for i, e := range evs {
		if e.Kind == txlock.SerializationRetry {
			retries++
			if assert.Less(t, i+1, len(evs), "SerializationRetry is the last event, and fn never ran again: %v", kindsOf(evs)) {
				assert.Equal(t, txlock.WaitStarted, evs[i+1].Kind, "SerializationRetry precedes a new round")
			}
		}
	}
	assert.Equal(t, runs-1, retries, "one SerializationRetry per re-run of fn: %v", kindsOf(evs))
}

// Fencing: TokenIssued once per sequence a fn draws from, with the token
// FenceToken returned and the sequence it came from; StaleWrite for a write
// refused after a larger token was written, told to the FencedTable's
// Observer if it has one, else to the enclosing call's.
func TestObserveFenced(t *testing.T) {
	db := direct(t)
	ft := stockTable(t, db)
	ctx := context.Background()
	sku := []txlock.Col{{Name: "sku", Value: "SKU-1001"}}
	qty := func(n int) []txlock.Col { return []txlock.Col{{Name: "qty", Value: n}} }
	own := txlock.Fencer{Sequence: "obs_fence_" + strconv.FormatInt(time.Now().UnixNano(), 10)}
	require.NoError(t, own.CreateSequence(ctx, db))
	t.Cleanup(func() { _, _ = db.Exec(`DROP SEQUENCE ` + txlock.DefaultFenceSchema + `.` + own.Sequence) })

	// sameRelation reports whether two names, as PostgreSQL reads them,
	// are the same relation.
	sameRelation := func(t *testing.T, a, b string) bool {
		t.Helper()
		var same bool
		require.NoError(t, db.QueryRow(`SELECT $1::regclass = $2::regclass`, a, b).Scan(&same))
		return same
	}

	key, otherKey := txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t))
	log, laterLog := &obsLog{}, &obsLog{}
	var token, again, ownToken, later int64
	var staleErr error
	err := txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		token, err = txlock.FenceToken(ctx)
		require.NoError(t, err)
		again, err = txlock.FenceToken(ctx)
		require.NoError(t, err)
		ownToken, err = own.Token(ctx)
		require.NoError(t, err)
		// Meanwhile another holder draws a larger token and writes first.
		require.NoError(t, txlock.WithLock(ctx, db, otherKey, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			later, err = txlock.FenceToken(ctx)
			require.NoError(t, err)
			_, err = ft.Update(ctx, db, later, qty(40), sku)
			return err
		}, txlock.WithObserver(laterLog)))
		_, staleErr = ft.Update(ctx, db, token, qty(39), sku)
		return nil
	}, txlock.WithObserver(log))
	require.NoError(t, err)
	require.ErrorIs(t, staleErr, txlock.ErrStaleToken)
	assert.Equal(t, token, again)
	require.Greater(t, later, token)
	var stale *txlock.StaleTokenError
	require.ErrorAs(t, staleErr, &stale)

	evs := log.take()
	assertKeys(t, evs, []txlock.Key{key}, false)
	_, rest := waitRound(t, evs, 0, txlock.Acquired, txlock.TokenIssued, txlock.TokenIssued, txlock.StaleWrite, txlock.Released)
	def, ownIssued, sw := rest[1], rest[2], rest[3]
	assert.Equal(t, token, def.Token, "TokenIssued carries FenceToken's token")
	assert.True(t, sameRelation(t, def.Sequence, txlock.DefaultFenceSchema+"."+txlock.DefaultFenceSequence), "TokenIssued.Sequence %q", def.Sequence)
	assert.Equal(t, ownToken, ownIssued.Token)
	assert.True(t, sameRelation(t, ownIssued.Sequence, txlock.DefaultFenceSchema+"."+own.Sequence), "TokenIssued.Sequence %q", ownIssued.Sequence)
	var lastValue int64
	require.NoError(t, db.QueryRow(`SELECT last_value FROM `+ownIssued.Sequence).Scan(&lastValue))
	assert.GreaterOrEqual(t, lastValue, ownIssued.Token, "the token came from that sequence")

	assert.Equal(t, token, sw.Token)
	assert.Equal(t, later, sw.Current, "StaleWrite.Current is the larger token written first")
	assert.Equal(t, stale.Table, sw.Table)
	assert.True(t, sameRelation(t, sw.Table, ft.Name), "StaleWrite.Table %q", sw.Table)
	sameErr(t, staleErr, sw.Err, "StaleWrite")

	// The other holder's call saw its own token, and no stale write.
	evs = laterLog.take()
	assertKeys(t, evs, []txlock.Key{otherKey}, false)
	_, rest = waitRound(t, evs, 0, txlock.Acquired, txlock.TokenIssued, txlock.Released)
	assert.Equal(t, later, rest[1].Token)

	// A FencedTable's own Observer is told instead of the call's, inside
	// fn, and outside any fn, where the event has no keys.
	tableLog := &obsLog{}
	observed := ft
	observed.Observer = tableLog
	require.NoError(t, txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		_, err := observed.Update(ctx, db, token, qty(38), sku)
		assert.ErrorIs(t, err, txlock.ErrStaleToken)
		return nil
	}, txlock.WithObserver(log)))
	waitRound(t, log.take(), 0, txlock.Acquired, txlock.Released)
	evs = tableLog.take()
	require.Equal(t, namesOf([]txlock.EventKind{txlock.StaleWrite}), namesOf(kindsOf(evs)))
	assert.Equal(t, []txlock.Key{key}, evs[0].Keys)
	assert.Equal(t, token, evs[0].Token)
	assert.Equal(t, later, evs[0].Current)

	_, err = observed.Delete(ctx, db, token, sku)
	require.ErrorIs(t, err, txlock.ErrStaleToken)
	evs = tableLog.take()
	require.Equal(t, namesOf([]txlock.EventKind{txlock.StaleWrite}), namesOf(kindsOf(evs)))
	assert.Empty(t, evs[0].Keys, "outside fn there are no keys")
	assert.Equal(t, token, evs[0].Token)
	assert.Equal(t, later, evs[0].Current)
	sameErr(t, err, evs[0].Err, "StaleWrite")

	// A write that is not refused reports nothing.
	_, err = observed.Update(ctx, db, later, qty(37), sku)
	require.NoError(t, err)
	assert.Empty(t, tableLog.take())
	q, tok := readStock(t, db, ft)
	assert.Equal(t, 37, q)
	assert.Equal(t, later, tok)
}

// A Locker's Observer is told of the events of all its methods; a call's
// WithObserver replaces it, and WithObserver(nil) silences it.
func TestObserveLocker(t *testing.T) {
	db := direct(t)
	log := &obsLog{}
	l, err := txlock.New(db, txlock.WithObserver(log), txlock.WithTimeout(10*time.Second))
	require.NoError(t, err)
	ctx := context.Background()
	key, other := txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t))
	fn := func(context.Context, *sql.Tx) error { return nil }
	ownTx := []txlock.EventKind{txlock.Acquired, txlock.Released}
	callerTx := []txlock.EventKind{txlock.Acquired}

	calls := []struct {
		name string
		tail []txlock.EventKind
		call func(opts ...txlock.Option) error
	}{
		{"WithLock", ownTx, func(opts ...txlock.Option) error { return l.WithLock(ctx, key, fn, opts...) }},
		{"WithLocks", ownTx, func(opts ...txlock.Option) error { return l.WithLocks(ctx, []txlock.Key{key, other}, fn, opts...) }},
		{"TryWithLock", ownTx, func(opts ...txlock.Option) error {
			ok, err := l.TryWithLock(ctx, key, fn, opts...)
			assert.True(t, ok)
			return err
		}},
		{"TryWithLocks", ownTx, func(opts ...txlock.Option) error {
			ok, err := l.TryWithLocks(ctx, []txlock.Key{key, other}, fn, opts...)
			assert.True(t, ok)
			return err
		}},
		{"WithSemaphore", ownTx, func(opts ...txlock.Option) error { return l.WithSemaphore(ctx, key, 2, fn, opts...) }},
		{"TryWithSemaphore", ownTx, func(opts ...txlock.Option) error {
			ok, err := l.TryWithSemaphore(ctx, key, 2, fn, opts...)
			assert.True(t, ok)
			return err
		}},
		{"LockTx", callerTx, func(opts ...txlock.Option) error {
			tx, err := db.Begin()
			require.NoError(t, err)
			defer tx.Rollback()
			return l.LockTx(ctx, tx, key, opts...)
		}},
		{"TryLockTx", callerTx, func(opts ...txlock.Option) error {
			tx, err := db.Begin()
			require.NoError(t, err)
			defer tx.Rollback()
			ok, err := l.TryLockTx(ctx, tx, key, opts...)
			assert.True(t, ok)
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, c.call())
			waitRound(t, log.take(), 0, c.tail...)

			perCall := &obsLog{}
			require.NoError(t, c.call(txlock.WithObserver(perCall)))
			assert.Empty(t, log.take(), "the call's Observer replaces the Locker's")
			waitRound(t, perCall.take(), 0, c.tail...)

			require.NoError(t, c.call(txlock.WithObserver(nil)))
			assert.Empty(t, log.take(), "WithObserver(nil) reports nothing")

			// The Locker's Observer is back for the next call.
			require.NoError(t, c.call())
			waitRound(t, log.take(), 0, c.tail...)
		})
	}

	// A Locker with no Observer reports nothing, and one given per call
	// applies.
	quiet, err := txlock.New(db)
	require.NoError(t, err)
	require.NoError(t, quiet.WithLock(ctx, key, fn))
	require.NoError(t, quiet.WithLock(ctx, key, fn, txlock.WithObserver(log)))
	waitRound(t, log.take(), 0, ownTx...)
}

type obsCtxKey struct{}

// The context the Observer returns at Acquired reaches fn, and the call's
// later events, on a real lock.
func TestObserveContextReachesFn(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	var atReleased any
	obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		switch e.Kind {
		case txlock.Acquired:
			return context.WithValue(ctx, obsCtxKey{}, "hold span")
		case txlock.Released:
			atReleased = ctx.Value(obsCtxKey{})
		}
		return ctx
	})
	var inFn any
	require.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		inFn = ctx.Value(obsCtxKey{})
		return nil
	}, txlock.WithObserver(obs)))
	assert.Equal(t, "hold span", inFn)
	assert.Equal(t, "hold span", atReleased)
}

// A wait that ends in an error that is not about the lock ends with Failed:
// here a server nobody listens on.
func TestObserveFailed(t *testing.T) {
	db, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	defer db.Close()
	log := &obsLog{}
	err = txlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(log))
	require.Error(t, err)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
	evs := log.take()
	_, rest := waitRound(t, evs, 0, txlock.Failed)
	assert.Equal(t, err, rest[0].Err, "Failed carries the call's error")
}
