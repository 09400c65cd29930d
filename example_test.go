package txlock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/txlock/txlock"
)

func ExampleStringKey() {
	k := txlock.StringKey("orders:42")
	n, _ := k.Int64()
	fmt.Println(n)
	fmt.Println(k)
	// Output:
	// -8476019149258318077
	// "orders:42" bigint(-8476019149258318077)
}

func ExampleNewKeyspace() {
	inventory := txlock.NewKeyspace("inventory")
	fmt.Println(inventory.Namespace())
	fmt.Println(inventory.Key("sku:1001"))
	fmt.Println(inventory.ID(1001))
	// Output:
	// -1323661902
	// "inventory/sku:1001" pair(-1323661902,-797322307)
	// "inventory/#1001" pair(-1323661902,1001)
}

func ExampleKeyFromPgLocks() {
	// A row of: SELECT classid, objid, objsubid FROM pg_locks WHERE locktype = 'advisory'
	k, err := txlock.KeyFromPgLocks(19088743, 2309737967, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(k)
	k, err = txlock.KeyFromPgLocks(4294967294, 4294967293, 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(k)
	// Output:
	// bigint(81985529216486895)
	// pair(-2,-3)
}

func ExampleStringKey_invalid() {
	err := txlock.StringKey("").Err()
	fmt.Println(errors.Is(err, txlock.ErrInvalidKey))
	fmt.Println(err)
	// Output:
	// true
	// txlock: invalid key: key name is empty
}

// This example needs a database, so it is compiled but not run.
func ExampleWithLock() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	key := txlock.NewKeyspace("inventory").Key("sku:1001")
	err = txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		var qty int
		if err := tx.QueryRowContext(ctx, `SELECT qty FROM stock WHERE sku = $1`, "sku:1001").Scan(&qty); err != nil {
			return err
		}
		if qty == 0 {
			return errors.New("out of stock")
		}
		_, err := tx.ExecContext(ctx, `UPDATE stock SET qty = $1 WHERE sku = $2`, qty-1, "sku:1001")
		return err
	}, txlock.WithTimeout(2*time.Second))

	var te *txlock.LockTimeoutError
	switch {
	case errors.As(err, &te):
		log.Printf("busy: gave up after %d attempts in %v", te.Attempts, te.Waited)
	case err != nil:
		log.Fatal(err)
	}
}

// A singleton job: each instance tries once, and skips the run if another
// instance has it. This example needs a database, so it is compiled but not run.
func ExampleDo() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// The next invoice number of a tenant, taken under the tenant's lock.
	key := txlock.NewKeyspace("invoices").Key("tenant:42")
	next, err := txlock.Do(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) (n int64, err error) {
		err = tx.QueryRowContext(ctx, `UPDATE tenants SET last_invoice = last_invoice + 1 WHERE id = 42 RETURNING last_invoice`).Scan(&n)
		return n, err
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("invoice %d", next)
}

func ExampleTryWithLock() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ran, err := txlock.TryWithLock(context.Background(), db, txlock.StringKey("cron:nightly-report"),
		func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO reports (day) VALUES (current_date) ON CONFLICT DO NOTHING`)
			return err
		})
	switch {
	case err != nil:
		log.Fatal(err)
	case !ran:
		log.Print("another instance is running the report")
	}
}

// This example needs a database, so it is compiled but not run.
func ExampleLockTx() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// A repository method that runs inside the caller's transaction.
	if err := txlock.LockTx(ctx, tx, txlock.StringKey("account:7"), txlock.WithTimeout(time.Second)); err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance - 10 WHERE id = 7`); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// Fencing: a holder that lost its lock is refused by the resource. This
// example runs against the test database.
func ExampleFencedTable_Update() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_stock (sku text PRIMARY KEY, qty int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		TRUNCATE example_stock; INSERT INTO example_stock (sku, qty) VALUES ('SKU-1001', 50)`); err != nil {
		log.Fatal(err)
	}
	stock := txlock.FencedTable{Name: "example_stock"}
	sku := []txlock.Col{{Name: "sku", Value: "SKU-1001"}}

	// Holder B, with token 2, writes.
	n, err := stock.Update(ctx, db, 2, []txlock.Col{{Name: "qty", Value: 42}}, sku)
	fmt.Println(n, err)

	// Holder A, paused while it held token 1, wakes up and tries.
	_, err = stock.Update(ctx, db, 1, []txlock.Col{{Name: "qty", Value: 49}}, sku)
	fmt.Println(errors.Is(err, txlock.ErrStaleToken))
	var stale *txlock.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("row holds token", stale.Current)
	}
	_, err = stock.Update(ctx, db, 3, []txlock.Col{{Name: "qty", Value: 1}}, []txlock.Col{{Name: "sku", Value: "SKU-404"}})
	fmt.Println(errors.Is(err, txlock.ErrRowNotFound))
	// Output:
	// 1 <nil>
	// true
	// row holds token 2
	// true
}

// A fencing token inside fn. This example runs against the test database.
func ExampleFenceToken() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	key := txlock.StringKey("example:fence")
	var first, second int64
	for _, token := range []*int64{&first, &second} {
		err := txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			*token, err = txlock.FenceToken(ctx)
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(second > first)

	_, err := txlock.FenceToken(ctx) // not inside fn: no lock, no token
	fmt.Println(errors.Is(err, txlock.ErrNoToken))
	// Output:
	// true
	// true
}

// A service builds one Locker at start-up, with the options every call
// shares, here an Observer that prints each event's kind.
func ExampleNew() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()

	printer := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		fmt.Println(e.Kind, e.Keys[0].Name())
		return ctx
	})
	locks, err := txlock.New(db, txlock.WithObserver(printer), txlock.WithTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = locks.WithLock(ctx, txlock.StringKey("example:new"), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `SELECT 1`)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// A call's own options come after the Locker's: this one reports nothing.
	if err := locks.WithLock(ctx, txlock.StringKey("example:quiet"), func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(nil)); err != nil {
		log.Fatal(err)
	}
	// Output:
	// wait_started example:new
	// acquired example:new
	// released example:new
}

// SlogObserver logs lock events; this handler drops the time and the
// durations so that the output is stable.
func ExampleSlogObserver() {
	db := exampleDB()
	defer db.Close()

	h := slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "waited", "held":
				return slog.Attr{}
			}
			return a
		},
	})
	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:slog"), func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(txlock.SlogObserver(slog.New(h))))
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// level=DEBUG msg="txlock: wait_started" keys="\"example:slog\" bigint(-5857948528979404225)"
	// level=DEBUG msg="txlock: acquired" keys="\"example:slog\" bigint(-5857948528979404225)" attempts=1
	// level=DEBUG msg="txlock: released" keys="\"example:slog\" bigint(-5857948528979404225)" committed=true
}
