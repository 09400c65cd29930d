// Command inventory shows why txlock exists: several workers sell from a
// small stock at the same time, first without a lock and then with one.
//
//	go run ./examples/inventory
//	go run ./examples/inventory -workers 16 -stock 500 -duration 20s
//	DATABASE_URL='postgres://you@127.0.0.1:5432/db?sslmode=disable' go run ./examples/inventory
//
// Without DATABASE_URL it starts a throwaway PostgreSQL on 127.0.0.1 from
// the installed server binaries, and a PgBouncer in transaction mode in
// front of it if pgbouncer is installed, and removes them when it ends (on
// Ctrl-C too). With DATABASE_URL it uses that database, and PGBOUNCER_URL,
// if set, for the PgBouncer phase; it creates its txlock_example_* tables
// there and drops them at the end.
//
// Each sale is a read-then-write in one transaction: read the quantity in
// stock, take a moment (a price lookup, a call to a payment service), write
// back the quantity read minus one, and record the sale. The phases:
//
//  1. Without a lock. Workers read the same quantity, and each writes it back
//     minus one, so sales overwrite each other's decrement and the shop sells
//     more than it has. It prints by how much.
//  2. The same transaction inside txlock.WithLock: no oversell.
//  3. The same through PgBouncer in transaction mode, when there is one.
//  4. Fencing. Each sale also copies the quantity left to a mirror table
//     written through another connection pool, outside the lock's
//     transaction (standing in for another database or service), with a
//     fencing token. One worker stalls past its hold bound (WithMaxHold),
//     loses its lock, and wakes up; the others have written since, with
//     larger tokens, and the fence refuses its late write.
//
// It ends with a summary table, and exits non-zero if a locked phase
// oversold or the fence let the stale write through.
//
// The part to copy is sell.go (sellLocked) and fence.go (sellFenced); the
// rest is the demo.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/examples/internal/exampledb"
	"github.com/txlock/txlock/examples/internal/progress"
)

const (
	sku = "SKU-1001"
	// stallTime is how long the fencing phase's stalled worker sleeps while
	// holding the lock: long enough past its hold bound, holdBound, for the
	// other workers to take the lock and write.
	stallTime = holdBound + 1500*time.Millisecond
)

func main() { exampledb.Main("inventory", run) }

// config is what the flags set.
type config struct {
	workers  int
	stock    int
	duration time.Duration
}

// run runs the example with the command-line arguments args, writing its
// report to stdout. It returns an error if a locked phase oversold, if the
// fence let a stale write through, or if anything else failed.
func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	fs := flag.NewFlagSet("inventory", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var cfg config
	fs.IntVar(&cfg.workers, "workers", 8, "concurrent workers selling (at least 2)")
	fs.IntVar(&cfg.stock, "stock", 200, "units in stock at the start of each phase")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "the longest a phase sells before it stops")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q: the example takes only flags (-h lists them)", fs.Args())
	case cfg.workers < 2:
		return fmt.Errorf("-workers %d: need at least 2, for a race and for another worker to take over the lock", cfg.workers)
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

	db, err := openDB(servers.URL, false)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxIdleConns(cfg.workers + 2)
	if err := createTables(ctx, db); err != nil {
		return err
	}
	defer func() {
		// Leave nothing behind in a database of one's own; not even after
		// Ctrl-C, hence a context of its own.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, derr := db.ExecContext(dctx, `DROP TABLE IF EXISTS txlock_example_stock, txlock_example_sales, txlock_example_mirror`)
		err = errors.Join(err, derr)
	}()

	out := progress.NewPrinter(stdout)
	fmt.Fprintf(stdout, "\n%d workers sell %s from a stock of %d; each phase stops when it is sold out or after %v\n",
		cfg.workers, sku, cfg.stock, cfg.duration)
	var results []result
	key := txlock.NewKeyspace("inventory").Key(sku)

	// Phase 1: the same transaction as the locked phases, without the lock.
	r, err := sellPhase(ctx, out, db, cfg, "1 no lock", false, func(ctx context.Context, phase string, worker int, waits *waitLog) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := sale(ctx, tx, sku, phase, worker); err != nil {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return err
	}
	results = append(results, r)

	// Phase 2: inside txlock.WithLock.
	locked := func(db *sql.DB) saleFunc {
		return func(ctx context.Context, phase string, worker int, waits *waitLog) error {
			waited, err := sellLocked(ctx, db, key, sku, phase, worker)
			waits.add(waited, err)
			return err
		}
	}
	r, err = sellPhase(ctx, out, db, cfg, "2 txlock.WithLock", true, locked(db))
	if err != nil {
		return err
	}
	results = append(results, r)

	// Phase 3: the same through PgBouncer, if there is one.
	if servers.BouncerURL == "" {
		fix := "install pgbouncer (Debian and Ubuntu: apt-get install pgbouncer)"
		if !servers.Throwaway {
			fix = "set PGBOUNCER_URL to a PgBouncer in transaction mode in front of DATABASE_URL"
		}
		fmt.Fprintf(stdout, "\nphase 3: skipped, no PgBouncer (%s); to run it, %s\n", servers.BouncerMissing, fix)
		results = append(results, result{name: "3 WithLock through PgBouncer", skipped: true})
	} else {
		bdb, err := openDB(servers.BouncerURL, true)
		if err != nil {
			return err
		}
		defer bdb.Close()
		bdb.SetMaxIdleConns(cfg.workers + 2)
		r, err = sellPhase(ctx, out, bdb, cfg, "3 WithLock through PgBouncer", true, locked(bdb))
		if err != nil {
			return err
		}
		results = append(results, r)
	}

	// Phase 4: fencing. The mirror is written through a pool of its own.
	mirror, err := openDB(servers.URL, false)
	if err != nil {
		return err
	}
	defer mirror.Close()
	r, err = fencingPhase(ctx, out, db, mirror, key, cfg)
	if err != nil {
		return err
	}
	results = append(results, r)

	summary(stdout, results)
	for _, r := range results {
		if r.locked && r.oversold > 0 {
			return fmt.Errorf("phase %s oversold by %d under the lock", r.name, r.oversold)
		}
	}
	return nil
}

// openDB opens a database/sql pool on url with pgx. Behind PgBouncer
// (bouncer), pgx's default exec mode, cache_statement, and describe_exec
// fail for the example's own parameterized queries, because PgBouncer 1.18
// does not support prepared statements (examples/pgbouncer shows the
// error): such a URL is switched to exec. Every other setting of the URL is
// kept.
func openDB(url string, bouncer bool) (*sql.DB, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the connection string: %w", err)
	}
	if bouncer {
		switch cc.DefaultQueryExecMode {
		case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec:
			cc.DefaultQueryExecMode = pgx.QueryExecModeExec
		}
	}
	return stdlib.OpenDB(*cc), nil
}

func createTables(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, `
		DROP TABLE IF EXISTS txlock_example_stock, txlock_example_sales, txlock_example_mirror;
		CREATE TABLE txlock_example_stock (sku text PRIMARY KEY, qty int NOT NULL);
		CREATE TABLE txlock_example_sales (id bigserial PRIMARY KEY, phase text NOT NULL, worker int NOT NULL);
		CREATE TABLE txlock_example_mirror (sku text PRIMARY KEY, qty int NOT NULL, writer int NOT NULL,
			fence_token bigint NOT NULL DEFAULT 0)`)
	if err != nil {
		return fmt.Errorf("creating the example's tables: %w", err)
	}
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		return fmt.Errorf("creating the fencing sequence: %w", err)
	}
	return nil
}

// saleFunc makes one sale for worker in phase.
type saleFunc func(ctx context.Context, phase string, worker int, waits *waitLog) error

// resetStock puts the stock back to n units.
func resetStock(ctx context.Context, db *sql.DB, n int) error {
	_, err := db.ExecContext(ctx, `INSERT INTO txlock_example_stock (sku, qty) VALUES ($1, $2)
		ON CONFLICT (sku) DO UPDATE SET qty = EXCLUDED.qty`, sku, n)
	if err != nil {
		return fmt.Errorf("resetting the stock: %w", err)
	}
	return nil
}

// tally reads a phase's outcome from the database: the sales recorded and
// the quantity left.
func tally(ctx context.Context, db *sql.DB, phase string, stock int) (sold, left, oversold int, err error) {
	err = db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM txlock_example_sales WHERE phase = $1),
		(SELECT qty FROM txlock_example_stock WHERE sku = $2)`, phase, sku).Scan(&sold, &left)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("counting the sales: %w", err)
	}
	return sold, left, max(0, sold-stock), nil
}

// sellPhase resets the stock and has cfg.workers workers sell with sell
// until it is sold out or cfg.duration has passed.
func sellPhase(ctx context.Context, out *progress.Printer, db *sql.DB, cfg config, name string, locked bool, sell saleFunc) (result, error) {
	if err := resetStock(ctx, db, cfg.stock); err != nil {
		return result{}, err
	}
	out.Printf("\nphase %s\n", title(name))
	var sold atomic.Int64
	var waits waitLog
	stop := out.Progress(func(elapsed time.Duration) string {
		return fmt.Sprintf("  selling: %d sold of a stock of %d, %v", sold.Load(), cfg.stock, elapsed.Round(100*time.Millisecond))
	})
	deadline := time.Now().Add(cfg.duration)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for w := 1; w <= cfg.workers; w++ {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				err := sell(ctx, name, w, &waits)
				switch {
				case errors.Is(err, errSoldOut):
					return
				case err != nil:
					cancel(fmt.Errorf("phase %s, worker %d: %w", name, w, err))
					return
				}
				sold.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := stop()
	if err := context.Cause(ctx); err != nil {
		return result{}, err
	}
	r := result{name: name, locked: locked, waits: waits.all()}
	var err error
	if r.sold, r.left, r.oversold, err = tally(ctx, db, name, cfg.stock); err != nil {
		return result{}, err
	}
	out.Printf("  %d sold in %v, %d left", r.sold, elapsed.Round(time.Millisecond), r.left)
	switch {
	case r.oversold > 0:
		out.Printf(": OVERSOLD by %d (%d sales of a stock of %d)\n", r.oversold, r.sold, cfg.stock)
	case r.sold+r.left != cfg.stock:
		out.Printf(": %d units unaccounted for\n", cfg.stock-r.sold-r.left)
	default:
		out.Printf(": every unit sold once\n")
	}
	if locked && r.sold+r.left != cfg.stock && r.oversold == 0 {
		return result{}, fmt.Errorf("phase %s: %d sold and %d left of a stock of %d", name, r.sold, r.left, cfg.stock)
	}
	return r, nil
}

// fencingPhase sells as phase 2 does, and mirrors the quantity left to a
// table written through mirror, outside the lock's transaction, with a
// fencing token. Worker 1 takes the lock first and stalls past its hold
// bound; the others take the lock once it is lost, and write; worker 1 then
// wakes up and writes, and the fence refuses it.
func fencingPhase(ctx context.Context, out *progress.Printer, db, mirror *sql.DB, key txlock.Key, cfg config) (result, error) {
	const name = "4 fencing"
	if err := resetStock(ctx, db, cfg.stock); err != nil {
		return result{}, err
	}
	if _, err := mirror.ExecContext(ctx, `INSERT INTO txlock_example_mirror (sku, qty, writer, fence_token) VALUES ($1, $2, 0, 0)
		ON CONFLICT (sku) DO UPDATE SET qty = EXCLUDED.qty, writer = 0, fence_token = 0`, sku, cfg.stock); err != nil {
		return result{}, fmt.Errorf("resetting the mirror: %w", err)
	}
	out.Printf("\nphase %s, each sale also writing the quantity left to txlock_example_mirror through another pool, with a fencing token; WithMaxHold(%v)\n", title(name), holdBound)

	var waits waitLog
	var sold atomic.Int64
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := out.Progress(func(elapsed time.Duration) string {
		return fmt.Sprintf("  selling: %d sold of a stock of %d, %v", sold.Load(), cfg.stock, elapsed.Round(100*time.Millisecond))
	})
	defer stop()

	// Worker 1 takes the lock as sellFenced does, and stalls while it holds
	// it.
	acquired := make(chan struct{}) // worker 1 holds the lock
	woke := make(chan struct{})     // worker 1 is done
	var stalledToken int64
	var stalledErr error
	lateWriteLanded := false
	go func() {
		defer close(woke)
		var once sync.Once
		defer once.Do(func() { close(acquired) })
		stalledErr = txlock.WithLock(ctx, db, key, func(fctx context.Context, tx *sql.Tx) error {
			lock, _ := txlock.LockFromContext(fctx)
			waits.add(lock.Waited, nil)
			token, err := txlock.FenceToken(fctx)
			if err != nil {
				return err
			}
			stalledToken = token
			var qty int
			if err := tx.QueryRowContext(fctx, `SELECT qty FROM txlock_example_stock WHERE sku = $1`, sku).Scan(&qty); err != nil {
				return fmt.Errorf("reading the stock: %w", err)
			}
			out.Printf("  worker 1 holds the lock with token %d, reads %d in stock, and stalls for %v\n", token, qty, stallTime)
			once.Do(func() { close(acquired) })
			// The stall: a GC pause, a frozen VM, a slow disk. It ignores
			// fn's context, as a stalled process does, and ends early only
			// on Ctrl-C. Meanwhile the hold bound passes: txlock rolls the
			// transaction back, and the server ends the session
			// (idle_in_transaction_session_timeout), so the lock is free.
			select {
			case <-time.After(stallTime):
			case <-ctx.Done():
				return ctx.Err()
			}
			// The late write. A write to another system need not be bound
			// to fn's context (a request with a context of its own, one
			// already on the wire), so the hold bound's cancel does not
			// stop it; the fence has to. The write uses a context that the
			// hold bound does not cancel.
			wctx, stopW := context.WithTimeout(context.WithoutCancel(fctx), 10*time.Second)
			defer stopW()
			out.Printf("  worker 1 wakes up after %v and writes %d to the mirror with token %d\n", stallTime, qty-1, token)
			if _, err := mirrorTable.Update(wctx, mirror, token,
				[]txlock.Col{{Name: "qty", Value: qty - 1}, {Name: "writer", Value: 1}},
				[]txlock.Col{{Name: "sku", Value: sku}}); err != nil {
				return err
			}
			lateWriteLanded = true
			return record(fctx, tx, sku, name, 1, qty-1)
		}, txlock.WithMaxHold(holdBound), txlock.WithFencing())
	}()
	select {
	case <-acquired:
	case <-ctx.Done():
	}

	// The others sell, and mirror what they sold, until they have sold out
	// and worker 1 is done, or the phase's time is up.
	var mu sync.Mutex
	var lastToken int64
	var lastWriter, lastQty int
	var first sync.Once
	deadline := time.Now().Add(max(cfg.duration, stallTime+time.Second))
	var wg sync.WaitGroup
	for w := 2; w <= cfg.workers; w++ {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				token, left, waited, err := sellFenced(ctx, db, mirror, key, sku, name, w)
				waits.add(waited, err)
				switch {
				case errors.Is(err, errSoldOut):
					// Sold out: wait for worker 1 before the phase ends.
					select {
					case <-woke:
					case <-ctx.Done():
					}
					return
				case err != nil:
					cancel(fmt.Errorf("phase %s, worker %d: %w", name, w, err))
					return
				}
				sold.Add(1)
				first.Do(func() {
					out.Printf("  worker %d took the lock after waiting %v, with token %d, and wrote %d to the mirror\n",
						w, fmtDur(waited), token, left)
				})
				// The holders' sales are in the order of their tokens; their
				// returns need not be.
				mu.Lock()
				if token > lastToken {
					lastToken, lastWriter, lastQty = token, w, left
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	<-woke
	stop()
	if err := context.Cause(ctx); err != nil {
		return result{}, err
	}

	r := result{name: name, locked: true, fenced: true, waits: waits.all()}
	var stale *txlock.StaleTokenError
	switch {
	case lateWriteLanded:
		return result{}, fmt.Errorf("phase %s: worker 1's late write with token %d was not refused (worker 1: %v)", name, stalledToken, stalledErr)
	case errors.As(stalledErr, &stale):
		r.stale++
		out.Printf("  refused: %v\n", stale)
	default:
		return result{}, fmt.Errorf("phase %s: worker 1: %w", name, stalledErr)
	}
	if !errors.Is(stalledErr, txlock.ErrHoldTimeout) {
		return result{}, fmt.Errorf("phase %s: worker 1 should have outlived its hold bound: %w", name, stalledErr)
	}

	var err error
	if r.sold, r.left, r.oversold, err = tally(ctx, db, name, cfg.stock); err != nil {
		return result{}, err
	}
	var mQty, mWriter int
	var mToken int64
	if err := mirror.QueryRowContext(ctx, `SELECT qty, writer, fence_token FROM txlock_example_mirror WHERE sku = $1`, sku).Scan(&mQty, &mWriter, &mToken); err != nil {
		return result{}, fmt.Errorf("reading the mirror: %w", err)
	}
	mu.Lock()
	wantToken, wantWriter, wantQty := lastToken, lastWriter, lastQty
	mu.Unlock()
	if mToken != wantToken || mWriter != wantWriter || mQty != wantQty || mQty != r.left {
		return result{}, fmt.Errorf("phase %s: the mirror holds qty %d from worker %d with token %d; want the last write, qty %d from worker %d with token %d, and the stock's %d",
			name, mQty, mWriter, mToken, wantQty, wantWriter, wantToken, r.left)
	}
	out.Printf("  the mirror keeps worker %d's write: qty %d, token %d, the same as the %d left in stock\n", mWriter, mQty, mToken, r.left)
	if r.sold+r.left != cfg.stock && r.oversold == 0 {
		return result{}, fmt.Errorf("phase %s: %d sold and %d left of a stock of %d", name, r.sold, r.left, cfg.stock)
	}
	return r, nil
}
