// Command txlock-bench measures what a lock costs when nobody contends and
// how it behaves when everybody does, for txlock and the alternatives users
// pick, in one run on one machine, and prints the results as a markdown
// table (or JSON lines with -json) and an SVG chart.
//
// It starts its own throwaway PostgreSQL, PgBouncer (transaction mode) and
// Redis on 127.0.0.1 unless given URLs of existing ones:
//
//	go run ./cmd/txlock-bench -quick
//	go run ./cmd/txlock-bench -json -svg contended.svg
//	go run ./cmd/txlock-bench -pg postgres://… -pgbouncer postgres://… -pgbouncer-admin postgres://… -redis 127.0.0.1:6379
//
// Compare numbers within one run: they are ratios' raw material, and the
// absolute values depend on the machine and its load.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

const rows = 10000 // rows of bench_rows; uncontended keys are drawn from them

type options struct {
	quick      bool
	jsonOut    bool
	svgPath    string
	dur        time.Duration
	rounds     int
	roundsSet  bool // -rounds was given: use it for every scenario
	pool       int
	only       string
	pgURL      string
	bouncerURL string
	adminURL   string
	redisAddr  string
}

func main() {
	var o options
	flag.BoolVar(&o.quick, "quick", false, "short runs and fewer PgBouncer combinations (under 2 minutes)")
	flag.BoolVar(&o.jsonOut, "json", false, "print one JSON object per measurement instead of the markdown table")
	flag.StringVar(&o.svgPath, "svg", "txlock-bench.svg", "write the contention chart here (empty: none)")
	flag.DurationVar(&o.dur, "d", 0, "measured time per implementation and configuration (default 3s, 400ms with -quick)")
	flag.IntVar(&o.rounds, "rounds", 0, "split each measurement into this many interleaved rounds (default 3, 2 with -quick; four times as many for one-worker scenarios)")
	flag.IntVar(&o.pool, "pool", 20, "PgBouncer default_pool_size of the throwaway PgBouncer")
	flag.StringVar(&o.only, "only", "", "run only scenarios whose name contains this")
	flag.StringVar(&o.pgURL, "pg", "", "PostgreSQL URL (default: start a throwaway cluster)")
	flag.StringVar(&o.bouncerURL, "pgbouncer", "", "PgBouncer (transaction mode) URL in front of -pg")
	flag.StringVar(&o.adminURL, "pgbouncer-admin", "", "PgBouncer admin console URL")
	flag.StringVar(&o.redisAddr, "redis", "", "Redis host:port (default: start a throwaway redis-server)")
	flag.Parse()
	if o.dur == 0 {
		o.dur = 3 * time.Second
		if o.quick {
			o.dur = 400 * time.Millisecond
		}
	}
	o.roundsSet = o.rounds != 0
	if o.rounds == 0 {
		o.rounds = 3
		if o.quick {
			o.rounds = 2
		}
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "txlock-bench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// servers starts what was not given, and returns a function that stops it.
func servers(o *options) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		stop()
		os.Exit(130)
	}()
	if o.pgURL == "" {
		logf("starting PostgreSQL…")
		c, err := pgtest.StartCluster(pgtest.ClusterOptions{Settings: map[string]string{"max_connections": "300"}})
		if err != nil {
			return stop, err
		}
		stops = append(stops, func() { _ = c.Close() })
		o.pgURL = c.URL()
		if o.bouncerURL == "" {
			logf("starting PgBouncer (transaction mode, pool %d)…", o.pool)
			b, err := pgtest.StartBouncer(c, pgtest.BouncerOptions{PoolSize: o.pool})
			if err != nil {
				return stop, err
			}
			stops = append(stops, func() { _ = b.Close() })
			o.bouncerURL, o.adminURL = b.URL(), b.AdminURL()
		}
	}
	if o.bouncerURL == "" || o.adminURL == "" {
		return stop, fmt.Errorf("with -pg, give -pgbouncer and -pgbouncer-admin too")
	}
	if o.redisAddr == "" {
		logf("starting Redis…")
		r, err := startRedis()
		if err != nil {
			return stop, err
		}
		stops = append(stops, r.close)
		o.redisAddr = r.addr
	}
	return stop, nil
}

// counter counts statements sent to PostgreSQL, except those of the
// guarded work itself (marked with a leading /*fn*/ comment).
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.HasPrefix(d.SQL, "/*fn*/") {
		c.n.Add(1)
	}
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type redisCounter struct{ n *atomic.Int64 }

func (h redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// bench holds the shared state of a run.
type bench struct {
	o       options
	stmts   *counter
	admin   *sql.DB // PgBouncer admin console
	results []result
	rdb     *redis.Client
	locks   *redislock.Client
}

// pool opens a pool on url with the statement counter.
func (b *bench) pool(url string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.Tracer = b.stmts
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(100)
	db.SetMaxIdleConns(100)
	return db, nil
}

func run(o options) error {
	stop, err := servers(&o)
	defer stop()
	if err != nil {
		return err
	}
	b := &bench{o: o, stmts: &counter{}}
	setup, err := sql.Open("pgx", o.pgURL)
	if err != nil {
		return err
	}
	defer setup.Close()
	if _, err := setup.Exec(`DROP TABLE IF EXISTS bench_rows;
		CREATE TABLE bench_rows (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
		INSERT INTO bench_rows (id) SELECT generate_series(0, ` + fmt.Sprint(rows) + `)`); err != nil {
		return fmt.Errorf("creating bench_rows: %w", err)
	}
	if _, err := setup.Exec(`VACUUM ANALYZE bench_rows`); err != nil {
		return fmt.Errorf("vacuum bench_rows: %w", err)
	}
	if b.admin, err = sql.Open("pgx", o.adminURL); err != nil {
		return err
	}
	defer b.admin.Close()
	b.rdb = redis.NewClient(&redis.Options{Addr: o.redisAddr, PoolSize: 100})
	defer b.rdb.Close()
	var redisN atomic.Int64
	b.rdb.AddHook(redisCounter{&redisN})
	b.locks = redislock.New(b.rdb)
	if err := b.rdb.Ping(context.Background()).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	redisCount = &redisN

	vias := map[string]string{
		"direct": o.pgURL,
		// PgBouncer 1.18 has no prepared statements: fn's statements go
		// with pgx's exec mode there.
		"pgbouncer": o.bouncerURL + "&default_query_exec_mode=exec",
	}
	envs := map[string]*env{}
	for via, url := range vias {
		db, err := b.pool(url)
		if err != nil {
			return err
		}
		defer db.Close()
		envs[via] = &env{db: db, rdb: b.rdb, locks: b.locks}
	}
	start := time.Now()
	for _, sc := range scenarios(o) {
		if o.only != "" && !strings.Contains(sc.name, o.only) {
			continue
		}
		logf("%s: %s, %d workers, hold %v (%d implementations)", sc.name, sc.via, sc.workers, sc.hold, len(sc.impls))
		e := envs[sc.via]
		var second *env
		if sc.pools == 2 {
			db2, err := b.pool(vias[sc.via])
			if err != nil {
				return err
			}
			second = &env{db: db2, rdb: b.rdb, locks: b.locks}
		}
		rs, err := b.measureGroup(sc, e, second)
		if second != nil {
			second.db.Close()
		}
		if err != nil {
			return err
		}
		b.results = append(b.results, rs...)
	}
	logf("done in %v", time.Since(start).Round(time.Second))
	if o.jsonOut {
		printJSON(os.Stdout, b.results)
	} else {
		printTable(os.Stdout, b.results, o)
	}
	if o.svgPath != "" {
		if err := os.WriteFile(o.svgPath, []byte(chart(b.results)), 0o644); err != nil {
			return err
		}
		logf("wrote %s", o.svgPath)
	}
	return nil
}

var redisCount *atomic.Int64

// scenario is one configuration, measured for each of its implementations.
type scenario struct {
	name    string
	via     string
	workers int
	hold    time.Duration
	keys    int  // 0: random rows of all; 1: one key; n: n keys
	pools   int  // 2: split the workers over two pools (two "processes")
	fn      work // the guarded work
	impls   []impl
}

// guarded work
func updateRow(ctx context.Context, tx *sql.Tx, id int) error {
	_, err := tx.ExecContext(ctx, `/*fn*/ UPDATE bench_rows SET n = n + 1 WHERE id = $1`, id)
	return err
}

func selectRow(ctx context.Context, tx *sql.Tx, id int) error {
	var n int64
	return tx.QueryRowContext(ctx, `/*fn*/ SELECT n FROM bench_rows WHERE id = $1`, id).Scan(&n)
}

func holdFor(d time.Duration) work {
	return func(ctx context.Context, tx *sql.Tx, id int) error {
		if d > 0 {
			time.Sleep(d)
		}
		return nil
	}
}

func updateAndHold(d time.Duration) work {
	return func(ctx context.Context, tx *sql.Tx, id int) error {
		if err := updateRow(ctx, tx, id); err != nil {
			return err
		}
		if d > 0 {
			time.Sleep(d)
		}
		return nil
	}
}

func scenarios(o options) []scenario {
	// The backoff bounds of redislock are txlock's default ones, so that
	// the comparison is of the designs, not of the constants.
	rl := redisLock(time.Millisecond, 64*time.Millisecond)
	var out []scenario
	for _, via := range []string{"direct", "pgbouncer"} {
		for _, f := range []struct {
			name string
			fn   work
		}{{"uncontended-select", selectRow}, {"uncontended-update", updateRow}} {
			impls := []impl{txlockImpl("txlock"), plainTx, plainTxRoundTrip, plainTxLockStmt, forUpdate, rl}
			if via == "direct" {
				impls = append(impls, sessionLock)
			}
			out = append(out, scenario{name: f.name, via: via, workers: 1, keys: 0, fn: f.fn, impls: impls})
		}
	}
	contended := append([]impl{txlockImpl("txlock"), blocking, pollHeldTx, rl}, txlockStrategies()...)
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
	// Between processes, polling is what passes the lock: a backoff tuned to
	// the hold time (a poll every 1–2 ms here) is measured there too.
	fair := append([]impl{txlockImpl("txlock"), blocking, rl}, txlockStrategies()...)
	fair = append(fair, txlockImpl("txlock/backoff-hold", txlock.WithRetry(txlock.ConstantBackoff{Interval: time.Millisecond, Jitter: time.Millisecond})))
	out = append(out, scenario{name: "two-pools", via: "direct", workers: 16, pools: 2, hold: time.Millisecond, keys: 1, fn: holdFor(time.Millisecond), impls: fair})
	return out
}

// txlockStrategies are txlock's non-default wait strategies.
func txlockStrategies() []impl {
	return []impl{
		txlockImpl("txlock/server-wait", txlock.WithServerWait(txlock.ServerWait{})),
		txlockImpl("txlock/backoff-1-8ms", txlock.WithRetry(txlock.ExponentialBackoff{Min: time.Millisecond, Max: 8 * time.Millisecond})),
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
	perPool  [2]int64
	// PgBouncer samples: server connections in use by non-holders.
	samples, waiterConnsSum, waiterConnsMax, clWaitingMax int
}

func (b *bench) measureGroup(sc scenario, e, second *env) ([]result, error) {
	accs := make([]accum, len(sc.impls))
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
		if err := b.measure(sc, im, e, second, 50*time.Millisecond, &accum{}); err != nil {
			return nil, fmt.Errorf("%s/%s/%s (warm-up): %w", sc.name, sc.via, im.name, err)
		}
	}
	for range rounds {
		for i, im := range sc.impls {
			if sc.via == "pgbouncer" && !im.pgbouncerSafe {
				continue
			}
			if err := b.measure(sc, im, e, second, per, &accs[i]); err != nil {
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

// measure runs im for d with sc's workers and adds to a.
func (b *bench) measure(sc scenario, im impl, e, second *env, d time.Duration, a *accum) error {
	ctx := context.Background()
	var stopFlag atomic.Bool
	var holders atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	workers := make([]workerImpl, sc.workers)
	if im.perWorker != nil {
		for i := range workers {
			w, err := im.perWorker(ctx, e)
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
			we, pool := e, 0
			if second != nil && wi%2 == 1 {
				we, pool = second, 1
			}
			var waits []time.Duration
			var inWindow, total, errs int64
			var firstErr error
			for !stopFlag.Load() {
				id := 1
				switch {
				case sc.keys == 0:
					id = 1 + rand.IntN(rows)
				case sc.keys > 1:
					id = 1 + rand.IntN(sc.keys)
				}
				t0 := time.Now()
				var tg time.Time
				granted := func() { tg = time.Now(); holders.Add(1) }
				var err error
				if workers[wi] != nil {
					err = workers[wi].run(ctx, we, id, sc.fn, granted)
				} else {
					err = im.run(ctx, we, id, sc.fn, granted)
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
			}
			mu.Lock()
			a.waits = append(a.waits, waits...)
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
