package main

// This file is the part of the example to copy for sqlx: wallets.go's
// Deposit written with sqlx, in sqlxlock.WithLock's *sqlx.Tx, under the same
// keys (walletKeys) and timeout (lockTimeout).

import (
	"context"

	"github.com/jmoiron/sqlx"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/sqlxlock"
)

// SqlxWallets is the same service written with sqlx.
type SqlxWallets struct {
	db *sqlx.DB
}

type accountRow struct {
	ID      string `db:"id"`
	Balance int64  `db:"balance"`
}

type entryRow struct {
	AccountID string `db:"account_id"`
	Amount    int64  `db:"amount"`
	Via       string `db:"via"`
}

// Deposit adds amount to account id in sqlxlock.WithLock's transaction.
func (w *SqlxWallets) Deposit(ctx context.Context, id string, amount int64) error {
	return sqlxlock.WithLock(ctx, w.db, walletKeys.Key(id), func(ctx context.Context, tx *sqlx.Tx) error {
		var a accountRow
		if err := tx.GetContext(ctx, &a, `SELECT id, balance FROM repo_accounts WHERE id = $1`, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE repo_accounts SET balance = $2 WHERE id = $1`, id, a.Balance+amount); err != nil {
			return err
		}
		_, err := tx.NamedExecContext(ctx, `INSERT INTO repo_entries (account_id, amount, via) VALUES (:account_id, :amount, :via)`,
			entryRow{AccountID: id, Amount: amount, Via: "sqlxlock"})
		return err
	}, txlock.WithTimeout(lockTimeout))
}
