// Command repository puts a repository's methods under txlock locks: a
// sqlc-style Queries used inside the lock's transaction, the same in a
// transaction the caller already has, and sqlx through package sqlxlock.
//
//	go run ./examples/repository             # a throwaway PostgreSQL of its own
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable' go run ./examples/repository -workers 8
//
// Three services deposit into the same accounts at the same time, each a
// read-modify-write (read the balance, write balance+amount, journal the
// entry) under the account's lock:
//
//   - Wallets.Deposit runs the Queries of queries.go in txlock.WithLock's
//     transaction: q.WithTx(tx).
//   - Wallets.DepositTx is for code that already has a transaction:
//     txlock.LockTx takes the lock in it, and the lock lasts until that
//     code commits.
//   - SqlxWallets.Deposit does the same with sqlx (GetContext,
//     NamedExecContext) in sqlxlock.WithLock's *sqlx.Tx.
//
// All three lock the same key for an account, so they exclude each other.
// At the end every balance must equal the sum of the deposits made into it,
// as counted by the program and as journaled; it exits non-zero otherwise.
// It starts by dropping and recreating its tables, repo_accounts and
// repo_entries.
//
// The part to copy is wallets.go (Wallets) and sqlxwallets.go
// (SqlxWallets), over queries.go; the rest is the demo.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/txlock/txlock/examples/internal/exampledb"
)

func main() { exampledb.Main("repository", run) }

// depositInOwnTx is code that owns its transaction, as a handler that
// writes other rows in it would: it calls the repository method inside it,
// and commits.
func depositInOwnTx(ctx context.Context, db *sql.DB, w *Wallets, id string, amount int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := w.DepositTx(ctx, tx, id, amount); err != nil {
		return err
	}
	return tx.Commit()
}

type config struct {
	accounts int
	workers  int
	deposits int
}

// way is one of the three ways in, as the output names it.
type way struct {
	name string
	via  string // what it journals
	do   func(ctx context.Context, id string, amount int64) error
}

func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	fs := flag.NewFlagSet("repository", flag.ContinueOnError)
	var cfg config
	fs.IntVar(&cfg.accounts, "accounts", 3, "number of accounts")
	fs.IntVar(&cfg.workers, "workers", 4, "concurrent workers for each of the three services")
	fs.IntVar(&cfg.deposits, "deposits", 25, "deposits each worker makes")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q (the settings are flags; see -h)", fs.Arg(0))
	case cfg.accounts < 1:
		return fmt.Errorf("-accounts %d: at least 1", cfg.accounts)
	case cfg.workers < 1:
		return fmt.Errorf("-workers %d: at least 1", cfg.workers)
	case cfg.deposits < 1:
		return fmt.Errorf("-deposits %d: at least 1", cfg.deposits)
	}

	servers, err := exampledb.Start(stdout, false)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, servers.Close()) }()
	db, err := sql.Open("pgx", servers.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxIdleConns(3 * cfg.workers)

	q := New(db)
	for _, stmt := range []string{
		`DROP TABLE IF EXISTS repo_entries, repo_accounts`,
		`CREATE TABLE repo_accounts (id text PRIMARY KEY, balance bigint NOT NULL)`,
		`CREATE TABLE repo_entries (account_id text NOT NULL REFERENCES repo_accounts, amount bigint NOT NULL, via text NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("creating the tables: %w", err)
		}
	}
	ids := make([]string, cfg.accounts)
	for i := range ids {
		ids[i] = fmt.Sprintf("acct-%d", i+1)
		if err := q.CreateAccount(ctx, CreateAccountParams{ID: ids[i]}); err != nil {
			return err
		}
	}

	// One pool for all three: sqlx wraps the same *sql.DB, so its callers
	// and the database/sql ones also queue behind each other locally.
	wallets := &Wallets{db: db, q: q}
	sqlxWallets := &SqlxWallets{db: sqlx.NewDb(db, "pgx")}
	ways := []way{
		{"Wallets.Deposit: Queries in txlock.WithLock's tx", "WithLock", wallets.Deposit},
		{"Wallets.DepositTx: Queries after txlock.LockTx in the caller's tx", "LockTx",
			func(ctx context.Context, id string, amount int64) error {
				return depositInOwnTx(ctx, db, wallets, id, amount)
			}},
		{"SqlxWallets.Deposit: sqlx in sqlxlock.WithLock's tx", "sqlxlock", sqlxWallets.Deposit},
	}
	fmt.Fprintf(stdout, "repository: %d accounts; %d workers for each of %d services, %d deposits per worker\n",
		cfg.accounts, cfg.workers, len(ways), cfg.deposits)

	deposited, err := deposits(ctx, ways, ids, cfg)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	return verify(ctx, stdout, q, sqlxWallets.db, ways, cfg, deposited)
}

// deposits runs every way's workers at once and returns the sum deposited
// into each account. The first error stops the run.
func deposits(ctx context.Context, ways []way, ids []string, cfg config) (map[string]int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu        sync.Mutex
		deposited = map[string]int64{}
		firstErr  error
		wg        sync.WaitGroup
	)
	for _, w := range ways {
		for range cfg.workers {
			wg.Go(func() {
				for range cfg.deposits {
					id, amount := ids[rand.IntN(len(ids))], 1+rand.Int64N(100)
					err := w.do(ctx, id, amount)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = fmt.Errorf("%s: deposit of %d into %s: %w", w.via, amount, id, err)
						cancel()
					}
					if err == nil {
						deposited[id] += amount
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	return deposited, firstErr
}

// verify compares each balance with what was deposited into it and with
// its journal, and each service's journal entries with its deposits.
func verify(ctx context.Context, stdout io.Writer, q *Queries, db *sqlx.DB, ways []way, cfg config, deposited map[string]int64) error {
	var byVia []struct {
		Via string `db:"via"`
		N   int    `db:"n"`
	}
	if err := db.SelectContext(ctx, &byVia, `SELECT via, count(*) AS n FROM repo_entries GROUP BY via`); err != nil {
		return err
	}
	counts := map[string]int{}
	for _, v := range byVia {
		counts[v.Via] = v.N
	}
	want := cfg.workers * cfg.deposits
	for _, w := range ways {
		if counts[w.via] != want {
			return fmt.Errorf("%s: %d deposits journaled, want %d", w.name, counts[w.via], want)
		}
		fmt.Fprintf(stdout, "  %s: %d deposits\n", w.name, counts[w.via])
	}

	totals, err := q.ListAccountTotals(ctx)
	if err != nil {
		return err
	}
	var sum int64
	for _, a := range totals {
		if a.Balance != deposited[a.ID] || a.Journaled != deposited[a.ID] {
			return fmt.Errorf("account %s: balance %d, %d deposited, %d journaled: NOT exact, updates were lost", a.ID, a.Balance, deposited[a.ID], a.Journaled)
		}
		fmt.Fprintf(stdout, "account %s: balance %d = %d deposited, in %d journal entries: exact\n", a.ID, a.Balance, deposited[a.ID], a.Entries)
		sum += a.Balance
	}
	if len(totals) != cfg.accounts {
		return fmt.Errorf("%d accounts, want %d", len(totals), cfg.accounts)
	}
	fmt.Fprintf(stdout, "every balance is exact: %d deposits, %d in all, none lost\n", len(ways)*want, sum)
	return nil
}
