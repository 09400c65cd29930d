package main

// This file is the part of the example to copy: a repository's method under
// pgxlock.WithLock, running the Queries sqlc generates for pgx/v5 (package
// stock) in the lock's pgx.Tx, and the same in a pgx.Tx the caller already
// has, with pgxlock.LockTx. The rest of the program is the demo around it.

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/examples/sqlcpgx/stock"
	"github.com/txlock/txlock/pgxlock"
)

// skuKeys gives each SKU its lock.
var skuKeys = txlock.NewKeyspace("stock")

// lockTimeout bounds every lock wait of the example.
const lockTimeout = 30 * time.Second

// errSoldOut is an order that found no stock left.
var errSoldOut = errors.New("sold out")

// Shop is a service over the generated repository.
type Shop struct {
	pool *pgxpool.Pool
}

// Reserve reserves one unit of sku for order: the lock, then the
// repository's read and writes in the lock's own transaction, committed
// with it.
func (s *Shop) Reserve(ctx context.Context, sku, order string) error {
	return pgxlock.WithLock(ctx, s.pool, skuKeys.Key(sku), func(ctx context.Context, tx pgx.Tx) error {
		return reserve(ctx, stock.New(tx), sku, order, "WithLock")
	}, txlock.WithTimeout(lockTimeout))
}

// ReserveTx is Reserve inside the caller's transaction tx. The lock lasts
// until the caller commits or rolls back tx.
func (s *Shop) ReserveTx(ctx context.Context, tx pgx.Tx, sku, order string) error {
	if err := pgxlock.LockTx(ctx, tx, skuKeys.Key(sku), txlock.WithTimeout(lockTimeout)); err != nil {
		return err
	}
	return reserve(ctx, stock.New(tx), sku, order, "LockTx")
}

// reserve is the read-modify-write. It subtracts in Go, not in SQL, on
// purpose: without the lock, two orders could read the same quantity, and
// both would be sold the same unit.
func reserve(ctx context.Context, q *stock.Queries, sku, order, via string) error {
	n, err := q.GetQuantity(ctx, sku)
	if err != nil {
		return err
	}
	if n == 0 {
		return errSoldOut
	}
	if err := q.SetQuantity(ctx, stock.SetQuantityParams{Sku: sku, Quantity: n - 1}); err != nil {
		return err
	}
	return q.AddReservation(ctx, stock.AddReservationParams{Sku: sku, OrderID: order, Quantity: 1, Via: via})
}
