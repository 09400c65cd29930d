package main

// This file has the shape sqlc generates for database/sql (sql_package
// "database/sql"): a DBTX interface that *sql.DB, *sql.Conn and *sql.Tx all
// satisfy, a Queries struct made with New and moved into a transaction with
// WithTx, and one method per named query. It is written by hand so that the
// example needs no generator; generated code is used the same way.

import (
	"context"
	"database/sql"
)

// DBTX is what Queries runs its statements on.
type DBTX interface {
	ExecContext(context.Context, string, ...interface{}) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryContext(context.Context, string, ...interface{}) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...interface{}) *sql.Row
}

// New returns the queries, run on db.
func New(db DBTX) *Queries {
	return &Queries{db: db}
}

// Queries holds the repository's queries.
type Queries struct {
	db DBTX
}

// WithTx returns the queries, run in tx.
func (q *Queries) WithTx(tx *sql.Tx) *Queries {
	return &Queries{
		db: tx,
	}
}

const createAccount = `-- name: CreateAccount :exec
INSERT INTO repo_accounts (id, balance) VALUES ($1, $2)
`

// CreateAccountParams are the arguments of CreateAccount.
type CreateAccountParams struct {
	ID      string
	Balance int64
}

// CreateAccount opens an account.
func (q *Queries) CreateAccount(ctx context.Context, arg CreateAccountParams) error {
	_, err := q.db.ExecContext(ctx, createAccount, arg.ID, arg.Balance)
	return err
}

const getBalance = `-- name: GetBalance :one
SELECT balance FROM repo_accounts WHERE id = $1
`

// GetBalance reads an account's balance.
func (q *Queries) GetBalance(ctx context.Context, id string) (int64, error) {
	row := q.db.QueryRowContext(ctx, getBalance, id)
	var balance int64
	err := row.Scan(&balance)
	return balance, err
}

const setBalance = `-- name: SetBalance :exec
UPDATE repo_accounts SET balance = $2 WHERE id = $1
`

// SetBalanceParams are the arguments of SetBalance.
type SetBalanceParams struct {
	ID      string
	Balance int64
}

// SetBalance writes an account's balance.
func (q *Queries) SetBalance(ctx context.Context, arg SetBalanceParams) error {
	_, err := q.db.ExecContext(ctx, setBalance, arg.ID, arg.Balance)
	return err
}

const addEntry = `-- name: AddEntry :exec
INSERT INTO repo_entries (account_id, amount, via) VALUES ($1, $2, $3)
`

// AddEntryParams are the arguments of AddEntry.
type AddEntryParams struct {
	AccountID string
	Amount    int64
	Via       string
}

// AddEntry journals a change of balance.
func (q *Queries) AddEntry(ctx context.Context, arg AddEntryParams) error {
	_, err := q.db.ExecContext(ctx, addEntry, arg.AccountID, arg.Amount, arg.Via)
	return err
}

const listAccountTotals = `-- name: ListAccountTotals :many
SELECT a.id, a.balance, COALESCE(sum(e.amount), 0)::bigint AS journaled, count(e.amount) AS entries
FROM repo_accounts a LEFT JOIN repo_entries e ON e.account_id = a.id
GROUP BY a.id, a.balance
ORDER BY a.id
`

// ListAccountTotalsRow is a row of ListAccountTotals.
type ListAccountTotalsRow struct {
	ID        string
	Balance   int64
	Journaled int64
	Entries   int64
}

// ListAccountTotals lists each account's balance beside the sum and count
// of its journal entries.
func (q *Queries) ListAccountTotals(ctx context.Context) ([]ListAccountTotalsRow, error) {
	rows, err := q.db.QueryContext(ctx, listAccountTotals)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var items []ListAccountTotalsRow
	for rows.Next() {
		var i ListAccountTotalsRow
		if err := rows.Scan(&i.ID, &i.Balance, &i.Journaled, &i.Entries); err != nil {
			return nil, err
		}
		items = append(items, i)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return items, nil
}
