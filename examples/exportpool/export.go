package main

// This file is the part of the example to copy: a job that runs in one of a
// fleet-wide semaphore's slots, with txlock.WithSemaphore. The rest of the
// program is the demo around it.

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/txlock/txlock"
)

// exportKey is the fleet's semaphore: its slots are the exports allowed to
// run at once.
var exportKey = txlock.StringKey("orders-export")

// runJob runs export job of replica in one of the slots of key, waiting for
// a free one. WithOwner labels the session, which pg_stat_activity shows
// while the job holds its slot.
func runJob(ctx context.Context, db *sql.DB, key txlock.Key, slots int, work time.Duration, replica, job int) error {
	return txlock.WithSemaphore(ctx, db, key, slots, func(ctx context.Context, tx *sql.Tx) error {
		lock, _ := txlock.LockFromContext(ctx)
		return export(ctx, tx, work, replica, job, lock.Slot)
	}, txlock.WithOwner(fmt.Sprintf("export replica-%d job-%d", replica, job)),
		// Jobs queue for a slot for as long as the run lasts, longer than
		// txlock.DefaultTimeout.
		txlock.WithTimeout(time.Minute))
}

// export is the job itself, in the transaction that holds its slot. Its
// start and end are taken inside that transaction, so they lie within the
// slot's hold: if more jobs ran than there are slots, their recorded times
// would overlap. They are clock_timestamp(): now() is the transaction's
// start, and the replicas' own clocks are not one clock.
func export(ctx context.Context, tx *sql.Tx, work time.Duration, replica, job, slot int) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO exportpool_runs (job, replica, slot, started_at)
		VALUES ($1, $2, $3, clock_timestamp())`, job, replica, slot); err != nil {
		return fmt.Errorf("recording the start: %w", err)
	}
	// The export's work: in real life a long query, written out somewhere.
	select {
	case <-time.After(work):
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := tx.ExecContext(ctx, `UPDATE exportpool_runs SET ended_at = clock_timestamp() WHERE job = $1`, job); err != nil {
		return fmt.Errorf("recording the end: %w", err)
	}
	return nil
}
