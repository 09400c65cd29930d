package reliability_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/reliability/internal/checker"
)

// Classes of errors a broken or refused connection explains.
var connectionFaults = []string{checker.ClassShutdown, checker.ClassNetwork, checker.ClassConnection}

// TestFaultTerminateBackend terminates holders' backends with
// pg_terminate_backend: first one call of the test's own, in a known state,
// then random holders of the running workload. The terminated call fails
// with a connection error, its writes vanish, and the other workers proceed.
// It runs with txlock, then with pgxlock.
func TestFaultTerminateBackend(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name(), func(t *testing.T) {
			path := v.path
			pg, dsn := paths(t, path)
			leaks := newLeaks()
			admin := pool(t, pg, 4)
			db := newClient(t, v.lib, dsn, workers)
			// A longer sleep keeps holders inside fn, where a termination
			// lands mid-transaction.
			l := newLedger(t, admin, checker.Config{Keys: keys, Sleep: 10 * time.Millisecond})
			ctx := context.Background()
			run := db.start(l, workers, 0)
			require.True(t, run.WaitFor(100, 60*time.Second), "the workload made no progress")

			// One call in a known state: it holds the lock and has written.
			table := l.Table("victim")
			_, err := admin.ExecContext(ctx, `CREATE TABLE `+table+` (v text)`)
			require.NoError(t, err)
			key := txlock.StringKey(table)
			pids, resume, done := db.victim(key, table)
			pid := <-pids
			var ok bool
			require.NoError(t, admin.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
			require.True(t, ok)
			close(resume)
			err = <-done
			require.Error(t, err, "the terminated call must fail")
			t.Logf("the terminated call returned (%s): %v", checker.Classify(err), err)
			assert.Contains(t, connectionFaults, checker.Classify(err))
			var n int
			require.NoError(t, admin.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n))
			assert.Zero(t, n, "the terminated call's writes must vanish")
			require.Eventually(t, func() bool {
				p, err := checker.HeldBy(ctx, admin, key)
				return err == nil && len(p) == 0
			}, 5*time.Second, 10*time.Millisecond, "the terminated call's lock must be released")
			_, err = admin.ExecContext(ctx, `DROP TABLE `+table)
			require.NoError(t, err)

			// Random holders of the workload.
			rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
			terminated := 1
			for range 3 {
				if terminateHolder(t, ctx, admin, rng) {
					terminated++
				}
				check(t, l, "after a termination")
				require.True(t, run.WaitFor(50, 60*time.Second), "the other workers must proceed")
			}
			s := run.Stop()
			t.Logf("%s: %v", path, s)
			requireOnly(t, s, connectionFaults...)
			assert.NotZero(t, s.Failures, "terminating holders must fail their calls")
			rep := check(t, l, "after the run", s)
			db.finish(t, l, leaks, admin)
			figures(t, "lib=%s path=%s terminations=%d acquisitions=%d failures=%v overlaps=%d lost=%d phantoms=%d",
				v.lib, path, terminated, s.Acquisitions, s.Classes, rep.Overlaps, rep.LostUpdates(), rep.Phantoms)
		})
	}
}

// TestFaultPgBouncerKill kills PgBouncer with SIGKILL under load, twice,
// and starts it again. While it is down, the server releases every lock its
// clients held; after it is back, the workload resumes.
func TestFaultPgBouncerKill(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	b := pgtest.NewBouncer(t, c, pgtest.BouncerOptions{PoolSize: 8})
	leaks := newLeaks()
	admin := pool(t, c.URL(), 4)
	db := pool(t, bouncerDSN(b.URL()), workers)
	l := newLedger(t, admin, checker.Config{Keys: keys})
	run := l.Start(db, workers, 0)
	require.True(t, run.WaitFor(200, 60*time.Second), "the workload made no progress")
	const rounds = 2
	for range rounds {
		require.NoError(t, b.Kill())
		require.NoError(t, checker.NoAdvisoryLocks(admin, 10*time.Second), "the server must release the killed pooler's locks")
		check(t, l, "while PgBouncer is down")
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, b.Start())
		require.True(t, run.WaitFor(200, 60*time.Second), "the workload must resume after PgBouncer restarts")
		check(t, l, "after PgBouncer restarted")
	}
	s := run.Stop()
	t.Logf("%v", s)
	requireOnly(t, s, connectionFaults...)
	assert.NotZero(t, s.Failures, "killing PgBouncer must fail some calls")
	rep := check(t, l, "after the run", s)
	finish(t, l, leaks, admin, db)
	figures(t, "kills=%d acquisitions=%d failures=%v overlaps=%d lost=%d phantoms=%d vanished=%d ambiguous=%d",
		rounds, s.Acquisitions, s.Classes, rep.Overlaps, rep.LostUpdates(), rep.Phantoms, rep.Vanished, rep.Ambiguous)
}

// TestFaultPostgresRestart stops PostgreSQL under load (fast shutdown, and
// immediate shutdown with crash recovery), twice each, and starts it again,
// with half the workers connected directly and half through PgBouncer. No
// commit a caller saw succeed is lost, even to crash recovery.
func TestFaultPostgresRestart(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	b := pgtest.NewBouncer(t, c, pgtest.BouncerOptions{PoolSize: 8})
	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			leaks := newLeaks()
			admin := pool(t, c.URL(), 4)
			direct := pool(t, c.URL(), workers/2)
			pooled := pool(t, bouncerDSN(b.URL()), workers/2)
			l := newLedger(t, admin, checker.Config{Keys: keys, Lock: checker.Locked(txlock.WithTimeout(10 * time.Second))})
			runs := []*checker.Run{l.Start(direct, workers/2, 0), l.Start(pooled, workers/2, 0)}
			progress := func(what string) {
				t.Helper()
				for _, r := range runs {
					require.True(t, r.WaitFor(100, 90*time.Second), "no progress %s", what)
				}
			}
			progress("before the fault")
			rounds := 1
			if os.Getenv(loadEnv) != "" {
				rounds = 3
			}
			for range rounds {
				require.NoError(t, c.Stop(mode))
				time.Sleep(200 * time.Millisecond)
				require.NoError(t, c.Start())
				check(t, l, fmt.Sprintf("right after a %s restart", mode))
				progress("after the restart")
				check(t, l, "after recovery")
			}
			var sums []checker.Summary
			var acq int64
			classes := map[string]int{}
			for _, r := range runs {
				s := r.Stop()
				t.Logf("%v", s)
				// After a restart every client reconnects at once, and after a
				// failed server login PgBouncer waits server_login_retry (15s)
				// before it tries again, its clients queueing meanwhile: a lock
				// wait may run out, and says so.
				requireOnly(t, s, append(connectionFaults, checker.ClassLockTimeout)...)
				sums = append(sums, s)
				acq += s.Acquisitions
				for c, n := range s.Classes {
					classes[c] += n
				}
			}
			assert.NotEmpty(t, classes, "restarting PostgreSQL must fail some calls")
			rep := check(t, l, "after the run", sums...)
			finish(t, l, leaks, admin, direct, pooled)
			figures(t, "mode=%s restarts=%d acquisitions=%d failures=%v overlaps=%d lost=%d phantoms=%d vanished=%d ambiguous=%d(committed %d)",
				mode, rounds, acq, classes, rep.Overlaps, rep.LostUpdates(), rep.Phantoms, rep.Vanished, rep.Ambiguous, rep.InDoubt)
		})
	}
}
