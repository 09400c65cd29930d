package txlock_test

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

const (
	sqlStringKey = `('x' || left(encode(sha256(convert_to($1::text, 'UTF8')), 'hex'), 16))::bit(64)::bigint`
	sqlHash32    = `('x' || left(encode(sha256(convert_to($1::text, 'UTF8')), 'hex'), 8))::bit(32)::int4`
)

// randomName returns a random valid key name: ASCII, Latin, CJK, emoji and
// combining marks, 1 to 40 runes.
func randomName(r *rand.Rand) string {
	ranges := [][2]rune{{0x20, 0x7e}, {0xa0, 0x24f}, {0x4e00, 0x9fff}, {0x1f300, 0x1f6ff}, {0x300, 0x36f}, {0x1, 0x1f}}
	var sb strings.Builder
	for range 1 + r.IntN(40) {
		rg := ranges[r.IntN(len(ranges))]
		sb.WriteRune(rg[0] + rune(r.IntN(int(rg[1]-rg[0]+1))))
	}
	return sb.String()
}

// The documented SQL reproduces every key the package derives.
func TestKeysMatchSQL(t *testing.T) {
	db := direct(t)
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"orders:42", "a", "Grüße, 世界", "inventory", strings.Repeat("long", 10000)}
	for range 300 {
		names = append(names, randomName(r))
	}
	ks := txlock.NewKeyspace("billing")
	for _, name := range names {
		require.True(t, utf8.ValidString(name))
		var big int64
		var h32, ns int32
		require.NoError(t, db.QueryRow(`SELECT `+sqlStringKey+`, `+sqlHash32+`, `+strings.ReplaceAll(sqlHash32, "$1", "$2"),
			name, "billing").Scan(&big, &h32, &ns))
		got, _ := txlock.StringKey(name).Int64()
		assert.Equal(t, big, got, "StringKey(%q)", name)
		a, b, _ := ks.Key(name).Pair()
		assert.Equal(t, ns, a, "namespace")
		assert.Equal(t, h32, b, "ks.Key(%q)", name)
		assert.Equal(t, h32, txlock.NewKeyspace(name).Namespace(), "NewKeyspace(%q)", name)
	}
}

// The key the package locks is the key pg_locks shows, and decodes back.
func TestPgLocksRoundTripOnServer(t *testing.T) {
	db := direct(t)
	keys := []txlock.Key{
		txlock.StringKey(uniq(t)), txlock.Int64Key(-1), txlock.Int64Key(0x0123456789ABCDEF),
		txlock.PairKey(-2, -3), txlock.NewKeyspace(uniq(t)).Key("x"), txlock.Int64Key(-9223372036854775808),
	}
	err := txlock.WithLocks(context.Background(), db, keys, func(ctx context.Context, tx *sql.Tx) error {
		var pid int
		if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		rows, err := db.QueryContext(ctx, `SELECT classid, objid, objsubid FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND pid = $1`, pid)
		if err != nil {
			return err
		}
		defer rows.Close()
		var got []txlock.Key
		for rows.Next() {
			var classid, objid int64
			var objsubid int
			require.NoError(t, rows.Scan(&classid, &objid, &objsubid))
			k, err := txlock.KeyFromPgLocks(uint32(classid), uint32(objid), objsubid)
			require.NoError(t, err)
			got = append(got, k)
		}
		require.NoError(t, rows.Err())
		var want []txlock.Key
		for _, k := range keys {
			n, isInt := k.Int64()
			a, b, _ := k.Pair()
			if isInt {
				want = append(want, txlock.Int64Key(n))
			} else {
				want = append(want, txlock.PairKey(a, b))
			}
		}
		assert.ElementsMatch(t, want, got)
		return nil
	})
	require.NoError(t, err)
}

// The same name in two keyspaces, and the bigint and pair spaces, never
// conflict.
func TestKeySeparation(t *testing.T) {
	db := direct(t)
	name := uniq(t)
	nop := func(context.Context, *sql.Tx) error { return nil }
	try := func(k txlock.Key) bool {
		ok, err := txlock.TryWithLock(context.Background(), db, k, nop)
		require.NoError(t, err)
		return ok
	}

	a, b := txlock.NewKeyspace("service-a"), txlock.NewKeyspace("service-b")
	hold(t, db, a.Key(name), false)
	assert.False(t, try(a.Key(name)), "same keyspace, same name: conflict")
	assert.True(t, try(b.Key(name)), "other keyspace: no conflict")
	assert.True(t, try(txlock.StringKey(name)), "bigint space: no conflict")

	// A bigint and a pair with the very same bits are different locks.
	n := int64(0x11223344_55667788)
	hold(t, db, txlock.Int64Key(n), false)
	assert.True(t, try(txlock.PairKey(0x11223344, 0x55667788)))
	assert.False(t, try(txlock.Int64Key(n)))
}

// FuzzStringKeySQL checks Go against the server's SQL for arbitrary valid
// names. The seed corpus runs with every go test; go test -fuzz explores.
func FuzzStringKeySQL(f *testing.F) {
	for _, s := range []string{"orders:42", "a", "Grüße, 世界", "🔒", "\u0301", " ", "x'||'y", `"quoted"`} {
		f.Add(s)
	}
	db := direct(f)
	stmt, err := db.Prepare(`SELECT ` + sqlStringKey + `, ` + sqlHash32)
	require.NoError(f, err)
	f.Cleanup(func() { stmt.Close() })
	f.Fuzz(func(t *testing.T, name string) {
		k := txlock.StringKey(name)
		if !utf8.ValidString(name) || name == "" || strings.IndexByte(name, 0) >= 0 {
			require.ErrorIs(t, k.Err(), txlock.ErrInvalidKey)
			return
		}
		var big int64
		var h32 int32
		require.NoError(t, stmt.QueryRow(name).Scan(&big, &h32))
		got, _ := k.Int64()
		if got != big {
			t.Fatalf("StringKey(%q) = %d, SQL says %d", name, got, big)
		}
		if _, b, _ := txlock.KeyspaceID(0).Key(name).Pair(); b != h32 {
			t.Fatalf("Keyspace.Key(%q) = %d, SQL says %d", name, b, h32)
		}
	})
}
