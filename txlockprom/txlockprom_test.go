package txlockprom_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/txlockprom"
)

// setup returns a registry, an Observer registered with it, and a Locker
// on the test PostgreSQL that reports to the Observer.
func setup(t *testing.T, opts ...txlock.Option) (*prometheus.Registry, *txlock.Locker, *sql.DB) {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := txlockprom.New(reg)
	require.NoError(t, err)
	db := open(t, pgtest.Postgres(t))
	locker, err := txlock.New(db, append([]txlock.Option{txlock.WithObserver(obs)}, opts...)...)
	require.NoError(t, err)
	return reg, locker, db
}

// TestCountsMatchCalls runs contended WithLock calls from several
// goroutines on a keyspace key, a StringKey, shared locks and a WithLocks
// call across both, counting the acquisitions itself, and checks every
// series against those counts. The raw key names never appear as labels.
func TestCountsMatchCalls(t *testing.T) {
	reg, locker, _ := setup(t, txlock.WithRetry(txlock.ExponentialBackoff{Min: time.Millisecond, Max: 5 * time.Millisecond}))
	billingName, plainName := uniq(t), uniq(t)
	billing := txlock.NewKeyspace("billing").Key(billingName)
	plain := txlock.StringKey(plainName)
	const sleep = 2 * time.Millisecond

	var nBilling, nPlain, nShared, nMixed atomic.Int64
	work := func(ctx context.Context, tx *sql.Tx) error {
		time.Sleep(sleep)
		return nil
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := range 8 {
				var err error
				switch (w + i) % 4 {
				case 0, 1:
					err = locker.WithLock(ctx, billing, work)
					if err == nil {
						nBilling.Add(1)
					}
				case 2:
					err = locker.WithLock(ctx, plain, work)
					if err == nil {
						nPlain.Add(1)
					}
				case 3:
					if w%2 == 0 {
						err = locker.WithLock(ctx, billing, work, txlock.WithShared())
						if err == nil {
							nShared.Add(1)
						}
					} else {
						err = locker.WithLocks(ctx, []txlock.Key{billing, plain}, work)
						if err == nil {
							nMixed.Add(1)
						}
					}
				}
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(6*8), nBilling.Load()+nPlain.Load()+nShared.Load()+nMixed.Load())

	for _, tc := range []struct {
		keyspace, mode string
		n              int64
	}{
		{"billing", "exclusive", nBilling.Load()},
		{txlockprom.NoKeyspace, "exclusive", nPlain.Load()},
		{"billing", "shared", nShared.Load()},
		{txlockprom.MixedKeyspaces, "exclusive", nMixed.Load()},
	} {
		n := float64(tc.n)
		require.Positive(t, n, "the workload made no %s %s call", tc.keyspace, tc.mode)
		acq := get(t, reg, "txlock_acquisitions_total", "keyspace", tc.keyspace, "mode", tc.mode)
		assert.Equal(t, n, acq.value, "txlock_acquisitions_total{keyspace=%q,mode=%q}", tc.keyspace, tc.mode)
		wait := get(t, reg, "txlock_wait_seconds", "keyspace", tc.keyspace, "mode", tc.mode, "outcome", "acquired")
		assert.Equal(t, n, wait.count, "txlock_wait_seconds_count{keyspace=%q,mode=%q}", tc.keyspace, tc.mode)
		hold := get(t, reg, "txlock_hold_seconds", "keyspace", tc.keyspace, "mode", tc.mode, "outcome", "committed")
		assert.Equal(t, n, hold.count, "txlock_hold_seconds_count{keyspace=%q,mode=%q}", tc.keyspace, tc.mode)
		// Every fn slept, so every hold lasted at least that long.
		assert.GreaterOrEqual(t, hold.sum, n*sleep.Seconds(), "txlock_hold_seconds_sum{keyspace=%q,mode=%q}", tc.keyspace, tc.mode)
	}
	assert.Equal(t, []string{"billing", txlockprom.MixedKeyspaces, txlockprom.NoKeyspace}, labelValues(t, reg, "keyspace"))
	assert.Equal(t, []string{"exclusive", "shared"}, labelValues(t, reg, "mode"))
	assert.Equal(t, []string{"acquired", "committed"}, labelValues(t, reg, "outcome"))
	for _, v := range allLabelValues(t, reg) {
		assert.False(t, strings.Contains(v, billingName) || strings.Contains(v, plainName), "a label holds a key name: %q", v)
	}
	assert.False(t, get(t, reg, "txlock_timeouts_total", "keyspace", "billing", "mode", "exclusive").found, "a timeout was counted")
}

// TestTimeoutAndFailOpen checks the counters and the wait histogram of
// calls that time out behind a holder on another connection, with and
// without WithFailOpen.
func TestTimeoutAndFailOpen(t *testing.T) {
	reg, locker, db := setup(t)
	key := txlock.StringKey(uniq(t))
	hold(t, db, key)
	const timeout = 100 * time.Millisecond
	ctx := context.Background()
	ran := false
	err := locker.WithLock(ctx, key, func(context.Context, *sql.Tx) error { ran = true; return nil }, txlock.WithTimeout(timeout))
	require.ErrorIs(t, err, txlock.ErrLockTimeout)
	require.False(t, ran)
	err = locker.WithLock(ctx, key, func(context.Context, *sql.Tx) error { ran = true; return nil },
		txlock.WithTimeout(timeout), txlock.WithFailOpen(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	require.True(t, ran, "fail-open did not run fn")

	none := []string{"keyspace", txlockprom.NoKeyspace, "mode", "exclusive"}
	assert.Equal(t, 2.0, get(t, reg, "txlock_timeouts_total", none...).value)
	assert.Equal(t, 1.0, get(t, reg, "txlock_fail_opens_total", none...).value)
	wait := get(t, reg, "txlock_wait_seconds", append(none, "outcome", "timed_out")...)
	assert.Equal(t, 2.0, wait.count)
	assert.GreaterOrEqual(t, wait.sum, 2*timeout.Seconds(), "each wait lasts until its timeout")
	assert.Positive(t, get(t, reg, "txlock_busy_attempts_total", none...).value)
	assert.False(t, get(t, reg, "txlock_acquisitions_total", none...).found, "a fail-open run was counted as an acquisition")
	assert.False(t, get(t, reg, "txlock_hold_seconds", append(none, "outcome", "committed")...).found, "a fail-open run was counted as a hold")
}

// TestCanceled checks that a wait its caller's context cancelled counts as
// outcome canceled, and not as a timeout: a deploy's shutdown must not look
// like lock contention.
func TestCanceled(t *testing.T) {
	reg, locker, db := setup(t)
	key := txlock.StringKey(uniq(t))
	hold(t, db, key)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := locker.WithLock(ctx, key, func(context.Context, *sql.Tx) error { return nil }, txlock.WithTimeout(time.Minute))
	require.ErrorIs(t, err, context.Canceled)
	none := []string{"keyspace", txlockprom.NoKeyspace, "mode", "exclusive"}
	assert.Equal(t, 1.0, get(t, reg, "txlock_wait_seconds", append(none, "outcome", "canceled")...).count)
	assert.False(t, get(t, reg, "txlock_timeouts_total", none...).found, "a cancellation was counted as a timeout")
	assert.False(t, get(t, reg, "txlock_wait_seconds", append(none, "outcome", "timed_out")...).found)
}

// TestTryBusy checks that a try turned away by a holder counts one busy
// attempt, a wait with outcome skipped, and no acquisition or timeout.
func TestTryBusy(t *testing.T) {
	reg, locker, db := setup(t)
	key := txlock.NewKeyspace("jobs").Key(uniq(t))
	hold(t, db, key)
	ran, err := locker.TryWithLock(context.Background(), key, func(context.Context, *sql.Tx) error { return nil })
	require.NoError(t, err)
	require.False(t, ran)
	jobs := []string{"keyspace", "jobs", "mode", "exclusive"}
	assert.Equal(t, 1.0, get(t, reg, "txlock_busy_attempts_total", jobs...).value)
	assert.Equal(t, 1.0, get(t, reg, "txlock_wait_seconds", append(jobs, "outcome", "skipped")...).count)
	assert.False(t, get(t, reg, "txlock_wait_seconds", append(jobs, "outcome", "acquired")...).found)
	assert.False(t, get(t, reg, "txlock_timeouts_total", jobs...).found)
}

// TestHoldTimeout checks the hold timeout counter and a rolled-back hold
// that lasted the bound.
func TestHoldTimeout(t *testing.T) {
	reg, locker, _ := setup(t)
	key := txlock.NewKeyspace("billing").ID(7)
	const maxHold = 100 * time.Millisecond
	err := locker.WithLock(context.Background(), key, func(ctx context.Context, tx *sql.Tx) error {
		<-ctx.Done()
		return ctx.Err()
	}, txlock.WithMaxHold(maxHold))
	require.ErrorIs(t, err, txlock.ErrHoldTimeout)
	billing := []string{"keyspace", "billing", "mode", "exclusive"}
	assert.Equal(t, 1.0, get(t, reg, "txlock_hold_timeouts_total", billing...).value)
	h := get(t, reg, "txlock_hold_seconds", append(billing, "outcome", "rolled_back")...)
	assert.Equal(t, 1.0, h.count)
	assert.GreaterOrEqual(t, h.sum, maxHold.Seconds())
}

// TestSerializationRetry checks that a round that fails with SQLSTATE 40001
// counts a retry, a rolled-back hold, and a second acquisition.
func TestSerializationRetry(t *testing.T) {
	reg, locker, _ := setup(t)
	key := txlock.StringKey(uniq(t))
	rounds := 0
	err := locker.WithLock(context.Background(), key, func(ctx context.Context, tx *sql.Tx) error {
		rounds++
		if rounds == 1 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"}
		}
		return nil
	}, txlock.WithSerializationRetries(1))
	require.NoError(t, err)
	require.Equal(t, 2, rounds)
	none := []string{"keyspace", txlockprom.NoKeyspace, "mode", "exclusive"}
	assert.Equal(t, 1.0, get(t, reg, "txlock_serialization_retries_total", none...).value)
	assert.Equal(t, 2.0, get(t, reg, "txlock_acquisitions_total", none...).value)
	assert.Equal(t, 1.0, get(t, reg, "txlock_hold_seconds", append(none, "outcome", "rolled_back")...).count)
	assert.Equal(t, 1.0, get(t, reg, "txlock_hold_seconds", append(none, "outcome", "committed")...).count)
}

// TestStaleWrite makes fenced writes with a token older than the row's:
// inside fn they count under the lock's keyspace, outside under none.
func TestStaleWrite(t *testing.T) {
	reg, locker, db := setup(t)
	ctx := context.Background()
	table := "prom_stale_" + uniq(t)[len(t.Name())+1:] // the random hex part
	_, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, v int, fence_token bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), `DROP TABLE `+table) })
	_, err = db.ExecContext(ctx, `INSERT INTO `+table+` (id, v, fence_token) VALUES (1, 0, 100)`)
	require.NoError(t, err)

	ft := txlock.FencedTable{Name: table}
	key := txlock.NewKeyspace("billing").Key(uniq(t))
	err = locker.WithLock(ctx, key, func(ctx context.Context, tx *sql.Tx) error {
		_, err := ft.Update(ctx, db, 1, []txlock.Col{{Name: "v", Value: 1}}, []txlock.Col{{Name: "id", Value: 1}})
		return err
	})
	require.ErrorIs(t, err, txlock.ErrStaleToken)
	assert.Equal(t, 1.0, get(t, reg, "txlock_stale_writes_total", "keyspace", "billing").value)

	// Outside a lock, the table's own Observer is told.
	reg2 := prometheus.NewRegistry()
	obs2, err := txlockprom.New(reg2)
	require.NoError(t, err)
	ft.Observer = obs2
	_, err = ft.Update(ctx, db, 2, []txlock.Col{{Name: "v", Value: 2}}, []txlock.Col{{Name: "id", Value: 1}})
	require.ErrorIs(t, err, txlock.ErrStaleToken)
	assert.Equal(t, 1.0, get(t, reg2, "txlock_stale_writes_total", "keyspace", txlockprom.NoKeyspace).value)
}

// TestStandbyRefused checks the refusal counter and the wait histogram on
// a hot standby.
func TestStandbyRefused(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := txlockprom.New(reg)
	require.NoError(t, err)
	db := open(t, pgtest.Standby(t))
	key := txlock.NewKeyspace("billing").Key(uniq(t))
	err = txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error { return nil }, txlock.WithObserver(obs))
	require.ErrorIs(t, err, txlock.ErrStandby)
	billing := []string{"keyspace", "billing", "mode", "exclusive"}
	assert.Equal(t, 1.0, get(t, reg, "txlock_standby_refusals_total", billing...).value)
	assert.Equal(t, 1.0, get(t, reg, "txlock_wait_seconds", append(billing, "outcome", "standby_refused")...).count)
	assert.False(t, get(t, reg, "txlock_acquisitions_total", billing...).found)
}

// TestNewRefuses checks that bad arguments are refused with a message
// naming them, and that a failed registration leaves nothing registered.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		reg  prometheus.Registerer
		opts []txlockprom.Option
		want string
	}{
		{"nil registerer", nil, nil, "Registerer is nil"},
		{"nil option", prometheus.NewRegistry(), []txlockprom.Option{nil}, "nil Option"},
		{"no buckets", prometheus.NewRegistry(), []txlockprom.Option{txlockprom.WithWaitBuckets()}, "WithWaitBuckets: no bucket bounds"},
		{"decreasing", prometheus.NewRegistry(), []txlockprom.Option{txlockprom.WithHoldBuckets(1, 0.5)}, "WithHoldBuckets: bounds must increase, but bound 1 (0.5) follows 1"},
		{"infinite", prometheus.NewRegistry(), []txlockprom.Option{txlockprom.WithWaitBuckets(1, math.Inf(1))}, "bound 1 is +Inf"},
		{"NaN", prometheus.NewRegistry(), []txlockprom.Option{txlockprom.WithHoldBuckets(math.NaN())}, "bound 0 is NaN"},
	} {
		obs, err := txlockprom.New(tc.reg, tc.opts...)
		assert.Nil(t, obs, tc.name)
		if assert.Error(t, err, tc.name) {
			assert.Contains(t, err.Error(), tc.want, tc.name)
		}
	}

	// A registry where txlock_hold_seconds is taken: New fails, and takes
	// back txlock_wait_seconds, which it had registered first. Once the
	// other collector is gone, New succeeds. (The collector in the way has
	// txlock's own help and labels: a registry never lets a name be reused
	// with others.)
	reg := prometheus.NewRegistry()
	taken := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "txlock_hold_seconds",
		Help: "Time from a lock's grant to the end of its transaction, by outcome: committed or rolled_back.",
	}, []string{"keyspace", "mode", "outcome"})
	reg.MustRegister(taken)
	_, err := txlockprom.New(reg)
	var are prometheus.AlreadyRegisteredError
	require.True(t, errors.As(err, &are), "New on a registry with txlock_hold_seconds taken: %v", err)
	assert.Contains(t, err.Error(), "txlockprom: registering the metrics")
	require.True(t, reg.Unregister(taken))
	_, err = txlockprom.New(reg)
	require.NoError(t, err, "txlock_wait_seconds stayed registered after New failed")

	// A second Observer on the same registry is refused.
	reg = prometheus.NewRegistry()
	_, err = txlockprom.New(reg)
	require.NoError(t, err)
	_, err = txlockprom.New(reg)
	assert.True(t, errors.As(err, &are), "a second New on one registry: %v", err)
}

// TestBuckets checks that WithWaitBuckets and WithHoldBuckets set the
// histograms' bounds, and the defaults otherwise.
func TestBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := txlockprom.New(reg, txlockprom.WithWaitBuckets(0.01, 0.1, 1))
	require.NoError(t, err)
	ctx := context.Background()
	for _, k := range []txlock.EventKind{txlock.Acquired, txlock.Released} {
		obs.Observe(ctx, txlock.Event{Kind: k, Keys: []txlock.Key{txlock.Int64Key(1)}, Waited: 50 * time.Millisecond, Held: time.Second, Committed: true})
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	bounds := map[string][]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				var b []float64
				for _, bucket := range h.GetBucket() {
					b = append(b, bucket.GetUpperBound())
				}
				bounds[f.GetName()] = b
			}
		}
	}
	assert.Equal(t, []float64{0.01, 0.1, 1}, bounds["txlock_wait_seconds"])
	assert.Equal(t, txlockprom.DefaultBuckets, bounds["txlock_hold_seconds"])
	assert.True(t, slices.IsSorted(txlockprom.DefaultBuckets))
}

// BenchmarkObserve measures the events of one uncontended call: a wait
// started, a grant and a release.
func BenchmarkObserve(b *testing.B) {
	obs, err := txlockprom.New(prometheus.NewRegistry())
	require.NoError(b, err)
	keys := []txlock.Key{txlock.NewKeyspace("billing").Key("inv-7")}
	ctx := context.Background()
	for b.Loop() {
		for _, k := range []txlock.EventKind{txlock.WaitStarted, txlock.Acquired, txlock.Released} {
			ctx = obs.Observe(ctx, txlock.Event{Kind: k, Keys: keys, Attempts: 1, Waited: time.Millisecond, Held: time.Millisecond, Committed: true})
		}
	}
}

// TestTermLost checks that a term whose backend is terminated counts a lost
// term and a rolled-back hold, under its keyspace's label.
func TestTermLost(t *testing.T) {
	reg, locker, db := setup(t)
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, db))
	key := txlock.NewKeyspace("leases").ID(int32(time.Now().UnixNano() & math.MaxInt32))
	term, err := locker.AcquireTerm(ctx, key, txlock.WithHeartbeat(txlock.Heartbeat{Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, TTL: 5 * time.Second}))
	require.NoError(t, err)
	a, b, _ := key.Pair()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1 AND objid = $2 AND objsubid = 2`, int64(uint32(a)), int64(uint32(b))).Scan(&n))
	require.Equal(t, 1, n)
	select {
	case <-term.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the term outlived its backend")
	}
	require.ErrorIs(t, term.Err(), txlock.ErrLockLost)
	require.NoError(t, term.Release(ctx))
	leases := []string{"keyspace", "leases", "mode", "exclusive"}
	assert.Equal(t, 1.0, get(t, reg, "txlock_terms_lost_total", leases...).value)
	assert.Equal(t, 1.0, get(t, reg, "txlock_acquisitions_total", leases...).value)
	assert.Equal(t, 1.0, get(t, reg, "txlock_hold_seconds", append(leases, "outcome", "rolled_back")...).count)
}
