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

// A Go service shares a lock with services that run
// SELECT pg_try_advisory_xact_lock(hashtext('nightly-report-job')).
func ExampleHashtextKey() {
	fmt.Println(interop.HashtextKey("nightly-report-job"))
	// Output: bigint(-1906875880)
}

// Hashtext is PostgreSQL's hashtext(text), computed in Go.
func ExampleHashtext() {
	fmt.Println(interop.Hashtext("orders:42"))
	// Output: -1852455970
}

// A Go service shares a lock with tools that lock the 64-bit FNV-1a of a
// name.
func ExampleFNV1a64() {
	fmt.Println(interop.FNV1a64("orders:42"))
	// Output: bigint(5475843843707809360)
}

// A Go worker and a Django view that uses pglock.advisory("orders:42")
// exclude each other.
func ExampleDjangoPglock() {
	fmt.Println(interop.DjangoPglock("orders:42"))
	// Output: bigint(260941440247488394)
}

// A Go job and a Rails model's with_advisory_lock("orders:42"), with
// WITH_ADVISORY_LOCK_PREFIX unset, exclude each other.
func ExampleWithAdvisoryLock() {
	fmt.Println(interop.WithAdvisoryLock("orders:42", 0))
	// Output: pair(218055877,0)
}

// A Go service and a .NET service that locks
// new PostgresAdvisoryLockKey("orders:42") exclude each other; a longer
// name is hashed only where the .NET side allows hashing.
func ExampleDistributedLock() {
	fmt.Println(interop.DistributedLock("orders:42", false))
	fmt.Println(interop.DistributedLock("nightly-report-job", true))
	fmt.Println(interop.DistributedLock("nightly-report-job", false).Err() != nil)
	// Output:
	// pair(-540334498,1558000740)
	// bigint(-8279099796375110145)
	// true
}

// A Go service that must not run while Rails migrates the database "app".
func ExampleRailsMigrations() {
	fmt.Println(interop.RailsMigrations("app"))
	// Output: bigint(6939591962871035475)
}

// A Go service that must not run while Prisma Migrate migrates.
func ExamplePrismaMigrate() {
	fmt.Println(interop.PrismaMigrate())
	// Output: bigint(72707369)
}

// A Go service that must not run while Flyway migrates with its default
// history table, public.flyway_schema_history.
func ExampleFlyway() {
	fmt.Println(interop.Flyway("", ""))
	// Output: bigint(77433833903597)
}
