// Command pgbouncer runs the inventory workload (workers selling from a
// small stock, each sale a read-then-write under txlock.WithLock, here on
// four SKUs with a lock each) through PgBouncer in transaction mode, in two
// rounds: first with pgx's default default_query_exec_mode,
// cache_statement, where the sales' own parameterized queries fail, and it
// prints the errors as they happen and what they mean; then with
// default_query_exec_mode=exec, where the same workload sells every unit
// exactly once.
//
//	go run ./examples/pgbouncer
//	DATABASE_URL='postgres://you@127.0.0.1:5432/db?sslmode=disable' PGBOUNCER_URL='postgres://you@127.0.0.1:6432/db?sslmode=disable' go run ./examples/pgbouncer
//
// Each round sells half the stock, then restarts the service (a new
// connection pool, as after a deploy) and sells the rest: PgBouncer keeps
// its server connections across the restart, with what the first pool
// prepared on them, and after that cache_statement all but certainly fails.
//
// Without DATABASE_URL it starts a throwaway PostgreSQL and a PgBouncer in
// transaction mode from the installed binaries (Debian bookworm's
// pgbouncer is 1.18), and removes them when it ends, on Ctrl-C too. It needs pgbouncer
// installed, or PGBOUNCER_URL set, and says so and exits non-zero without.
// With DATABASE_URL it uses that database, and PGBOUNCER_URL in front of it;
// it creates its txlock_example_pgb_* tables there and drops them at the
// end. Whatever default_query_exec_mode those URLs name, each round sets its
// own.
//
// It exits non-zero if a round oversold, or if the round in exec mode
// failed. A PgBouncer that supports prepared statements (1.21 and later,
// with max_prepared_statements set) passes the first round too, and the
// program says so.
//
// The part to copy is sale.go (openDB, sell); the rest is the demo.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/examples/internal/exampledb"
	"github.com/txlock/txlock/examples/internal/progress"
)

// skus are the products for sale, each with a lock of its own.
var skus = [...]string{"SKU-1001", "SKU-1002", "SKU-1003", "SKU-1004"}

// maxFailures is how many failed sales a run of the service takes before it
// gives up.
const maxFailures = 200

// errNoBouncer: there is a database, but no PgBouncer in front of it.
var errNoBouncer = errors.New("no PgBouncer")

func main() { exampledb.Main("pgbouncer", run) }

type config struct {
	workers  int
	stock    int
	duration time.Duration
}

// run runs the example with the command-line arguments args, writing its
// report to stdout.
func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	fs := flag.NewFlagSet("pgbouncer", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var cfg config
	fs.IntVar(&cfg.workers, "workers", 8, "concurrent workers selling")
	fs.IntVar(&cfg.stock, "stock", 200, "units in stock at the start of each round")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "the longest a round sells before it stops")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q: the example takes only flags (-h lists them)", fs.Args())
	case cfg.workers < 1:
		return fmt.Errorf("-workers %d: need at least 1", cfg.workers)
	case cfg.stock < 1:
		return fmt.Errorf("-stock %d: need at least 1 unit", cfg.stock)
	case cfg.duration <= 0:
		return fmt.Errorf("-duration %v: need a positive duration", cfg.duration)
	}

	servers, err := exampledb.Start(stdout, true)
	if err != nil {
		return fmt.Errorf("no database: %w", err)
	}
	defer func() {
		err = errors.Join(err, servers.Close())
		if servers.Throwaway {
			fmt.Fprintln(stdout, "stopped the throwaway servers")
		}
	}()
	if servers.BouncerURL == "" {
		fix := "install pgbouncer (Debian and Ubuntu: apt-get install pgbouncer) for it to start one, or set DATABASE_URL and PGBOUNCER_URL to a PostgreSQL and a PgBouncer in transaction mode in front of it"
		if !servers.Throwaway {
			fix = "set PGBOUNCER_URL to a PgBouncer in transaction mode in front of DATABASE_URL"
		}
		return fmt.Errorf("%w: this example needs a PgBouncer in transaction mode, and there is none (%s): %s", errNoBouncer, servers.BouncerMissing, fix)
	}

	// The tables are made directly, not through PgBouncer.
	direct, err := openDB(servers.URL, pgx.QueryExecModeExec)
	if err != nil {
		return err
	}
	defer direct.Close()
	if _, err := direct.ExecContext(ctx, `
		DROP TABLE IF EXISTS txlock_example_pgb_stock, txlock_example_pgb_sales;
		CREATE TABLE txlock_example_pgb_stock (sku text PRIMARY KEY, qty int NOT NULL);
		CREATE TABLE txlock_example_pgb_sales (id bigserial PRIMARY KEY, round text NOT NULL, sku text NOT NULL, worker int NOT NULL)`); err != nil {
		return fmt.Errorf("creating the example's tables: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, derr := direct.ExecContext(dctx, `DROP TABLE IF EXISTS txlock_example_pgb_stock, txlock_example_pgb_sales`)
		err = errors.Join(err, derr)
	}()

	out := progress.NewPrinter(stdout)
	out.Printf("\n%d workers sell %d SKUs, %d units of each, under txlock.WithLock (a lock per SKU), through PgBouncer in transaction mode\n",
		cfg.workers, len(skus), cfg.stock)

	// exampledb's URLs end in default_query_exec_mode=exec, and a
	// PGBOUNCER_URL of one's own may set a mode too. Each round sets the
	// mode it shows on the parsed configuration, which overrides whatever
	// the URL says: first pgx's default, cache_statement, which a URL
	// without the parameter gets.
	first, err := sellRound(ctx, out, servers.BouncerURL, direct, cfg, pgx.QueryExecModeCacheStatement)
	if err != nil {
		return err
	}
	explain(out, first)

	// The fix: default_query_exec_mode=exec in the URL. pgx then sends each
	// query as an unnamed statement, parsed, bound and executed in one
	// round trip, so nothing outlives the transaction's server connection.
	second, err := sellRound(ctx, out, servers.BouncerURL, direct, cfg, pgx.QueryExecModeExec)
	if err != nil {
		return err
	}

	out.Printf("\nsummary\n")
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "default_query_exec_mode\tsold\tstock left\toversold\tsales failed")
	for _, r := range []roundResult{first, second} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", modeName(r.mode), r.sold, r.left, r.oversold, r.failed)
	}
	tw.Flush()
	total := len(skus) * cfg.stock
	switch {
	case first.oversold > 0 || second.oversold > 0:
		return errors.New("a round oversold under the lock")
	case second.failed > 0 || second.sold+second.left != total:
		return fmt.Errorf("default_query_exec_mode=exec: %d sales failed, %d sold and %d left of a stock of %d", second.failed, second.sold, second.left, total)
	}
	out.Printf("\nBehind PgBouncer 1.18, put default_query_exec_mode=exec (or simple_protocol) in the connection string.\n")
	return nil
}

// explain says what the errors of the cache_statement round mean.
func explain(out *progress.Printer, r roundResult) {
	if r.failed == 0 {
		out.Printf("  No error: this PgBouncer keeps track of prepared statements (1.21 and later, with max_prepared_statements set), where cache_statement works.\n")
		return
	}
	out.Printf(`  What it means: in cache_statement mode pgx prepares each parameterized
  query once per client connection, as a named statement on the server
  connection ("stmtcache_" and a hash of the SQL), and from then on only
  executes it. PgBouncer in transaction mode gives each transaction
  whichever server connection is free, and PgBouncer 1.18 does not track
  prepared statements.
`)
	if r.errs["42P05"] > 0 {
		out.Printf(`  42P05 "already exists": another client connection prepared the same
    query, under the same name, on the server connection this transaction
    got, and this one has not cached it yet. It cannot prepare it on any
    server connection that has it, so it fails again and again. After a
    restart, every new client connection starts out so on every server
    connection the old pool used.
`)
	}
	if r.errs["26000"] > 0 {
		out.Printf(`  26000 "does not exist": this client connection prepared the query on
    another server connection than the one this transaction got.
`)
	}
	out.Printf(`  txlock's own statements take no parameters, so pgx sends them with the
  simple protocol and they pass: the lock held, and the failed sales rolled
  back (%d oversold).
`, r.oversold)
}

// modeName returns the name of mode as default_query_exec_mode spells it.
func modeName(mode pgx.QueryExecMode) string {
	switch mode {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement"
	case pgx.QueryExecModeExec:
		return "exec"
	}
	return mode.String()
}

type roundResult struct {
	mode                         pgx.QueryExecMode
	sold, left, oversold, failed int
	errs                         map[string]int // failed sales by SQLSTATE
	soldBy, failedBy             [2]int         // sales of each run of the service
}

// sellRound sells the stock through PgBouncer in exec mode mode, in two
// runs of the service, as across a restart or a deploy: the first run
// sells half the stock and closes its pool; the second, with a pool of its
// own, sells the rest. Either stops when cfg.duration has passed.
//
// PgBouncer keeps its server connections, and what the first run prepared
// on them, when the first run's client connections close. Without the
// restart cache_statement fails too, whenever a client connection meets a
// server connection that another client connection used before: how often
// depends on how many of each there are and how they pair up (more
// workers, more failures; a pool that closes idle connections and opens
// new ones; a second instance of the service). After the restart it is
// all but certain: every server connection the first run used has the
// statements, and a new client connection has none of them cached.
func sellRound(ctx context.Context, out *progress.Printer, bouncerURL string, direct *sql.DB, cfg config, mode pgx.QueryExecMode) (roundResult, error) {
	round := modeName(mode)
	for _, sku := range skus {
		if _, err := direct.ExecContext(ctx, `INSERT INTO txlock_example_pgb_stock (sku, qty) VALUES ($1, $2)
			ON CONFLICT (sku) DO UPDATE SET qty = EXCLUDED.qty`, sku, cfg.stock); err != nil {
			return roundResult{}, fmt.Errorf("resetting the stock: %w", err)
		}
	}
	out.Printf("\nround: default_query_exec_mode=%s\n", round)
	r := roundResult{mode: mode, errs: map[string]int{}}
	total := len(skus) * cfg.stock
	deadline := time.Now().Add(cfg.duration)
	start := time.Now()
	var sold atomic.Int64
	for instance, target := range []int{total / 2, total} {
		if instance == 1 {
			out.Printf("  the service restarts: a new pool, new client connections; PgBouncer's server connections stay\n")
		}
		before := sold.Load()
		if err := sellInstance(ctx, out, bouncerURL, cfg, mode, instance, target, deadline, &sold, &r); err != nil {
			return roundResult{}, err
		}
		r.soldBy[instance] = int(sold.Load() - before)
	}
	elapsed := time.Since(start)

	rows, err := direct.QueryContext(ctx, `SELECT s.qty, (SELECT count(*) FROM txlock_example_pgb_sales WHERE round = $1 AND sku = s.sku)
		FROM txlock_example_pgb_stock s`, round)
	if err != nil {
		return roundResult{}, fmt.Errorf("counting the sales: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var left, sold int
		if err := rows.Scan(&left, &sold); err != nil {
			return roundResult{}, fmt.Errorf("counting the sales: %w", err)
		}
		r.left += left
		r.sold += sold
		r.oversold += max(0, sold-cfg.stock)
	}
	if err := rows.Err(); err != nil {
		return roundResult{}, fmt.Errorf("counting the sales: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  before the restart %d sold, %d failed; after it %d sold, %d failed\n",
		r.soldBy[0], r.failedBy[0], r.soldBy[1], r.failedBy[1])
	fmt.Fprintf(&b, "  %d sold in %v, %d left, %d oversold; %d sales failed",
		r.sold, elapsed.Round(time.Millisecond), r.left, r.oversold, r.failed)
	codes := make([]string, 0, len(r.errs))
	for code := range r.errs {
		codes = append(codes, code)
	}
	slices.Sort(codes)
	for i, code := range codes {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%sSQLSTATE %s ×%d", sep, code, r.errs[code])
	}
	out.Printf("%s\n", b.String())
	return r, nil
}

// sellInstance is one run of the service: a pool of its own, and
// cfg.workers workers that sell until sold (counting the whole round's
// sales) reaches target, every SKU is sold out, or the deadline passes.
// Each worker moves on to the next SKU after every sale, so sales of
// different SKUs, under different locks, run at the same time on different
// connections. A sale that fails is counted in r, and its error printed the
// first time its SQLSTATE is seen in the instance; the worker goes on.
func sellInstance(ctx context.Context, out *progress.Printer, bouncerURL string, cfg config, mode pgx.QueryExecMode, instance, target int, deadline time.Time, sold *atomic.Int64, r *roundResult) error {
	db, err := openDB(bouncerURL, mode)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxIdleConns(cfg.workers + 2)
	round := modeName(mode)
	var mu sync.Mutex // guards r
	seen := map[string]bool{}
	var failed atomic.Int64
	var soldOut [len(skus)]atomic.Bool
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := out.Progress(func(elapsed time.Duration) string {
		return fmt.Sprintf("  selling: %d sold of %d, %d sales failed in this run, %v",
			sold.Load(), len(skus)*cfg.stock, failed.Load(), elapsed.Round(100*time.Millisecond))
	})

	var wg sync.WaitGroup
	for w := 1; w <= cfg.workers; w++ {
		wg.Go(func() {
			next := w - 1
			for time.Now().Before(deadline) && sold.Load() < int64(target) && failed.Load() < maxFailures {
				// The next SKU that is not sold out, if any.
				i := -1
				for range skus {
					next = (next + 1) % len(skus)
					if !soldOut[next].Load() {
						i = next
						break
					}
				}
				if i < 0 {
					return
				}
				err := sell(ctx, db, round, skus[i], w)
				switch {
				case err == nil:
					sold.Add(1)
					continue
				case errors.Is(err, errSoldOut):
					soldOut[i].Store(true)
					continue
				case ctx.Err() != nil:
					return
				}
				code := txlock.SQLState(err)
				if code == "" {
					// Not a refusal by the server: a broken connection, a
					// lock timeout. That is not what this example shows.
					cancel(fmt.Errorf("round %s, worker %d: %w", round, w, err))
					return
				}
				failed.Add(1)
				mu.Lock()
				r.failed++
				r.failedBy[instance]++
				r.errs[code]++
				first := !seen[code]
				seen[code] = true
				mu.Unlock()
				if first {
					out.Printf("  worker %d, %s: %v\n", w, skus[i], err)
				}
			}
		})
	}
	wg.Wait()
	stop()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if n := failed.Load(); n >= maxFailures {
		out.Printf("  this run gave up after %d failed sales\n", n)
	}
	return nil
}
