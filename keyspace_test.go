package txlock_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

// Keys are a compatibility contract: these values must never change. They
// are also checked against the server's own SQL in TestKeysMatchSQL.
func TestStringKeyGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		want int64
	}{
		{"orders:42", -8476019149258318077}, // sha256 starts 8a5f217ddb0c9f03
		{"a", -3848465438864589366},
		{"Grüße, 世界", 5297205355307771638},
		{"inventory", -5685084577523496196},
	} {
		k := txlock.StringKey(tc.name)
		require.NoError(t, k.Err())
		got, ok := k.Int64()
		require.True(t, ok)
		assert.Equal(t, tc.want, got, tc.name)
		_, _, ok = k.Pair()
		assert.False(t, ok)
	}
}

func TestKeyspaceGolden(t *testing.T) {
	ks := txlock.NewKeyspace("inventory")
	require.NoError(t, ks.Err())
	assert.Equal(t, int32(-1323661902), ks.Namespace())
	a, b, ok := ks.Key("orders:42").Pair()
	require.True(t, ok)
	assert.Equal(t, int32(-1323661902), a)
	assert.Equal(t, int32(-1973476995), b)

	a, b, ok = txlock.KeyspaceID(7).ID(-3).Pair()
	require.True(t, ok)
	assert.Equal(t, [2]int32{7, -3}, [2]int32{a, b})
	assert.Equal(t, txlock.PairKey(7, -3), txlock.KeyspaceID(7).ID(-3))
}

func TestKeyString(t *testing.T) {
	assert.Equal(t, `"orders:42" bigint(-8476019149258318077)`, txlock.StringKey("orders:42").String())
	assert.Equal(t, `bigint(42)`, txlock.Int64Key(42).String())
	assert.Equal(t, `pair(1,-2)`, txlock.PairKey(1, -2).String())
	assert.Equal(t, `"inventory/orders:42" pair(-1323661902,-1973476995)`, txlock.NewKeyspace("inventory").Key("orders:42").String())
	assert.Equal(t, `"inventory/#9" pair(-1323661902,9)`, txlock.NewKeyspace("inventory").ID(9).String())
	long := txlock.StringKey(strings.Repeat("é", 100)).String()
	assert.Contains(t, long, "…")
	assert.Less(t, len(long), 120)
	assert.Equal(t, "invalid", txlock.Key{}.String())
}

func TestPgLocksDecodeTable(t *testing.T) {
	// Rows as PostgreSQL 15 shows them in pg_locks.
	for _, tc := range []struct {
		classid, objid uint32
		objsubid       int
		want           txlock.Key
	}{
		{4294967295, 4294967295, 1, txlock.Int64Key(-1)},
		{19088743, 2309737967, 1, txlock.Int64Key(0x0123456789ABCDEF)},
		{4294967294, 4294967293, 2, txlock.PairKey(-2, -3)},
		{0, 0, 1, txlock.Int64Key(0)},
		{2147483648, 0, 1, txlock.Int64Key(math.MinInt64)},
	} {
		got, err := txlock.KeyFromPgLocks(tc.classid, tc.objid, tc.objsubid)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got)
	}
	_, err := txlock.KeyFromPgLocks(1, 2, 3)
	assert.ErrorIs(t, err, txlock.ErrInvalidKey)
	assert.ErrorContains(t, err, "objsubid 3")
}

func TestInvalidKeys(t *testing.T) {
	for _, tc := range []struct {
		key  txlock.Key
		want string
	}{
		{txlock.Key{}, "zero Key"},
		{txlock.StringKey(""), "key name is empty"},
		{txlock.StringKey("bad\xff"), "not valid UTF-8"},
		{txlock.StringKey("nul\x00byte"), "NUL byte"},
		{txlock.NewKeyspace("").Key("x"), "keyspace name is empty"},
		{txlock.NewKeyspace("\xfe").ID(1), "keyspace name"},
		{txlock.NewKeyspace("ok").Key(""), "key name is empty"},
	} {
		err := tc.key.Err()
		require.Error(t, err, tc.want)
		assert.ErrorIs(t, err, txlock.ErrInvalidKey)
		assert.ErrorContains(t, err, tc.want)
	}
	// A 1 MiB name is valid: it is hashed like any other.
	big := strings.Repeat("x", 1<<20)
	k := txlock.StringKey(big)
	require.NoError(t, k.Err())
	assert.Equal(t, big, k.Name())
	assert.Less(t, len(k.String()), 100)
}

func FuzzPgLocksRoundTrip(f *testing.F) {
	f.Add(int64(0), int32(0), int32(0), false)
	f.Add(int64(-1), int32(-2), int32(-3), true)
	f.Add(int64(math.MinInt64), int32(math.MinInt32), int32(math.MaxInt32), false)
	f.Add(int64(0x0123456789ABCDEF), int32(1), int32(-1), true)
	f.Fuzz(func(t *testing.T, n int64, a, b int32, pair bool) {
		k := txlock.Int64Key(n)
		if pair {
			k = txlock.PairKey(a, b)
		}
		classid, objid, objsubid := txlock.PgLocksOf(k)
		got, err := txlock.KeyFromPgLocks(classid, objid, objsubid)
		if err != nil {
			t.Fatal(err)
		}
		if got != k {
			t.Fatalf("decode(encode(%v)) = %v", k, got)
		}
	})
}
