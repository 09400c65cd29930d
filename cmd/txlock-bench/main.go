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
// have), and reports each implementation's least served pool. The
// bystander scenario puts another service's SELECT 1, every 5 ms, through
// the PgBouncer that a fleet of 30 pools contends behind, and reports its
// latency.
// The semaphore scenario shares the 4 slots of one key (WithSemaphore)
// among 16 workers, beside its ideal, 4 independent keys of 4 workers each,
// and beside the slots polled by hand, one try a slot, as allisson/go-pglock's
// README builds a resource pool.
//
// Compare numbers within one run: they are ratios' raw material, and the
// absolute values depend on the machine and its load.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

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

// bench holds the shared state of a run.
type bench struct {
	o     options
	stmts *counter
	admin *sql.DB // PgBouncer admin console
	// bystander is another service's client of PgBouncer (scenario's
	// bystander), with one connection.
	bystander *sql.DB
	results   []result
	rdb       *redis.Client
	locks     *redislock.Client
	network   string // what the simulated network measured, if it ran
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
	if b.bystander, err = sql.Open("pgx", urls["pgbouncer"]); err != nil {
		return err
	}
	defer b.bystander.Close()
	b.bystander.SetMaxOpenConns(1)
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
