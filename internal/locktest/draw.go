package locktest

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

// A Drawer takes key through one of the drivers, with WithFencing if
// fencing, and runs body inside fn with fn's context: the suites' adapter to
// DrawingHolders and FullPoolDraws.
type Drawer func(ctx context.Context, key txlock.Key, fencing bool, body func(ctx context.Context) error) error

// DrawingHolders runs n holders on keys of their own, iters calls each,
// every call with WithFencing and a 10 s deadline, each drawing a fencing
// token: on a pool of n connections, every draw must succeed. It returns
// the calls' errors.
func DrawingHolders(t testing.TB, n, iters int, lock Drawer) []error {
	errs := make(chan error, n*iters)
	var wg sync.WaitGroup
	for w := range n {
		key := txlock.StringKey(fmt.Sprintf("%s/%d", Uniq(t), w))
		wg.Go(func() {
			for range iters {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				errs <- lock(ctx, key, true, func(ctx context.Context) error {
					_, err := txlock.FenceToken(ctx)
					return err
				})
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	var out []error
	for err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// FullPoolDraws runs n holders on keys of their own, without WithFencing:
// each takes its lock, waits until all n hold theirs (a pool of n is then
// full), draws a token, and keeps its lock until all have drawn. It checks
// that every draw failed at once (within 10 s of a minute's deadline) with
// ErrNoToken, naming WithFencing.
func FullPoolDraws(t *testing.T, n int, lock Drawer) {
	var in, drew sync.WaitGroup
	in.Add(n)
	drew.Add(n)
	errs := make(chan error, n)
	took := make(chan time.Duration, n)
	var wg sync.WaitGroup
	for w := range n {
		key := txlock.StringKey(fmt.Sprintf("%s/%d", Uniq(t), w))
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs <- lock(ctx, key, false, func(ctx context.Context) error {
				in.Done()
				in.Wait()
				start := time.Now()
				_, err := txlock.FenceToken(ctx)
				took <- time.Since(start)
				drew.Done()
				drew.Wait()
				return err
			})
		})
	}
	wg.Wait()
	close(errs)
	close(took)
	for err := range errs {
		require.ErrorIs(t, err, txlock.ErrNoToken)
		assert.ErrorContains(t, err, "txlock.WithFencing()")
	}
	for d := range took {
		assert.Less(t, d, 10*time.Second, "a draw waited for a connection")
	}
}

// DrawSession is what pg_stat_activity shows of the connection WithFencing
// set aside for draws, found by its application_name.
type DrawSession struct {
	PID   int
	State string
	Xid   bool // it has a transaction id
	Xmin  bool // it holds a snapshot
}

// DrawSessions returns the sessions on admin's server that are connections
// set aside for fencing-token draws.
func DrawSessions(t testing.TB, admin *sql.DB) []DrawSession {
	t.Helper()
	rows, err := admin.Query(`SELECT pid, state, backend_xid IS NOT NULL, backend_xmin IS NOT NULL
		FROM pg_stat_activity WHERE application_name = 'txlock fencing-token draws'`)
	require.NoError(t, err)
	defer rows.Close()
	var out []DrawSession
	for rows.Next() {
		var s DrawSession
		require.NoError(t, rows.Scan(&s.PID, &s.State, &s.Xid, &s.Xmin))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// PinnedDraws checks that the connection WithFencing sets aside keeps its
// server connection, and holds nothing on it, while holders keep every
// other server connection of the pooler: lock, through a pooler of
// poolSize server connections (or directly, with poolSize 0), runs
// poolSize-2 holders that keep their locks while one more holder draws a
// token, five times over (each a call of its own, while the holders'
// reservations keep the draw connection set aside): the holders, the
// drawing holder and the draw connection use every server connection of
// the pooler. After each draw, the
// server shows exactly one draw session, idle in a transaction with no
// transaction id and no snapshot, always the same backend; and every draw
// succeeds at once.
func PinnedDraws(t *testing.T, admin *sql.DB, poolSize int, lock Drawer) {
	holders := max(poolSize-2, 1)
	var in sync.WaitGroup
	in.Add(holders)
	done := make(chan struct{})
	errs := make(chan error, holders)
	var wg sync.WaitGroup
	for w := range holders {
		key := txlock.StringKey(fmt.Sprintf("%s/holder/%d", Uniq(t), w))
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs <- lock(ctx, key, true, func(ctx context.Context) error {
				in.Done()
				<-done
				return nil
			})
		})
	}
	defer func() {
		close(done)
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err, "a holder")
		}
	}()
	in.Wait()
	var pid int
	for i := range 5 {
		key := txlock.StringKey(fmt.Sprintf("%s/drawer/%d", Uniq(t), i))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		err := lock(ctx, key, true, func(ctx context.Context) error {
			_, err := txlock.FenceToken(ctx)
			return err
		})
		cancel()
		require.NoError(t, err, "draw %d", i)
		assert.Less(t, time.Since(start), 10*time.Second, "draw %d waited for a server connection", i)
		s := DrawSessions(t, admin)
		require.Len(t, s, 1, "draw sessions after draw %d", i)
		assert.Equal(t, "idle in transaction", s[0].State)
		assert.False(t, s[0].Xid, "the draw session keeps a transaction id")
		assert.False(t, s[0].Xmin, "the draw session keeps a snapshot")
		if i == 0 {
			pid = s[0].PID
		}
		assert.Equal(t, pid, s[0].PID, "draw %d ran on another server connection", i)
	}
}
