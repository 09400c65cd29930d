package txlock_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// Terms (AcquireTerm, TryAcquireTerm, Lead) against the real server: what a
// term holds and costs, how it ends, and what it refuses. The tests across
// processes (exclusion, SIGSTOP) are in term_process_test.go.

// fastBeat is the heartbeat of the tests that measure how a term ends: an
// interval short enough to keep the tests quick, and a Timeout and a TTL
// far enough above the pauses of a loaded machine (a second, at times) that
// such a pause does not end a healthy term. A heartbeat that times out ends
// the term, and a server that stalls for a second stalls the heartbeat sent
// as it began for that long, so the Timeout is twice that; it also bounds
// Release's rollback.
var fastBeat = txlock.Heartbeat{Interval: 200 * time.Millisecond, Timeout: 2 * time.Second, TTL: 4 * time.Second}

// steadyBeat is the heartbeat of the tests that hold a term without
// measuring how it ends: the default interval, a Timeout that a loaded
// machine's pause does not reach, and a TTL so long that a lock the server
// frees only at the TTL, rather than when the term ends, would show as far
// too late.
var steadyBeat = locktest.TermSteadyBeat

// termDB returns a pool on the test PostgreSQL where the fencing sequence
// exists, with the checks of direct.
func termDB(t *testing.T) *sql.DB {
	t.Helper()
	db := direct(t)
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), db))
	return db
}

// termPID returns the pid of the backend that holds k, or 0.
var termPID = locktest.HolderPID

// backend is a row of pg_stat_activity.
type backend struct {
	state     string
	xmin, xid sql.NullString
}

// activity returns pid's row of pg_stat_activity.
func activity(t *testing.T, db *sql.DB, pid int) backend {
	t.Helper()
	var b backend
	require.NoError(t, db.QueryRow(`SELECT coalesce(state, ''), backend_xmin::text, backend_xid::text FROM pg_stat_activity WHERE pid = $1`, pid).
		Scan(&b.state, &b.xmin, &b.xid))
	return b
}

// released asserts that term ended as Release ends it.
func assertReleased(t *testing.T, db *sql.DB, term *txlock.Term) {
	t.Helper()
	select {
	case <-term.Done():
	default:
		t.Fatal("Done is not closed after Release")
	}
	assert.ErrorIs(t, term.Err(), txlock.ErrTermReleased)
	assert.ErrorIs(t, context.Cause(term.Context()), txlock.ErrTermReleased)
	assert.False(t, txlock.Held(term.Context()))
	assert.Equal(t, 0, heldBy(t, db, term.Key()), "the lock outlived Release")
}

// termVias are the two ways to a term's server: directly, and through
// PgBouncer in transaction mode.
var termVias = []struct {
	name string
	db   func(t *testing.T) *sql.DB
}{
	{"direct", termDB},
	{"PgBouncer", func(t *testing.T) *sql.DB {
		termDB(t)
		db, _ := bouncer(t, "exec")
		return db
	}},
}

func TestTermHoldsAndReleases(t *testing.T) {
	for _, via := range termVias {
		t.Run(via.name, func(t *testing.T) {
			db := via.db(t)
			check := termDB(t)
			ctx := context.Background()
			key := txlock.StringKey(uniq(t))
			term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(fastBeat))
			require.NoError(t, err)
			t.Cleanup(func() { _ = term.Release(ctx) })
			assert.Equal(t, key, term.Key())
			assert.Positive(t, term.Token())
			assert.NoError(t, term.Err())
			assert.True(t, txlock.Held(term.Context()))
			tok, err := txlock.FenceToken(term.Context())
			require.NoError(t, err)
			assert.Equal(t, term.Token(), tok, "FenceToken in the term's context is the term's token")
			lock, ok := txlock.LockFromContext(term.Context())
			require.True(t, ok)
			assert.Equal(t, []txlock.Key{key}, lock.Keys)
			assert.Equal(t, 1, lock.Attempts)

			// Several heartbeats later the term still holds, and another
			// candidate finds the lock busy.
			time.Sleep(5 * fastBeat.Interval)
			assert.NoError(t, term.Err())
			assert.Equal(t, 1, heldBy(t, check, key))
			other, err := txlock.TryAcquireTerm(ctx, check, key)
			require.NoError(t, err)
			assert.Nil(t, other, "a second term of the same key")
			pid := termPID(t, check, key)
			require.NotZero(t, pid)
			b := activity(t, check, pid)
			assert.False(t, b.xid.Valid, "the term's transaction was given a transaction id")

			require.NoError(t, term.Release(ctx))
			assertReleased(t, check, term)
			require.NoError(t, term.Release(ctx), "a second Release")

			next, err := txlock.AcquireTerm(ctx, db, key, txlock.WithTimeout(5*time.Second))
			require.NoError(t, err)
			assert.Greater(t, next.Token(), term.Token(), "the next term's token")
			require.NoError(t, next.Release(ctx))
		})
	}
}

// A DB that drops the transaction options it is given, so that the
// server's default_transaction_isolation applies.
type dropOptions struct{ db *sql.DB }

func (d dropOptions) BeginTx(ctx context.Context, _ *sql.TxOptions) (*sql.Tx, error) {
	return d.db.BeginTx(ctx, nil)
}

func (d dropOptions) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return d.db.QueryRowContext(ctx, q, args...)
}

func TestTermOptionsRefused(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	for _, c := range []struct {
		name string
		opt  txlock.TermOption
		want string
	}{
		{"WithShared", txlock.WithShared(), "WithShared does not apply to a term"},
		{"WithServerWait", txlock.WithServerWait(txlock.ServerWait{}), "WithServerWait does not apply to a term"},
		{"WithMaxHold", txlock.WithMaxHold(time.Second), "WithMaxHold does not apply to a term"},
		{"WithFailOpen", txlock.WithFailOpen(nil), "WithFailOpen does not apply to a term"},
		{"WithSerializationRetries", txlock.WithSerializationRetries(1), "WithSerializationRetries does not apply to a term"},
		{"RepeatableRead", txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelRepeatableRead}), "a term needs ReadCommitted, and WithTxOptions asks for Repeatable Read"},
		{"Serializable", txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelSerializable}), "asks for Serializable"},
		{"TTL below two intervals", txlock.WithHeartbeat(txlock.Heartbeat{Interval: time.Second, TTL: 1500 * time.Millisecond}), "TTL 1.5s must be at least twice Interval 1s"},
		{"negative interval", txlock.WithHeartbeat(txlock.Heartbeat{Interval: -time.Second}), "must not be negative"},
		{"ReadUncommitted", txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelReadUncommitted}), "asks for Read Uncommitted: a term's transaction is always begun READ COMMITTED"},
		{"TTL above the server's limit", txlock.WithHeartbeat(txlock.Heartbeat{TTL: 25 * 24 * time.Hour}), "TTL 600h0m0s is above 2147483647ms"},
		{"bad Fencer", txlock.WithTermFencer(txlock.Fencer{Sequence: "a\x00b"}), "WithTermFencer"},
		{"zero timeout", txlock.WithTimeout(0), "WithTimeout needs a positive duration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			term, err := txlock.AcquireTerm(ctx, db, key, c.opt)
			assert.Nil(t, term)
			require.ErrorIs(t, err, txlock.ErrInvalidArgument)
			assert.Contains(t, err.Error(), c.want)
			err = txlock.Lead(ctx, db, key, func(context.Context, *txlock.Term) error {
				t.Error("fn ran")
				return nil
			}, c.opt)
			assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
		})
	}
	t.Run("nil TermOption", func(t *testing.T) {
		var none txlock.TermOption
		_, err := txlock.AcquireTerm(ctx, db, key, none)
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
		_, err = txlock.AcquireTerm(ctx, db, key, txlock.Option(nil))
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	})
	t.Run("from New", func(t *testing.T) {
		for _, c := range []struct {
			opt  txlock.Option
			name string
		}{
			{txlock.WithMaxHold(time.Second), "WithMaxHold"},
			{txlock.WithServerWait(txlock.ServerWait{}), "WithServerWait"},
		} {
			l, err := txlock.New(db, c.opt)
			require.NoError(t, err)
			want := c.name + " was given to New, which sets it for every call of the Locker: build a Locker without it for terms"
			_, err = l.AcquireTerm(ctx, key)
			require.ErrorIs(t, err, txlock.ErrInvalidArgument)
			assert.Contains(t, err.Error(), want)
			_, err = l.TryAcquireTerm(ctx, key)
			assert.ErrorContains(t, err, want)
			err = l.Lead(ctx, key, func(context.Context, *txlock.Term) error { return nil })
			assert.ErrorContains(t, err, want)
			// The same option given to the call itself is not New's.
			plain, err := txlock.New(db)
			require.NoError(t, err)
			_, err = plain.AcquireTerm(ctx, key, c.opt)
			require.ErrorIs(t, err, txlock.ErrInvalidArgument)
			assert.NotContains(t, err.Error(), "given to New")
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		_, err := txlock.AcquireTerm(ctx, nil, key)
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "db is nil")
		_, err = txlock.AcquireTerm(ctx, db, txlock.StringKey(""))
		assert.ErrorIs(t, err, txlock.ErrInvalidKey)
		err = txlock.Lead(ctx, db, key, nil)
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "fn is nil")
	})
	t.Run("ReadCommitted accepted", func(t *testing.T) {
		term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelReadCommitted}))
		require.NoError(t, err)
		require.NoError(t, term.Release(ctx))
	})
}

// The server's default_transaction_isolation cannot make a term hold a
// snapshot: AcquireTerm begins at read committed, and a DB that drops
// that option is refused by the statement itself.
func TestTermServerDefaultRepeatableRead(t *testing.T) {
	check := termDB(t)
	u, err := url.Parse(pgtest.Postgres(t))
	require.NoError(t, err)
	q := u.Query()
	q.Set("default_transaction_isolation", "repeatable read")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	rr := open(t, u.String())
	var level string
	require.NoError(t, rr.QueryRow(`SELECT current_setting('transaction_isolation')`).Scan(&level))
	require.Equal(t, "repeatable read", level, "the pool's default isolation")
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))

	term, err := txlock.AcquireTerm(ctx, rr, key, txlock.WithHeartbeat(fastBeat))
	require.NoError(t, err)
	pid := termPID(t, check, key)
	idle := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b := activity(t, check, pid); b.state == "idle in transaction" {
			idle++
			assert.False(t, b.xmin.Valid, "backend_xmin of a term begun on a repeatable read pool: %s", b.xmin.String)
		}
	}
	assert.Positive(t, idle)
	require.NoError(t, term.Release(ctx))

	term, err = txlock.AcquireTerm(ctx, dropOptions{rr}, key, txlock.WithTimeout(10*time.Second))
	assert.Nil(t, term)
	require.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "a term needs read committed, the transaction is repeatable read")
	assert.Equal(t, 0, heldBy(t, check, key))
}

// terminate ends pid's backend and returns when it did.
func terminate(t *testing.T, db *sql.DB, pid int) time.Time {
	t.Helper()
	var ok bool
	require.NoError(t, db.QueryRow(`SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
	require.True(t, ok)
	return time.Now()
}

// The bound: a terminated term's holder sees its context cancelled
// within one heartbeat interval plus the heartbeat's timeout. The
// assertion allows 2s more for a loaded machine, and the test logs the
// number.
func TestTermTerminated(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	var obs obsLog
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(fastBeat), txlock.WithObserver(&obs))
	require.NoError(t, err)
	time.Sleep(2 * fastBeat.Interval)
	killed := terminate(t, db, termPID(t, db, key))
	select {
	case <-term.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the term's context was not cancelled after its backend was terminated")
	}
	took := time.Since(killed)
	bound := fastBeat.Interval + fastBeat.Timeout
	t.Logf("context cancelled %v after pg_terminate_backend (bound: interval + timeout = %v)", took.Round(time.Millisecond), bound)
	assert.Less(t, took, bound+2*time.Second)

	require.ErrorIs(t, term.Err(), txlock.ErrLockLost)
	assert.ErrorIs(t, context.Cause(term.Context()), txlock.ErrLockLost)
	assert.Contains(t, term.Err().Error(), "heartbeat failed")
	assert.False(t, txlock.Held(term.Context()))
	require.NoError(t, term.Release(ctx), "Release after a loss")
	require.Eventually(t, func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.events) > 0 && obs.events[len(obs.events)-1].Kind == txlock.Released
	}, 5*time.Second, 10*time.Millisecond, "the term's Released event")
	{
		evs := obs.take()
		k := kindsOf(evs)
		require.GreaterOrEqual(t, len(evs), 2)
		lost := evs[len(evs)-2]
		assert.Equal(t, txlock.TermLost, lost.Kind)
		assert.Equal(t, term.Token(), lost.Token)
		assert.ErrorIs(t, lost.Err, txlock.ErrLockLost)
		assert.Positive(t, lost.Held)
		assert.ErrorIs(t, evs[len(evs)-1].Err, txlock.ErrLockLost)
		assert.False(t, evs[len(evs)-1].Committed)
		assert.Equal(t, []txlock.EventKind{txlock.WaitStarted, txlock.Acquired, txlock.TokenIssued, txlock.TermLost, txlock.Released}, k)
	}

	next, err := txlock.TryAcquireTerm(ctx, db, key)
	require.NoError(t, err)
	require.NotNil(t, next, "the lock is free once the backend is gone")
	assert.Greater(t, next.Token(), term.Token())
	require.NoError(t, next.Release(ctx))
}

// Lead's fn sees its context cancelled with ErrLockLost, and Lead returns
// fn's error joined with the loss.
func TestLeadLost(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	fnErr := errors.New("fn saw the loss")
	var cause error
	err := txlock.Lead(ctx, db, key, func(ctx context.Context, term *txlock.Term) error {
		terminate(t, db, termPID(t, db, key))
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Error("fn's context was not cancelled")
		}
		cause = context.Cause(ctx)
		return fnErr
	}, txlock.WithHeartbeat(fastBeat))
	assert.ErrorIs(t, cause, txlock.ErrLockLost)
	assert.ErrorIs(t, err, txlock.ErrLockLost)
	assert.ErrorIs(t, err, fnErr)
	assert.Equal(t, 0, heldBy(t, db, key))

	// fn returns the loss itself: Lead returns it once, not joined with
	// itself.
	err = txlock.Lead(ctx, db, key, func(ctx context.Context, term *txlock.Term) error {
		terminate(t, db, termPID(t, db, key))
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Error("fn's context was not cancelled")
		}
		cause = context.Cause(ctx)
		return cause
	}, txlock.WithHeartbeat(fastBeat))
	require.ErrorIs(t, err, txlock.ErrLockLost)
	assert.Equal(t, cause.Error(), err.Error(), "Lead's error repeats the loss")
	assert.Equal(t, 0, heldBy(t, db, key))
}

// Resignation: when the term ends, a candidate of another process (here,
// another pool, which does not share the local queue) is elected within
// one of its polls. The poll is 100ms; the assertion allows 2s more, for a
// loaded machine's pause of a second. The term's TTL is 10s, so that a lock
// freed only by the server's idle_in_transaction_session_timeout, not by
// the term's end, would still be far past the bound.
func TestTermResignation(t *testing.T) {
	check := termDB(t)
	a := open(t, pgtest.Postgres(t))
	b := open(t, pgtest.Postgres(t))
	ctx := context.Background()
	poll := 100 * time.Millisecond
	for _, how := range []string{"Release", "Lead returns"} {
		t.Run(how, func(t *testing.T) {
			key := txlock.StringKey(uniq(t))
			held := make(chan struct{})
			resign := make(chan struct{})
			var resigned time.Time
			var leadErr error
			var wg sync.WaitGroup
			wg.Add(1)
			if how == "Release" {
				term, err := txlock.AcquireTerm(ctx, a, key, txlock.WithHeartbeat(steadyBeat))
				require.NoError(t, err)
				close(held)
				go func() {
					defer wg.Done()
					<-resign
					leadErr = term.Release(ctx)
					resigned = time.Now()
				}()
			} else {
				go func() {
					defer wg.Done()
					leadErr = txlock.Lead(ctx, a, key, func(context.Context, *txlock.Term) error {
						close(held)
						<-resign
						return nil
					}, txlock.WithHeartbeat(steadyBeat))
					resigned = time.Now()
				}()
				<-held
			}
			var busy atomic.Int32
			obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
				if e.Kind == txlock.Busy {
					busy.Add(1)
				}
				return ctx
			})
			got := make(chan *txlock.Term, 1)
			go func() {
				term, err := txlock.AcquireTerm(ctx, b, key, txlock.WithRetry(txlock.ConstantBackoff{Interval: poll}), txlock.WithObserver(obs), txlock.WithTimeout(20*time.Second),
					txlock.WithHeartbeat(steadyBeat))
				assert.NoError(t, err)
				got <- term
			}()
			require.Eventually(t, func() bool { return busy.Load() >= 2 }, 10*time.Second, 5*time.Millisecond, "the candidate polls")
			close(resign)
			term := <-got
			elected := time.Now()
			wg.Wait()
			require.NoError(t, leadErr)
			require.NotNil(t, term)
			took := elected.Sub(resigned)
			t.Logf("the candidate was elected %v after the term ended (poll %v)", took.Round(time.Millisecond), poll)
			assert.Less(t, took, poll+2*time.Second)
			assert.Equal(t, 1, heldBy(t, check, key))
			require.NoError(t, term.Release(ctx))
		})
	}
}

// Candidates of one pool queue locally: while a term of the pool holds the
// lock, they wait in the queue and do not poll, and the term passes the
// turn to the next as it ends, in FIFO order.
func TestTermLocalQueue(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	refs := txlock.QueueRefs()
	first, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(steadyBeat))
	require.NoError(t, err)
	require.Equal(t, refs+1, txlock.QueueRefs(), "the first term holds the turn of its local queue")
	var busy atomic.Int32
	obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		if e.Kind == txlock.Busy {
			busy.Add(1)
		}
		return ctx
	})
	const n = 3
	got := make(chan int, n)
	terms := make([]*txlock.Term, n)
	for i := range n {
		go func() {
			term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithObserver(obs), txlock.WithTimeout(20*time.Second), txlock.WithHeartbeat(steadyBeat))
			assert.NoError(t, err)
			terms[i] = term
			got <- i
		}()
		// Queue in order: the next candidate starts once this one waits
		// in the local queue.
		require.Eventually(t, func() bool { return txlock.QueueRefs() == refs+2+i }, 10*time.Second, time.Millisecond, "candidate %d queues", i)
	}
	time.Sleep(time.Second)
	assert.Zero(t, busy.Load(), "candidates polled while a term of their own process held the lock")
	// Each election includes the token's durable commit: the bound allows
	// for a loaded machine's pause.
	require.NoError(t, first.Release(ctx))
	for want := range n {
		released := time.Now()
		var i int
		select {
		case i = <-got:
		case <-time.After(20 * time.Second):
			t.Fatalf("no candidate was elected within 20s of the previous term's end")
		}
		took := time.Since(released)
		t.Logf("candidate %d was elected %v after the previous term ended", i, took.Round(time.Millisecond))
		assert.Equal(t, want, i, "FIFO order")
		assert.Less(t, took, 3*time.Second)
		require.NoError(t, terms[i].Release(ctx))
	}
	assert.Zero(t, busy.Load())
}

func TestLeadPanicReleases(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	require.PanicsWithValue(t, "boom", func() {
		_ = txlock.Lead(ctx, db, key, func(context.Context, *txlock.Term) error {
			require.Equal(t, 1, heldBy(t, db, key))
			panic("boom")
		})
	})
	assert.Equal(t, 0, heldBy(t, db, key), "the lock outlived fn's panic")
	term, err := txlock.TryAcquireTerm(ctx, db, key)
	require.NoError(t, err)
	require.NotNil(t, term)
	require.NoError(t, term.Release(ctx))
}

// The context given to AcquireTerm bounds the term.
func TestTermContextEnds(t *testing.T) {
	db := termDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	key := txlock.StringKey(uniq(t))
	term, err := txlock.AcquireTerm(ctx, db, key)
	require.NoError(t, err)
	cancel()
	select {
	case <-term.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the term outlived its context")
	}
	assert.ErrorIs(t, term.Err(), context.Canceled)
	assert.NotErrorIs(t, term.Err(), txlock.ErrLockLost)
	require.Eventually(t, func() bool { return heldBy(t, db, key) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, term.Release(context.Background()))
}

// A campaign bounded by WithTimeout, or ended by its context, fails with
// ErrLockTimeout; a missing fencing sequence ends the term at once.
func TestTermCampaignEnds(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	release := hold(t, db, key, false)
	start := time.Now()
	_, err := txlock.AcquireTerm(ctx, db, key, txlock.WithTimeout(300*time.Millisecond))
	require.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.Less(t, time.Since(start), 3*time.Second)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = txlock.Lead(cctx, db, key, func(context.Context, *txlock.Term) error {
		t.Error("fn ran")
		return nil
	})
	require.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	release()

	_, err = txlock.AcquireTerm(ctx, db, key, txlock.WithTermFencer(txlock.Fencer{Sequence: "txlock_no_such_sequence"}))
	require.Error(t, err)
	assert.Equal(t, "42P01", txlock.SQLState(err))
	assert.Contains(t, err.Error(), "Fencer.CreateSequence")
	assert.Equal(t, 0, heldBy(t, db, key))
}

// A term pins exactly one PgBouncer server connection for its length,
// measured with SHOW POOLS and SHOW CLIENTS, while candidates that wait for
// it through the same PgBouncer hold none between their attempts.
func TestTermPinsOneServerConnection(t *testing.T) {
	db, adminURL := bouncer(t, "exec")
	termDB(t)
	admin, err := sql.Open("pgx", adminURL)
	require.NoError(t, err)
	defer admin.Close()
	require.Eventually(t, func() bool { return showPools(t, admin)["sv_active"] == 0 }, 10*time.Second, 20*time.Millisecond, "server connections in use before the test")
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(fastBeat))
	require.NoError(t, err)
	lo, hi := 1<<30, 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		n := showPools(t, admin)["sv_active"]
		lo, hi = min(lo, n), max(hi, n)
	}
	t.Logf("one term, no candidate: sv_active between %d and %d over 2s", lo, hi)
	assert.Equal(t, 1, lo)
	assert.Equal(t, 1, hi)

	// Eight candidates of their own pools campaign through the same
	// PgBouncer: the term keeps its server connection, and the candidates
	// take one only for an attempt.
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	bouncerURL, _ := pgtest.PgBouncer(t)
	for range 8 {
		cand := open(t, bouncerURL+"&default_query_exec_mode=exec")
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := txlock.AcquireTerm(cctx, cand, key, txlock.WithRetry(txlock.ConstantBackoff{Interval: 50 * time.Millisecond}))
			assert.ErrorIs(t, err, context.Canceled, "the campaign's context was cancelled")
		}()
	}
	time.Sleep(300 * time.Millisecond)
	var total, n int
	linkedAll := map[string]int{}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		total += showPools(t, admin)["sv_active"]
		n++
		for c := range linkedClients(t, admin) {
			linkedAll[c]++
		}
	}
	stop()
	wg.Wait()
	always := 0
	for _, k := range linkedAll {
		if k == n {
			always++
		}
	}
	t.Logf("one term and 8 polling candidates: %.2f server connections in use on average over %d samples; %d client always linked", float64(total)/float64(n), n, always)
	assert.Equal(t, 1, always, "exactly one client, the term's, keeps a server connection throughout")
	assert.NoError(t, term.Err())
	require.NoError(t, term.Release(ctx))
	require.Eventually(t, func() bool { return showPools(t, admin)["sv_active"] == 0 }, 10*time.Second, 20*time.Millisecond, "the term's server connection is given back")
}

// On PostgreSQL 17 and later a transaction_timeout in force must not end a
// healthy term: the term's statement turns it off for the transaction. Here
// it comes from the connection (a startup parameter), set to 1s, which
// ends a plain transaction on the same pool; the term outlives it three
// times over. On 16 and earlier the setting does not exist, which the test
// asserts, and the term holds as well.
func TestTermOutlivesTransactionTimeout(t *testing.T) {
	check := termDB(t)
	ctx := context.Background()
	v := serverVersion(t, check)
	url := pgtest.Postgres(t)
	if hasTxTimeout(v) {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		url += sep + "transaction_timeout=1000"
	}
	db := open(t, url)
	var setting sql.NullString
	require.NoError(t, db.QueryRow(`SELECT pg_catalog.current_setting('transaction_timeout', true)`).Scan(&setting))
	if !hasTxTimeout(v) {
		require.False(t, setting.Valid, "server %d has transaction_timeout", v)
	} else {
		require.Equal(t, "1s", setting.String)
		// The setting is in force: it ends a plain transaction.
		tx, err := db.Begin()
		require.NoError(t, err)
		_, err = tx.Exec(`SELECT pg_sleep(1.5)`)
		assert.Error(t, err, "a plain transaction outlived transaction_timeout")
		_ = tx.Rollback()
	}
	key := txlock.StringKey(uniq(t))
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(fastBeat))
	require.NoError(t, err)
	time.Sleep(3 * time.Second)
	assert.NoError(t, term.Err(), "server %d", v)
	assert.Equal(t, 1, heldBy(t, check, key))
	require.NoError(t, term.Release(ctx))
}

// A term of 30 seconds holds back no vacuum: between heartbeats its
// backend has neither backend_xmin nor backend_xid, and a VACUUM during the
// term removes the rows updated during it. The control, a repeatable read
// transaction that has taken its snapshot, keeps them. It runs on a server
// of its own, where no other test's transaction holds the horizon back.
func TestTermHoldsBackNoVacuum(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	db := open(t, c.URL())
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, db))
	_, err := db.Exec(`CREATE TABLE churn (id int PRIMARY KEY, n int NOT NULL) WITH (autovacuum_enabled = false);
		INSERT INTO churn SELECT g, 0 FROM generate_series(1, 100) g`)
	require.NoError(t, err)
	deadRows := func() int64 {
		var n int64
		require.NoError(t, db.QueryRow(`SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'churn'`).Scan(&n))
		return n
	}
	update := func() {
		_, err := db.Exec(`UPDATE churn SET n = n + 1`)
		require.NoError(t, err)
	}
	vacuum := func() {
		_, err := db.Exec(`VACUUM churn`)
		require.NoError(t, err)
	}
	vacuum()

	key := txlock.StringKey(uniq(t))
	// The default interval, with a Timeout and a TTL that a loaded
	// machine's pause of a second cannot reach in 30s of heartbeats.
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(txlock.Heartbeat{Timeout: 3 * time.Second, TTL: 6 * time.Second}))
	require.NoError(t, err)
	pid := termPID(t, db, key)
	require.NotZero(t, pid)
	var idle, active, updates, i int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b := activity(t, db, pid)
		switch b.state {
		case "idle in transaction":
			idle++
			assert.False(t, b.xmin.Valid, "backend_xmin %s between heartbeats", b.xmin.String)
		case "active":
			active++
		default:
			t.Fatalf("the term's backend is %q", b.state)
		}
		assert.False(t, b.xid.Valid, "backend_xid %s", b.xid.String)
		if i++; i%10 == 0 {
			update()
			updates++
		}
	}
	require.NoError(t, term.Err(), "the 30s term")
	t.Logf("30s term: %d samples idle in transaction with backend_xmin NULL, %d during a heartbeat; %d updates of 100 rows", idle, active, updates)
	assert.Greater(t, idle, 100)
	require.Eventually(t, func() bool { return deadRows() > 0 }, 10*time.Second, 50*time.Millisecond, "the updates left dead rows")
	before := deadRows()
	vacuum()
	require.Eventually(t, func() bool { return deadRows() == 0 }, 10*time.Second, 50*time.Millisecond, "VACUUM during the term left dead rows: %d", deadRows())
	t.Logf("VACUUM during the term: n_dead_tup %d before, 0 after", before)
	assert.Equal(t, 1, heldBy(t, db, key), "the term still holds")
	require.NoError(t, term.Release(ctx))

	// The control: a snapshot that is held keeps the dead rows.
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.Exec(`SELECT count(*) FROM churn`) // takes the snapshot
	require.NoError(t, err)
	for range 5 {
		update()
	}
	require.Eventually(t, func() bool { return deadRows() > 0 }, 10*time.Second, 50*time.Millisecond)
	vacuum()
	time.Sleep(time.Second) // PostgreSQL 13 and 14 report vacuum's counts asynchronously
	kept := deadRows()
	t.Logf("control, a repeatable read snapshot held: n_dead_tup %d after VACUUM", kept)
	assert.Positive(t, kept, "the control should keep dead rows")
	require.NoError(t, tx.Rollback())
}

// A released term reports the events of its wait, its token, and a
// Released without an error, never committed.
func TestTermEventsOnRelease(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.NewKeyspace("terms").Key(uniq(t))
	var obs obsLog
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithObserver(&obs))
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, term.Release(ctx))
	evs := obs.take()
	require.Equal(t, []txlock.EventKind{txlock.WaitStarted, txlock.Acquired, txlock.TokenIssued, txlock.Released}, kindsOf(evs))
	assert.Equal(t, term.Token(), evs[2].Token)
	rel := evs[3]
	assert.NoError(t, rel.Err)
	assert.False(t, rel.Committed)
	assert.GreaterOrEqual(t, rel.Held, 50*time.Millisecond)
	assert.Equal(t, []txlock.Key{key}, rel.Keys)
	assert.Equal(t, "term_lost", txlock.TermLost.String())
}

// A context given to AcquireTerm with a deadline bounds the term as any
// context does: at the deadline the term ends, its cause matches
// context.DeadlineExceeded (not ErrLockLost), and the lock is freed. (Such
// a context once gave the term's transaction no context of its own, which
// left a rollback in a partition unbounded: see the reliability module's
// TestLeaseReleaseInBlackhole.)
func TestTermCtxDeadline(t *testing.T) {
	db := termDB(t)
	key := txlock.StringKey(uniq(t))
	// Long enough that AcquireTerm returns before the deadline through a
	// loaded machine's pause of a second.
	const life = 2500 * time.Millisecond
	start := time.Now() // before the deadline is set, so that it is at least life after start
	ctx, cancel := context.WithTimeout(context.Background(), life)
	defer cancel()
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(fastBeat))
	require.NoError(t, err)
	assert.True(t, txlock.Held(term.Context()))
	select {
	case <-term.Done():
	case <-time.After(life + 10*time.Second):
		t.Fatal("the term outlived its context's deadline")
	}
	took := time.Since(start)
	t.Logf("the term ended %v after AcquireTerm began (deadline %v)", took.Round(time.Millisecond), life)
	assert.GreaterOrEqual(t, took, life)
	assert.ErrorIs(t, term.Err(), context.DeadlineExceeded)
	assert.NotErrorIs(t, term.Err(), txlock.ErrLockLost)
	require.Eventually(t, func() bool { return heldBy(t, db, key) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, term.Release(context.Background()), "Release after the context ended the term")
}

// Release with a context that has already ended sends no rollback: it
// closes the term's connection, which frees the lock, and reports that
// the rollback was cut off, every time (it once raced the heartbeat
// goroutine, and either rolled back or did not).
func TestTermReleaseEndedCtx(t *testing.T) {
	db := termDB(t)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 5 {
		key := txlock.StringKey(uniq(t))
		term, err := txlock.AcquireTerm(context.Background(), db, key, txlock.WithHeartbeat(fastBeat))
		require.NoError(t, err)
		err = term.Release(ended)
		require.Error(t, err, "round %d", i)
		assert.Contains(t, err.Error(), "the rollback was cut off, as Release's ctx had ended", "round %d", i)
		assert.ErrorIs(t, term.Err(), txlock.ErrTermReleased)
		assert.False(t, txlock.Held(term.Context()))
		require.Eventually(t, func() bool { return heldBy(t, db, key) == 0 }, 5*time.Second, 10*time.Millisecond,
			"the lock outlived the closed connection (round %d)", i)
		assert.NoError(t, term.Release(context.Background()), "a second Release")
	}
}

// The local expiry reaches Held on contexts derived from the term's (a
// WithCancel or WithTimeout child registers on the term's base context,
// and its own Err does not look at the expiry), and the term's context and
// its WithValue children directly. AgeTerm makes the term look frozen past
// its TTL; the interval is long, so that no heartbeat runs meanwhile.
func TestTermDerivedContexts(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	beat := txlock.Heartbeat{Interval: 10 * time.Second, Timeout: 10 * time.Second, TTL: 30 * time.Second}
	for _, how := range []string{"WithCancel", "WithTimeout", "WithValue"} {
		t.Run(how, func(t *testing.T) {
			term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(beat))
			require.NoError(t, err)
			var child context.Context
			switch how {
			case "WithCancel":
				c, cancel := context.WithCancel(term.Context())
				defer cancel()
				child = c
			case "WithTimeout":
				c, cancel := context.WithTimeout(term.Context(), time.Hour)
				defer cancel()
				child = c
			default:
				child = context.WithValue(term.Context(), struct{}{}, 1)
			}
			require.True(t, txlock.Held(child))
			txlock.AgeTerm(term, beat.TTL)
			if how == "WithValue" {
				assert.Error(t, child.Err(), "a WithValue child checks the expiry itself")
			} else {
				assert.False(t, txlock.Held(child), "Held on a %s child after the TTL", how)
				assert.Error(t, child.Err(), "the child is cancelled once Held noticed the expiry")
			}
			assert.False(t, txlock.Held(child))
			require.ErrorIs(t, term.Err(), txlock.ErrLockLost)
			assert.ErrorIs(t, context.Cause(child), txlock.ErrLockLost)
			assert.Contains(t, term.Err().Error(), "no heartbeat succeeded for")
			require.Eventually(t, func() bool { return heldBy(t, db, key) == 0 }, 5*time.Second, 10*time.Millisecond, "the expired term's lock")
			require.NoError(t, term.Release(ctx))
		})
	}
}

// With WithTermFencer, the term's context carries the term's token from
// that Fencer's sequence: its Token returns it, FenceToken (the zero
// Fencer's sequence) gets ErrNoToken naming the term's sequence, and
// neither draws a second token, whose check would run on the term's
// transaction alongside the heartbeats.
func TestTermFencerFenceToken(t *testing.T) {
	db := termDB(t)
	ctx := context.Background()
	seq := "term_fencer_" + strings.ReplaceAll(locktest.TableSuffix(t), "-", "_")
	f := txlock.Fencer{Sequence: seq}
	require.NoError(t, f.CreateSequence(ctx, db))
	t.Cleanup(func() { _, _ = db.Exec(`DROP SEQUENCE public.` + seq) })
	_, err := db.Exec(`SELECT setval('public.` + seq + `', 1000000)`)
	require.NoError(t, err)
	lastValue := func(name string) int64 {
		var v int64
		require.NoError(t, db.QueryRow(`SELECT last_value FROM public.`+name).Scan(&v))
		return v
	}
	key := txlock.StringKey(uniq(t))
	beat := txlock.Heartbeat{Interval: 20 * time.Millisecond, Timeout: 2 * time.Second, TTL: 3 * time.Second}
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithTermFencer(f), txlock.WithHeartbeat(beat))
	require.NoError(t, err)
	defer term.Release(ctx)
	require.EqualValues(t, 1000001, term.Token())
	defaultBefore := lastValue(txlock.DefaultFenceSequence)

	for range 20 { // while heartbeats run every 20ms
		tok, err := f.Token(term.Context())
		require.NoError(t, err)
		assert.Equal(t, term.Token(), tok)
		_, err = txlock.FenceToken(term.Context())
		require.ErrorIs(t, err, txlock.ErrNoToken)
		assert.Contains(t, err.Error(), `drawn from "public"."`+seq+`", the sequence of the term's Fencer`)
		time.Sleep(5 * time.Millisecond)
	}
	assert.EqualValues(t, 1000001, lastValue(seq), "a second token was drawn from the term's sequence")
	assert.Equal(t, defaultBefore, lastValue(txlock.DefaultFenceSequence), "a token was drawn from the default sequence")
	assert.NoError(t, term.Err())
	require.NoError(t, term.Release(ctx))
	_, err = f.Token(term.Context())
	assert.ErrorIs(t, err, txlock.ErrNoToken, "a token after Release")
}

// A term's start draws its token on a connection of the pool to spare: with
// none (MaxOpenConns 2, one held by another user of the pool, one by the
// term), the start fails at once with ErrNoToken, which says what to
// change, frees the lock, and reports Released with the error, but no
// TermLost (the term was never handed out). WithFencing then sets the
// draw's connection aside before the campaign, and the start succeeds with
// a pool of two whose connections are otherwise all the term's.
func TestTermStartPoolBusy(t *testing.T) {
	check := termDB(t)
	db := open(t, pgtest.Postgres(t))
	db.SetMaxOpenConns(2)
	ctx := context.Background()
	conn, err := db.Conn(ctx) // another user of the pool
	require.NoError(t, err)
	defer conn.Close()
	key := txlock.StringKey(uniq(t))
	var obs obsLog
	beat := txlock.Heartbeat{Interval: 200 * time.Millisecond, Timeout: time.Second, TTL: time.Second}
	start := time.Now()
	term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(beat), txlock.WithObserver(&obs))
	took := time.Since(start)
	t.Logf("AcquireTerm with no free connection for the token returned after %v (TTL %v): %v", took.Round(time.Millisecond), beat.TTL, err)
	assert.Nil(t, term)
	require.ErrorIs(t, err, txlock.ErrNoToken)
	assert.Contains(t, err.Error(), "txlock.WithFencing()")
	assert.Less(t, took, beat.TTL, "the start waited for a connection instead of failing at once")
	require.Eventually(t, func() bool { return heldBy(t, check, key) == 0 }, 5*time.Second, 10*time.Millisecond, "the lock of a term that never started")
	evs := obs.take()
	require.NotEmpty(t, evs)
	assert.NotContains(t, kindsOf(evs), txlock.TermLost)
	last := evs[len(evs)-1]
	assert.Equal(t, txlock.Released, last.Kind)
	assert.ErrorIs(t, last.Err, txlock.ErrNoToken)
	require.NoError(t, conn.Close())

	// With the connection back and WithFencing, the pool of two starts a
	// term (with a TTL that a loaded machine's pause does not reach
	// before the start is over): one connection for the term, one set
	// aside for its draw.
	term, err = txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(fastBeat), txlock.WithFencing())
	require.NoError(t, err)
	assert.Positive(t, term.Token())
	require.NoError(t, term.Release(ctx))
	require.Eventually(t, func() bool { return db.Stats().InUse == 0 }, 5*time.Second, 10*time.Millisecond, "the draw's connection went back to the pool")
}
