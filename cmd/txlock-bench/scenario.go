package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txlock/txlock"
)

// The scenarios, the work each call does inside its lock, and how a
// scenario's implementations are measured against each other.

var redisCount *atomic.Int64

// scenario is one configuration, measured for each of its implementations.
type scenario struct {
	name    string
	via     string
	workers int
	hold    time.Duration
	keys    int  // 0: random rows of all; 1: one key; n: n keys
	pools   int  // n > 1: split the workers over n pools (n "processes"), worker i in pool i mod n
	network bool // through the simulated network (the name ends in -network)
	// keyPerWorker: worker i locks key i mod keys every time, rather than a
	// random one of the keys: keys independent locks, each of its own
	// workers. (The semaphore implementations lock their one key whatever
	// the row.)
	keyPerWorker bool
	// bystander: a client of another service sends SELECT 1 through the
	// same PgBouncer every bystanderEvery while the workers run, and its
	// latencies are reported (result.Bystander*).
	bystander bool
	fn        work // the guarded work
	impls     []impl
}

// exclusive reports whether sc's workers take one lock in turn, whose
// handoffs are then measured (result.HandoffUS).
func (sc scenario) exclusive() bool { return sc.keys == 1 && sc.workers > 1 && !sc.keyPerWorker }

// envKey names the network path of the scenario's pools.
func (sc scenario) envKey() string {
	if sc.network {
		return sc.via + "+network"
	}
	return sc.via
}

// guarded work
const (
	updateSQL = `/*fn*/ UPDATE bench_rows SET n = n + 1 WHERE id = $1`
	selectSQL = `/*fn*/ SELECT n FROM bench_rows WHERE id = $1`
)

func updateSQLTx(ctx context.Context, tx *sql.Tx, id int) error {
	_, err := tx.ExecContext(ctx, updateSQL, id)
	return err
}

var updateRow = work{
	sql: updateSQLTx,
	pgx: func(ctx context.Context, q pgxQuerier, id int) error {
		_, err := q.Exec(ctx, updateSQL, id)
		return err
	},
}

var selectRow = work{
	sql: func(ctx context.Context, tx *sql.Tx, id int) error {
		var n int64
		return tx.QueryRowContext(ctx, selectSQL, id).Scan(&n)
	},
	pgx: func(ctx context.Context, q pgxQuerier, id int) error {
		var n int64
		return q.QueryRow(ctx, selectSQL, id).Scan(&n)
	},
}

func holdFor(d time.Duration) work {
	hold := func() {
		if d > 0 {
			time.Sleep(d)
		}
	}
	return work{
		sql: func(ctx context.Context, tx *sql.Tx, id int) error { hold(); return nil },
		pgx: func(ctx context.Context, q pgxQuerier, id int) error { hold(); return nil },
	}
}

func updateAndHold(d time.Duration) work {
	return work{
		sql: func(ctx context.Context, tx *sql.Tx, id int) error {
			if err := updateSQLTx(ctx, tx, id); err != nil {
				return err
			}
			if d > 0 {
				time.Sleep(d)
			}
			return nil
		},
		pgx: func(ctx context.Context, q pgxQuerier, id int) error {
			if err := updateRow.pgx(ctx, q, id); err != nil {
				return err
			}
			if d > 0 {
				time.Sleep(d)
			}
			return nil
		},
	}
}

func scenarios(o options) []scenario {
	// The backoff bounds of redislock are txlock's default ones, so that
	// the comparison is of the designs, not of the constants.
	rl := redisLock(time.Millisecond, 64*time.Millisecond)
	rlPgx := redisLockPgx(time.Millisecond, 64*time.Millisecond)
	var out []scenario
	uncontended := func(name, via string, network bool, fn work) scenario {
		impls := []impl{txlockImpl("txlock"), pgxlockImpl("pgxlock"), plainTx, plainTxRoundTrip, plainTxLockStmt, plainTxBareLock,
			plainPgx, plainPgxBareLockInBegin, forUpdate, rl, rlPgx,
			// A semaphore's uncontended acquisition, beside WithLock's: the
			// same round trips, a longer statement.
			txlockSemaphoreImpl("txlock-semaphore", semaphoreSlots, lockKey), pgxlockSemaphoreImpl("pgxlock-semaphore", semaphoreSlots, lockKey)}
		if via == "direct" {
			impls = append(impls, sessionLock)
		}
		return scenario{name: name, via: via, workers: 1, keys: 0, network: network, fn: fn, impls: impls}
	}
	for _, via := range []string{"direct", "pgbouncer"} {
		out = append(out, uncontended("uncontended-select", via, false, selectRow), uncontended("uncontended-update", via, false, updateRow))
	}
	contended := append([]impl{txlockImpl("txlock"), pgxlockImpl("pgxlock"), blocking, pollHeldTx, rl}, txlockStrategies()...)
	for _, via := range []string{"direct", "pgbouncer"} {
		for _, w := range []int{2, 16, 64} {
			for _, h := range []time.Duration{0, time.Millisecond} {
				if via == "pgbouncer" && o.quick && (w != 16 || h == 0) {
					continue
				}
				out = append(out, scenario{name: "contended", via: via, workers: w, hold: h, keys: 1, fn: holdFor(h), impls: contended})
			}
		}
	}
	many := append([]impl{txlockImpl("txlock"), plainTx, blocking, forUpdate, rl}, txlockStrategies()...)
	for _, via := range []string{"direct", "pgbouncer"} {
		out = append(out, scenario{name: "many-keys", via: via, workers: 64, keys: 1000, fn: updateAndHold(0), impls: many})
	}
	// A semaphore of 4 slots shared by 16 workers, against its ideal, 4
	// independent keys of 4 workers each (the 16 workers' total), and
	// against its slots polled by hand (semaphoreImpls).
	for _, via := range []string{"direct", "pgbouncer"} {
		out = append(out, scenario{name: "semaphore", via: via, workers: 16, hold: time.Millisecond, keys: semaphoreSlots, keyPerWorker: true,
			fn: holdFor(time.Millisecond), impls: semaphoreImpls()})
	}
	// Between processes, polling is what passes the lock: a backoff tuned to
	// the hold time (a poll every 1–2 ms here) is measured there too.
	fair := append([]impl{txlockImpl("txlock"), pgxlockImpl("pgxlock"), blocking, rl}, txlockStrategies()...)
	fair = append(fair, txlockImpl("txlock/backoff-hold", txlock.WithRetry(txlock.ConstantBackoff{Interval: time.Millisecond, Jitter: time.Millisecond})))
	out = append(out, scenario{name: "two-pools", via: "direct", workers: 16, pools: 2, hold: time.Millisecond, keys: 1, fn: holdFor(time.Millisecond), impls: fair})
	// A fleet: the same 16 workers on one key as 16 processes of one worker
	// each, and as 4 of 4, directly and through PgBouncer. Each pool is a
	// *sql.DB and a pgxpool of its own, so that txlock's and pgxlock's local
	// queues are per pool, as they are per process.
	for _, via := range []string{"direct", "pgbouncer"} {
		for _, pools := range []int{16, 4} {
			out = append(out, scenario{name: "fleet", via: via, workers: 16, pools: pools, hold: time.Millisecond, keys: 1, fn: holdFor(time.Millisecond), impls: fair})
		}
	}
	// A bystander behind PgBouncer: a fleet of 30 processes of 2 workers on
	// one hot key, on a PgBouncer pool of -pool (20) server connections,
	// and another service's SELECT 1 through the same PgBouncer.
	quiet := []impl{txlockImpl("txlock"), txlockImpl("txlock/polling", txlock.WithRetry(txlock.ExponentialBackoff{})),
		pgxlockImpl("pgxlock"), pgxlockImpl("pgxlock/polling", txlock.WithRetry(txlock.ExponentialBackoff{})), blocking}
	out = append(out, scenario{name: "bystander", via: "pgbouncer", workers: 60, pools: 30, hold: 2 * time.Millisecond, keys: 1, bystander: true, fn: holdFor(2 * time.Millisecond), impls: quiet})
	// Across the simulated network, where round trips dominate.
	if o.latency > 0 {
		out = append(out,
			uncontended("uncontended-select-network", "direct", true, selectRow),
			uncontended("uncontended-update-network", "direct", true, updateRow),
			scenario{name: "contended-network", via: "direct", workers: 16, hold: time.Millisecond, keys: 1, network: true, fn: holdFor(time.Millisecond), impls: contended})
	}
	return out
}

// txlockStrategies are txlock's non-default wait strategies.
func txlockStrategies() []impl {
	return []impl{
		txlockImpl("txlock/server-wait", txlock.WithServerWait(txlock.ServerWait{})),
		txlockImpl("txlock/backoff-1-8ms", txlock.WithRetry(txlock.ExponentialBackoff{Min: time.Millisecond, Max: 8 * time.Millisecond})),
		// Polling only: the default strategy without its queue head's
		// window in the server.
		txlockImpl("txlock/polling", txlock.WithRetry(txlock.ExponentialBackoff{})),
	}
}

// accum accumulates the measurements of one implementation over rounds.
type accum struct {
	inWindow int64 // acquisitions completed within the measured time
	total    int64 // all acquisitions, including those that drained after it
	elapsed  time.Duration
	waits    []time.Duration
	stmts    int64
	mallocs  uint64
	errs     int64
	firstErr error
	perPool  []int64 // acquisitions within the measured time, by pool
	// PgBouncer samples: server connections in use by non-holders.
	samples, waiterConnsSum, waiterConnsMax, clWaitingMax int
	bystander                                             []time.Duration // the bystander's SELECT 1 latencies
	holds                                                 []span          // each fn's start and end, one key's scenarios only (see handoffs)
}

// span is one fn's time under the lock, from its start to its return, and
// when its call returned, after the commit.
type span struct{ start, end, ret time.Time }

// bystanderEvery is how often the bystander sends its SELECT 1.
const bystanderEvery = 5 * time.Millisecond

func (b *bench) measureGroup(sc scenario, envs []*env) ([]result, error) {
	accs := make([]accum, len(sc.impls))
	for i := range accs {
		accs[i].perPool = make([]int64, len(envs))
	}
	rounds := b.o.rounds
	if sc.workers == 1 && !b.o.roundsSet {
		// One worker's time per operation differs between implementations
		// by tens of microseconds, less than the machine's drift over a
		// second: finer interleaving lets the drift hit them all alike.
		rounds *= 4
	}
	per := b.o.dur / time.Duration(rounds)
	// A short unmeasured run of each implementation first, so that opening
	// the pools' connections (tens of milliseconds each) does not land in the
	// first implementation's wait times.
	for _, im := range sc.impls {
		if sc.via == "pgbouncer" && !im.pgbouncerSafe {
			continue
		}
		if err := b.measure(sc, im, envs, 50*time.Millisecond, &accum{perPool: make([]int64, len(envs))}); err != nil {
			return nil, fmt.Errorf("%s/%s/%s (warm-up): %w", sc.name, sc.via, im.name, err)
		}
	}
	for range rounds {
		for i, im := range sc.impls {
			if sc.via == "pgbouncer" && !im.pgbouncerSafe {
				continue
			}
			if err := b.measure(sc, im, envs, per, &accs[i]); err != nil {
				return nil, fmt.Errorf("%s/%s/%s: %w", sc.name, sc.via, im.name, err)
			}
		}
	}
	var out []result
	for i, im := range sc.impls {
		if sc.via == "pgbouncer" && !im.pgbouncerSafe {
			continue
		}
		out = append(out, summarize(sc, im, &accs[i]))
	}
	return out, nil
}

// measure runs im for d with sc's workers, worker i on envs[i mod
// len(envs)], and adds to a.
func (b *bench) measure(sc scenario, im impl, envs []*env, d time.Duration, a *accum) error {
	ctx := context.Background()
	var stopFlag atomic.Bool
	var holders atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	workers := make([]workerImpl, sc.workers)
	if im.perWorker != nil {
		for i := range workers {
			w, err := im.perWorker(ctx, envs[i%len(envs)])
			if err != nil {
				return err
			}
			workers[i] = w
			defer w.close()
		}
	}
	runtime.GC()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	stmts0, redis0 := b.stmts.n.Load(), redisCount.Load()
	start := time.Now()
	deadline := start.Add(d)
	for wi := range sc.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool := wi % len(envs)
			we := envs[pool]
			var waits []time.Duration
			var holds []span
			var inWindow, total, errs int64
			var firstErr error
			fn, fnEnd := sc.fn, time.Time{}
			if sc.exclusive() {
				fn = work{
					sql: func(ctx context.Context, tx *sql.Tx, id int) error {
						err := sc.fn.sql(ctx, tx, id)
						fnEnd = time.Now()
						return err
					},
					pgx: func(ctx context.Context, q pgxQuerier, id int) error {
						err := sc.fn.pgx(ctx, q, id)
						fnEnd = time.Now()
						return err
					},
				}
			}
			for !stopFlag.Load() {
				id := 1
				switch {
				case sc.keyPerWorker:
					id = 1 + wi%max(sc.keys, 1)
				case sc.keys == 0:
					id = 1 + rand.IntN(rows)
				case sc.keys > 1:
					id = 1 + rand.IntN(sc.keys)
				}
				t0 := time.Now()
				var tg time.Time
				granted := func() { tg = time.Now(); holders.Add(1) }
				var err error
				fnEnd = time.Time{}
				if workers[wi] != nil {
					err = workers[wi].run(ctx, we, id, fn, granted)
				} else {
					err = im.run(ctx, we, id, fn, granted)
				}
				if !tg.IsZero() {
					holders.Add(-1)
				}
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				total++
				if time.Now().Before(deadline) {
					inWindow++
				}
				waits = append(waits, tg.Sub(t0))
				if !fnEnd.IsZero() && time.Now().Before(deadline) {
					holds = append(holds, span{tg, fnEnd, time.Now()})
				}
			}
			mu.Lock()
			a.waits = append(a.waits, waits...)
			a.holds = append(a.holds, holds...)
			a.inWindow += inWindow
			a.total += total
			a.perPool[pool] += inWindow
			a.errs += errs
			if a.firstErr == nil {
				a.firstErr = firstErr
			}
			mu.Unlock()
		}()
	}
	bystanderDone := make(chan struct{})
	if sc.bystander {
		go func() {
			defer close(bystanderDone)
			var lat []time.Duration
			for time.Now().Before(deadline) {
				t0 := time.Now()
				var one int
				if err := b.bystander.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
					mu.Lock()
					a.errs++
					if a.firstErr == nil {
						a.firstErr = fmt.Errorf("bystander: %w", err)
					}
					mu.Unlock()
				}
				lat = append(lat, time.Since(t0))
				time.Sleep(bystanderEvery)
			}
			mu.Lock()
			a.bystander = append(a.bystander, lat...)
			mu.Unlock()
		}()
	} else {
		close(bystanderDone)
	}
	// Sample PgBouncer's pools while the workers run.
	sampleDone := make(chan struct{})
	if sc.via == "pgbouncer" && sc.workers > 1 {
		go func() {
			defer close(sampleDone)
			for time.Now().Before(deadline) {
				active, waiting, ok := b.showPools()
				if ok {
					w := max(active-int(holders.Load()), 0)
					mu.Lock()
					a.samples++
					a.waiterConnsSum += w
					a.waiterConnsMax = max(a.waiterConnsMax, w)
					a.clWaitingMax = max(a.clWaitingMax, waiting)
					mu.Unlock()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	} else {
		close(sampleDone)
	}
	time.Sleep(time.Until(deadline))
	stopFlag.Store(true)
	wg.Wait()
	<-sampleDone
	<-bystanderDone
	a.elapsed += d
	runtime.ReadMemStats(&ms1)
	a.mallocs += ms1.Mallocs - ms0.Mallocs
	a.stmts += b.stmts.n.Load() - stmts0 + redisCount.Load() - redis0
	if a.total == 0 && a.firstErr != nil {
		return a.firstErr
	}
	return nil
}

// showPools returns sv_active and cl_waiting summed over the pools of
// database postgres.
func (b *bench) showPools() (active, waiting int, ok bool) {
	rows, err := b.admin.Query("SHOW POOLS")
	if err != nil {
		return 0, 0, false
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if rows.Scan(ptrs...) != nil {
			return 0, 0, false
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		if row["database"] != "postgres" {
			continue
		}
		var n, m int
		fmt.Sscan(row["sv_active"], &n)
		fmt.Sscan(row["cl_waiting"], &m)
		active += n
		waiting += m
	}
	return active, waiting, rows.Err() == nil
}
