package main

// This file is the part of the example to copy: a scheduled job that one
// process runs each tick, however many try, with txlock.TryWithLock. The rest
// of the program is the demo around it.

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlock/txlock"
)

// jobKey is the job's lock: one key for every run of it.
var jobKey = txlock.StringKey("examples/cron:report")

// tryJob runs job for tick, recording the run (tick, pid) in cron_runs, if
// it gets the lock at once; within maxHold, the tick's length, so that the
// next tick's tries do not find it still busy. locked is false if another
// process holds the lock (busy); ranBy is the pid of a process that ran the
// tick before, if one did. A process that comes late, after the tick's run
// has committed and released the lock, must not run it again: the lock makes
// the check and the record atomic.
func tryJob(ctx context.Context, db *sql.DB, tick, pid int, maxHold time.Duration, job func(context.Context) error) (locked bool, ranBy int, err error) {
	locked, err = txlock.TryWithLock(ctx, db, jobKey, func(ctx context.Context, tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT pid FROM cron_runs WHERE tick = $1`, tick).Scan(&ranBy)
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO cron_runs (tick, pid) VALUES ($1, $2)`, tick, pid); err != nil {
			return err
		}
		// The job's work, holding the lock; the run commits with it.
		return job(ctx)
	}, txlock.WithMaxHold(maxHold))
	return locked, ranBy, err
}
