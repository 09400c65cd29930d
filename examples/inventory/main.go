// Command inventory reserves stock under a txlock lock.
//
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable&default_query_exec_mode=exec' go run ./examples/inventory
//
// It creates a small stock table, then runs several concurrent reservations
// of the same SKU, each a read-modify-write under the lock, and prints the
// stock left: every reservation is counted exactly once.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
)

var errOutOfStock = errors.New("out of stock")

func main() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		log.Fatal("set DATABASE_URL to a PostgreSQL connection string")
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS txlock_example_stock (sku text PRIMARY KEY, qty int NOT NULL);
		INSERT INTO txlock_example_stock VALUES ('SKU-1001', 50) ON CONFLICT (sku) DO UPDATE SET qty = 50`); err != nil {
		log.Fatal(err)
	}

	inventory := txlock.NewKeyspace("inventory")
	reserve := func(sku string, n int) error {
		return txlock.WithLock(ctx, db, inventory.Key(sku), func(ctx context.Context, tx *sql.Tx) error {
			var qty int
			if err := tx.QueryRowContext(ctx, `SELECT qty FROM txlock_example_stock WHERE sku = $1`, sku).Scan(&qty); err != nil {
				return err
			}
			if qty < n {
				return errOutOfStock
			}
			_, err := tx.ExecContext(ctx, `UPDATE txlock_example_stock SET qty = $1 WHERE sku = $2`, qty-n, sku)
			return err
		}, txlock.WithTimeout(10*time.Second))
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	reserved := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				err := reserve("SKU-1001", 1)
				switch {
				case errors.Is(err, errOutOfStock):
					return
				case errors.Is(err, txlock.ErrLockTimeout):
					log.Printf("gave up waiting: %v", err)
				case err != nil:
					log.Fatal(err)
				default:
					mu.Lock()
					reserved++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()

	var left int
	if err := db.QueryRowContext(ctx, `SELECT qty FROM txlock_example_stock WHERE sku = 'SKU-1001'`).Scan(&left); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("reserved %d, left %d, total %d\n", reserved, left, reserved+left)
}
