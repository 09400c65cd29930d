// Command singleton runs a job on at most one instance at a time.
//
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable' go run ./examples/singleton
//
// Start it several times at once: one instance runs the job, the others
// report that it is busy and exit.
package main

import (
	"context"
	"database/sql"
	"log"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
)

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

	ran, err := txlock.TryWithLock(context.Background(), db, txlock.StringKey("job:nightly-report"),
		func(ctx context.Context, tx *sql.Tx) error {
			log.Print("running the job")
			select { // stands in for the job's work
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}, txlock.WithMaxHold(time.Minute))
	switch {
	case err != nil:
		log.Fatal(err)
	case !ran:
		log.Print("another instance is running the job; skipping")
	default:
		log.Print("done")
	}
}
