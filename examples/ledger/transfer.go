package main

// This file is the part of the example to copy: a transfer between two
// accounts under txlock.WithLocks, with fenced writes to a second database.
// The rest of the program is the demo around it.

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlock/txlock"
)

// accountKeys gives account n its lock, accountKeys.ID(n).
var accountKeys = txlock.NewKeyspace("ledger")

// errNoFunds refuses a transfer larger than the balance it draws on.
var errNoFunds = errors.New("insufficient funds")

// transfer moves amount from one account to another, and writes both new
// balances to balances in the database reports, outside the lock's
// transaction, with a fencing token. The keys are in the transfer's own
// direction, so transfers name a pair in either order: WithLocks takes them
// all or nothing, and two transfers never deadlock.
func transfer(ctx context.Context, db, reports *sql.DB, balances txlock.FencedTable, from, to int, amount int64) error {
	keys := []txlock.Key{accountKeys.ID(int32(from)), accountKeys.ID(int32(to))}
	return txlock.WithLocks(ctx, db, keys, func(ctx context.Context, tx *sql.Tx) error {
		// A read-modify-write in Go, on purpose: only the lock keeps two
		// transfers on one account from losing one of their updates.
		var fromBal, toBal int64
		if err := tx.QueryRowContext(ctx, `SELECT (SELECT balance FROM ledger_accounts WHERE id = $1),
			(SELECT balance FROM ledger_accounts WHERE id = $2)`, from, to).Scan(&fromBal, &toBal); err != nil {
			return err
		}
		if fromBal < amount {
			return errNoFunds
		}
		fromBal, toBal = fromBal-amount, toBal+amount

		// The token is drawn once, durably, and is larger than that of
		// every earlier holder of either account.
		token, err := txlock.FenceToken(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE ledger_accounts SET balance = CASE id WHEN $1 THEN $2::bigint ELSE $4::bigint END
			WHERE id IN ($1, $3)`, from, fromBal, to, toBal); err != nil {
			return err
		}
		var id int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO ledger_transfers (from_id, to_id, amount, fence_token)
			VALUES ($1, $2, $3, $4) RETURNING id`, from, to, amount, token).Scan(&id); err != nil {
			return err
		}

		// The reports database: each write commits at once, on its own.
		// A holder that lost its lock and wrote after a newer holder would
		// get *txlock.StaleTokenError here instead of overwriting.
		for _, acct := range []struct {
			id  int
			bal int64
		}{{from, fromBal}, {to, toBal}} {
			if _, err := balances.Update(ctx, reports, token,
				[]txlock.Col{{Name: "balance", Value: acct.bal}, {Name: "transfer_id", Value: id}},
				[]txlock.Col{{Name: "account", Value: acct.id}}); err != nil {
				return err
			}
		}
		return nil
	}, txlock.WithTimeout(10*time.Second), txlock.WithMaxHold(5*time.Second), txlock.WithFencing())
}
