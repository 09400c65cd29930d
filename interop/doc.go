// Package interop builds the txlock.Key of the advisory lock another tool
// takes, so that a Go service can take the same lock as a tool it shares a
// database with, and names the tool behind a lock seen in pg_locks.
//
// A txlock call takes a transaction-scoped lock (pg_advisory_xact_lock); most
// of these tools take a session-scoped one (pg_advisory_lock) on the same
// key. The two conflict: whichever holds the key first makes the other wait.
//
// The keys, each derived as its tool's source derives it, or, for
// HashtextKey and FNV1a64, which name no tool, by the formula of the lock
// statement or hash (each function's comment names its source and what
// could not be checked):
//
//	func Hashtext(s string) int32                                 // PostgreSQL's hashtext(text)
//	func HashtextKey(name string) txlock.Key                      // pg_advisory_xact_lock(hashtext(name)): bigint
//	func FNV1a64(name string) txlock.Key                          // 64-bit FNV-1a of the UTF-8 name: bigint
//	func DjangoPglock(name string) txlock.Key                     // django-pglock: bigint
//	func WithAdvisoryLock(name string, prefix int64) txlock.Key   // Ruby's with_advisory_lock: int4 pair
//	func DistributedLock(name string, allowHashing bool) txlock.Key // DistributedLock.Postgres (.NET): bigint or pair
//	func GolangMigrate(database, schema, table string) txlock.Key // golang-migrate's postgres and pgx drivers: bigint
//	func RailsMigrations(database string) txlock.Key              // Rails migrations: bigint
//	func PrismaMigrate() txlock.Key                               // Prisma Migrate: bigint
//	func Flyway(schema, table string) txlock.Key                  // Flyway's PostgreSQL support: bigint
//
// and the decoder, for a key read from pg_locks (txlock.KeyFromPgLocks):
//
//	type Hints struct{ Database string; Names, MigrateTables, FlywayTables []string }
//	type Match struct{ Tool, Label string }
//	func Identify(k txlock.Key, h Hints) (Match, bool)
//
// Tool names Identify reports are the Tool constants; DefaultSchema,
// GolangMigrateTable and FlywayTable are the defaults an empty schema or
// table stands for.
//
// A constructor never panics. Given input its tool cannot have (a name that
// is not valid UTF-8, an empty database name, a DistributedLock name that
// needs hashing when allowHashing is false), it returns a Key that carries
// the error, as txlock's own constructors do: Err reports it, matching
// txlock.ErrInvalidKey and naming the argument ("GolangMigrate database
// name is empty"), and every locking call returns it.
package interop
