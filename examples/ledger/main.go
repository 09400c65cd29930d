// Command ledger moves money between accounts under multi-key locks, and
// mirrors every balance to a second database through fenced writes.
//
//	go run ./examples/ledger                  # a throwaway PostgreSQL of its own
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable' go run ./examples/ledger -workers 16 -duration 10s
//
// Workers transfer random amounts between random pairs of accounts, in both
// directions. Each transfer locks both accounts with txlock.WithLocks, all or
// nothing: however two transfers name the same pair, neither ever holds one
// account while it waits for the other, so they never deadlock. Inside the
// lock it reads both balances, writes them back in the lock's transaction and
// journals the transfer.
//
// Each transfer also writes both new balances to a reports database, over a
// pool of its own: those writes commit on their own, outside the lock's
// transaction, so the lock alone cannot protect them from a holder that
// stalled and lost its lock. They carry the transfer's txlock.FenceToken, and
// txlock.FencedTable refuses a write whose token is older than the row's.
// With a throwaway server the reports live in a database of their own
// (CREATE DATABASE ledger_reports); with DATABASE_URL, in the schema
// ledger_reports of that database, reached through a second pool, which for
// the fence is the same thing: another connection, another transaction.
//
// At the end it checks that the total is conserved, that each balance is its
// opening balance plus the transfers the journal records (no lost update),
// that a write with a stale token is refused, and that every report row holds
// its account's balance and the token of the account's last transfer. It
// exits non-zero if any check fails.
//
// It starts by dropping and recreating its tables, ledger_accounts and
// ledger_transfers, and ledger_balances in the reports; run one at a time
// per database.
//
// The part to copy is transfer.go (transfer); the rest is the demo.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/examples/internal/exampledb"
)

func main() { exampledb.Main("ledger", run) }

// reportsName is the database (throwaway server) or schema (DATABASE_URL)
// the reports live in.
const reportsName = "ledger_reports"

type config struct {
	accounts int
	workers  int
	duration time.Duration
	opening  int64
}

func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	var cfg config
	fs.IntVar(&cfg.accounts, "accounts", 10, "number of accounts (at least 2)")
	fs.IntVar(&cfg.workers, "workers", 8, "concurrent workers making transfers")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "how long the workers start new transfers")
	fs.Int64Var(&cfg.opening, "balance", 1000, "opening balance of each account")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q (the settings are flags; see -h)", fs.Arg(0))
	case cfg.accounts < 2:
		return fmt.Errorf("-accounts %d: a transfer needs two accounts, so at least 2", cfg.accounts)
	case cfg.workers < 1:
		return fmt.Errorf("-workers %d: at least 1", cfg.workers)
	case cfg.duration <= 0:
		return fmt.Errorf("-duration %v: must be positive", cfg.duration)
	case cfg.opening < 1:
		return fmt.Errorf("-balance %d: must be at least 1", cfg.opening)
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
	// Each holder keeps one connection for its lock's transaction and, while
	// it draws its fencing token, needs a second.
	db.SetMaxOpenConns(2 * cfg.workers)
	db.SetMaxIdleConns(2 * cfg.workers)
	if err := setupLedger(ctx, db, cfg); err != nil {
		return err
	}

	// On a throwaway server the reports get a database of their own; on
	// DATABASE_URL's they get a schema (creating a database on someone's
	// server is not the example's business).
	reports, where, err := openReports(ctx, db, servers.URL, servers.Throwaway)
	if err != nil {
		return err
	}
	defer reports.db.Close()
	reports.db.SetMaxOpenConns(cfg.workers)
	reports.db.SetMaxIdleConns(cfg.workers)
	if err := reports.setup(ctx, cfg); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "ledger: %d accounts of %d, %d workers for %v; reports in %s, written outside the lock's transaction with fencing tokens\n",
		cfg.accounts, cfg.opening, cfg.workers, cfg.duration, where)

	st, err := transfers(ctx, db, reports, cfg)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("after %d transfers: %w", st.up+st.down, ctx.Err())
	}
	fmt.Fprintf(stdout, "transfers: %d done (%d to a higher account id, %d to a lower), %d refused for lack of funds, %d gave up waiting for the lock; no deadlock, no other error\n",
		st.up+st.down, st.up, st.down, st.noFunds, st.timedOut)

	return verify(ctx, stdout, db, reports, cfg, st.up+st.down)
}

// setupLedger (re)creates the ledger's tables and the fencing sequence.
func setupLedger(ctx context.Context, db *sql.DB, cfg config) error {
	for _, stmt := range []string{
		`DROP TABLE IF EXISTS ledger_transfers, ledger_accounts`,
		`CREATE TABLE ledger_accounts (id int PRIMARY KEY, balance bigint NOT NULL)`,
		`CREATE TABLE ledger_transfers (
			id bigserial PRIMARY KEY,
			from_id int NOT NULL REFERENCES ledger_accounts,
			to_id int NOT NULL REFERENCES ledger_accounts,
			amount bigint NOT NULL,
			fence_token bigint NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("creating the ledger: %w", err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO ledger_accounts SELECT g, $1 FROM generate_series(1, $2) g`, cfg.opening, cfg.accounts); err != nil {
		return fmt.Errorf("opening the accounts: %w", err)
	}
	// public.txlock_fence_seq, which txlock.FenceToken draws from.
	return txlock.Fencer{}.CreateSequence(ctx, db)
}

// reportsDB is the second database: a pool of its own, and the table of
// balances that fenced writes keep there.
type reportsDB struct {
	db    *sql.DB
	table txlock.FencedTable
}

// openReports connects to the reports: a database of their own on a
// throwaway server, or a schema of the DATABASE_URL database. where says
// which, for the output.
func openReports(ctx context.Context, db *sql.DB, mainURL string, ownServer bool) (r reportsDB, where string, err error) {
	schema, reportsURL := reportsName, mainURL
	where = fmt.Sprintf("schema %s of the same database, through a second pool", reportsName)
	if ownServer {
		if _, err := db.ExecContext(ctx, `CREATE DATABASE `+reportsName); err != nil {
			return r, "", fmt.Errorf("creating the reports database: %w", err)
		}
		u, err := url.Parse(mainURL)
		if err != nil {
			return r, "", err
		}
		u.Path = "/" + reportsName
		schema, reportsURL = "public", u.String()
		where = fmt.Sprintf("database %s", reportsName)
	}
	rdb, err := sql.Open("pgx", reportsURL)
	if err != nil {
		return r, "", err
	}
	if !ownServer {
		if _, err := rdb.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+reportsName); err != nil {
			rdb.Close()
			return r, "", fmt.Errorf("creating the reports schema: %w", err)
		}
	}
	return reportsDB{db: rdb, table: txlock.FencedTable{Schema: schema, Name: "ledger_balances"}}, where, nil
}

// setup (re)creates the reports table, one row per account, never fenced.
func (r reportsDB) setup(ctx context.Context, cfg config) error {
	table := r.table.Schema + "." + r.table.Name
	for _, stmt := range []string{
		`DROP TABLE IF EXISTS ` + table,
		`CREATE TABLE ` + table + ` (
			account int PRIMARY KEY,
			balance bigint NOT NULL,
			transfer_id bigint,
			fence_token bigint NOT NULL DEFAULT 0)`,
	} {
		if _, err := r.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("creating the reports table: %w", err)
		}
	}
	_, err := r.db.ExecContext(ctx, `INSERT INTO `+table+` (account, balance) SELECT g, $1 FROM generate_series(1, $2) g`, cfg.opening, cfg.accounts)
	return err
}

type stats struct {
	up, down, noFunds, timedOut int64
}

// transfers runs the workers until cfg.duration has passed. A transfer in
// progress then finishes: cutting it off could cancel it between its fenced
// writes and its commit. Any error other than a refusal for lack of funds
// or a lock wait that timed out stops the run.
func transfers(ctx context.Context, db *sql.DB, reports reportsDB, cfg config) (stats, error) {
	var st struct{ up, down, noFunds, timedOut atomic.Int64 }
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	end := time.Now().Add(cfg.duration)
	for range cfg.workers {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				from := 1 + rand.IntN(cfg.accounts)
				to := 1 + rand.IntN(cfg.accounts-1)
				if to >= from {
					to++
				}
				amount := 1 + rand.Int64N(cfg.opening/2+1)
				err := transfer(ctx, db, reports.db, reports.table, from, to, amount)
				switch {
				case err == nil && from < to:
					st.up.Add(1)
				case err == nil:
					st.down.Add(1)
				case errors.Is(err, errNoFunds):
					st.noFunds.Add(1)
				case errors.Is(err, txlock.ErrLockTimeout):
					st.timedOut.Add(1)
				default:
					errOnce.Do(func() {
						firstErr = fmt.Errorf("transfer of %d from account %d to %d: %w", amount, from, to, err)
						cancel()
					})
					return
				}
			}
		})
	}
	wg.Wait()
	return stats{st.up.Load(), st.down.Load(), st.noFunds.Load(), st.timedOut.Load()}, firstErr
}

// verify checks the ledger and the reports, printing one line per check.
func verify(ctx context.Context, stdout io.Writer, db *sql.DB, reports reportsDB, cfg config, done int64) error {
	// The total: money is neither made nor lost.
	var total int64
	if err := db.QueryRowContext(ctx, `SELECT sum(balance) FROM ledger_accounts`).Scan(&total); err != nil {
		return err
	}
	want := int64(cfg.accounts) * cfg.opening
	if total != want {
		return fmt.Errorf("total: %d at the start, %d at the end: NOT conserved", want, total)
	}
	fmt.Fprintf(stdout, "total: %d at the start, %d at the end: conserved\n", want, total)

	// No lost update: every balance is what the journal says it must be.
	// An update lost to a race would leave a balance that disagrees.
	var journaled, wrong int64
	var negative bool
	if err := db.QueryRowContext(ctx, `
		WITH moves AS (
			SELECT from_id AS id, -amount AS delta FROM ledger_transfers
			UNION ALL SELECT to_id, amount FROM ledger_transfers)
		SELECT (SELECT count(*) FROM ledger_transfers),
			(SELECT count(*) FROM ledger_accounts a
				WHERE a.balance <> $1 + COALESCE((SELECT sum(delta) FROM moves m WHERE m.id = a.id), 0)),
			(SELECT COALESCE(bool_or(balance < 0), false) FROM ledger_accounts)`, cfg.opening).Scan(&journaled, &wrong, &negative); err != nil {
		return err
	}
	switch {
	case journaled != done:
		return fmt.Errorf("no lost update: %d transfers succeeded, the journal holds %d", done, journaled)
	case wrong > 0:
		return fmt.Errorf("no lost update: %d accounts disagree with their opening balance plus the journal: updates were lost", wrong)
	case negative:
		return errors.New("no lost update: a balance went negative")
	}
	fmt.Fprintf(stdout, "no lost update: every balance is its opening balance plus the %d transfers the journal records\n", journaled)

	ledger, err := accountsAndLastTransfers(ctx, db)
	if err != nil {
		return err
	}

	// A holder that stalled and lost its lock, waking up with the run's
	// oldest token: the fence refuses its write.
	if err := staleWrite(ctx, stdout, db, reports, ledger); err != nil {
		return err
	}

	// The reports: each row holds its account's balance, and the token and
	// id of the account's last transfer, whatever order the writes of
	// concurrent transfers reached it in.
	rows, err := reports.db.QueryContext(ctx, `SELECT account, balance, COALESCE(transfer_id, 0), fence_token FROM `+
		reports.table.Schema+`.`+reports.table.Name)
	if err != nil {
		return err
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var r account
		var id int
		if err := rows.Scan(&id, &r.balance, &r.transfer, &r.token); err != nil {
			return err
		}
		if l, ok := ledger[id]; !ok || r != l {
			return fmt.Errorf("reports: account %d holds balance %d, transfer %d, token %d; the ledger says balance %d, last transfer %d, token %d: NOT consistent",
				id, r.balance, r.transfer, r.token, l.balance, l.transfer, l.token)
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if seen != len(ledger) {
		return fmt.Errorf("reports: %d rows for %d accounts: NOT consistent", seen, len(ledger))
	}
	fmt.Fprintf(stdout, "reports: %d rows, each with its account's balance and the token and id of the account's last transfer: consistent\n", seen)
	return nil
}

// account is what the ledger says a report row must hold.
type account struct {
	balance, transfer, token int64
}

// accountsAndLastTransfers reads each account's balance and its last
// transfer (the one with the largest token) from the ledger.
func accountsAndLastTransfers(ctx context.Context, db *sql.DB) (map[int]account, error) {
	rows, err := db.QueryContext(ctx, `
		SELECT a.id, a.balance, COALESCE(t.id, 0), COALESCE(t.fence_token, 0)
		FROM ledger_accounts a
		LEFT JOIN LATERAL (SELECT id, fence_token FROM ledger_transfers
			WHERE a.id IN (from_id, to_id) ORDER BY fence_token DESC LIMIT 1) t ON true`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[int]account{}
	for rows.Next() {
		var id int
		var a account
		if err := rows.Scan(&id, &a.balance, &a.transfer, &a.token); err != nil {
			return nil, err
		}
		m[id] = a
	}
	return m, rows.Err()
}

// staleWrite writes to a report row with the oldest token of the run, as a
// holder that lost its lock long ago would, and checks that it is refused.
func staleWrite(ctx context.Context, stdout io.Writer, db *sql.DB, reports reportsDB, ledger map[int]account) error {
	var oldest int64
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(min(fence_token), 0) FROM ledger_transfers`).Scan(&oldest); err != nil {
		return err
	}
	victim := 0
	for id, a := range ledger {
		if a.token > oldest && (victim == 0 || id < victim) {
			victim = id
		}
	}
	if victim == 0 {
		fmt.Fprintln(stdout, "stale write: not tried, fewer than two transfers ran")
		return nil
	}
	_, err := reports.table.Update(ctx, reports.db, oldest,
		[]txlock.Col{{Name: "balance", Value: -1}},
		[]txlock.Col{{Name: "account", Value: victim}})
	var stale *txlock.StaleTokenError
	if !errors.As(err, &stale) {
		return fmt.Errorf("stale write: a write with token %d to account %d, which holds token %d, was not refused (error %v)",
			oldest, victim, ledger[victim].token, err)
	}
	fmt.Fprintf(stdout, "stale write refused: token %d for account %d: %v\n", oldest, victim, err)
	return nil
}
