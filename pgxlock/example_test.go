package pgxlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// The examples below run against the test server, on a pool that
// examplePool opens. Another instance of the service that holds a lock is
// played by a transaction of the example's own that took it with LockTx.

// examplePool opens a pool on the shared test PostgreSQL for a runnable
// example.
func examplePool() *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), pgtest.ExampleURL())
	if err != nil {
		panic(err)
	}
	return pool
}

// createFenceSequence creates the sequence of the zero txlock.Fencer, as the
// library's migration file does.
func createFenceSequence(ctx context.Context, pool *pgxpool.Pool) {
	if _, err := pool.Exec(ctx, `CREATE SEQUENCE IF NOT EXISTS public.txlock_fence_seq AS bigint CACHE 1 NO CYCLE`); err != nil {
		log.Fatal(err)
	}
}

// noop is a fn with nothing to do under the lock.
func noop(context.Context, pgx.Tx) error { return nil }

// Selling a unit: the read and the write run under the SKU's lock, so two
// sales never both take the last unit.
func ExampleWithLock() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgxexample_inventory (sku text PRIMARY KEY, qty int NOT NULL);
		TRUNCATE pgxexample_inventory; INSERT INTO pgxexample_inventory VALUES ('sku:1001', 1)`); err != nil {
		log.Fatal(err)
	}
	sell := func(ctx context.Context, tx pgx.Tx) error {
		var qty int
		if err := tx.QueryRow(ctx, `SELECT qty FROM pgxexample_inventory WHERE sku = $1`, "sku:1001").Scan(&qty); err != nil {
			return err
		}
		if qty == 0 {
			return errors.New("out of stock")
		}
		_, err := tx.Exec(ctx, `UPDATE pgxexample_inventory SET qty = qty - 1 WHERE sku = $1`, "sku:1001")
		return err
	}
	key := txlock.NewKeyspace("inventory").Key("sku:1001")
	fmt.Println(pgxlock.WithLock(ctx, pool, key, sell, txlock.WithTimeout(2*time.Second)))
	fmt.Println(pgxlock.WithLock(ctx, pool, key, sell, txlock.WithTimeout(2*time.Second)))
	// Output:
	// <nil>
	// out of stock
}

// A lock on a connection the caller already has: a *pgxpool.Conn here, or
// a *pgx.Conn. It must not be shared by calls that run at the same time.
func ExampleDB() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Release()

	err = pgxlock.WithLock(ctx, conn, txlock.StringKey("pgxexample:conn"), func(ctx context.Context, tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
		fmt.Println("locked on the caller's connection:", one)
		return err
	})
	fmt.Println(err)
	// Output:
	// locked on the caller's connection: 1
	// <nil>
}

// A transfer locks both accounts, all or nothing, in one statement: two
// transfers in opposite directions never deadlock.
func ExampleWithLocks() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgxexample_accounts (id int PRIMARY KEY, balance int NOT NULL);
		TRUNCATE pgxexample_accounts; INSERT INTO pgxexample_accounts VALUES (1, 100), (2, 0)`); err != nil {
		log.Fatal(err)
	}
	accounts := txlock.NewKeyspace("accounts")
	err := pgxlock.WithLocks(ctx, pool, []txlock.Key{accounts.ID(1), accounts.ID(2)}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE pgxexample_accounts SET balance = balance + CASE id WHEN 1 THEN -30 ELSE 30 END WHERE id IN (1, 2)`)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	var from, to int
	if err := pool.QueryRow(ctx, `SELECT (SELECT balance FROM pgxexample_accounts WHERE id = 1), (SELECT balance FROM pgxexample_accounts WHERE id = 2)`).Scan(&from, &to); err != nil {
		log.Fatal(err)
	}
	fmt.Println(from, to)
	// Output: 70 30
}

// A singleton job: each instance tries once, and skips the run if another
// instance has it.
func ExampleTryWithLock() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	key := txlock.StringKey("pgxexample:nightly-report")
	report := func(ctx context.Context, tx pgx.Tx) error {
		fmt.Println("running the report")
		return nil
	}

	other, err := pool.Begin(ctx) // another instance, running the report
	if err != nil {
		log.Fatal(err)
	}
	if err := pgxlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	ran, err := pgxlock.TryWithLock(ctx, pool, key, report)
	fmt.Println(ran, err)

	_ = other.Rollback(ctx) // the other instance is done
	ran, err = pgxlock.TryWithLock(ctx, pool, key, report)
	fmt.Println(ran, err)
	// Output:
	// false <nil>
	// running the report
	// true <nil>
}

// A job that needs two resources runs only if it gets both at once.
func ExampleTryWithLocks() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	keys := []txlock.Key{txlock.StringKey("pgxexample:warehouse-a"), txlock.StringKey("pgxexample:warehouse-b")}

	other, err := pool.Begin(ctx) // another instance has one of them
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if err := pgxlock.LockTx(ctx, other, keys[1]); err != nil {
		log.Fatal(err)
	}
	ran, err := pgxlock.TryWithLocks(ctx, pool, keys, func(ctx context.Context, tx pgx.Tx) error {
		fmt.Println("rebalancing stock between the warehouses")
		return nil
	})
	fmt.Println(ran, err)
	// Output: false <nil>
}

// The next invoice number of a tenant, taken under the tenant's lock.
func ExampleDo() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgxexample_tenants (id int PRIMARY KEY, last_invoice bigint NOT NULL);
		TRUNCATE pgxexample_tenants; INSERT INTO pgxexample_tenants VALUES (42, 1000)`); err != nil {
		log.Fatal(err)
	}
	key := txlock.NewKeyspace("invoices").ID(42)
	next, err := pgxlock.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (n int64, err error) {
		err = tx.QueryRow(ctx, `UPDATE pgxexample_tenants SET last_invoice = last_invoice + 1 WHERE id = 42 RETURNING last_invoice`).Scan(&n)
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
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	key := txlock.StringKey("pgxexample:cache-warmup")
	warm := func(ctx context.Context, tx pgx.Tx) (n int, err error) {
		err = tx.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = 'public'`).Scan(&n)
		return n, err
	}

	n, ran, err := pgxlock.TryDo(ctx, pool, key, warm)
	fmt.Println(n, ran, err)

	other, err := pool.Begin(ctx) // another instance warms the cache now
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if err := pgxlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	n, ran, err = pgxlock.TryDo(ctx, pool, key, warm)
	fmt.Println(n, ran, err)
	// Output:
	// 1 true <nil>
	// 0 false <nil>
}

// A repository method that runs inside the caller's transaction.
func ExampleLockTx() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgxexample_balances (id int PRIMARY KEY, balance int NOT NULL);
		TRUNCATE pgxexample_balances; INSERT INTO pgxexample_balances VALUES (7, 100)`); err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := pgxlock.LockTx(ctx, tx, txlock.StringKey("pgxexample:account:7"), txlock.WithTimeout(time.Second)); err != nil {
		log.Fatal(err)
	}
	var balance int
	if err := tx.QueryRow(ctx, `UPDATE pgxexample_balances SET balance = balance - 10 WHERE id = 7 RETURNING balance`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil { // the commit releases the lock
		log.Fatal(err)
	}
	fmt.Println(balance)
	// Output: 90
}

// Inside the caller's transaction, one attempt: a busy lock leaves the
// transaction usable, to do something else.
func ExampleTryLockTx() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	key := txlock.StringKey("pgxexample:account:8")

	other, err := pool.Begin(ctx) // another session holds the lock
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if err := pgxlock.LockTx(ctx, other, key); err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ok, err := pgxlock.TryLockTx(ctx, tx, key)
	fmt.Println(ok, err)
	// Output: false <nil>
}

// At most two exports run at once across all instances, whatever their
// number.
func ExampleWithSemaphore() {
	pool := examplePool()
	defer pool.Close()
	var mu sync.Mutex
	running, most := 0, 0
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			err := pgxlock.WithSemaphore(context.Background(), pool, txlock.StringKey("pgxexample:exports"), 2, func(ctx context.Context, tx pgx.Tx) error {
				mu.Lock()
				running++
				most = max(most, running)
				mu.Unlock()
				_, err := tx.Exec(ctx, `SELECT pg_sleep(0.02)`) // the export
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

// Both slots of a semaphore of two are taken, here by hand
// (txlock.SlotKey), so a try with n 2 is skipped; a try with n 3 gets the
// third slot.
func ExampleTryWithSemaphore() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	key := txlock.StringKey("pgxexample:thumbnails")

	other, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	for i := range 2 {
		if err := pgxlock.LockTx(ctx, other, txlock.SlotKey(key, i)); err != nil {
			log.Fatal(err)
		}
	}
	for _, n := range []int{2, 3} {
		ran, err := pgxlock.TryWithSemaphore(ctx, pool, key, n, func(ctx context.Context, tx pgx.Tx) error {
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

// Fenced writes on pgx, through QuerierOf. Each holder draws a fencing
// token under the lock, and writes outside the lock's transaction, where
// the write can outlive the lock: holder A stalls, holder B takes the lock
// and writes, and A's late write is refused.
func ExampleQuerierOf() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	createFenceSequence(ctx, pool)
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgxexample_stock (sku text PRIMARY KEY, qty int NOT NULL, fence_token bigint);
		TRUNCATE pgxexample_stock`); err != nil {
		log.Fatal(err)
	}
	stock := txlock.FencedTable{Name: "pgxexample_stock"}.On(pgxlock.QuerierOf(pool))
	sku, key := []txlock.Col{{Name: "sku", Value: "SKU-1"}}, txlock.StringKey("pgxexample:stock")
	draw := func(ctx context.Context, tx pgx.Tx) (int64, error) { return txlock.FenceToken(ctx) }

	tokenA, errA := pgxlock.Do(ctx, pool, key, draw) // holder A, which then stalls
	tokenB, errB := pgxlock.Do(ctx, pool, key, draw) // holder B, the next one
	if err := errors.Join(errA, errB); err != nil {
		log.Fatal(err)
	}
	fmt.Println(stock.Upsert(ctx, tokenB, sku, []txlock.Col{{Name: "qty", Value: 9}})) // B writes
	err := stock.Upsert(ctx, tokenA, sku, []txlock.Col{{Name: "qty", Value: 8}})       // A wakes up and writes
	fmt.Println(errors.Is(err, txlock.ErrStaleToken))
	// Output:
	// <nil>
	// true
}

// The keyspace registry on pgx: the table is created with the Registry's
// DDL, and the calls go through QuerierOf.
func ExampleQuerierOf_registry() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	registry := txlock.Registry{Table: "pgxexample_keyspaces"}
	ddl, err := registry.DDL()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS pgxexample_keyspaces; `+ddl); err != nil { // a fresh registry
		log.Fatal(err)
	}
	reg := registry.On(pgxlock.QuerierOf(pool))
	for _, name := range []string{"shipping", "billing"} {
		if err := reg.Register(ctx, txlock.NewKeyspace(name)); err != nil {
			log.Fatal(err)
		}
	}
	all, err := reg.Keyspaces(ctx)
	fmt.Println(all, err)
	// Output: [billing shipping] <nil>
}

// A leader holds its term while it works, and fences its writes outside
// the term with the term's token.
func ExampleAcquireTerm() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	createFenceSequence(ctx, pool)
	term, err := pgxlock.AcquireTerm(ctx, pool, txlock.StringKey("pgxexample:scheduler"),
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
	// leading pgxexample:scheduler with token > 0: true
	// holding: true true
	// true
}

// One attempt: while another replica leads, there is no term to start.
func ExampleTryAcquireTerm() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	createFenceSequence(ctx, pool)
	key := txlock.StringKey("pgxexample:compactor")
	leader, err := pgxlock.TryAcquireTerm(ctx, pool, key)
	if err != nil || leader == nil {
		log.Fatal("the first replica does not lead: ", err)
	}
	defer func() { _ = leader.Release(ctx) }()
	fmt.Println("first replica leads:", leader.Err() == nil)

	second, err := pgxlock.TryAcquireTerm(ctx, pool, key)
	fmt.Println("second replica leads:", second != nil, err)
	// Output:
	// first replica leads: true
	// second replica leads: false <nil>
}

// One term: fn runs while the replica leads, and the term is released when
// it returns. A service calls Lead in a loop to stay a candidate.
func ExampleLead() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	createFenceSequence(ctx, pool)
	err := pgxlock.Lead(ctx, pool, txlock.StringKey("pgxexample:leader"), func(ctx context.Context, t *txlock.Term) error {
		token, err := txlock.FenceToken(ctx) // the term's token
		fmt.Println("leading with the term's token:", token == t.Token())
		return err
	}, txlock.WithHeartbeat(txlock.Heartbeat{Interval: 500 * time.Millisecond}), txlock.WithTimeout(10*time.Second))
	fmt.Println(err)
	// Output:
	// leading with the term's token: true
	// <nil>
}

// A service builds one Locker at start-up, with the options every call
// shares, here an Observer that prints each event's kind.
func ExampleNew() {
	pool := examplePool()
	defer pool.Close()

	printer := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		fmt.Println(e.Kind, e.Keys[0].Name())
		return ctx
	})
	locks, err := pgxlock.New(pool, txlock.WithObserver(printer), txlock.WithTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	if err := locks.WithLock(context.Background(), txlock.StringKey("pgxexample:new"), noop); err != nil {
		log.Fatal(err)
	}
	// Output:
	// wait_started pgxexample:new
	// acquired pgxexample:new
	// released pgxexample:new
}

// The Locker's options apply to every call: here each holder is named for
// operators.
func ExampleLocker_WithLock() {
	pool := examplePool()
	defer pool.Close()
	locks, err := pgxlock.New(pool, txlock.WithOwner("orders-service"), txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = locks.WithLock(context.Background(), txlock.StringKey("pgxexample:order:42"), func(ctx context.Context, tx pgx.Tx) error {
		var owner string
		err := tx.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&owner)
		fmt.Println(owner)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: orders-service
}

func ExampleLocker_TryWithLock() {
	pool := examplePool()
	defer pool.Close()
	locks, err := pgxlock.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	ran, err := locks.TryWithLock(context.Background(), txlock.StringKey("pgxexample:cleanup"), func(ctx context.Context, tx pgx.Tx) error {
		fmt.Println("cleaning up")
		return nil
	})
	fmt.Println(ran, err)
	// Output:
	// cleaning up
	// true <nil>
}

func ExampleLocker_WithLocks() {
	pool := examplePool()
	defer pool.Close()
	locks, err := pgxlock.New(pool, txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	seats := txlock.NewKeyspace("seats")
	err = locks.WithLocks(context.Background(), []txlock.Key{seats.Key("12A"), seats.Key("12B")}, func(ctx context.Context, tx pgx.Tx) error {
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
	pool := examplePool()
	defer pool.Close()
	locks, err := pgxlock.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	seats := txlock.NewKeyspace("seats")
	ran, err := locks.TryWithLocks(context.Background(), []txlock.Key{seats.Key("14A"), seats.Key("14B")}, func(ctx context.Context, tx pgx.Tx) error {
		fmt.Println("booking both seats")
		return nil
	})
	fmt.Println(ran, err)
	// Output:
	// booking both seats
	// true <nil>
}

func ExampleLocker_WithSemaphore() {
	pool := examplePool()
	defer pool.Close()
	locks, err := pgxlock.New(pool, txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = locks.WithSemaphore(context.Background(), txlock.StringKey("pgxexample:uploads"), 4, func(ctx context.Context, tx pgx.Tx) error {
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
	pool := examplePool()
	defer pool.Close()
	locks, err := pgxlock.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	ran, err := locks.TryWithSemaphore(context.Background(), txlock.StringKey("pgxexample:reindex"), 1, func(ctx context.Context, tx pgx.Tx) error {
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
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	locks, err := pgxlock.New(pool, txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	tx, err := locks.Pool().Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := locks.LockTx(ctx, tx, txlock.StringKey("pgxexample:customer:9")); err != nil {
		log.Fatal(err)
	}
	fmt.Println(tx.Commit(ctx)) // the commit releases the lock
	// Output: <nil>
}

func ExampleLocker_TryLockTx() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	locks, err := pgxlock.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ok, err := locks.TryLockTx(ctx, tx, txlock.StringKey("pgxexample:customer:10"))
	fmt.Println(ok, err)
	// Output: true <nil>
}

func ExampleLocker_AcquireTerm() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	createFenceSequence(ctx, pool)
	locks, err := pgxlock.New(pool, txlock.WithTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	term, err := locks.AcquireTerm(ctx, txlock.StringKey("pgxexample:locker-term"))
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
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	createFenceSequence(ctx, pool)
	locks, err := pgxlock.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	term, err := locks.TryAcquireTerm(ctx, txlock.StringKey("pgxexample:locker-try-term"))
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
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	createFenceSequence(ctx, pool)
	locks, err := pgxlock.New(pool, txlock.WithTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = locks.Lead(ctx, txlock.StringKey("pgxexample:locker-lead"), func(ctx context.Context, t *txlock.Term) error {
		fmt.Println("leading", t.Key().Name())
		return nil
	})
	fmt.Println(err)
	// Output:
	// leading pgxexample:locker-lead
	// <nil>
}

// The Locker's pool, for the work of a service that keeps only its Locker:
// here the start-up statement that creates the fencing tokens' sequence,
// whose tokens the Locker's calls then draw.
func ExampleLocker_Pool() {
	pool := examplePool()
	defer pool.Close()
	ctx := context.Background()
	locks, err := pgxlock.New(pool, txlock.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(locks.Pool() == pool)

	ddl, err := txlock.Fencer{}.DDL()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := locks.Pool().Exec(ctx, ddl); err != nil {
		log.Fatal(err)
	}
	err = locks.WithLock(ctx, txlock.StringKey("pgxexample:locker-pool"), func(ctx context.Context, tx pgx.Tx) error {
		token, err := txlock.FenceToken(ctx)
		fmt.Println("token > 0:", token > 0)
		return err
	})
	fmt.Println(err)
	// Output:
	// true
	// token > 0: true
	// <nil>
}
