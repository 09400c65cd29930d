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
//	go run ./cmd/txlock-bench -only fleet,network
//
// Scenarios whose name ends in -network reach PostgreSQL and Redis through
// an in-process toxiproxy that adds -latency each way, a simulated network
// where round trips dominate. The fleet scenario splits 16 workers over
// pools (one *sql.DB and one pgxpool each, as separate processes would
// have), and reports each implementation's least served pool.
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
	"github.com/jackc/pgx/v5/pgxpool"
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
	only       []string // run only scenarios whose name contains one of these
	latency    time.Duration
	pgURL      string
	bouncerURL string
	adminURL   string
	redisAddr  string
}

func main() {
	var o options
	flag.BoolVar(&o.quick, "quick", false, "short runs and fewer PgBouncer combinations (about 2 minutes)")
	flag.BoolVar(&o.jsonOut, "json", false, "print one JSON object per measurement instead of the markdown table")
	flag.StringVar(&o.svgPath, "svg", "txlock-bench.svg", "write the contention chart here (empty: none)")
	flag.DurationVar(&o.dur, "d", 0, "measured time per implementation and configuration (default 3s, 400ms with -quick)")
	flag.IntVar(&o.rounds, "rounds", 0, "split each measurement into this many interleaved rounds (default 3, 2 with -quick; four times as many for one-worker scenarios)")
	flag.IntVar(&o.pool, "pool", 20, "PgBouncer default_pool_size of the throwaway PgBouncer")
	only := flag.String("only", "", "run only scenarios whose name contains this (a comma-separated list: any of them)")
	flag.DurationVar(&o.latency, "latency", 500*time.Microsecond, "latency added each way by the simulated network of the -network scenarios (0: skip them)")
	flag.StringVar(&o.pgURL, "pg", "", "PostgreSQL URL (default: start a throwaway cluster)")
	flag.StringVar(&o.bouncerURL, "pgbouncer", "", "PgBouncer (transaction mode) URL in front of -pg")
	flag.StringVar(&o.adminURL, "pgbouncer-admin", "", "PgBouncer admin console URL")
	flag.StringVar(&o.redisAddr, "redis", "", "Redis host:port (default: start a throwaway redis-server)")
	flag.Parse()
	for _, s := range strings.Split(*only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.only = append(o.only, s)
		}
	}
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
// guarded work itself (marked with a leading /*fn*/ comment). A query of
// several statements (pgxlock's polling attempt: the lock statement, then
// BEGIN) counts those that ran: all of them when it succeeds, the first
// only when it fails, as a busy attempt's lock statement does, which ends
// the query before its BEGIN.
type counter struct {
	n atomic.Int64
	// The statements after the first of each connection's query in flight,
	// if it has several: a map, not a context value, so that counting
	// allocates nothing per query once the map has room for the
	// connections.
	mu       sync.Mutex
	more     map[*pgx.Conn]int64
	inFlight atomic.Int64 // entries of more, read without mu
}

func (c *counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "/*fn*/") {
		return ctx
	}
	c.n.Add(1)
	if strings.IndexByte(d.SQL, ';') < 0 {
		return ctx
	}
	if n := countStatements(d.SQL); n > 1 {
		c.mu.Lock()
		if c.more == nil {
			c.more = map[*pgx.Conn]int64{}
		}
		c.more[conn] = int64(n - 1)
		c.inFlight.Add(1)
		c.mu.Unlock()
	}
	return ctx
}

func (c *counter) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	if c.inFlight.Load() == 0 { // the usual case: one statement per query
		return
	}
	c.mu.Lock()
	n, ok := c.more[conn]
	if ok {
		delete(c.more, conn)
		c.inFlight.Add(-1)
	}
	c.mu.Unlock()
	if ok && d.Err == nil {
		c.n.Add(n)
	}
}

// countStatements returns the number of statements in query: its
// semicolons outside quotes, identifiers and comments, plus one unless the
// text after the last of them is empty. It knows the SQL this program and
// the library send, not dollar quoting.
func countStatements(query string) int {
	n := 0
	pending := false // text after the last semicolon
	for i := 0; i < len(query); i++ {
		switch ch := query[i]; {
		case ch == '\'' || ch == '"':
			j := strings.IndexByte(query[i+1:], ch)
			if j < 0 {
				i = len(query)
			} else {
				i += j + 1 // a doubled quote is two quoted strings, side by side
			}
			pending = true
		case ch == '-' && strings.HasPrefix(query[i:], "--"):
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query) - i
			}
			i += j
		case ch == '/' && strings.HasPrefix(query[i:], "/*"):
			j := strings.Index(query[i+2:], "*/")
			if j < 0 {
				i = len(query)
			} else {
				i += j + 3
			}
		case ch == ';':
			if pending {
				n++
			}
			pending = false
		case ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r':
			pending = true
		}
	}
	if pending {
		n++
	}
	return n
}

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
	network string // what the simulated network measured, if it ran
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

// pgxPool opens a pgx pool on url with the statement counter, for pgxlock
// and the pgx-native references.
func (b *bench) pgxPool(url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = b.stmts
	cfg.MaxConns = 100
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// selected reports whether the scenario named name is to run.
func (o *options) selected(name string) bool {
	if len(o.only) == 0 {
		return true
	}
	for _, s := range o.only {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
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

	urls := map[string]string{
		"direct": o.pgURL,
		// PgBouncer 1.18 has no prepared statements: fn's statements go
		// with pgx's exec mode there.
		"pgbouncer": o.bouncerURL + "&default_query_exec_mode=exec",
	}
	rdbs := map[string]*redis.Client{"direct": b.rdb, "pgbouncer": b.rdb}
	all := scenarios(o)
	var selected []scenario
	network := false
	for _, sc := range all {
		if o.selected(sc.name) {
			selected = append(selected, sc)
			network = network || sc.network
		}
	}
	if network {
		// The simulated network: a proxy in front of PostgreSQL and one in
		// front of Redis, each adding o.latency each way.
		pgAddr, err := hostPort(o.pgURL)
		if err != nil {
			return err
		}
		pgProxy, err := startProxy("postgres", pgAddr, o.latency)
		if err != nil {
			return err
		}
		defer pgProxy.close()
		redisProxy, err := startProxy("redis", o.redisAddr, o.latency)
		if err != nil {
			return err
		}
		defer redisProxy.close()
		if urls["direct+network"], err = viaProxy(o.pgURL, pgProxy.addr()); err != nil {
			return err
		}
		nrdb := redis.NewClient(&redis.Options{Addr: redisProxy.addr(), PoolSize: 100})
		defer nrdb.Close()
		nrdb.AddHook(redisCounter{&redisN})
		rdbs["direct+network"] = nrdb
		direct, err := medianRoundTrip(context.Background(), o.pgURL)
		if err != nil {
			return err
		}
		proxied, err := medianRoundTrip(context.Background(), urls["direct+network"])
		if err != nil {
			return err
		}
		b.network = fmt.Sprintf("%v each way in front of PostgreSQL and Redis; a SELECT 1 round trip to PostgreSQL took %v through it (median of 51), %v without", o.latency, proxied.Round(time.Microsecond), direct.Round(time.Microsecond))
		logf("simulated network: %s", b.network)
	}
	// openEnv opens the pools of one env on the network path named by key:
	// a *sql.DB and a pgxpool, which open their connections when first
	// used.
	openEnv := func(key string) (*env, error) {
		db, err := b.pool(urls[key])
		if err != nil {
			return nil, err
		}
		rdb := rdbs[key]
		e := &env{db: db, stmts: b.stmts, rdb: rdb, locks: redislock.New(rdb)}
		if e.pgx, err = b.pgxPool(urls[key]); err != nil {
			db.Close()
			return nil, err
		}
		return e, nil
	}
	closeEnv := func(e *env) {
		e.db.Close()
		e.pgx.Close()
	}
	envs := map[string]*env{}
	for key := range urls {
		e, err := openEnv(key)
		if err != nil {
			return err
		}
		defer closeEnv(e)
		envs[key] = e
	}
	start := time.Now()
	for _, sc := range selected {
		pools := max(sc.pools, 1)
		logf("%s: %s, %d workers in %d pool(s), hold %v (%d implementations)", sc.name, sc.via, sc.workers, pools, sc.hold, len(sc.impls))
		key := sc.envKey()
		es := []*env{envs[key]}
		var err error
		for len(es) < pools && err == nil {
			var e *env
			if e, err = openEnv(key); err == nil {
				es = append(es, e)
			}
		}
		var rs []result
		if err == nil {
			rs, err = b.measureGroup(sc, es)
		}
		for _, e := range es[1:] {
			closeEnv(e)
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
		printTable(os.Stdout, b.results, o, b.network)
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
	pools   int  // n > 1: split the workers over n pools (n "processes"), worker i in pool i mod n
	network bool // through the simulated network (the name ends in -network)
	fn      work // the guarded work
	impls   []impl
}

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
			plainPgx, plainPgxBareLockInBegin, forUpdate, rl, rlPgx}
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
}

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
