package main

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/pgxlock"
)

// The semaphore scenario: n slots of one key shared by more workers than
// slots, against what n independent keys achieve, and against slots polled
// by hand.

// semaphoreSlots is the n of the semaphore scenario, and of the semaphore
// acquisitions of the uncontended scenarios.
const semaphoreSlots = 4

// semaphoreKey is the key of the semaphore scenario's semaphore.
var semaphoreKey = txlock.StringKey("bench:semaphore")

// theSemaphore is semaphoreKey whatever the row: every worker of the
// semaphore scenario shares its slots.
func theSemaphore(int) txlock.Key { return semaphoreKey }

// txlockSemaphoreImpl is txlock.WithSemaphore of n slots of key(id), with
// the options of txlockImpl.
func txlockSemaphoreImpl(name string, n int, key func(id int) txlock.Key, opts ...txlock.Option) impl {
	opts = append([]txlock.Option{txlock.WithTimeout(60 * time.Second)}, opts...)
	return impl{name: name, pgbouncerSafe: true,
		run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
			return txlock.WithSemaphore(ctx, e.db, key(id), n, func(ctx context.Context, tx *sql.Tx) error {
				granted()
				return w.sql(ctx, tx, id)
			}, opts...)
		}}
}

// pgxlockSemaphoreImpl is pgxlock.WithSemaphore of n slots of key(id) on
// the env's pgxpool, with the options of pgxlockImpl.
func pgxlockSemaphoreImpl(name string, n int, key func(id int) txlock.Key, opts ...txlock.Option) impl {
	opts = append([]txlock.Option{txlock.WithTimeout(60 * time.Second)}, opts...)
	return impl{name: name, pgbouncerSafe: true,
		run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
			return pgxlock.WithSemaphore(ctx, e.pgx, key(id), n, func(ctx context.Context, tx pgx.Tx) error {
				granted()
				return w.pgx(ctx, tx, id)
			}, opts...)
		}}
}

// slotPoll is a semaphore of n slots of semaphoreKey polled by hand, as
// allisson/go-pglock's README builds a resource pool: try slot 0, then 1,
// and so on to n-1, one pg_try_advisory_xact_lock (one round trip) each,
// and take the first granted; if none is, sleep every and start again
// from slot 0. The slots are txlock.SlotKey's, so that it takes the same
// advisory locks as WithSemaphore. The README holds each slot with a
// session lock on a connection of its own; here the slots are tried in a
// transaction, which the grant's fn runs in and whose end releases the
// slot, so that it runs behind PgBouncer too, and a busy round rolls back
// (BEGIN, n tries, ROLLBACK) before the sleep.
func slotPoll(name string, n int, every time.Duration) impl {
	tries := make([]string, n)
	for i := range tries {
		k, _ := txlock.SlotKey(semaphoreKey, i).Int64()
		tries[i] = "SELECT pg_catalog.pg_try_advisory_xact_lock('" + strconv.FormatInt(k, 10) + "'::int8)"
	}
	return impl{name: name, pgbouncerSafe: true,
		run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
			for {
				err := inTx(ctx, e.db, id, w, granted, func(tx *sql.Tx) error {
					for _, q := range tries {
						var ok bool
						if err := tx.QueryRowContext(ctx, q).Scan(&ok); err != nil {
							return err
						}
						if ok {
							return nil
						}
					}
					return errBusy
				})
				if !errors.Is(err, errBusy) {
					return err
				}
				if err := sleepCtx(ctx, every); err != nil {
					return err
				}
			}
		}}
}

// renamed is im under another name: the same implementation measured in
// another role (the semaphore scenario's ideal).
func renamed(im impl, name string) impl {
	im.name = name
	return im
}

// semaphoreImpls are the semaphore scenario's implementations: the
// semaphore on both paths, sharing 4 slots of one key; its ideal, 4
// independent keys of WithLock (and of pgxlock's, and of the server's
// blocking lock), each locked by 4 of the workers always (see
// scenario.keyPerWorker); and the slots polled by hand.
func semaphoreImpls() []impl {
	return []impl{
		txlockSemaphoreImpl("txlock-semaphore", semaphoreSlots, theSemaphore),
		pgxlockSemaphoreImpl("pgxlock-semaphore", semaphoreSlots, theSemaphore),
		txlockImpl("txlock-4-keys"),
		pgxlockImpl("pgxlock-4-keys"),
		renamed(blocking, "pg-blocking-4-keys"),
		slotPoll("slot-poll-1ms", semaphoreSlots, time.Millisecond),
	}
}
