package checker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// Leaks checks that nothing outlives a piece of work: no goroutine started
// after it was made, no connection of a pool in use, no advisory lock on the
// server.
type Leaks struct {
	baseline goleak.Option
	ignore   []goleak.Option
}

// NewLeaks snapshots the goroutines running now; Goroutines later reports
// any other that is still running. Make it after the servers the test uses
// are up, and before the test opens pools.
func NewLeaks(ignore ...goleak.Option) *Leaks {
	return &Leaks{baseline: goleak.IgnoreCurrent(), ignore: ignore}
}

// Goroutines waits up to timeout for every goroutine started since NewLeaks
// to end, and returns an error listing those that did not.
func (lk *Leaks) Goroutines(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := goleak.Find(append([]goleak.Option{lk.baseline}, lk.ignore...)...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PoolIdle waits up to timeout for db to have no connection in use.
func PoolIdle(db *sql.DB, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for db.Stats().InUse != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("checker: %d connections still in use after %v: %+v", db.Stats().InUse, timeout, db.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// PgxPoolIdle is PoolIdle for a pgx pool: it waits up to timeout for p to
// have no connection acquired.
func PgxPoolIdle(p *pgxpool.Pool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for p.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("checker: %d connections still acquired after %v", p.Stat().AcquiredConns(), timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// NoAdvisoryLocks waits up to timeout for admin's database to show no
// advisory lock in pg_locks.
func NoAdvisoryLocks(admin *sql.DB, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := AdvisoryLocks(ctx, admin)
		cancel()
		if err == nil && n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("checker: counting advisory locks: %w", err)
			}
			return fmt.Errorf("checker: %d advisory locks still held after %v", n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RequireNone checks, at the end of a test, that the pools are idle, the
// server holds no advisory lock, and (after closing the pools) that no
// goroutine is left. It fails t otherwise.
func (lk *Leaks) RequireNone(t testing.TB, admin *sql.DB, pools ...*sql.DB) {
	t.Helper()
	var errs []error
	for _, db := range pools {
		errs = append(errs, PoolIdle(db, 10*time.Second))
	}
	if admin != nil {
		errs = append(errs, NoAdvisoryLocks(admin, 10*time.Second))
	}
	for _, db := range append(pools, admin) {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	errs = append(errs, lk.Goroutines(20*time.Second))
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("leaked: %v", err)
	}
}

// Holders describes the backends holding advisory locks in admin's current
// database, from pg_stat_activity, for failure messages.
func Holders(ctx context.Context, admin *sql.DB) string {
	rows, err := admin.QueryContext(ctx, `SELECT l.pid, l.granted, coalesce(a.state, ''), coalesce(a.wait_event_type, ''),
			coalesce(a.wait_event, ''), now() - a.state_change, left(coalesce(a.query, ''), 120)
		FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory'
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var sb strings.Builder
	for rows.Next() {
		var pid int
		var granted bool
		var state, wtype, wevent, since, query string
		if err := rows.Scan(&pid, &granted, &state, &wtype, &wevent, &since, &query); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&sb, "pid %d granted=%v state=%q wait=%s/%s for %s: %s\n", pid, granted, state, wtype, wevent, since, query)
	}
	return sb.String()
}
