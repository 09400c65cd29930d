// Command observability runs a small contended workload through a Locker
// whose lock events feed Prometheus metrics (txlockprom), serves them on
// 127.0.0.1, and prints a few lines of its own /metrics.
//
//	go run ./examples/observability                     # a throwaway PostgreSQL of its own
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable' go run ./examples/observability
//	go run ./examples/observability -linger 1m          # then: curl http://127.0.0.1:PORT/metrics
//
// The workers lock keys of two keyspaces, "orders" and "billing", three
// keys each, so that they contend; each holds its lock for -hold inside
// PostgreSQL. Meanwhile a report holds one billing key for a while, and an
// impatient caller gives up on it after 100ms: one timeout. The workload
// counts its acquisitions and timeouts from what the calls return, and
// prints them next to the metrics, which count them from the lock events.
// Last it says how to load txlockprom's Grafana dashboard of these metrics.
//
// It is a module of its own (examples/observability/go.mod), so that the
// txlock module does not depend on the Prometheus client; the repository's
// go.work lets `go run ./examples/observability` work from its root.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/examples/internal/exampledb"
)

func main() { exampledb.Main("observability", run) }

type settings struct {
	workers, calls int
	hold, linger   time.Duration
}

func parse(args []string) (settings, error) {
	var s settings
	fs := flag.NewFlagSet("observability", flag.ContinueOnError)
	fs.IntVar(&s.workers, "workers", 8, "concurrent workers")
	fs.IntVar(&s.calls, "calls", 25, "lock calls per worker")
	fs.DurationVar(&s.hold, "hold", 2*time.Millisecond, "how long each call holds its lock (in PostgreSQL: pg_sleep)")
	fs.DurationVar(&s.linger, "linger", 0, "keep serving /metrics this long after the workload, or until interrupted")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	switch {
	case fs.NArg() > 0:
		return s, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case s.workers < 1 || s.workers > 64:
		return s, fmt.Errorf("-workers %d: want 1 to 64", s.workers)
	case s.calls < 1:
		return s, fmt.Errorf("-calls %d: want at least 1", s.calls)
	case s.hold < 0 || s.hold > time.Second:
		return s, fmt.Errorf("-hold %v: want 0 to 1s", s.hold)
	case s.linger < 0:
		return s, fmt.Errorf("-linger %v: want 0 or more", s.linger)
	}
	return s, nil
}

func run(ctx context.Context, args []string, w io.Writer) error {
	s, err := parse(args)
	if err != nil {
		return err
	}

	servers, err := exampledb.Start(w, false)
	if err != nil {
		return err
	}
	defer servers.Close()
	db, err := sql.Open("pgx", servers.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(s.workers + 4)

	// The metrics: a registry of the program's own, with txlock's metrics
	// and a Locker that reports to them (metrics.go).
	locker, metrics, err := observedLocker(db, prometheus.NewRegistry())
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // returns ErrServerClosed at Shutdown
	defer srv.Shutdown(context.Background())
	url := "http://" + ln.Addr().String() + "/metrics"
	fmt.Fprintf(w, "serving metrics on %s\n", url)

	start := time.Now()
	res, err := workload(ctx, locker, s)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "workload done in %v: acquisitions %d (orders %d, billing %d), timeouts %d\n", time.Since(start).Round(time.Millisecond),
		res.orders+res.billing, res.orders, res.billing, res.timeouts)

	lines, err := scrape(ctx, url)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "from %s:\n", url)
	for _, l := range lines {
		fmt.Fprintln(w, "  "+l)
	}
	fmt.Fprintf(w, "Grafana: import %s (Dashboards > New > Import), datasource: your Prometheus\n", dashboardPath)
	fmt.Fprintf(w, "  scraping %s (-linger keeps it up); in code, the same JSON is txlockprom.Dashboard()\n", url)
	if s.linger > 0 {
		fmt.Fprintf(w, "serving %s for %v more (interrupt to stop)\n", url, s.linger)
		select {
		case <-ctx.Done():
		case <-time.After(s.linger):
		}
	}
	return nil
}

// dashboardPath is txlockprom's Grafana dashboard, from the root of the
// repository, where the program runs from.
const dashboardPath = "txlockprom/grafana-dashboard.json"

type result struct {
	orders, billing, timeouts int64
}

// workload runs s.workers workers of s.calls calls each, alternating
// between the keyspaces, while a report holds billing/"ledger" for 300ms
// and an impatient caller waits for it only 100ms. It counts what the
// calls return: nil (the lock was held and fn committed) or a timeout.
func workload(ctx context.Context, locker *txlock.Locker, s settings) (result, error) {
	orders, billing := txlock.NewKeyspace("orders"), txlock.NewKeyspace("billing")
	var nOrders, nBilling, nTimeouts atomic.Int64
	count := func(k txlock.Key, err error) error {
		switch {
		case err == nil && k.Keyspace() == "orders":
			nOrders.Add(1)
		case err == nil:
			nBilling.Add(1)
		case errors.Is(err, txlock.ErrLockTimeout):
			nTimeouts.Add(1)
		default:
			return err
		}
		return nil
	}
	sleep := func(d time.Duration) func(ctx context.Context, tx *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT pg_catalog.pg_sleep($1)", d.Seconds())
			return err
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, s.workers+2)
	ledger := billing.Key("ledger")
	granted := make(chan struct{})
	wg.Go(func() { // the report
		errs <- count(ledger, locker.WithLock(ctx, ledger, func(ctx context.Context, tx *sql.Tx) error {
			close(granted)
			return sleep(300*time.Millisecond)(ctx, tx)
		}))
	})
	wg.Go(func() { // the impatient caller
		select {
		case <-granted:
		case <-ctx.Done():
			errs <- ctx.Err()
			return
		}
		errs <- count(ledger, locker.WithLock(ctx, ledger, sleep(0), txlock.WithTimeout(100*time.Millisecond)))
	})
	for w := range s.workers {
		wg.Go(func() {
			for i := range s.calls {
				ks := orders
				if (w+i)%2 == 1 {
					ks = billing
				}
				k := ks.Key(fmt.Sprintf("item-%d", (w*7+i)%3))
				if err := count(k, locker.WithLock(ctx, k, sleep(s.hold))); err != nil {
					errs <- fmt.Errorf("worker %d, call %d on %v: %w", w, i, k, err)
					return
				}
			}
			errs <- nil
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return result{orders: nOrders.Load(), billing: nBilling.Load(), timeouts: nTimeouts.Load()}, errors.Join(all...)
}

// shown are the metrics whose lines the program prints: counters, and the
// histograms' counts and sums (their buckets are left out).
var shown = []string{"txlock_acquisitions_total", "txlock_timeouts_total", "txlock_wait_seconds_count",
	"txlock_wait_seconds_sum", "txlock_hold_seconds_count", "txlock_hold_seconds_sum"}

// scrape gets url and returns its lines of the metrics in shown.
func scrape(ctx context.Context, url string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		for _, name := range shown {
			if strings.HasPrefix(sc.Text(), name+"{") || strings.HasPrefix(sc.Text(), name+" ") {
				lines = append(lines, sc.Text())
			}
		}
	}
	return lines, sc.Err()
}
