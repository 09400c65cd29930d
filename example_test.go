package txlock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/interop"
	"github.com/txlock/txlock/pgxlock"
)

// The examples below that need a database run against the test server:
// exampleDB (in helpers_test.go) opens a *sql.DB on it, and examplePool a
// pgx pool. Another instance of the service that holds a lock is played by
// a transaction of the example's own that took it with LockTx.

// examplePool opens a pgx pool on the shared test PostgreSQL for a runnable
// example.
func examplePool() *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), pgtest.ExampleURL())
	if err != nil {
		panic(err)
	}
	return pool
}

// noop is a fn with nothing to do under the lock.
func noop(context.Context, *sql.Tx) error { return nil }

// ---- Keys ----

func ExampleStringKey() {
	k := txlock.StringKey("orders:42")
	n, _ := k.Int64()
	fmt.Println(n)
	fmt.Println(k)
	// Output:
	// -8476019149258318077
	// "orders:42" bigint(-8476019149258318077)
}

func ExampleStringKey_invalid() {
	err := txlock.StringKey("").Err()
	fmt.Println(errors.Is(err, txlock.ErrInvalidKey))
	fmt.Println(err)
	// Output:
	// true
	// txlock: invalid key: key name is empty
}

// Int64Key is the lock an existing SQL caller takes with
// pg_advisory_xact_lock(42), so both exclude each other.
func ExampleInt64Key() {
	k := txlock.Int64Key(42)
	n, ok := k.Int64()
	fmt.Println(k, n, ok)
	// Output: bigint(42) 42 true
}

// PairKey is the lock of pg_advisory_xact_lock(7, 1001), in the int4-pair
// space, apart from the bigint one.
func ExamplePairKey() {
	k := txlock.PairKey(7, 1001)
	a, b, ok := k.Pair()
	fmt.Println(k, a, b, ok)
	_, isBigint := k.Int64()
	fmt.Println(isBigint, k == txlock.KeyspaceID(7).ID(1001))
	// Output:
	// pair(7,1001) 7 1001 true
	// false true
}

// What a Key tells about itself: the name it was made from, the keyspace
// (a bounded value, for a metric label) and the PostgreSQL key.
func ExampleKey() {
	for _, k := range []txlock.Key{
		txlock.StringKey("orders:42"),
		txlock.NewKeyspace("billing").Key("inv-7"),
		txlock.Int64Key(42),
	} {
		fmt.Printf("name=%q keyspace=%q\n", k.Name(), k.Keyspace())
	}
	// Output:
	// name="orders:42" keyspace=""
	// name="billing/inv-7" keyspace="billing"
	// name="" keyspace=""
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

// A service that has been given a namespace number of its own.
func ExampleKeyspaceID() {
	orders := txlock.KeyspaceID(7)
	fmt.Println(orders, orders.Namespace())
	fmt.Println(orders.ID(1001))
	fmt.Println(orders.Key("order:1001").Pair())
	// Output:
	// 7 7
	// pair(7,1001)
	// 7 -434335972 true
}

// A bad keyspace name is reported by the keyspace and by every key of it.
func ExampleKeyspace_Err() {
	ks := txlock.NewKeyspace("")
	fmt.Println(ks.Err())
	fmt.Println(errors.Is(ks.Key("sku:1").Err(), txlock.ErrInvalidKey))
	// Output:
	// txlock: invalid key: keyspace name is empty
	// true
}

// A package that derives keys of its own reports bad input as txlock's
// constructors do: the locking functions then refuse the key.
func ExampleInvalidKey() {
	tenantKey := func(id string) txlock.Key {
		n, err := strconv.ParseInt(id, 10, 32)
		if err != nil {
			return txlock.InvalidKey(fmt.Errorf("tenant id %q is not a number", id))
		}
		return txlock.NewKeyspace("tenants").ID(int32(n))
	}
	fmt.Println(tenantKey("42"))
	err := tenantKey("forty-two").Err()
	fmt.Println(errors.Is(err, txlock.ErrInvalidKey), errors.Is(err, txlock.ErrInvalidArgument))
	// Output:
	// "tenants/#42" pair(91103926,42)
	// true true
}

// The key of one slot of a semaphore, which SQL can compute too.
func ExampleSlotKey() {
	db := exampleDB()
	defer db.Close()

	exports := txlock.Int64Key(42)
	slot0, _ := txlock.SlotKey(exports, 0).Int64()
	var inSQL int64
	err := db.QueryRow(`SELECT ('x' || left(encode(sha256('\x01'::bytea || int8send($1) || int4send($2)), 'hex'), 16))::bit(64)::bigint`,
		int64(42), int32(0)).Scan(&inSQL)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(slot0, slot0 == inSQL)
	// Output: -1695549985257308479 true
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

// A Go service that must not run while golang-migrate migrates the
// database takes golang-migrate's own lock (package interop builds the keys
// of other tools' locks).
func Example_otherTools() {
	db := exampleDB()
	defer db.Close()

	key := interop.GolangMigrate("app", "", "") // public.schema_migrations in the database "app"
	ran, err := txlock.TryWithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		return nil // no migration runs meanwhile
	})
	fmt.Println(key, ran, err)
	// Output: bigint(1787120056) true <nil>
}

// ---- Locking ----

// Selling a unit: the read and the write run under the SKU's lock, so two
// sales never both take the last unit.
func ExampleWithLock() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_inventory (sku text PRIMARY KEY, qty int NOT NULL);
		TRUNCATE example_inventory; INSERT INTO example_inventory VALUES ('sku:1001', 1)`); err != nil {
		log.Fatal(err)
	}
	sell := func(ctx context.Context, tx *sql.Tx) error {
		var qty int
		if err := tx.QueryRowContext(ctx, `SELECT qty FROM example_inventory WHERE sku = $1`, "sku:1001").Scan(&qty); err != nil {
			return err
		}
		if qty == 0 {
			return errors.New("out of stock")
		}
		_, err := tx.ExecContext(ctx, `UPDATE example_inventory SET qty = qty - 1 WHERE sku = $1`, "sku:1001")
		return err
	}
	key := txlock.NewKeyspace("inventory").Key("sku:1001")
	fmt.Println(txlock.WithLock(ctx, db, key, sell))
	fmt.Println(txlock.WithLock(ctx, db, key, sell))
	// Output:
	// <nil>
	// out of stock
}

// A transfer locks both accounts, all or nothing, in one statement: two
// transfers in opposite directions never deadlock.
func ExampleWithLocks() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_accounts (id int PRIMARY KEY, balance int NOT NULL);
		TRUNCATE example_accounts; INSERT INTO example_accounts VALUES (1, 100), (2, 0)`); err != nil {
		log.Fatal(err)
	}
	accounts := txlock.NewKeyspace("accounts")
	err := txlock.WithLocks(ctx, db, []txlock.Key{accounts.ID(1), accounts.ID(2)}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE example_accounts SET balance = balance + CASE id WHEN 1 THEN -30 ELSE 30 END WHERE id IN (1, 2)`)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	var from, to int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT balance FROM example_accounts WHERE id = 1), (SELECT balance FROM example_accounts WHERE id = 2)`).Scan(&from, &to); err != nil {
		log.Fatal(err)
	}
	fmt.Println(from, to)
	// Output: 70 30
}

// A singleton job: each instance tries once, and skips the run if another
// instance has it.
func ExampleTryWithLock() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:nightly-report")
	report := func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("running the report")
		return nil
	}

	other, err := db.BeginTx(ctx, nil) // another instance, running the report
	if err != nil {
		log.Fatal(err)
	}
	if err := txlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	ran, err := txlock.TryWithLock(ctx, db, key, report)
	fmt.Println(ran, err)

	_ = other.Rollback() // the other instance is done
	ran, err = txlock.TryWithLock(ctx, db, key, report)
	fmt.Println(ran, err)
	// Output:
	// false <nil>
	// running the report
	// true <nil>
}

// A job that needs two resources runs only if it gets both at once.
func ExampleTryWithLocks() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	keys := []txlock.Key{txlock.StringKey("example:warehouse-a"), txlock.StringKey("example:warehouse-b")}

	other, err := db.BeginTx(ctx, nil) // another instance has one of them
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if err := txlock.LockTx(ctx, other, keys[1]); err != nil {
		log.Fatal(err)
	}
	ran, err := txlock.TryWithLocks(ctx, db, keys, func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("rebalancing stock between the warehouses")
		return nil
	})
	fmt.Println(ran, err)
	// Output: false <nil>
}

// The next invoice number of a tenant, taken under the tenant's lock.
func ExampleDo() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_tenants (id int PRIMARY KEY, last_invoice bigint NOT NULL);
		TRUNCATE example_tenants; INSERT INTO example_tenants VALUES (42, 1000)`); err != nil {
		log.Fatal(err)
	}
	key := txlock.NewKeyspace("invoices").ID(42)
	next, err := txlock.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (n int64, err error) {
		err = tx.QueryRowContext(ctx, `UPDATE example_tenants SET last_invoice = last_invoice + 1 WHERE id = 42 RETURNING last_invoice`).Scan(&n)
		return n, err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoice", next)
	// Output: invoice 1001
}

// A value computed by at most one instance at a time; the others skip.
func ExampleTryDo() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:cache-warmup")
	warm := func(ctx context.Context, tx *sql.Tx) (n int, err error) {
		err = tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = 'public'`).Scan(&n)
		return n, err
	}

	n, ran, err := txlock.TryDo(ctx, db, key, warm)
	fmt.Println(n, ran, err)

	other, err := db.BeginTx(ctx, nil) // another instance warms the cache now
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if err := txlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	n, ran, err = txlock.TryDo(ctx, db, key, warm)
	fmt.Println(n, ran, err)
	// Output:
	// 1 true <nil>
	// 0 false <nil>
}

// A repository method that runs inside the caller's transaction.
func ExampleLockTx() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_balances (id int PRIMARY KEY, balance int NOT NULL);
		TRUNCATE example_balances; INSERT INTO example_balances VALUES (7, 100)`); err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := txlock.LockTx(ctx, tx, txlock.StringKey("example:account:7"), txlock.WithTimeout(time.Second)); err != nil {
		log.Fatal(err)
	}
	var balance int
	if err := tx.QueryRowContext(ctx, `UPDATE example_balances SET balance = balance - 10 WHERE id = 7 RETURNING balance`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // the commit releases the lock
		log.Fatal(err)
	}
	fmt.Println(balance)
	// Output: 90
}

// Inside the caller's transaction, one attempt: a busy lock leaves the
// transaction usable, to do something else.
func ExampleTryLockTx() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:account:8")

	other, err := db.BeginTx(ctx, nil) // another session holds the lock
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if err := txlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	ok, err := txlock.TryLockTx(ctx, tx, key)
	fmt.Println(ok, err)
	// Output: false <nil>
}

// At most two exports run at once across all instances, whatever their
// number.
func ExampleWithSemaphore() {
	db := exampleDB()
	defer db.Close()
	var mu sync.Mutex
	running, most := 0, 0
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			err := txlock.WithSemaphore(context.Background(), db, txlock.StringKey("example:exports"), 2, func(ctx context.Context, tx *sql.Tx) error {
				mu.Lock()
				running++
				most = max(most, running)
				mu.Unlock()
				_, err := tx.ExecContext(ctx, `SELECT pg_sleep(0.02)`) // the export
				mu.Lock()
				running--
				mu.Unlock()
				return err
			})
			if err != nil {
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("at most 2 at once:", most <= 2)
	// Output: at most 2 at once: true
}

// Both slots of a semaphore of two are taken, here by hand (SlotKey), so a
// try with n 2 is skipped; a try with n 3 gets the third slot.
func ExampleTryWithSemaphore() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:thumbnails")

	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	for i := range 2 {
		if err := txlock.LockTx(ctx, other, txlock.SlotKey(key, i)); err != nil {
			log.Fatal(err)
		}
	}
	for _, n := range []int{2, 3} {
		ran, err := txlock.TryWithSemaphore(ctx, db, key, n, func(ctx context.Context, tx *sql.Tx) error {
			l, _ := txlock.LockFromContext(ctx)
			fmt.Println("holding slot", l.Slot, "of", l.Slots)
			return nil
		})
		fmt.Println(n, ran, err)
	}
	// Output:
	// 2 false <nil>
	// holding slot 2 of 3
	// 3 true <nil>
}

// Inside fn, the context describes the lock fn runs under.
func ExampleLockFromContext() {
	db := exampleDB()
	defer db.Close()

	keys := []txlock.Key{txlock.StringKey("example:b"), txlock.StringKey("example:a")}
	err := txlock.WithLocks(context.Background(), db, keys, func(ctx context.Context, tx *sql.Tx) error {
		l, ok := txlock.LockFromContext(ctx)
		fmt.Println(ok, len(l.Keys), l.Shared, l.Held, l.Attempts >= 1)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	_, ok := txlock.LockFromContext(context.Background())
	fmt.Println(ok)
	// Output:
	// true 2 false true true
	// false
}

// A helper that must run under the lock checks that its caller holds it.
func ExampleHeld() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()

	mustHold := func(ctx context.Context) error {
		if !txlock.Held(ctx) {
			return errors.New("not under the lock")
		}
		return nil
	}
	err := txlock.WithLock(ctx, db, txlock.StringKey("example:held"), func(ctx context.Context, tx *sql.Tx) error {
		return mustHold(ctx)
	})
	fmt.Println(err)
	fmt.Println(mustHold(ctx))
	// Output:
	// <nil>
	// not under the lock
}

// fn's own database errors come back as they are; SQLState reads their code
// without importing the driver.
func ExampleSQLState() {
	db := exampleDB()
	defer db.Close()

	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:signup"), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TEMP TABLE example_users (email text PRIMARY KEY) ON COMMIT DROP;
			INSERT INTO example_users VALUES ('a@example.com'), ('a@example.com')`)
		return err
	})
	switch txlock.SQLState(err) {
	case "23505":
		fmt.Println("already signed up")
	default:
		fmt.Println(err)
	}
	// Output: already signed up
}

// ---- Options ----

// Another session holds the lock for longer than this caller will wait.
func ExampleWithTimeout() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:timeout")

	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if err := txlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	err = txlock.WithLock(ctx, db, key, noop, txlock.WithTimeout(100*time.Millisecond))
	var te *txlock.LockTimeoutError
	if errors.As(err, &te) {
		fmt.Println(errors.Is(err, txlock.ErrLockTimeout), te.Keys[0].Name())
	}
	// Output: true example:timeout
}

// The strategy between polling attempts: NoRetry makes one, and the
// backoffs (ExponentialBackoff, LinearBackoff, ConstantBackoff) sleep as
// they say until WithTimeout passes.
func ExampleWithRetry() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:retry")

	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if err := txlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	var te *txlock.LockTimeoutError
	err = txlock.WithLock(ctx, db, key, noop, txlock.WithRetry(txlock.NoRetry))
	fmt.Println(errors.As(err, &te), te.Attempts)

	err = txlock.WithLock(ctx, db, key, noop, txlock.WithTimeout(200*time.Millisecond),
		txlock.WithRetry(txlock.LinearBackoff{Step: 10 * time.Millisecond, Max: 50 * time.Millisecond, Jitter: 5 * time.Millisecond}))
	fmt.Println(errors.Is(err, txlock.ErrLockTimeout))
	// Output:
	// true 1
	// true
}

// Backoff bounds read from a service's configuration are checked at
// start-up; a lock call checks them too, and refuses bad ones.
func ExampleExponentialBackoff_Validate() {
	fmt.Println(txlock.ExponentialBackoff{Min: 5 * time.Millisecond, Max: 200 * time.Millisecond}.Validate())
	fmt.Println(txlock.ExponentialBackoff{Min: time.Second, Max: 100 * time.Millisecond}.Validate())
	// Output:
	// <nil>
	// txlock: ExponentialBackoff Min 1s is greater than Max 100ms
}

// Waiting in the server's lock queue: the lock passes the moment the other
// holder commits.
func ExampleWithServerWait() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:server-wait")

	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := txlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, func() { _ = other.Commit() })

	err = txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("acquired after the other holder committed")
		return nil
	}, txlock.WithServerWait(txlock.ServerWait{Window: time.Second}))
	fmt.Println(err)
	// Output:
	// acquired after the other holder committed
	// <nil>
}

// Readers share a lock; a writer excludes them.
func ExampleWithShared() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:catalog")

	reader, err := db.BeginTx(ctx, nil) // a reader holds the shared lock
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = reader.Rollback() }()
	if err := txlock.LockTx(ctx, reader, key, txlock.WithShared()); err != nil {
		log.Fatal(err)
	}
	ran, _ := txlock.TryWithLock(ctx, db, key, noop, txlock.WithShared())
	fmt.Println("another reader:", ran)
	ran, _ = txlock.TryWithLock(ctx, db, key, noop)
	fmt.Println("a writer:", ran)
	// Output:
	// another reader: true
	// a writer: false
}

// Operators see who holds a lock in pg_stat_activity.
func ExampleWithOwner() {
	db := exampleDB()
	defer db.Close()

	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:owner"), func(ctx context.Context, tx *sql.Tx) error {
		var pid int
		if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		var name string // what another session sees
		err := db.QueryRowContext(ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&name)
		fmt.Println(name)
		return err
	}, txlock.WithOwner("billing-worker host-7 pid 4242"))
	if err != nil {
		log.Fatal(err)
	}
	// Output: billing-worker host-7 pid 4242
}

// A fn stuck past its hold bound is cut off, and its transaction rolled
// back, releasing the lock.
func ExampleWithMaxHold() {
	db := exampleDB()
	defer db.Close()

	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:max-hold"), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `SELECT pg_sleep(10)`) // stuck
		return err
	}, txlock.WithMaxHold(100*time.Millisecond))
	fmt.Println(errors.Is(err, txlock.ErrHoldTimeout))
	// Output: true
}

// A cache refresh that had rather run unguarded than not at all: when the
// lock cannot be had in time, fn runs without it.
func ExampleWithFailOpen() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("example:cache-refresh")

	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if err := txlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler) // where the warning goes
	err = txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("refreshing; lock held:", txlock.Held(ctx))
		return nil
	}, txlock.WithTimeout(50*time.Millisecond), txlock.WithFailOpen(quiet))
	fmt.Println(err)
	// Output:
	// refreshing; lock held: false
	// <nil>
}

// A report that needs one consistent snapshot runs Serializable, and is
// re-run on a serialization failure.
func ExampleWithTxOptions() {
	db := exampleDB()
	defer db.Close()

	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:report"), func(ctx context.Context, tx *sql.Tx) error {
		var level string
		err := tx.QueryRowContext(ctx, `SHOW transaction_isolation`).Scan(&level)
		fmt.Println(level)
		return err
	}, txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelSerializable}), txlock.WithSerializationRetries(5))
	if err != nil {
		log.Fatal(err)
	}
	// Output: serializable
}

// Holders that draw fencing tokens set a connection aside for the draws,
// so that they never wait for one: here four holders on a pool of two.
func ExampleWithFencing() {
	db := exampleDB()
	defer db.Close()
	db.SetMaxOpenConns(2)
	if err := (txlock.Fencer{}).CreateSequence(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	var tokens sync.Map
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:fencing"), func(ctx context.Context, tx *sql.Tx) error {
				token, err := txlock.FenceToken(ctx)
				tokens.Store(token, true)
				return err
			}, txlock.WithFencing())
			if err != nil {
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	n := 0
	tokens.Range(func(any, any) bool { n++; return true })
	fmt.Println(n, "different tokens")
	// Output: 4 different tokens
}

// ---- Fencing ----

// A fencing token inside fn.
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

// Tokens from a sequence of the service's own; the first call in fn draws
// the token, and later ones return it.
func ExampleFencer_Token() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	jobs := txlock.Fencer{Sequence: "example_jobs_fence_seq"}
	if err := jobs.CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	err := txlock.WithLock(ctx, db, txlock.StringKey("example:jobs"), func(ctx context.Context, tx *sql.Tx) error {
		first, err := jobs.Token(ctx)
		if err != nil {
			return err
		}
		again, err := jobs.Token(ctx)
		fmt.Println(first > 0, again == first)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: true true
}

// Fencing: a holder that lost its lock is refused by the resource.
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

// Who runs a job, written by each holder with its token: an old holder's
// write is refused once a newer one has written.
func ExampleFencedTable_Upsert() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_jobs (job text PRIMARY KEY, worker text NOT NULL, fence_token bigint);
		TRUNCATE example_jobs`); err != nil {
		log.Fatal(err)
	}
	jobs := txlock.FencedTable{Name: "example_jobs"}
	job := []txlock.Col{{Name: "job", Value: "nightly"}}
	worker := func(name string) []txlock.Col { return []txlock.Col{{Name: "worker", Value: name}} }

	fmt.Println(jobs.Upsert(ctx, db, 7, job, worker("worker-a"))) // inserts
	fmt.Println(jobs.Upsert(ctx, db, 8, job, worker("worker-b"))) // updates
	err := jobs.Upsert(ctx, db, 7, job, worker("worker-a"))       // worker-a's term has passed
	fmt.Println(errors.Is(err, txlock.ErrStaleToken))
	// Output:
	// <nil>
	// <nil>
	// true
}

func ExampleFencedTable_Delete() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_leases (id int PRIMARY KEY, fence_token bigint NOT NULL);
		TRUNCATE example_leases; INSERT INTO example_leases VALUES (1, 5)`); err != nil {
		log.Fatal(err)
	}
	leases := txlock.FencedTable{Name: "example_leases"}
	lease := []txlock.Col{{Name: "id", Value: 1}}

	_, err := leases.Delete(ctx, db, 4, lease) // an older holder
	fmt.Println(errors.Is(err, txlock.ErrStaleToken))
	n, err := leases.Delete(ctx, db, 5, lease)
	fmt.Println(n, err)
	// Output:
	// true
	// 1 <nil>
}

// Fenced writes through pgx, with the pool's QuerierOf.
func ExampleFencedTable_On() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_pgx_stock (sku text PRIMARY KEY, qty int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		TRUNCATE example_pgx_stock; INSERT INTO example_pgx_stock (sku, qty) VALUES ('SKU-1', 10)`); err != nil {
		log.Fatal(err)
	}
	stock := txlock.FencedTable{Name: "example_pgx_stock"}.On(pgxlock.QuerierOf(pool))
	sku := []txlock.Col{{Name: "sku", Value: "SKU-1"}}

	n, err := stock.Update(ctx, 2, []txlock.Col{{Name: "qty", Value: 9}}, sku)
	fmt.Println(n, err)
	_, err = stock.Update(ctx, 1, []txlock.Col{{Name: "qty", Value: 8}}, sku)
	fmt.Println(errors.Is(err, txlock.ErrStaleToken))
	// Output:
	// 1 <nil>
	// true
}

// A lease deleted through pgx by its holder: an older holder's delete is
// refused, and so is one of a lease that is gone.
func ExampleFencedWrites_Delete() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_pgx_leases (id int PRIMARY KEY, fence_token bigint NOT NULL);
		TRUNCATE example_pgx_leases; INSERT INTO example_pgx_leases VALUES (1, 5)`); err != nil {
		log.Fatal(err)
	}
	leases := txlock.FencedTable{Name: "example_pgx_leases"}.On(pgxlock.QuerierOf(pool))
	lease := []txlock.Col{{Name: "id", Value: 1}}

	_, err := leases.Delete(ctx, 4, lease) // an older holder
	fmt.Println(errors.Is(err, txlock.ErrStaleToken))
	n, err := leases.Delete(ctx, 5, lease)
	fmt.Println(n, err)
	_, err = leases.Delete(ctx, 5, lease) // again: the lease is gone
	fmt.Println(errors.Is(err, txlock.ErrRowNotFound))
	// Output:
	// true
	// 1 <nil>
	// true
}

// A fenced upsert through pgx, in a transaction of the writer's own that
// also logs the run: a refused write rolls the log's row back with it.
func ExampleFencedWrites_Upsert() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_pgx_jobs (job text PRIMARY KEY, worker text NOT NULL, fence_token bigint);
		CREATE TABLE IF NOT EXISTS example_pgx_job_log (job text NOT NULL, worker text NOT NULL);
		TRUNCATE example_pgx_jobs, example_pgx_job_log`); err != nil {
		log.Fatal(err)
	}
	job := []txlock.Col{{Name: "job", Value: "nightly"}}
	run := func(worker string, token int64) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `INSERT INTO example_pgx_job_log VALUES ('nightly', $1)`, worker); err != nil {
			return err
		}
		jobs := txlock.FencedTable{Name: "example_pgx_jobs"}.On(pgxlock.QuerierOf(tx))
		if err := jobs.Upsert(ctx, token, job, []txlock.Col{{Name: "worker", Value: worker}}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}

	fmt.Println(run("worker-b", 8))
	err := run("worker-a", 7) // worker-a's term has passed
	fmt.Println(errors.Is(err, txlock.ErrStaleToken))
	var logged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM example_pgx_job_log`).Scan(&logged); err != nil {
		log.Fatal(err)
	}
	fmt.Println(logged, "run logged")
	// Output:
	// <nil>
	// true
	// 1 run logged
}

// ---- Terms ----

// A leader holds its term while it works, and fences its writes outside
// the term with the term's token.
func ExampleAcquireTerm() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	term, err := txlock.AcquireTerm(ctx, db, txlock.StringKey("example:scheduler"),
		txlock.WithHeartbeat(txlock.Heartbeat{Interval: 500 * time.Millisecond, TTL: 2 * time.Second}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leading", term.Key().Name(), "with token > 0:", term.Token() > 0)
	fmt.Println("holding:", term.Err() == nil, txlock.Held(term.Context()))

	if err := term.Release(ctx); err != nil {
		log.Fatal(err)
	}
	<-term.Done()
	fmt.Println(errors.Is(term.Err(), txlock.ErrTermReleased))
	// Output:
	// leading example:scheduler with token > 0: true
	// holding: true true
	// true
}

// One attempt: while another replica leads, there is no term to start.
func ExampleTryAcquireTerm() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	key := txlock.StringKey("example:compactor")
	leader, err := txlock.TryAcquireTerm(ctx, db, key)
	if err != nil || leader == nil {
		log.Fatal("the first replica does not lead: ", err)
	}
	defer func() { _ = leader.Release(ctx) }()
	fmt.Println("first replica leads:", leader.Err() == nil)

	second, err := txlock.TryAcquireTerm(ctx, db, key)
	fmt.Println("second replica leads:", second != nil, err)
	// Output:
	// first replica leads: true
	// second replica leads: false <nil>
}

// One term: fn runs while the replica leads, and the term is released when
// it returns. A service calls Lead in a loop to stay a candidate.
func ExampleLead() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	err := txlock.Lead(ctx, db, txlock.StringKey("example:leader"), func(ctx context.Context, t *txlock.Term) error {
		token, err := txlock.FenceToken(ctx) // the term's token
		fmt.Println("leading with the term's token:", token == t.Token())
		return err
	}, txlock.WithHeartbeat(txlock.Heartbeat{Interval: 500 * time.Millisecond}), txlock.WithTimeout(10*time.Second))
	fmt.Println(err)
	// Output:
	// leading with the term's token: true
	// <nil>
}

// A term that draws its token from the service's own sequence.
func ExampleWithTermFencer() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	leaders := txlock.Fencer{Sequence: "example_leader_fence_seq"}
	if err := leaders.CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	term, err := txlock.AcquireTerm(ctx, db, txlock.StringKey("example:term-fencer"), txlock.WithTermFencer(leaders))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = term.Release(ctx) }()

	token, err := leaders.Token(term.Context())
	fmt.Println(token == term.Token(), err)
	_, err = txlock.FenceToken(term.Context()) // the zero Fencer's sequence is not the term's
	fmt.Println(errors.Is(err, txlock.ErrNoToken))
	// Output:
	// true <nil>
	// true
}

// ---- Locker ----

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

// The Locker's options apply to every call: here each holder is named for
// operators.
func ExampleLocker_WithLock() {
	db := exampleDB()
	defer db.Close()
	locks, err := txlock.New(db, txlock.WithOwner("orders-service"), txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = locks.WithLock(context.Background(), txlock.StringKey("example:order:42"), func(ctx context.Context, tx *sql.Tx) error {
		var owner string
		err := tx.QueryRowContext(ctx, `SELECT current_setting('application_name')`).Scan(&owner)
		fmt.Println(owner)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: orders-service
}

func ExampleLocker_TryWithLock() {
	db := exampleDB()
	defer db.Close()
	locks, err := txlock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	ran, err := locks.TryWithLock(context.Background(), txlock.StringKey("example:cleanup"), func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("cleaning up")
		return nil
	})
	fmt.Println(ran, err)
	// Output:
	// cleaning up
	// true <nil>
}

func ExampleLocker_WithLocks() {
	db := exampleDB()
	defer db.Close()
	locks, err := txlock.New(db, txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	seats := txlock.NewKeyspace("seats")
	err = locks.WithLocks(context.Background(), []txlock.Key{seats.Key("12A"), seats.Key("12B")}, func(ctx context.Context, tx *sql.Tx) error {
		l, _ := txlock.LockFromContext(ctx)
		fmt.Println("booking", len(l.Keys), "seats")
		return nil
	})
	fmt.Println(err)
	// Output:
	// booking 2 seats
	// <nil>
}

func ExampleLocker_TryWithLocks() {
	db := exampleDB()
	defer db.Close()
	locks, err := txlock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	seats := txlock.NewKeyspace("seats")
	ran, err := locks.TryWithLocks(context.Background(), []txlock.Key{seats.Key("14A"), seats.Key("14B")}, func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("booking both seats")
		return nil
	})
	fmt.Println(ran, err)
	// Output:
	// booking both seats
	// true <nil>
}

func ExampleLocker_WithSemaphore() {
	db := exampleDB()
	defer db.Close()
	locks, err := txlock.New(db, txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = locks.WithSemaphore(context.Background(), txlock.StringKey("example:uploads"), 4, func(ctx context.Context, tx *sql.Tx) error {
		l, _ := txlock.LockFromContext(ctx)
		fmt.Println("one of", l.Slots, "uploads:", l.Slot >= 0 && l.Slot < l.Slots)
		return nil
	})
	fmt.Println(err)
	// Output:
	// one of 4 uploads: true
	// <nil>
}

func ExampleLocker_TryWithSemaphore() {
	db := exampleDB()
	defer db.Close()
	locks, err := txlock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	ran, err := locks.TryWithSemaphore(context.Background(), txlock.StringKey("example:reindex"), 1, func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("reindexing")
		return nil
	})
	fmt.Println(ran, err)
	// Output:
	// reindexing
	// true <nil>
}

// A repository method locks inside its caller's transaction with the
// Locker's options.
func ExampleLocker_LockTx() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	locks, err := txlock.New(db, txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	tx, err := locks.DB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := locks.LockTx(ctx, tx, txlock.StringKey("example:customer:9")); err != nil {
		log.Fatal(err)
	}
	fmt.Println(tx.Commit()) // the commit releases the lock
	// Output: <nil>
}

func ExampleLocker_TryLockTx() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	locks, err := txlock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	ok, err := locks.TryLockTx(ctx, tx, txlock.StringKey("example:customer:10"))
	fmt.Println(ok, err)
	// Output: true <nil>
}

func ExampleLocker_AcquireTerm() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	locks, err := txlock.New(db, txlock.WithTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	term, err := locks.AcquireTerm(ctx, txlock.StringKey("example:locker-term"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leading:", term.Err() == nil)
	fmt.Println(term.Release(ctx))
	// Output:
	// leading: true
	// <nil>
}

func ExampleLocker_TryAcquireTerm() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	locks, err := txlock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	term, err := locks.TryAcquireTerm(ctx, txlock.StringKey("example:locker-try-term"))
	if err != nil {
		log.Fatal(err)
	}
	if term == nil {
		fmt.Println("another replica leads")
		return
	}
	fmt.Println("leading")
	fmt.Println(term.Release(ctx))
	// Output:
	// leading
	// <nil>
}

func ExampleLocker_Lead() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	locks, err := txlock.New(db, txlock.WithTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = locks.Lead(ctx, txlock.StringKey("example:locker-lead"), func(ctx context.Context, t *txlock.Term) error {
		fmt.Println("leading", t.Key().Name())
		return nil
	})
	fmt.Println(err)
	// Output:
	// leading example:locker-lead
	// <nil>
}

// The Locker's database, for the work of a helper that is handed only the
// Locker: here a read that needs no lock, in a read-only transaction.
func ExampleLocker_DB() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	locks, err := txlock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(locks.DB() == db)

	tx, err := locks.DB().BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var readOnly string
	if err := tx.QueryRowContext(ctx, `SHOW transaction_read_only`).Scan(&readOnly); err != nil {
		log.Fatal(err)
	}
	fmt.Println(readOnly)
	fmt.Println(tx.Commit())
	// Output:
	// true
	// on
	// <nil>
}

// ---- Observers ----

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

// Two observers on one call: a counter of grants and a logger of releases.
func ExampleObservers() {
	db := exampleDB()
	defer db.Close()

	var grants atomic.Int64
	count := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		if e.Kind == txlock.Acquired {
			grants.Add(1)
		}
		return ctx
	})
	released := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		if e.Kind == txlock.Released {
			fmt.Println("released, committed:", e.Committed)
		}
		return ctx
	})
	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:observers"), noop,
		txlock.WithObserver(txlock.Observers(count, released)))
	fmt.Println(grants.Load(), err)
	// Output:
	// released, committed: true
	// 1 <nil>
}

// An observer labels its metrics with the keyspace of the call's keys.
func ExampleEvent_Keyspace() {
	db := exampleDB()
	defer db.Close()

	label := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		if e.Kind == txlock.Acquired {
			name, mixed := e.Keyspace()
			fmt.Printf("keyspace=%q mixed=%v\n", name, mixed)
		}
		return ctx
	})
	billing, shipping := txlock.NewKeyspace("billing"), txlock.NewKeyspace("shipping")
	for _, keys := range [][]txlock.Key{
		{billing.Key("inv-7"), billing.ID(8)},
		{billing.Key("inv-7"), shipping.Key("parcel-1")},
	} {
		if err := txlock.WithLocks(context.Background(), db, keys, noop, txlock.WithObserver(label)); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// keyspace="billing" mixed=false
	// keyspace="" mixed=true
}

// ---- Keyspace registry ----

// Each service registers its keyspaces at start-up; tools list them.
func ExampleRegistry() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	registry := txlock.Registry{Table: "example_keyspaces"}
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS example_keyspaces`); err != nil { // a fresh registry
		log.Fatal(err)
	}
	if err := registry.Create(ctx, db); err != nil {
		log.Fatal(err)
	}
	for _, name := range []string{"inventory", "billing", "inventory"} { // registering again is fine
		if err := registry.Register(ctx, db, txlock.NewKeyspace(name)); err != nil {
			log.Fatal(err)
		}
	}
	all, err := registry.Keyspaces(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	for _, ks := range all {
		fmt.Println(ks, ks.Namespace())
	}
	// Output:
	// billing 211142636
	// inventory -1323661902
}

// Two services whose keyspace names hash to the same namespace would lock
// each other's keys: the second one to register finds out at start-up.
func ExampleRegistry_Register() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	registry := txlock.Registry{Table: "example_clashing_keyspaces"}
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS example_clashing_keyspaces`); err != nil {
		log.Fatal(err)
	}
	if err := registry.Create(ctx, db); err != nil {
		log.Fatal(err)
	}
	fmt.Println(registry.Register(ctx, db, txlock.NewKeyspace("service-9049")))

	err := registry.Register(ctx, db, txlock.NewKeyspace("service-40850"))
	var clash *txlock.KeyspaceClashError
	if errors.As(err, &clash) {
		fmt.Println(errors.Is(err, txlock.ErrKeyspaceClash), clash.Namespace, clash.Owner)
	}
	// Output:
	// <nil>
	// true -2137967199 service-9049
}

// The registry's table, for a migration of the service's own.
func ExampleRegistry_DDL() {
	ddl, err := txlock.Registry{Schema: "locks", Table: "keyspaces"}.DDL()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS "locks"."keyspaces" (
	//     namespace integer PRIMARY KEY,
	//     name pg_catalog.text NOT NULL,
	//     registered_at timestamp with time zone NOT NULL DEFAULT pg_catalog.now(),
	//     last_registered_at timestamp with time zone NOT NULL DEFAULT pg_catalog.now(),
	//     CONSTRAINT namespace_is_hash_of_name CHECK (namespace OPERATOR(pg_catalog.=) CAST(CAST('x' OPERATOR(pg_catalog.||)
	//         pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(name, 'UTF8')), 'hex'), 8) AS bit(32)) AS integer))
	// )
}

// The registry through pgx: the table is created with the DDL, and the
// calls go through QuerierOf.
func ExampleRegistry_On() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	registry := txlock.Registry{Table: "example_pgx_keyspaces"}
	ddl, err := registry.DDL()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS example_pgx_keyspaces; `+ddl); err != nil {
		log.Fatal(err)
	}
	reg := registry.On(pgxlock.QuerierOf(pool))
	if err := reg.Register(ctx, txlock.NewKeyspace("shipping")); err != nil {
		log.Fatal(err)
	}
	all, err := reg.Keyspaces(ctx)
	fmt.Println(all, err)
	// Output: [shipping] <nil>
}

// A tool names the keyspace of a lock it finds in pg_locks: the lock's
// namespace is that of a registered keyspace.
func ExampleRegistry_Keyspaces() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	registry := txlock.Registry{Table: "example_listed_keyspaces"}
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS example_listed_keyspaces`); err != nil { // a fresh registry
		log.Fatal(err)
	}
	if err := registry.Create(ctx, db); err != nil {
		log.Fatal(err)
	}
	billing := txlock.NewKeyspace("billing")
	for _, ks := range []txlock.Keyspace{billing, txlock.NewKeyspace("shipping")} {
		if err := registry.Register(ctx, db, ks); err != nil {
			log.Fatal(err)
		}
	}

	other, err := db.BeginTx(ctx, nil) // a service holds invoice 8 of billing
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if err := txlock.LockTx(ctx, other, billing.ID(8)); err != nil {
		log.Fatal(err)
	}
	var pid int
	if err := other.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		log.Fatal(err)
	}

	all, err := registry.Keyspaces(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	names := map[int32]string{}
	for _, ks := range all {
		names[ks.Namespace()] = ks.String()
	}
	rows, err := db.QueryContext(ctx, `SELECT CAST(classid AS bigint), CAST(objid AS bigint), objsubid
		FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = $1`, pid)
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var classid, objid int64
		var objsubid int
		if err := rows.Scan(&classid, &objid, &objsubid); err != nil {
			log.Fatal(err)
		}
		k, err := txlock.KeyFromPgLocks(uint32(classid), uint32(objid), objsubid)
		if err != nil {
			log.Fatal(err)
		}
		if ns, id, ok := k.Pair(); ok {
			fmt.Println(names[ns], id)
		}
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
	// Output: billing 8
}

// Registering on a pgx transaction: the service's migration creates the
// registry and registers the keyspaces in one transaction, so that a clash
// fails the migration and registers nothing.
func ExampleRegistrar_Register() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	registry := txlock.Registry{Table: "example_migrated_keyspaces"}
	ddl, err := registry.DDL()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS example_migrated_keyspaces`); err != nil {
		log.Fatal(err)
	}
	migrate := func(names ...string) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return err
		}
		reg := registry.On(pgxlock.QuerierOf(tx))
		for _, name := range names {
			if err := reg.Register(ctx, txlock.NewKeyspace(name)); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	}
	err = migrate("orders", "service-9049", "service-40850") // the last two share a namespace
	fmt.Println(errors.Is(err, txlock.ErrKeyspaceClash))
	fmt.Println(migrate("orders", "service-9049"))

	all, err := registry.On(pgxlock.QuerierOf(pool)).Keyspaces(ctx)
	fmt.Println(all, err)
	// Output:
	// true
	// <nil>
	// [orders service-9049] <nil>
}

// An Observer for one call: it is told of the wait's start, the grant and
// the release. (New sets one for every call of a Locker.)
func ExampleWithObserver() {
	db := exampleDB()
	defer db.Close()
	seen := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		fmt.Println(e.Kind, e.Attempts)
		return ctx
	})
	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:observed"), func(context.Context, *sql.Tx) error {
		return nil
	}, txlock.WithObserver(seen))
	fmt.Println(err)
	// Output:
	// wait_started 0
	// acquired 1
	// released 1
	// <nil>
}

// Above ReadCommitted the server can refuse a transaction with a
// serialization failure (40001); the call then runs fn again, in a new
// transaction under the lock, up to n more times. Here the server refuses
// the first run.
func ExampleWithSerializationRetries() {
	db := exampleDB()
	defer db.Close()
	runs := 0
	err := txlock.WithLock(context.Background(), db, txlock.StringKey("example:serializable"), func(ctx context.Context, tx *sql.Tx) error {
		runs++
		if runs == 1 {
			_, err := tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$`)
			return err
		}
		return nil
	}, txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelSerializable}), txlock.WithSerializationRetries(2))
	fmt.Println(runs, err)
	// Output: 2 <nil>
}

// A term whose heartbeat runs every 200ms and which the server ends 1s
// after the last one, should the holder freeze.
func ExampleWithHeartbeat() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		log.Fatal(err)
	}
	term, err := txlock.AcquireTerm(ctx, db, txlock.StringKey("example:heartbeat"),
		txlock.WithHeartbeat(txlock.Heartbeat{Interval: 200 * time.Millisecond, TTL: time.Second}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(term.Token() > 0)
	fmt.Println(term.Release(ctx))
	// Output:
	// true
	// <nil>
}

// A heartbeat read from a service's configuration is checked at start-up:
// the server must not end a session that is merely idle between two
// heartbeats.
func ExampleHeartbeat_Validate() {
	fmt.Println(txlock.Heartbeat{Interval: time.Second, TTL: 5 * time.Second}.Validate())
	fmt.Println(txlock.Heartbeat{Interval: time.Second, TTL: 1500 * time.Millisecond}.Validate())
	// Output:
	// <nil>
	// txlock: Heartbeat TTL 1.5s must be at least twice Interval 1s: a session is idle for an interval between heartbeats, and the server ends it after TTL
}

// The sequence of a service's own tokens, made once at start-up (or by a
// migration, as migrations/ holds for the default sequence). Making it
// again is fine.
func ExampleFencer_CreateSequence() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	orders := txlock.Fencer{Sequence: "example_orders_fence_seq"}
	fmt.Println(orders.CreateSequence(ctx, db))
	fmt.Println(orders.CreateSequence(ctx, db))
	// Output:
	// <nil>
	// <nil>
}

// The statement that creates a Fencer's sequence, for a migration or for a
// pgx pool (pool.Exec(ctx, ddl)).
func ExampleFencer_DDL() {
	ddl, err := txlock.Fencer{Schema: "locks", Sequence: "order_tokens"}.DDL()
	fmt.Println(ddl, err)
	// Output: CREATE SEQUENCE IF NOT EXISTS "locks"."order_tokens" AS bigint CACHE 1 NO CYCLE <nil>
}

// The registry's table, made once at start-up (or by a migration:
// Registry.DDL gives the statement). Making it again is fine.
func ExampleRegistry_Create() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	registry := txlock.Registry{Table: "example_create_keyspaces"}
	fmt.Println(registry.Create(ctx, db))
	fmt.Println(registry.Create(ctx, db))
	// Output:
	// <nil>
	// <nil>
}
