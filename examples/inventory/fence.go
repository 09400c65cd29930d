package main

// This file, with sell.go, is the part of the example to copy for fencing: the
// sale of sell.go, mirrored to another system with the lock's fencing token.

import (
	"context"
	"database/sql"
	"time"

	"github.com/txlock/txlock"
)

// holdBound is how long a fenced sale may hold the lock (WithMaxHold).
const holdBound = time.Second

// mirrorTable is a copy of the stock in another system: a table written
// through another pool, outside the lock's transaction, with fencing tokens.
var mirrorTable = txlock.FencedTable{Name: "txlock_example_mirror"}

// sellFenced is sellLocked that also writes the quantity left to mirrorTable,
// through mirror, with the lock's fencing token. A holder that stalls past
// holdBound loses its lock; if its write still reaches the mirror after a
// newer holder's, the fence refuses it with a *txlock.StaleTokenError.
func sellFenced(ctx context.Context, db, mirror *sql.DB, key txlock.Key, sku, phase string, worker int) (token int64, left int, waited time.Duration, err error) {
	err = txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		lock, _ := txlock.LockFromContext(ctx)
		waited = lock.Waited
		var err error
		if token, err = txlock.FenceToken(ctx); err != nil {
			return err
		}
		if left, err = sale(ctx, tx, sku, phase, worker); err != nil {
			return err
		}
		_, err = mirrorTable.Update(ctx, mirror, token,
			[]txlock.Col{{Name: "qty", Value: left}, {Name: "writer", Value: worker}},
			[]txlock.Col{{Name: "sku", Value: sku}})
		return err
	}, txlock.WithMaxHold(holdBound), txlock.WithFencing())
	return token, left, waited, err
}
