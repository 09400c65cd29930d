// Command exportpool is a bounded export pool: replicas of a service run
// tenant export jobs, and txlock.WithSemaphore lets at most -slots of them
// run at once across the whole fleet.
//
//	go run ./examples/exportpool             # a throwaway PostgreSQL of its own
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable' go run ./examples/exportpool -replicas 4 -jobs 40
//
// An export is heavy on the database (a long scan of a tenant's orders), so
// only a few may run at once, however many replicas and workers there are.
// Each of -replicas replicas has a connection pool of its own, as a process
// of its own would, and -workers goroutines that take jobs from a shared
// queue. Each job runs in txlock.WithSemaphore on the key "orders-export",
// named with txlock.WithOwner ("export replica-2 job-17"), which
// pg_stat_activity shows while the job holds its slot. It records its slot
// (txlock.LockFromContext) and its start and end, by the server's clock, in
// exportpool_runs. (pgxlock.WithSemaphore is the same for a pgx pool.)
//
// While the jobs run, the program shows who holds the slots, as an operator
// would see it; at the end, the jobs done, the most that ran at once by the
// server's clock, and the jobs per slot. It exits non-zero if more than
// -slots ran at once, which -per-replica shows: each replica then has a
// semaphore of its own, as a limit kept inside each process would be.
//
// Without DATABASE_URL it starts a throwaway PostgreSQL from the installed
// server binaries, and removes it when it ends (on Ctrl-C too). It drops
// and recreates its table, exportpool_runs, and leaves it to be looked at.
//
// The part to copy is export.go (runJob, export); the rest is the demo.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/examples/internal/exampledb"
)

func main() { exampledb.Main("exportpool", run) }

type config struct {
	replicas, workers, jobs, slots int
	work                           time.Duration
	perReplica                     bool
}

func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	fs := flag.NewFlagSet("exportpool", flag.ContinueOnError)
	var cfg config
	fs.IntVar(&cfg.replicas, "replicas", 3, "replicas of the service, each with a connection pool of its own")
	fs.IntVar(&cfg.workers, "workers", 4, "workers of each replica that run export jobs")
	fs.IntVar(&cfg.jobs, "jobs", 24, "tenant export jobs to run")
	fs.IntVar(&cfg.slots, "slots", 3, "the most exports that may run at once across the fleet")
	fs.DurationVar(&cfg.work, "work", 200*time.Millisecond, "how long one export works")
	fs.BoolVar(&cfg.perReplica, "per-replica", false, "give each replica a semaphore of its own (the mistake the check catches)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q (the settings are flags; see -h)", fs.Arg(0))
	case cfg.replicas < 1:
		return fmt.Errorf("-replicas %d: at least 1", cfg.replicas)
	case cfg.workers < 1:
		return fmt.Errorf("-workers %d: at least 1", cfg.workers)
	case cfg.jobs < 1:
		return fmt.Errorf("-jobs %d: at least 1", cfg.jobs)
	case cfg.slots < 1 || cfg.slots > txlock.MaxKeys:
		return fmt.Errorf("-slots %d: between 1 and %d", cfg.slots, txlock.MaxKeys)
	case cfg.work < 10*time.Millisecond:
		return fmt.Errorf("-work %v: at least 10ms, for the exports to overlap measurably", cfg.work)
	}

	servers, err := exampledb.Start(stdout, false)
	if err != nil {
		return fmt.Errorf("no database: %w", err)
	}
	defer func() {
		err = errors.Join(err, servers.Close())
		if servers.Throwaway {
			fmt.Fprintln(stdout, "stopped the throwaway servers")
		}
	}()
	// db is the operator's pool: it sets up, looks at the slots, and reports.
	db, err := sql.Open("pgx", servers.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS exportpool_runs;
		CREATE TABLE exportpool_runs (job int PRIMARY KEY, replica int NOT NULL, slot int NOT NULL,
			started_at timestamptz NOT NULL, ended_at timestamptz)`); err != nil {
		return fmt.Errorf("creating exportpool_runs: %w", err)
	}

	fmt.Fprintf(stdout, "\n%d replicas x %d workers run %d tenant exports of %v each; at most %d at once (txlock.WithSemaphore %q",
		cfg.replicas, cfg.workers, cfg.jobs, cfg.work, cfg.slots, "orders-export")
	if cfg.perReplica {
		fmt.Fprint(stdout, ", one semaphore per replica")
	}
	fmt.Fprintln(stdout, ")")
	start := time.Now()
	if err := runJobs(ctx, stdout, servers.URL, db, cfg); err != nil {
		return err
	}
	return report(ctx, stdout, db, cfg, time.Since(start))
}

// runJobs runs every job on the replicas' workers. The first error stops
// the run.
func runJobs(ctx context.Context, stdout io.Writer, url string, db *sql.DB, cfg config) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan int, cfg.jobs) // stands in for the fleet's job queue
	for j := 1; j <= cfg.jobs; j++ {
		jobs <- j
	}
	close(jobs)

	var wg sync.WaitGroup
	var once sync.Once
	firstDone := make(chan struct{}) // closed once a job has finished
	for r := 1; r <= cfg.replicas; r++ {
		// A pool per replica: txlock's local queue, which keeps a process's
		// waiting callers off the database, is per pool, so nothing on the
		// client side bounds the fleet; the server's slots alone do.
		rdb, err := sql.Open("pgx", url)
		if err != nil {
			cancel(err)
			break
		}
		defer rdb.Close()
		key := exportKey
		if cfg.perReplica {
			key = txlock.StringKey(fmt.Sprintf("orders-export replica-%d", r))
		}
		for range cfg.workers {
			wg.Go(func() {
				for job := range jobs {
					if err := runJob(ctx, rdb, key, cfg.slots, cfg.work, r, job); err != nil {
						cancel(fmt.Errorf("replica-%d job-%d: %w", r, job, err))
						return
					}
					once.Do(func() { close(firstDone) })
				}
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if !cfg.perReplica {
		// Every slot is held at some point, unless there are fewer workers
		// or jobs than slots.
		busy := min(cfg.slots, cfg.replicas*cfg.workers, cfg.jobs)
		if err := snapshot(ctx, stdout, db, cfg, busy, firstDone, done); err != nil {
			cancel(err)
		}
	}
	<-done
	return context.Cause(ctx)
}

// snapshot prints, once while the jobs run, who holds the fleet's slots, as
// an operator would look: pg_locks for the slots' keys (txlock.SlotKey; a
// bigint key shows as classid<<32 | objid, see txlock.KeyFromPgLocks),
// joined to pg_stat_activity for the labels WithOwner set. A label is set
// by the statement that takes the slot, just after the grant, so a slot
// counts once its label shows. It polls until busy slots are held, or the
// jobs are done, and prints the last view it had.
func snapshot(ctx context.Context, stdout io.Writer, db *sql.DB, cfg config, busy int, firstDone, done <-chan struct{}) error {
	keys := make([]int64, cfg.slots)
	for i := range keys {
		keys[i], _ = txlock.SlotKey(exportKey, i).Int64()
	}
	// It looks once a job has finished: the first to start are often all
	// of the replica that started first, the later ones of the whole fleet.
	select {
	case <-firstDone:
	case <-done:
	}
	var n int
	var view string
	for full := false; !full; {
		err := db.QueryRowContext(ctx, `SELECT count(*), coalesce(string_agg(
				format(E'  slot %s: pid %s, "%s"\n', s.slot - 1, l.pid, a.application_name), '' ORDER BY s.slot), '')
			FROM unnest($1::bigint[]) WITH ORDINALITY AS s (key, slot)
			JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
				AND ((l.classid::bigint << 32) | l.objid::bigint) = s.key
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE a.application_name LIKE 'export %'`, keys).Scan(&n, &view)
		if err != nil {
			return fmt.Errorf("reading pg_locks: %w", err)
		}
		select {
		case <-done:
			full = true
		case <-time.After(20 * time.Millisecond):
			full = n >= busy
		}
	}
	fmt.Fprintf(stdout, "\n%d of %d slots of %q held, by pg_locks joined to pg_stat_activity:\n%s", n, cfg.slots, "orders-export", view)
	return nil
}

// report prints what the jobs recorded, measured by the server's clock, and
// returns an error if more than cfg.slots exports ran at once.
func report(ctx context.Context, stdout io.Writer, db *sql.DB, cfg config, elapsed time.Duration) error {
	// The most running at once is reached at some job's start: count, at
	// each start, the jobs that had started and not yet ended.
	var done, most int
	var perSlot string
	if err := db.QueryRowContext(ctx, `SELECT count(r.ended_at), coalesce(max(
			(SELECT count(*) FROM exportpool_runs o WHERE o.started_at <= r.started_at AND o.ended_at > r.started_at)), 0),
			coalesce((SELECT string_agg(format(E'  slot %s: %s\n', slot, n), '' ORDER BY slot)
				FROM (SELECT slot, count(*) AS n FROM exportpool_runs GROUP BY slot) AS c), '')
		FROM exportpool_runs r`).Scan(&done, &most, &perSlot); err != nil {
		return fmt.Errorf("reading exportpool_runs: %w", err)
	}
	fmt.Fprintf(stdout, "\nexports done: %d of %d in %v\n", done, cfg.jobs, elapsed.Round(time.Millisecond))
	fmt.Fprintf(stdout, "most running at once, by the server's clock: %d (the bound is %d)\n", most, cfg.slots)
	fmt.Fprintf(stdout, "exports per slot:\n%s", perSlot)
	switch {
	case most > cfg.slots:
		return fmt.Errorf("the bound was broken: %d exports ran at once, more than the %d allowed", most, cfg.slots)
	case done != cfg.jobs:
		return fmt.Errorf("%d exports of %d done", done, cfg.jobs)
	}
	fmt.Fprintf(stdout, "the bound held: never more than %d exports at once, across %d replicas\n", cfg.slots, cfg.replicas)
	return nil
}
