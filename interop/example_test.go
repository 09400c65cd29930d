package interop_test

import (
	"fmt"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/interop"
)

// A Go service that must not run while golang-migrate migrates the database
// "app" takes golang-migrate's key with txlock.
func ExampleGolangMigrate() {
	k := interop.GolangMigrate("app", "", "") // public.schema_migrations
	fmt.Println(k)
	// Output: bigint(1787120056)
}

// An operator's tool labels a row of pg_locks.
func ExampleIdentify() {
	k, err := txlock.KeyFromPgLocks(0, 72707369, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	if m, ok := interop.Identify(k, interop.Hints{Database: "app"}); ok {
		fmt.Println(m.Label)
	}
	// Output: Prisma Migrate: migration lock
}
