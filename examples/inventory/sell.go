package main

// This file is the part of the example to copy: a read-then-write sale under
// txlock.WithLock (fence.go adds fencing to it). The rest of the program is
// the demo around it.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txlock/txlock"
)

// errSoldOut is a sale's "nothing left to sell".
var errSoldOut = errors.New("sold out")

// thinkTime stands in for the work between a sale's read and its write (a
// price lookup, a call to a payment service).
const thinkTime = 2 * time.Millisecond

// sellLocked sells one unit of sku under its lock, key, and returns how long
// it waited for the lock.
func sellLocked(ctx context.Context, db *sql.DB, key txlock.Key, sku, phase string, worker int) (waited time.Duration, err error) {
	err = txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		lock, _ := txlock.LockFromContext(ctx)
		waited = lock.Waited
		_, err := sale(ctx, tx, sku, phase, worker)
		return err
	})
	return waited, err
}

// sale sells one unit of sku in tx: it reads the quantity, pauses, writes
// back the quantity read minus one, records the sale, and returns the
// quantity left; errSoldOut, having written nothing, if there was none.
// Without a lock two sales can read the same quantity, and one overwrites
// the other's decrement. (SELECT … FOR UPDATE would close this race too; a
// lock also covers decisions that span rows or tables, and writes that
// leave the database.)
func sale(ctx context.Context, tx *sql.Tx, sku, phase string, worker int) (left int, err error) {
	var qty int
	if err := tx.QueryRowContext(ctx, `SELECT qty FROM txlock_example_stock WHERE sku = $1`, sku).Scan(&qty); err != nil {
		return 0, fmt.Errorf("reading the stock: %w", err)
	}
	if qty <= 0 {
		return 0, errSoldOut
	}
	select {
	case <-time.After(thinkTime):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return qty - 1, record(ctx, tx, sku, phase, worker, qty-1)
}

// record writes qty as the quantity of sku left, and records one sale.
func record(ctx context.Context, tx *sql.Tx, sku, phase string, worker, qty int) error {
	if _, err := tx.ExecContext(ctx, `UPDATE txlock_example_stock SET qty = $1 WHERE sku = $2`, qty, sku); err != nil {
		return fmt.Errorf("writing the stock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO txlock_example_sales (phase, worker) VALUES ($1, $2)`, phase, worker); err != nil {
		return fmt.Errorf("recording the sale: %w", err)
	}
	return nil
}
