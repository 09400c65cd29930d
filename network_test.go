package txlock_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// Across a network, the default strategy passes the turn at the holder's
// grant, and the caller after the next begins its transaction then
// (ownTx.beginEarly): while a holder runs fn, one caller of its process
// waits in the server's lock queue, and the next has a transaction begun
// and no lock statement yet, so that its window goes out the moment its
// turn comes. Without that early BEGIN, a hold shorter than a round trip
// ends before the next window reaches the server. No more than one caller
// of the process waits in the server at any time.
func TestEarlyBeginAcrossNetwork(t *testing.T) {
	db, activity := delayedDB(t)
	key := txlock.StringKey(uniq(t))
	var inFn, overlaps, samples, begunBehindWaiter atomic.Int32
	var mostWaiting atomic.Int32
	sample := func() {
		waiting, begun, _ := activity()
		samples.Add(1)
		if waiting > mostWaiting.Load() {
			mostWaiting.Store(waiting)
		}
		if waiting > 0 && begun > 0 {
			begunBehindWaiter.Add(1)
		}
	}
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for range 6 {
				assert.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
					if inFn.Add(1) > 1 {
						overlaps.Add(1)
					}
					defer inFn.Add(-1)
					time.Sleep(15 * time.Millisecond) // the next callers' BEGIN and window go out
					sample()
					return nil
				}, txlock.WithTimeout(30*time.Second)))
			}
		})
	}
	wg.Wait()
	t.Logf("%d samples during holds; in %d, one caller waited in the server and another had begun early; most waiting at once: %d",
		samples.Load(), begunBehindWaiter.Load(), mostWaiting.Load())
	assert.Zero(t, overlaps.Load(), "two holders ran fn at once")
	assert.Positive(t, begunBehindWaiter.Load(), "no caller began its transaction while next in line")
	assert.LessOrEqual(t, mostWaiting.Load(), int32(1), "callers of one process waited in the server at once")
}

// A transaction begun early is rolled back after maxEarlyBegin (50ms) if
// the turn has not come: behind a long hold, the caller next in line holds
// no connection for longer.
func TestEarlyBeginBounded(t *testing.T) {
	db, activity := delayedDB(t)
	key := txlock.StringKey(uniq(t))
	call := func(hold time.Duration, holding chan<- struct{}) {
		assert.NoError(t, txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
			if holding != nil {
				close(holding)
			}
			time.Sleep(hold)
			return nil
		}, txlock.WithTimeout(30*time.Second)))
	}
	// A holder, and four callers queued behind it in turn: the first's
	// handoff is measured slow (a COMMIT's round trip across the network),
	// so the second, a long hold, passes its turn at its grant, and the
	// last is next in line for all of that hold.
	holding := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { call(100*time.Millisecond, holding) })
	<-holding
	// The holder's call queues nowhere: it was granted at once.
	for i, hold := range []time.Duration{5 * time.Millisecond, 700 * time.Millisecond, 0, 0} {
		wg.Go(func() { call(hold, nil) })
		require.Eventually(t, func() bool { return txlock.QueueRefs() == i+1 }, 5*time.Second, time.Millisecond)
	}
	start := time.Now()
	var longest time.Duration
	for time.Since(start) < 900*time.Millisecond {
		_, _, age := activity()
		longest = max(longest, age)
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("the longest a transaction stayed idle after BEGIN: %v", longest)
	// A poll's BEGIN waits a round trip (4ms) for its lock statement; one
	// begun early waits until its turn or its bound.
	require.Greater(t, longest, 20*time.Millisecond, "no caller began early behind the long hold")
	assert.Less(t, longest, 300*time.Millisecond, "a transaction begun early outlived its bound of 50ms")
}

// delayedDB opens a pool across a simulated network of 2ms each way, with
// idle connections already open (a call begins early only on an idle one),
// and returns it with a func that counts its sessions that wait for a lock
// in the server and those idle in a transaction that has run only BEGIN,
// and says for how long the oldest of those has been.
func delayedDB(t *testing.T) (*sql.DB, func() (waiting, begun int32, oldest time.Duration)) {
	admin := direct(t)
	app := "early_begin_" + uniq(t)
	db := open(t, pgtest.Delayed(t, pgtest.Postgres(t), 2*time.Millisecond)+"&application_name="+app)
	db.SetMaxIdleConns(10)
	var warm sync.WaitGroup
	for range 6 {
		warm.Go(func() { _, err := db.Exec(`SELECT pg_sleep(0.05)`); assert.NoError(t, err) })
	}
	warm.Wait()
	return db, func() (waiting, begun int32, oldest time.Duration) {
		var us int64
		require.NoError(t, admin.QueryRow(`
			SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),
			       count(*) FILTER (WHERE state = 'idle in transaction' AND query ILIKE 'begin%'),
			       coalesce(max(extract(epoch FROM clock_timestamp() - state_change) * 1e6)
			                FILTER (WHERE state = 'idle in transaction' AND query ILIKE 'begin%'), 0)::bigint
			FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&waiting, &begun, &us))
		return waiting, begun, time.Duration(us) * time.Microsecond
	}
}
