package interop_test

import (
	"errors"
	"hash/fnv"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/interop"
)

func int64Of(t *testing.T, k txlock.Key) int64 {
	t.Helper()
	require.NoError(t, k.Err())
	n, ok := k.Int64()
	require.True(t, ok, "%v is not a bigint key", k)
	return n
}

func pairOf(t *testing.T, k txlock.Key) [2]int32 {
	t.Helper()
	require.NoError(t, k.Err())
	a, b, ok := k.Pair()
	require.True(t, ok, "%v is not a pair key", k)
	return [2]int32{a, b}
}

// The golden values of Hashtext are the server's: SELECT hashtext($1) on
// PostgreSQL 15.18 (x86-64), the test cluster's.
func TestHashtextGolden(t *testing.T) {
	for s, want := range map[string]int32{
		"":                   -1477818771,
		"a":                  1075015857,
		"orders:42":          -1852455970,
		"abcdefghijkl":       -1586087212,
		"abcdefghijklm":      405849808,
		"ünïcødé ✓":          -1563823149,
		"😀 lock":             -668222629,
		"nightly-report-job": -1906875880,
	} {
		assert.Equal(t, want, interop.Hashtext(s), "Hashtext(%q)", s)
		assert.Equal(t, int64(want), int64Of(t, interop.HashtextKey(s)), "HashtextKey(%q)", s)
	}
}

// The golden values of FNV1a64 are the formula's, computed by
//
//	python3 -c 'import functools,sys;h=functools.reduce(lambda h,b:((h^b)*0x100000001b3)%2**64,sys.argv[1].encode(),0xcbf29ce484222325);print(h-2**64 if h>=2**63 else h)' NAME
//
// among them the published FNV-1a test vectors of "" (0xcbf29ce484222325),
// "a" (0xaf63dc4c8601ec8c) and "foobar" (0x85944171f73967e8). Every value,
// and the inputs of the Hashtext comparison, are also checked against Go's
// hash/fnv, which implements the published FNV-1a.
func TestFNV1a64Golden(t *testing.T) {
	golden := map[string]int64{
		"orders:42":          5475843843707809360,
		"":                   -3750763034362895579,
		"a":                  -5808556873153909620,
		"foobar":             -8821353812377114648,
		"x":                  -5808529385363204345,
		"ünïcødé ✓":          3385065596025144359,
		"😀 lock":             -7047429182888234353,
		"nightly-report-job": 1722970673108097797,
	}
	fnv64a := func(s string) int64 {
		h := fnv.New64a()
		h.Write([]byte(s))
		return int64(h.Sum64())
	}
	for s, want := range golden {
		assert.Equal(t, want, int64Of(t, interop.FNV1a64(s)), "FNV1a64(%q)", s)
		assert.Equal(t, want, fnv64a(s), "hash/fnv of %q", s)
	}
	for _, s := range hashtextInputs() {
		assert.Equal(t, fnv64a(s), int64Of(t, interop.FNV1a64(s)), "FNV1a64(%q)", s)
	}
}

// The golden values of DjangoPglock are django-pglock's _cast_lock_id,
// computed by
//
//	python3 -c 'import hashlib,sys;print(int.from_bytes(hashlib.sha256(sys.argv[1].encode("utf-8")).digest()[:8],"little",signed=True))' NAME
func TestDjangoPglockGolden(t *testing.T) {
	for s, want := range map[string]int64{
		"orders:42":          260941440247488394,
		"x":                  4949498559009812781,
		"ünïcødé ✓":          -823873513912961882,
		"😀 lock":             -6528915042149011897,
		"nightly-report-job": 1616830827871035417,
	} {
		assert.Equal(t, want, int64Of(t, interop.DjangoPglock(s)), "DjangoPglock(%q)", s)
	}
}

// The first halves of WithAdvisoryLock are Zlib.crc32(name) & 0x7fffffff;
// Ruby's Zlib.crc32 and Python's zlib.crc32 are both zlib's crc32:
//
//	python3 -c 'import sys,zlib;print(zlib.crc32(sys.argv[1].encode())&0x7fffffff)' NAME
func TestWithAdvisoryLockGolden(t *testing.T) {
	for s, want := range map[string]int32{
		"orders:42":          218055877,
		"":                   0,
		"x":                  215750275,
		"ünïcødé ✓":          1689604700,
		"😀 lock":             599930620,
		"nightly-report-job": 2019525761,
	} {
		assert.Equal(t, [2]int32{want, 0}, pairOf(t, interop.WithAdvisoryLock(s, 0)), "WithAdvisoryLock(%q, 0)", s)
	}
	// The prefix is masked as the gem masks it: ENV value .to_i & 0x7fffffff.
	assert.Equal(t, [2]int32{218055877, 42}, pairOf(t, interop.WithAdvisoryLock("orders:42", 42)))
	assert.Equal(t, [2]int32{218055877, 0x7fffffff}, pairOf(t, interop.WithAdvisoryLock("orders:42", -1)))
	assert.Equal(t, [2]int32{218055877, 1}, pairOf(t, interop.WithAdvisoryLock("orders:42", 1<<40+1)))
}

// The golden values of DistributedLock are the formulas of
// PostgresAdvisoryLockKey.cs (.NET cannot run here). ASCII names, packed
// 7 bits a character, a 0 bit, then 1 bits:
//
//	python3 -c 'import functools,sys;n=sys.argv[1];v=functools.reduce(lambda v,c:(v<<7)|ord(c),n,0)<<1
//	for i in range(len(n),9): v=(v<<7)|127
//	s=lambda x:x-2**32 if x>=2**31 else x;print(s(v>>32),s(v&0xffffffff))' NAME
//
// and hashed names, the first 8 bytes of SHA-1, little-endian:
//
//	python3 -c 'import hashlib,sys;print(int.from_bytes(hashlib.sha1(sys.argv[1].encode()).digest()[:8],"little",signed=True))' NAME
func TestDistributedLockGolden(t *testing.T) {
	for s, want := range map[string][2]int32{
		"":          {2147483647, -1},
		"a":         {-1023410177, -1},
		"x":         {-251658241, -1},
		"orders:42": {-540334498, 1558000740},
	} {
		assert.Equal(t, want, pairOf(t, interop.DistributedLock(s, false)), "DistributedLock(%q, false)", s)
	}
	for s, want := range map[string]int64{
		"nightly-report-job": -8279099796375110145,
		"ünïcødé ✓":          265627734578422724,
		"0123456789":         2363718883634621575, // 10 ASCII characters: one too many for the ASCII form
	} {
		err := interop.DistributedLock(s, false).Err()
		require.ErrorIs(t, err, txlock.ErrInvalidKey, "DistributedLock(%q, false)", s)
		require.ErrorContains(t, err, "DistributedLock name "+strconv.Quote(s))
		require.ErrorContains(t, err, "allowHashing is false")
		assert.Equal(t, want, int64Of(t, interop.DistributedLock(s, true)), "DistributedLock(%q, true)", s)
	}
	// The hex forms, which ToString produces and the constructor parses
	// back, with or without hashing.
	for _, allow := range []bool{false, true} {
		assert.Equal(t, int64(0x7fffffffffffffff), int64Of(t, interop.DistributedLock("7fffffffffffffff", allow)))
		assert.Equal(t, int64(-2), int64Of(t, interop.DistributedLock("FFFFFFFFFFFFFFFE", allow)))
		assert.Equal(t, [2]int32{-1, 42}, pairOf(t, interop.DistributedLock("ffffffff,0000002a", allow)))
	}
	// Not hex: hashed, or refused.
	int64Of(t, interop.DistributedLock("ffffffff,0000002g", true))
	require.ErrorIs(t, interop.DistributedLock("+fffffffffffffff", false).Err(), txlock.ErrInvalidKey)
}

// The golden values of GolangMigrate are golang-migrate v4.20.1's own
// database.GenerateAdvisoryLockId, which internal/interopcheck calls.
func TestGolangMigrateGolden(t *testing.T) {
	for _, c := range []struct {
		database, schema, table string
		want                    int64
	}{
		{"app", "public", "schema_migrations", 1787120056},
		{"app", "", "", 1787120056}, // the defaults
		{"postgres", "public", "schema_migrations", 143310882},
		{"txlock_test", "public", "schema_migrations", 1790255509},
		{"app", "migrate", "schema_migrations", 3825207687},
		{"app", "public", "versions", 1027539163},
		{"ünïcødé", "schéma", "tàble ✓", 538436801},
	} {
		assert.Equal(t, c.want, int64Of(t, interop.GolangMigrate(c.database, c.schema, c.table)), "GolangMigrate(%q, %q, %q)", c.database, c.schema, c.table)
	}
}

// The golden values of RailsMigrations are MIGRATOR_SALT * Zlib.crc32(db):
//
//	python3 -c 'import sys,zlib;print(2053462845*zlib.crc32(sys.argv[1].encode()))' DATABASE
func TestRailsMigrationsGolden(t *testing.T) {
	for s, want := range map[string]int64{
		"app":         6939591962871035475,
		"postgres":    737815420147457505,
		"txlock_test": 8007225962691906825,
		"ünïcødé":     8216301588294356760,
	} {
		assert.Equal(t, want, int64Of(t, interop.RailsMigrations(s)), "RailsMigrations(%q)", s)
	}
}

func TestPrismaMigrateGolden(t *testing.T) {
	assert.Equal(t, int64(72707369), int64Of(t, interop.PrismaMigrate()))
}

// The golden values of Flyway are 0x466C79776179 ("Flyway") plus Java's
// String.hashCode of the quoted, qualified table name over its UTF-16 code
// units (Java cannot run here):
//
//	python3 -c 'import sys;u=sys.argv[1].encode("utf-16-be");h=0
//	for i in range(0,len(u),2): h=(31*h+int.from_bytes(u[i:i+2],"big"))&0xffffffff
//	print(0x466C79776179+(h-2**32 if h>=2**31 else h))' '"public"."flyway_schema_history"'
func TestFlywayGolden(t *testing.T) {
	for _, c := range []struct {
		schema, table string
		want          int64
	}{
		{"public", "flyway_schema_history", 77433833903597}, // hashCode 2125624436
		{"", "", 77433833903597},                            // the defaults
		{"app", "flyway_schema_history", 77431436970681},    // hashCode -271308480
		{"public", `my"table`, 77433290367012},              // "public"."my""table": hashCode 1582087851
		{"😀", "history", 77433804909752},                    // a surrogate pair: hashCode 2096630591
	} {
		assert.Equal(t, c.want, int64Of(t, interop.Flyway(c.schema, c.table)), "Flyway(%q, %q)", c.schema, c.table)
	}
}

// TestBadInput checks that input a tool cannot have gives a Key that carries
// an error matching txlock.ErrInvalidKey, and that no constructor panics.
func TestBadInput(t *testing.T) {
	const notUTF8, withNUL = "a\xffb", "a\x00b"
	for name, k := range map[string]txlock.Key{
		"HashtextKey(not UTF-8)":          interop.HashtextKey(notUTF8),
		"HashtextKey(NUL)":                interop.HashtextKey(withNUL),
		"DistributedLock(not UTF-8)":      interop.DistributedLock(notUTF8, true),
		"DistributedLock(to hash)":        interop.DistributedLock("nightly-report-job", false),
		"FNV1a64(not UTF-8)":              interop.FNV1a64(notUTF8),
		"DjangoPglock(empty)":             interop.DjangoPglock(""),
		"DjangoPglock(not UTF-8)":         interop.DjangoPglock(notUTF8),
		"WithAdvisoryLock(not UTF-8)":     interop.WithAdvisoryLock(notUTF8, 0),
		"GolangMigrate(empty database)":   interop.GolangMigrate("", "public", "schema_migrations"),
		"GolangMigrate(NUL in table)":     interop.GolangMigrate("app", "public", withNUL),
		"GolangMigrate(not UTF-8 schema)": interop.GolangMigrate("app", notUTF8, ""),
		"RailsMigrations(empty)":          interop.RailsMigrations(""),
		"RailsMigrations(NUL)":            interop.RailsMigrations(withNUL),
		"Flyway(not UTF-8 table)":         interop.Flyway("public", notUTF8),
		"Flyway(NUL in schema)":           interop.Flyway(withNUL, ""),
	} {
		err := k.Err()
		require.ErrorIs(t, err, txlock.ErrInvalidKey, name)
		// The message names the argument: the function and which of its
		// names, as the case's name does before its parenthesis.
		fn, arg, _ := strings.Cut(strings.TrimSuffix(name, ")"), "(")
		assert.Contains(t, err.Error(), fn, name)
		for _, w := range []string{"database", "schema", "table"} {
			if strings.Contains(arg, w) || fn == "RailsMigrations" && w == "database" {
				assert.Contains(t, err.Error(), w+" name", name)
			}
		}
		t.Logf("%s: %v", name, err)
	}
	assert.ErrorContains(t, interop.DistributedLock(notUTF8, true).Err(), "UTF-8")
	// Valid input that the tools accept is no error.
	for name, k := range map[string]txlock.Key{
		"HashtextKey(empty)":      interop.HashtextKey(""),
		"FNV1a64(NUL)":            interop.FNV1a64(withNUL),
		"WithAdvisoryLock(empty)": interop.WithAdvisoryLock("", 0),
	} {
		require.NoError(t, k.Err(), name)
	}
	require.False(t, errors.Is(interop.PrismaMigrate().Err(), txlock.ErrInvalidKey))
}
