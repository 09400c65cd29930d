package txlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
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
// grant, and the caller first in line behind the one with the turn begins
// its transaction early (ticket.callOnDeck): while a holder runs fn, one
// caller of its process waits in the server's lock queue, and the next has
// a transaction begun and no lock statement yet, in which it later holds
// the lock. No more than one caller of the process waits in the server at
// any time. database/sql keeps 2 idle connections unless told otherwise:
// the early BEGIN works with those too.
//
// The test lengthens the bound of an early transaction (maxEarlyBegin,
// 50ms; TestEarlyBeginBounded checks that a bound holds) to a second: on a loaded
// machine fn's 15ms and its query of pg_stat_activity can outlast 50ms in
// every hold, and every early transaction was then rolled back unused.
func TestEarlyBeginAcrossNetwork(t *testing.T) {
	txlock.SetMaxEarlyBegin(t, time.Second)
	for _, idle := range []int{2, 10} {
		t.Run(fmt.Sprintf("idle=%d", idle), func(t *testing.T) {
			db, activity := delayedDB(t, idle)
			key := txlock.StringKey(uniq(t))
			var inFn, overlaps, mostWaiting atomic.Int32
			var mu sync.Mutex
			begunEarly := map[string]bool{} // sessions' transactions seen begun while another waited
			var ran []string                // the transactions that fn ran in
			var wg sync.WaitGroup
			for range 6 {
				wg.Go(func() {
					for range 6 {
						assert.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
							if inFn.Add(1) > 1 {
								overlaps.Add(1)
							}
							defer inFn.Add(-1)
							var self string
							if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid() || ' ' || now()::text`).Scan(&self); err != nil {
								return err
							}
							time.Sleep(15 * time.Millisecond) // the next callers' BEGINs and window go out
							a := activity()
							mu.Lock()
							defer mu.Unlock()
							ran = append(ran, self)
							if a.waiting > mostWaiting.Load() {
								mostWaiting.Store(a.waiting)
							}
							if a.waiting > 0 {
								for _, s := range a.begun {
									begunEarly[s] = true
								}
							}
							return nil
						}, txlock.WithTimeout(30*time.Second)))
					}
				})
			}
			wg.Wait()
			used := 0
			for _, s := range ran {
				if begunEarly[s] {
					used++
				}
			}
			t.Logf("%d of %d holds ran in a transaction seen begun while another caller waited in the server; most waiting at once: %d",
				used, len(ran), mostWaiting.Load())
			assert.Zero(t, overlaps.Load(), "two holders ran fn at once")
			assert.Positive(t, used, "no caller held the lock in a transaction it began on deck")
			assert.LessOrEqual(t, mostWaiting.Load(), int32(1), "callers of one process waited in the server at once")
		})
	}
}

// A transaction begun early is rolled back after maxEarlyBegin if the
// turn has not come: behind a long hold, the caller on deck holds no
// connection for longer. The test sets the bound to 150ms (from 50ms), so
// that a loaded machine's samples of pg_stat_activity, each a query, do
// not miss the transaction while it lasts; without a bound it would last
// the 700ms hold.
func TestEarlyBeginBounded(t *testing.T) {
	const bound = 150 * time.Millisecond
	txlock.SetMaxEarlyBegin(t, bound)
	db, activity := delayedDB(t, 10)
	key := txlock.StringKey(uniq(t))
	call := func(hold time.Duration, holding chan<- struct{}, proceed <-chan struct{}) {
		assert.NoError(t, txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
			if holding != nil {
				close(holding)
			}
			if proceed != nil {
				<-proceed
			}
			time.Sleep(hold)
			return nil
		}, txlock.WithTimeout(30*time.Second)))
	}
	// A holder, and four callers queued behind it in turn: the first's
	// handoff is measured slow (a COMMIT's round trip across the network),
	// so the second, a long hold, passes its turn at its grant, and the
	// last is on deck for all of that hold. The holder returns once all
	// four are queued.
	holding, proceed := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var proceedOnce sync.Once
	letGo := func() { proceedOnce.Do(func() { close(proceed) }) }
	// If the test stops early, its calls end before the bound is restored
	// (cleanups run last first).
	t.Cleanup(func() { letGo(); wg.Wait() })
	wg.Go(func() { call(0, holding, proceed) })
	<-holding
	// The holder's call queues nowhere: it was granted at once.
	for i, hold := range []time.Duration{5 * time.Millisecond, 700 * time.Millisecond, 0, 0} {
		wg.Go(func() { call(hold, nil, nil) })
		require.Eventually(t, func() bool { return txlock.QueueRefs() == i+1 }, 5*time.Second, time.Millisecond)
	}
	letGo()
	start := time.Now()
	var longest time.Duration
	for time.Since(start) < 900*time.Millisecond {
		longest = max(longest, activity().oldest)
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("the longest a transaction stayed idle after BEGIN: %v", longest)
	// A poll's BEGIN waits a round trip (4ms) for its lock statement; one
	// begun early waits until its turn or its bound.
	require.Greater(t, longest, 20*time.Millisecond, "no caller began early behind the long hold")
	assert.Less(t, longest, bound+250*time.Millisecond, "a transaction begun early outlived its bound of %v", bound)
}

// sessions is what pg_stat_activity shows of a pool's sessions: how many
// wait for a lock in the server, and those idle in a transaction that has
// run only BEGIN ("pid xact_start"), the oldest of which has been so for
// oldest.
type sessions struct {
	waiting int32
	begun   []string
	oldest  time.Duration
}

// delayedDB opens a pool across a simulated network of 2ms each way, which
// keeps up to idle connections idle, with those opened already (a call
// begins early only on an idle one), and returns it with a func that reads
// its sessions.
func delayedDB(t *testing.T, idle int) (*sql.DB, func() sessions) {
	admin := direct(t)
	u := uniq(t)
	app := "early_begin_" + u[len(u)-12:] // short of the server's 63-byte names
	dbURL, err := url.Parse(pgtest.Delayed(t, pgtest.Postgres(t), 2*time.Millisecond))
	require.NoError(t, err)
	q := dbURL.Query()
	q.Set("application_name", app)
	dbURL.RawQuery = q.Encode()
	db := open(t, dbURL.String())
	db.SetMaxIdleConns(idle)
	var warm sync.WaitGroup
	for range idle {
		warm.Go(func() { _, err := db.Exec(`SELECT pg_sleep(0.05)`); assert.NoError(t, err) })
	}
	warm.Wait()
	return db, func() sessions {
		rows, err := admin.Query(`
			SELECT wait_event_type IS NOT DISTINCT FROM 'Lock',
			       state = 'idle in transaction' AND query ILIKE 'begin%',
			       pid || ' ' || xact_start::text,
			       extract(epoch FROM clock_timestamp() - state_change) * 1e6
			FROM pg_stat_activity WHERE application_name = $1`, app)
		require.NoError(t, err)
		defer rows.Close()
		var s sessions
		for rows.Next() {
			var waiting, begun bool
			var tx sql.NullString
			var us sql.NullFloat64
			require.NoError(t, rows.Scan(&waiting, &begun, &tx, &us))
			if waiting {
				s.waiting++
			}
			if begun {
				s.begun = append(s.begun, tx.String)
				s.oldest = max(s.oldest, time.Duration(us.Float64)*time.Microsecond)
			}
		}
		require.NoError(t, rows.Err())
		return s
	}
}
