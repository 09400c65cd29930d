package interop

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgident"
)

// bad reports whether name has no counterpart in the tool: it is not valid
// UTF-8 (every tool here hashes a text string), or, when it becomes
// PostgreSQL text (noNUL), it holds a NUL byte. invalid then returns a Key
// carrying the error that says which.
func bad(name string, noNUL bool) bool {
	return !utf8.ValidString(name) || noNUL && strings.IndexByte(name, 0) >= 0
}

// invalid returns the Key carrying the error about s, the argument named
// what ("database name"), which is empty, not valid UTF-8, or holds a NUL
// byte.
func invalid(what, s string) txlock.Key { return txlock.InvalidKey(invalidErr(what, s)) }

func invalidErr(what, s string) error {
	return fmt.Errorf("interop: %s", pgident.Problem(what, s))
}

// FNV1a64 returns the bigint key whose value is the 64-bit FNV-1a hash of
// the UTF-8 name (offset basis 14695981039346656037, prime 1099511628211),
// read as a signed bigint, in the bigint space (pg_locks objsubid 1). Its
// golden values are the formula's, checked against Go's hash/fnv, which
// implements the published FNV-1a.
//
// A name that is not valid UTF-8 gives a Key carrying the error.
func FNV1a64(name string) txlock.Key {
	if bad(name, false) {
		return invalid("FNV1a64 name", name)
	}
	const offsetBasis, prime = 14695981039346656037, 1099511628211
	h := uint64(offsetBasis)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= prime
	}
	return txlock.Int64Key(int64(h))
}

// DjangoPglock returns the key of django-pglock's pglock.advisory(name): the
// first 8 bytes of the SHA-256 of the UTF-8 name, read little-endian as a
// signed bigint (pglock/core.py, _cast_lock_id: int.from_bytes(…[:8],
// "little", signed=True)), in the bigint space (pg_locks objsubid 1). By
// default django-pglock takes a session lock (pg_advisory_lock); with
// xact=True a transaction lock (pg_advisory_xact_lock); advisory.acquire
// builds the function name.
//
// django-pglock refuses an empty name (advisory._process_runtime_parameters
// raises ValueError): the empty name, like one that is not valid UTF-8,
// gives a Key carrying the error.
func DjangoPglock(name string) txlock.Key {
	if name == "" || bad(name, false) {
		return invalid("DjangoPglock name", name)
	}
	sum := sha256.Sum256([]byte(name))
	return txlock.Int64Key(int64(binary.LittleEndian.Uint64(sum[:8])))
}

// WithAdvisoryLock returns the key of Ruby's with_advisory_lock gem on
// PostgreSQL, with_advisory_lock(name), in the int4-pair space (pg_locks
// objsubid 2): (crc32(name) & 0x7fffffff, prefix & 0x7fffffff)
// (lib/with_advisory_lock/postgresql_advisory.rb, lock_keys_for, with
// stable_hashcode of core_advisory.rb: Zlib.crc32 of the string, the IEEE
// CRC-32). prefix is the integer value of the environment variable
// WITH_ADVISORY_LOCK_PREFIX, as Ruby's String#to_i reads it: 0 when it is
// unset or does not start with a number. The gem (7.5.0) takes a session
// lock (pg_try_advisory_lock, polled, or pg_advisory_lock with
// blocking: true), or with transaction: true a transaction lock.
//
// Only string names are covered: the gem uses an Integer name as the first
// half itself. A name that is not valid UTF-8 gives a Key carrying the
// error.
func WithAdvisoryLock(name string, prefix int64) txlock.Key {
	if bad(name, false) {
		return invalid("WithAdvisoryLock name", name)
	}
	return txlock.PairKey(int32(crc32.ChecksumIEEE([]byte(name))&0x7fffffff), int32(prefix&0x7fffffff))
}

// DistributedLock returns the key of DistributedLock.Postgres's
// new PostgresAdvisoryLockKey(name, allowHashing)
// (src/DistributedLock.Postgres/PostgresAdvisoryLockKey.cs, the
// PostgresAdvisoryLockKey(string, bool) constructor), tried in its order:
//
//   - a name of 0 to 9 ASCII characters (TryEncodeAscii): each character's
//     7 bits, in order, then a 0 bit, then a 1 bit for each of the 9 - len
//     missing characters' 7 bits, as one 64-bit value, used as the pair
//     (high 32 bits, low 32 bits) in the int4-pair space (pg_locks
//     objsubid 2);
//   - 16 hex digits (TryEncodeHashString): that 64-bit value, in the bigint
//     space (objsubid 1);
//   - 8 hex digits, a comma, 8 hex digits: that pair (objsubid 2);
//   - otherwise, only if allowHashing: the first 8 bytes of the SHA-1 of the
//     UTF-8 name, read little-endian (HashString), in the bigint space.
//
// Any other name, like a name that is not valid UTF-8, gives a Key carrying
// an error matching txlock.ErrInvalidKey, as the library throws a
// FormatException. The library takes a session lock (pg_advisory_lock,
// pg_try_advisory_lock) on a connection of its own, or a transaction lock
// (pg_advisory_xact_lock) inside a transaction:
// PostgresAdvisoryLock.CreateAcquireCommand. .NET cannot run here: the
// golden values are this formula's, taken from the source, not from the
// library.
func DistributedLock(name string, allowHashing bool) txlock.Key {
	if !utf8.ValidString(name) {
		return invalid("DistributedLock name", name)
	}
	if v, ok := distributedLockASCII(name); ok {
		return txlock.PairKey(int32(v>>32), int32(v))
	}
	if len(name) == 16 {
		if v, err := strconv.ParseUint(name, 16, 64); err == nil && isHex(name) {
			return txlock.Int64Key(int64(v))
		}
	}
	if len(name) == 17 && name[8] == ',' && isHex(name[:8]) && isHex(name[9:]) {
		a, _ := strconv.ParseUint(name[:8], 16, 32)
		b, _ := strconv.ParseUint(name[9:], 16, 32)
		return txlock.PairKey(int32(a), int32(b))
	}
	if !allowHashing {
		return txlock.InvalidKey(fmt.Errorf("interop: DistributedLock name %q is not 0 to 9 ASCII characters, 16 hex digits or 8 hex digits, a comma and 8 hex digits, and allowHashing is false", pgident.Truncate(name)))
	}
	sum := sha1.Sum([]byte(name))
	return txlock.Int64Key(int64(binary.LittleEndian.Uint64(sum[:8])))
}

// distributedLockASCII is PostgresAdvisoryLockKey.TryEncodeAscii. .NET
// counts UTF-16 code units and compares each with 127; for a name of
// ASCII bytes that is its length in bytes and each byte.
func distributedLockASCII(name string) (uint64, bool) {
	const maxLen, charBits, ones = 9, 7, 1<<7 - 1
	if len(name) > maxLen {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(name); i++ {
		if name[i] > ones {
			return 0, false
		}
		v = v<<charBits | uint64(name[i])
	}
	v <<= 1
	for i := len(name); i < maxLen; i++ {
		v = v<<charBits | ones
	}
	return v, true
}

// isHex reports whether s is all hex digits, as .NET's int.TryParse with
// NumberStyles.AllowHexSpecifier accepts them (no sign, no 0x, no space).
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return s != ""
}

// Defaults of the migration tools.
const (
	// DefaultSchema is the schema the migration tools use when none is
	// configured: the current_schema() of PostgreSQL's default search_path.
	DefaultSchema = "public"
	// GolangMigrateTable is golang-migrate's default migrations table
	// (database/postgres/postgres.go, DefaultMigrationsTable).
	GolangMigrateTable = "schema_migrations"
	// FlywayTable is Flyway's default schema history table
	// (flyway-core, FlywayModel: setTable("flyway_schema_history")).
	FlywayTable = "flyway_schema_history"
)

// golangMigrateSalt is advisoryLockIDSalt of golang-migrate's database/util.go.
const golangMigrateSalt = 1486364155

// GolangMigrate returns the key of golang-migrate's migration lock on
// PostgreSQL (the postgres, pgx and pgx/v5 drivers; Lock, or
// applyAdvisoryLock): database.GenerateAdvisoryLockId(database, schema,
// table) of database/util.go, the IEEE CRC-32 of schema, table and database
// joined with NUL bytes, in that order, times 1486364155, in uint32
// arithmetic. The driver passes that decimal string to pg_advisory_lock($1),
// a session lock, so the key is in the bigint space (pg_locks objsubid 1)
// and never negative. The internal/interopcheck module pins this against
// golang-migrate's own function.
//
// The driver takes database from the URL or current_database(), schema from
// x-migrations-table's quoted schema or current_schema(), and table from
// x-migrations-table. An empty schema means DefaultSchema and an empty table
// GolangMigrateTable; pass the real schema if the service's search_path
// puts another first. An empty database, which golang-migrate refuses
// (ErrNoDatabaseName), or a name that is not valid UTF-8 gives a Key
// carrying the error.
func GolangMigrate(database, schema, table string) txlock.Key {
	if schema == "" {
		schema = DefaultSchema
	}
	if table == "" {
		table = GolangMigrateTable
	}
	for _, a := range []struct{ what, s string }{{"GolangMigrate database name", database}, {"GolangMigrate schema name", schema}, {"GolangMigrate table name", table}} {
		if a.s == "" || bad(a.s, true) {
			return invalid(a.what, a.s)
		}
	}
	sum := crc32.ChecksumIEEE([]byte(schema + "\x00" + table + "\x00" + database))
	return txlock.Int64Key(int64(sum * golangMigrateSalt))
}

// railsMigratorSalt is ActiveRecord::Migrator::MIGRATOR_SALT.
const railsMigratorSalt = 2053462845

// RailsMigrations returns the key of the lock Rails takes while it migrates
// a PostgreSQL database (activerecord/lib/active_record/migration.rb,
// Migrator#generate_migrator_advisory_lock_id): 2053462845 times
// Zlib.crc32(current_database), the IEEE CRC-32, which fits a bigint
// without overflow. It is in the bigint space (pg_locks objsubid 1), taken
// as a session lock with one attempt (pg_try_advisory_lock, in
// PostgreSQLAdapter#get_advisory_lock). An empty database or one that is not
// valid UTF-8 gives a Key carrying the error.
func RailsMigrations(database string) txlock.Key {
	if database == "" || bad(database, true) {
		return invalid("RailsMigrations database name", database)
	}
	return txlock.Int64Key(railsMigratorSalt * int64(crc32.ChecksumIEEE([]byte(database))))
}

// prismaLock is the key of schema-engine's PostgresFlavour::acquire_lock.
const prismaLock = 72707369

// PrismaMigrate returns the key of Prisma Migrate's lock on PostgreSQL: the
// constant 72707369 in the bigint space (pg_locks objsubid 1), the same in
// every database, taken as a session lock with a 10 s timeout
// (prisma-engines,
// schema-engine/connectors/sql-schema-connector/src/flavour/postgres.rs,
// PostgresFlavour::acquire_lock: SELECT pg_advisory_lock(72707369)).
func PrismaMigrate() txlock.Key { return txlock.Int64Key(prismaLock) }

// flywayMagic is LOCK_MAGIC_NUM of Flyway's PostgreSQLAdvisoryLockTemplate:
// the ASCII bytes of "Flyway".
const flywayMagic = 0x46<<40 | 0x6C<<32 | 0x79<<24 | 0x77<<16 | 0x61<<8 | 0x79

// Flyway returns the key of Flyway's lock on the schema history table
// schema.table of a PostgreSQL database
// (flyway-database-postgresql, PostgreSQLAdvisoryLockTemplate: lockNum =
// LOCK_MAGIC_NUM + discriminator; PostgreSQLConnection.lock passes
// table.toString().hashCode()). Table.toString is the quoted, qualified
// name, "schema"."table", with each " doubled (SchemaObject.toString,
// Database.quote, PostgreSQLDatabase.doQuote), and hashCode is Java's
// String.hashCode over its UTF-16 code units. The key is in the bigint
// space (pg_locks objsubid 1). Flyway takes a transaction lock
// (pg_try_advisory_xact_lock, polled) unless
// flyway.postgresql.transactional.lock is false, and then a session lock
// (pg_try_advisory_lock). Java cannot run here: the golden values are the
// formula's, and the hashCode of the tests is checked against its
// definition.
//
// An empty schema means DefaultSchema (Flyway uses the first of its
// schemas, or current_schema()), an empty table FlywayTable. A name that is
// not valid UTF-8 gives a Key carrying the error.
func Flyway(schema, table string) txlock.Key {
	if schema == "" {
		schema = DefaultSchema
	}
	if table == "" {
		table = FlywayTable
	}
	for _, a := range []struct{ what, s string }{{"Flyway schema name", schema}, {"Flyway table name", table}} {
		if bad(a.s, true) {
			return invalid(a.what, a.s)
		}
	}
	return txlock.Int64Key(flywayMagic + int64(javaHashCode(pgident.Quote(schema)+"."+pgident.Quote(table))))
}

// javaHashCode is Java's String.hashCode: s[0]*31^(n-1) + … + s[n-1] over
// the UTF-16 code units of s, in int arithmetic.
func javaHashCode(s string) int32 {
	var h int32
	for _, u := range utf16.Encode([]rune(s)) {
		h = 31*h + int32(u)
	}
	return h
}
