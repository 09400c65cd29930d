package main

// This file is the part of the example to copy: a repository's method under
// txlock.WithLock, running sqlc-style Queries (queries.go) in the lock's
// transaction, and the same in a transaction the caller already has, with
// txlock.LockTx. sqlxwallets.go is the same with sqlx. The rest of the
// program is the demo around it.

import (
	"context"
	"database/sql"
	"time"

	"github.com/txlock/txlock"
)

// walletKeys gives each account its lock, whichever service takes it.
var walletKeys = txlock.NewKeyspace("wallets")

// lockTimeout bounds every lock wait of the example.
const lockTimeout = 30 * time.Second

// Wallets is a service over the sqlc-style repository.
type Wallets struct {
	db *sql.DB
	q  *Queries
}

// Deposit adds amount to account id: the lock, then the repository's read
// and writes in the lock's own transaction, committed with it.
func (w *Wallets) Deposit(ctx context.Context, id string, amount int64) error {
	return txlock.WithLock(ctx, w.db, walletKeys.Key(id), func(ctx context.Context, tx *sql.Tx) error {
		return deposit(ctx, w.q.WithTx(tx), id, amount, "WithLock")
	}, txlock.WithTimeout(lockTimeout))
}

// DepositTx is Deposit inside the caller's transaction tx. The lock lasts
// until the caller commits or rolls back tx. LockTx holds tx's connection
// while it waits; prefer Deposit where the lock can come first.
func (w *Wallets) DepositTx(ctx context.Context, tx *sql.Tx, id string, amount int64) error {
	if err := txlock.LockTx(ctx, tx, walletKeys.Key(id), txlock.WithTimeout(lockTimeout)); err != nil {
		return err
	}
	return deposit(ctx, w.q.WithTx(tx), id, amount, "LockTx")
}

// deposit is the read-modify-write. It adds in Go, not in SQL, on purpose:
// without the lock, two deposits could read the same balance and one of
// them would be lost.
func deposit(ctx context.Context, q *Queries, id string, amount int64, via string) error {
	balance, err := q.GetBalance(ctx, id)
	if err != nil {
		return err
	}
	if err := q.SetBalance(ctx, SetBalanceParams{ID: id, Balance: balance + amount}); err != nil {
		return err
	}
	return q.AddEntry(ctx, AddEntryParams{AccountID: id, Amount: amount, Via: via})
}
