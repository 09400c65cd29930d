package interop_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/interop"
)

func TestIdentify(t *testing.T) {
	names := []string{"orders:42", "nightly-report-job"}
	hints := interop.Hints{Database: "app", Names: names}
	for _, c := range []struct {
		key   txlock.Key
		hints interop.Hints
		tool  string
		label string
	}{
		{interop.PrismaMigrate(), interop.Hints{}, interop.ToolPrisma, "Prisma Migrate: migration lock"},
		{interop.GolangMigrate("app", "", ""), hints, interop.ToolGolangMigrate,
			`golang-migrate: migration lock of database "app" (public.schema_migrations)`},
		{interop.GolangMigrate("app", "migrate", "versions"), interop.Hints{Database: "app", MigrateTables: []string{"x.y", "migrate.versions"}},
			interop.ToolGolangMigrate, `golang-migrate: migration lock of database "app" (migrate.versions)`},
		{interop.GolangMigrate("app", "public", "versions"), interop.Hints{Database: "app", MigrateTables: []string{"versions"}},
			interop.ToolGolangMigrate, `golang-migrate: migration lock of database "app" (public.versions)`},
		// An unquoted x-migrations-table=app.migrations is the table
		// "app.migrations" of current_schema(): the candidate is split at
		// its first dot.
		{interop.GolangMigrate("app", "public", "app.migrations"), interop.Hints{Database: "app", MigrateTables: []string{"public.app.migrations"}},
			interop.ToolGolangMigrate, `golang-migrate: migration lock of database "app" (public.app.migrations)`},
		{interop.RailsMigrations("app"), hints, interop.ToolRails, `Rails migrations: migration lock of database "app"`},
		{interop.Flyway("", ""), interop.Hints{}, interop.ToolFlyway,
			`Flyway: lock of schema history table "public"."flyway_schema_history"`},
		{interop.Flyway("app", "history"), interop.Hints{FlywayTables: []string{"app.history"}}, interop.ToolFlyway,
			`Flyway: lock of schema history table "app"."history"`},
		{interop.FNV1a64("nightly-report-job"), hints, interop.ToolFNV1a64, `FNV-1a lock "nightly-report-job" (the 64-bit FNV-1a hash of the name)`},
		{interop.HashtextKey("orders:42"), hints, interop.ToolHashtext,
			`hashtext lock "orders:42" (pg_advisory_xact_lock(hashtext(name)))`},
		{interop.DjangoPglock("nightly-report-job"), hints, interop.ToolDjangoPglock, `django-pglock: lock "nightly-report-job"`},
		{interop.WithAdvisoryLock("orders:42", 7), hints, interop.ToolWithAdvisoryLock, `with_advisory_lock: lock "orders:42" (prefix 7)`},
		{interop.DistributedLock("orders:42", false), hints, interop.ToolDistributedLock, `DistributedLock: lock "orders:42"`},
		{interop.DistributedLock("nightly-report-job", true), hints, interop.ToolDistributedLock, `DistributedLock: lock "nightly-report-job"`},
	} {
		m, ok := interop.Identify(c.key, c.hints)
		require.True(t, ok, "Identify(%v, %+v)", c.key, c.hints)
		assert.Equal(t, interop.Match{Tool: c.tool, Label: c.label}, m)
	}
}

func TestIdentifyNoMatch(t *testing.T) {
	hints := interop.Hints{Database: "app", Names: []string{"orders:42"}}
	for _, c := range []struct {
		why   string
		key   txlock.Key
		hints interop.Hints
	}{
		{"a txlock key", txlock.StringKey("orders:42"), hints},
		{"a txlock keyspace key", txlock.NewKeyspace("billing").Key("orders:42"), hints},
		{"another database", interop.GolangMigrate("other", "", ""), hints},
		{"no database given", interop.RailsMigrations("app"), interop.Hints{Names: hints.Names}},
		{"another table", interop.GolangMigrate("app", "public", "versions"), hints},
		{"a dotted table name given without its schema", interop.GolangMigrate("app", "public", "app.migrations"),
			interop.Hints{Database: "app", MigrateTables: []string{"app.migrations"}}}, // schema app, table migrations
		{"a name not given", interop.DjangoPglock("orders:43"), hints},
		{"a pair whose halves are swapped", txlock.PairKey(0, 218055877), hints},
		{"a with_advisory_lock pair with a negative second half", txlock.PairKey(218055877, -1), hints},
		{"the zero Key", txlock.Key{}, hints},
		{"an invalid key", interop.RailsMigrations(""), interop.Hints{}},
	} {
		m, ok := interop.Identify(c.key, c.hints)
		assert.False(t, ok, "%s: Identify(%v) = %+v", c.why, c.key, m)
	}
}
