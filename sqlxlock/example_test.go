package sqlxlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jmoiron/sqlx"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/sqlxlock"
)

// The examples run against the test server. Each uses a table of its own,
// sqlxexample_*, and keys of its own.

func exampleDB() *sqlx.DB {
	db, err := sqlx.Open("pgx", pgtest.ExampleURL())
	if err != nil {
		log.Fatal(err)
	}
	return db
}

type account struct {
	ID      string `db:"id"`
	Balance int    `db:"balance"`
}

// exampleAccounts creates a table of two accounts, a and b, of 100 each.
func exampleAccounts(ctx context.Context, db *sqlx.DB, table string) {
	db.MustExecContext(ctx, `DROP TABLE IF EXISTS `+table+`; CREATE TABLE `+table+` (id text PRIMARY KEY, balance int NOT NULL);
		INSERT INTO `+table+` VALUES ('a', 100), ('b', 100)`)
}

// fn receives a *sqlx.Tx: Get, Select and the named queries work in the
// lock's transaction.
func ExampleWithLock() {
	ctx := context.Background()
	db := exampleDB()
	defer db.Close()
	exampleAccounts(ctx, db, "sqlxexample_withlock")

	err := sqlxlock.WithLock(ctx, db, txlock.StringKey("sqlxexample:account:a"), func(ctx context.Context, tx *sqlx.Tx) error {
		var a account
		if err := tx.GetContext(ctx, &a, `SELECT id, balance FROM sqlxexample_withlock WHERE id = 'a'`); err != nil {
			return err
		}
		_, err := tx.NamedExecContext(ctx, `UPDATE sqlxexample_withlock SET balance = :balance WHERE id = :id`, account{ID: a.ID, Balance: a.Balance - 30})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	var balance int
	_ = db.GetContext(ctx, &balance, `SELECT balance FROM sqlxexample_withlock WHERE id = 'a'`)
	fmt.Println("a:", balance)
	// Output: a: 70
}

// Both accounts, all or nothing, in any order: two transfers that name the
// pair in opposite orders cannot deadlock.
func ExampleWithLocks() {
	ctx := context.Background()
	db := exampleDB()
	defer db.Close()
	exampleAccounts(ctx, db, "sqlxexample_withlocks")

	keys := []txlock.Key{txlock.StringKey("sqlxexample:account:b"), txlock.StringKey("sqlxexample:account:a")}
	err := sqlxlock.WithLocks(ctx, db, keys, func(ctx context.Context, tx *sqlx.Tx) error {
		tx.MustExecContext(ctx, `UPDATE sqlxexample_withlocks SET balance = balance - 25 WHERE id = 'a'`)
		tx.MustExecContext(ctx, `UPDATE sqlxexample_withlocks SET balance = balance + 25 WHERE id = 'b'`)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	var accounts []account
	_ = db.SelectContext(ctx, &accounts, `SELECT id, balance FROM sqlxexample_withlocks ORDER BY id`)
	fmt.Println(accounts)
	// Output: [{a 75} {b 125}]
}

// One attempt: while another session holds the key, the call does not
// run fn and reports it.
func ExampleTryWithLock() {
	ctx := context.Background()
	db := exampleDB()
	defer db.Close()
	key := txlock.StringKey("sqlxexample:nightly")

	// Another instance holds the key, in a transaction of its own.
	other := db.MustBeginTx(ctx, nil)
	if err := sqlxlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	ran, err := sqlxlock.TryWithLock(ctx, db, key, func(ctx context.Context, tx *sqlx.Tx) error { return nil })
	fmt.Println("while held:", ran, err)
	_ = other.Rollback()
	ran, err = sqlxlock.TryWithLock(ctx, db, key, func(ctx context.Context, tx *sqlx.Tx) error { return nil })
	fmt.Println("after:", ran, err)
	// Output:
	// while held: false <nil>
	// after: true <nil>
}

// TryWithLocks takes every key or none.
func ExampleTryWithLocks() {
	ctx := context.Background()
	db := exampleDB()
	defer db.Close()
	a, b := txlock.StringKey("sqlxexample:try:a"), txlock.StringKey("sqlxexample:try:b")

	other := db.MustBeginTx(ctx, nil)
	if err := sqlxlock.LockTx(ctx, other, b); err != nil {
		log.Fatal(err)
	}
	ran, err := sqlxlock.TryWithLocks(ctx, db, []txlock.Key{a, b}, func(ctx context.Context, tx *sqlx.Tx) error { return nil })
	fmt.Println("b held:", ran, err)
	_ = other.Rollback()
	ran, err = sqlxlock.TryWithLocks(ctx, db, []txlock.Key{a, b}, func(ctx context.Context, tx *sqlx.Tx) error { return nil })
	fmt.Println("both free:", ran, err)
	// Output:
	// b held: false <nil>
	// both free: true <nil>
}

// Inside a repository method's own transaction: the lock is the
// transaction's until it commits or rolls back.
func ExampleLockTx() {
	ctx := context.Background()
	db := exampleDB()
	defer db.Close()
	exampleAccounts(ctx, db, "sqlxexample_locktx")

	tx := db.MustBeginTx(ctx, nil)
	defer func() { _ = tx.Rollback() }()
	if err := sqlxlock.LockTx(ctx, tx, txlock.StringKey("sqlxexample:account:b")); err != nil {
		log.Fatal(err)
	}
	tx.MustExecContext(ctx, `UPDATE sqlxexample_locktx SET balance = balance + 5 WHERE id = 'b'`)
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	var balance int
	_ = db.GetContext(ctx, &balance, `SELECT balance FROM sqlxexample_locktx WHERE id = 'b'`)
	fmt.Println("b:", balance)
	// Output: b: 105
}

// TryLockTx reports a busy key without waiting, and leaves the caller's
// transaction usable.
func ExampleTryLockTx() {
	ctx := context.Background()
	db := exampleDB()
	defer db.Close()
	key := txlock.StringKey("sqlxexample:trylocktx")

	other := db.MustBeginTx(ctx, nil)
	if err := sqlxlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	tx := db.MustBeginTx(ctx, nil)
	defer func() { _ = tx.Rollback() }()
	ok, err := sqlxlock.TryLockTx(ctx, tx, key)
	fmt.Println("acquired:", ok, err)
	var one int
	fmt.Println("tx usable:", tx.GetContext(ctx, &one, `SELECT 1`) == nil)
	// Output:
	// acquired: false <nil>
	// tx usable: true
}
