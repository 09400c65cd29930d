package interop

import (
	"fmt"
	"strings"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgident"
)

// Hints tells Identify what to try: the keys of most tools depend on names
// that only the operator knows.
type Hints struct {
	// Database is current_database(): golang-migrate's and Rails' keys
	// depend on it. Empty skips them.
	Database string
	// Names are lock names to try with every name-derived scheme: FNV1a64,
	// HashtextKey, DjangoPglock, WithAdvisoryLock (with any prefix) and
	// DistributedLock (with hashing allowed).
	Names []string
	// MigrateTables are "schema.table" candidates for golang-migrate, split
	// at the first dot; one without a dot is a table in DefaultSchema.
	// Empty means golang-migrate's default, public.schema_migrations.
	// golang-migrate splits its x-migrations-table only when
	// x-migrations-table-quoted is set (database/postgres/postgres.go): an
	// unquoted x-migrations-table=app.migrations is the table
	// "app.migrations" in current_schema(), which is the candidate
	// "public.app.migrations" when that schema is public.
	MigrateTables []string
	// FlywayTables are "schema.table" candidates for Flyway's schema history
	// table, read as MigrateTables. Empty means public.flyway_schema_history.
	FlywayTables []string
}

// Match names the tool behind a key.
type Match struct {
	Tool  string // short tool name, e.g. "golang-migrate"
	Label string // e.g. `golang-migrate: migration lock of database "app" (public.schema_migrations)`
}

// Tool names of Match.Tool.
const (
	ToolGolangMigrate    = "golang-migrate"
	ToolRails            = "rails"
	ToolPrisma           = "prisma"
	ToolFlyway           = "flyway"
	ToolHashtext         = "hashtext"
	ToolFNV1a64          = "FNV-1a"
	ToolDjangoPglock     = "django-pglock"
	ToolWithAdvisoryLock = "with_advisory_lock"
	ToolDistributedLock  = "DistributedLock"
)

// Identify reports which tool's lock k is, trying the keys of h: first the
// migration tools (Prisma always, golang-migrate and Rails when h.Database is
// set, Flyway on its tables), then every name of h.Names with each
// name-derived scheme, in the order of the Hints.Names comment. The first
// match wins; ok is false when none matches. A match means the key is
// equal, not that the tool holds it: another holder may use the same
// number.
func Identify(k txlock.Key, h Hints) (Match, bool) {
	if n, ok := k.Int64(); ok {
		return identifyInt64(n, h)
	}
	if a, b, ok := k.Pair(); ok {
		return identifyPair(a, b, h)
	}
	return Match{}, false
}

func identifyInt64(n int64, h Hints) (Match, bool) {
	is := func(k txlock.Key) bool {
		v, ok := k.Int64()
		return ok && k.Err() == nil && v == n
	}
	if is(PrismaMigrate()) {
		return Match{ToolPrisma, "Prisma Migrate: migration lock"}, true
	}
	if h.Database != "" {
		for _, t := range tables(h.MigrateTables, GolangMigrateTable) {
			if is(GolangMigrate(h.Database, t[0], t[1])) {
				return Match{ToolGolangMigrate, fmt.Sprintf("golang-migrate: migration lock of database %q (%s.%s)", h.Database, t[0], t[1])}, true
			}
		}
		if is(RailsMigrations(h.Database)) {
			return Match{ToolRails, fmt.Sprintf("Rails migrations: migration lock of database %q", h.Database)}, true
		}
	}
	for _, t := range tables(h.FlywayTables, FlywayTable) {
		if is(Flyway(t[0], t[1])) {
			return Match{ToolFlyway, fmt.Sprintf("Flyway: lock of schema history table %s.%s", pgident.Quote(t[0]), pgident.Quote(t[1]))}, true
		}
	}
	for _, name := range h.Names {
		switch {
		case is(FNV1a64(name)):
			return Match{ToolFNV1a64, fmt.Sprintf("FNV-1a lock %q (the 64-bit FNV-1a hash of the name)", name)}, true
		case is(HashtextKey(name)):
			return Match{ToolHashtext, fmt.Sprintf("hashtext lock %q (pg_advisory_xact_lock(hashtext(name)))", name)}, true
		case is(DjangoPglock(name)):
			return Match{ToolDjangoPglock, fmt.Sprintf("django-pglock: lock %q", name)}, true
		case is(DistributedLock(name, true)):
			return Match{ToolDistributedLock, fmt.Sprintf("DistributedLock: lock %q", name)}, true
		}
	}
	return Match{}, false
}

func identifyPair(a, b int32, h Hints) (Match, bool) {
	for _, name := range h.Names {
		if x, y, ok := WithAdvisoryLock(name, int64(b)).Pair(); ok && x == a && y == b {
			return Match{ToolWithAdvisoryLock, fmt.Sprintf("with_advisory_lock: lock %q (prefix %d)", name, b)}, true
		}
		if k := DistributedLock(name, true); k.Err() == nil {
			if x, y, ok := k.Pair(); ok && x == a && y == b {
				return Match{ToolDistributedLock, fmt.Sprintf("DistributedLock: lock %q", name)}, true
			}
		}
	}
	return Match{}, false
}

// tables splits "schema.table" candidates, or returns the default table in
// DefaultSchema when there are none.
func tables(candidates []string, def string) [][2]string {
	if len(candidates) == 0 {
		return [][2]string{{DefaultSchema, def}}
	}
	out := make([][2]string, 0, len(candidates))
	for _, c := range candidates {
		schema, table, ok := strings.Cut(c, ".")
		if !ok {
			schema, table = DefaultSchema, c
		}
		out = append(out, [2]string{schema, table})
	}
	return out
}
