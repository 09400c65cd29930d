package main

// This file is the part of the example to copy: a sale under txlock.WithLock
// on a pool that works through PgBouncer in transaction mode. The rest of the
// program is the demo around it.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
)

var (
	skuKeys    = txlock.NewKeyspace("pgbouncer-example") // a lock per SKU
	errSoldOut = errors.New("sold out")
)

// thinkTime is the pause between a sale's read and its write.
const thinkTime = 2 * time.Millisecond

// openDB opens a database/sql pool on url with pgx, in query exec mode mode
// whatever the URL says. Behind PgBouncer 1.18 in transaction mode, use
// pgx.QueryExecModeExec (default_query_exec_mode=exec in the URL): pgx's
// default, cache_statement, prepares named statements on server
// connections, which PgBouncer does not track.
func openDB(url string, mode pgx.QueryExecMode) (*sql.DB, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the connection string: %w", err)
	}
	cc.DefaultQueryExecMode = mode
	return stdlib.OpenDB(*cc), nil
}

// sell sells one unit of sku under its lock: it reads the quantity, pauses,
// writes back the quantity read minus one, and records the sale; errSoldOut
// if there is no stock. Its queries take parameters, as an application's
// do; txlock's own take none, and work in every exec mode.
func sell(ctx context.Context, db *sql.DB, round, sku string, worker int) error {
	return txlock.WithLock(ctx, db, skuKeys.Key(sku), func(ctx context.Context, tx *sql.Tx) error {
		var qty int
		if err := tx.QueryRowContext(ctx, `SELECT qty FROM txlock_example_pgb_stock WHERE sku = $1`, sku).Scan(&qty); err != nil {
			return fmt.Errorf("reading the stock: %w", err)
		}
		if qty <= 0 {
			return errSoldOut
		}
		select {
		case <-time.After(thinkTime):
		case <-ctx.Done():
			return ctx.Err()
		}
		if _, err := tx.ExecContext(ctx, `UPDATE txlock_example_pgb_stock SET qty = $1 WHERE sku = $2`, qty-1, sku); err != nil {
			return fmt.Errorf("writing the stock: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO txlock_example_pgb_sales (round, sku, worker) VALUES ($1, $2, $3)`, round, sku, worker); err != nil {
			return fmt.Errorf("recording the sale: %w", err)
		}
		return nil
	})
}
