package interopcheck

import (
	"strconv"
	"testing"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/database/postgres"

	"github.com/txlock/txlock/interop"
)

// TestGolangMigrateKey compares interop.GolangMigrate with the lock id that
// golang-migrate's PostgreSQL drivers pass to pg_advisory_lock:
// database.GenerateAdvisoryLockId(database, schema, table), a decimal
// string.
func TestGolangMigrateKey(t *testing.T) {
	for _, c := range []struct{ database, schema, table string }{
		{"app", "public", "schema_migrations"},
		{"postgres", "public", "schema_migrations"},
		{"txlock_test", "public", "schema_migrations"},
		{"app", "migrate", "schema_migrations"},
		{"app", "public", "versions"},
		{"ünïcødé", "schéma", "tàble ✓"},
		{"a", "b", "c"},
		{"b", "a", "c"}, // the order of the names matters
	} {
		id, err := database.GenerateAdvisoryLockId(c.database, c.schema, c.table)
		if err != nil {
			t.Fatalf("GenerateAdvisoryLockId(%q, %q, %q): %v", c.database, c.schema, c.table, err)
		}
		want, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			t.Fatalf("GenerateAdvisoryLockId(%q, %q, %q) = %q, not a bigint: %v", c.database, c.schema, c.table, id, err)
		}
		k := interop.GolangMigrate(c.database, c.schema, c.table)
		got, ok := k.Int64()
		if !ok || k.Err() != nil {
			t.Fatalf("GolangMigrate(%q, %q, %q) = %v (err %v), want the bigint key %d", c.database, c.schema, c.table, k, k.Err(), want)
		}
		if got != want {
			t.Errorf("GolangMigrate(%q, %q, %q) = %d, golang-migrate's lock id = %s", c.database, c.schema, c.table, got, id)
		}
		t.Logf("GenerateAdvisoryLockId(%q, %q, %q) = %s", c.database, c.schema, c.table, id)
	}
}

// TestGolangMigrateDefaults checks interop's defaults against
// golang-migrate's: the default migrations table is the postgres driver's
// DefaultMigrationsTable.
func TestGolangMigrateDefaults(t *testing.T) {
	if interop.GolangMigrateTable != postgres.DefaultMigrationsTable {
		t.Errorf("interop.GolangMigrateTable = %q, golang-migrate's postgres.DefaultMigrationsTable = %q", interop.GolangMigrateTable, postgres.DefaultMigrationsTable)
	}
}
