package txlock_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

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

// Keys and identifiers follow one rule for names, each reported naming what
// was wrong: a key's error matches ErrInvalidKey (and, an invalid key being
// an invalid argument, ErrInvalidArgument), an identifier's
// ErrInvalidArgument only.
func TestInvalidNamesOfKeysAndIdentifiers(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"", "is empty"},
		{"bad\xff", "is not valid UTF-8"},
		{"nul\x00byte", "contains a NUL byte"},
	} {
		err := txlock.StringKey(tc.name).Err()
		assert.ErrorIs(t, err, txlock.ErrInvalidKey)
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
		assert.ErrorContains(t, err, "key name")
		assert.ErrorContains(t, err, tc.want)

		_, err = txlock.QuoteIdent("column", tc.name)
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
		assert.NotErrorIs(t, err, txlock.ErrInvalidKey)
		assert.ErrorContains(t, err, "column name")
		assert.ErrorContains(t, err, tc.want)
	}
}

// Long names are cut, in Key.String and in error messages, at a character
// boundary: never inside a character, whatever its width and wherever it
// falls.
func TestStringTruncatesWholeCharacters(t *testing.T) {
	for _, r := range []string{"é", "€", "𝄞"} { // 2, 3 and 4 bytes
		for pad := range 4 {
			name := strings.Repeat("a", pad) + strings.Repeat(r, 40)
			s := txlock.StringKey(name).String()
			requireCut(t, name, quoted(t, s))

			err := txlock.StringKey(name + "\x00").Err()
			require.ErrorContains(t, err, "NUL byte")
			requireCut(t, name, quoted(t, err.Error()))

			_, err = txlock.QuoteIdent("column", name)
			require.ErrorContains(t, err, "63 bytes")
			requireCut(t, name, quoted(t, err.Error()))
		}
	}
	// Bytes that are not UTF-8 are kept as they are: the cut backs up no
	// further than a character could reach.
	junk := strings.Repeat("\x80", 100)
	err := txlock.StringKey(junk).Err()
	require.ErrorContains(t, err, "not valid UTF-8")
	assert.Equal(t, junk[:64]+"…", quoted(t, err.Error()))
}

// quoted returns the first Go-quoted string in s, unquoted.
func quoted(t *testing.T, s string) string {
	t.Helper()
	i := strings.IndexByte(s, '"')
	require.GreaterOrEqual(t, i, 0, "no quoted name in %s", s)
	q, err := strconv.QuotedPrefix(s[i:])
	require.NoError(t, err, s)
	u, err := strconv.Unquote(q)
	require.NoError(t, err)
	return u
}

// requireCut checks that shown is name cut to at most 64 bytes, at the last
// character boundary, followed by "…".
func requireCut(t *testing.T, name, shown string) {
	t.Helper()
	cut, ok := strings.CutSuffix(shown, "…")
	require.True(t, ok, "%q does not end in …", shown)
	require.True(t, utf8.ValidString(cut), "%q splits a character", cut)
	require.True(t, strings.HasPrefix(name, cut), "%q is not a prefix of the name", cut)
	require.LessOrEqual(t, len(cut), 64)
	_, size := utf8.DecodeRuneInString(name[len(cut):])
	require.Greater(t, len(cut)+size, 64, "%q is cut a character too early", cut)
}

// FuzzKeyStringTruncation: whatever the name, Key.String shows it whole, or
// cut at a character boundary.
func FuzzKeyStringTruncation(f *testing.F) {
	for _, s := range []string{"a", strings.Repeat("é", 40), "a" + strings.Repeat("𝄞", 20), strings.Repeat("x", 64), strings.Repeat("x", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k := txlock.StringKey(name)
		if k.Err() != nil {
			return
		}
		shown := quoted(t, k.String())
		if len(name) <= 64 {
			require.Equal(t, name, shown)
			return
		}
		requireCut(t, name, shown)
	})
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

func TestKeyKeyspace(t *testing.T) {
	billing := txlock.NewKeyspace("billing")
	assert.Equal(t, "billing", billing.Key("inv-7").Keyspace())
	assert.Equal(t, "billing", billing.ID(7).Keyspace())
	assert.Empty(t, txlock.KeyspaceID(7).ID(1).Keyspace(), "a keyspace without a name")
	assert.Empty(t, txlock.StringKey("orders:42").Keyspace())
	assert.Empty(t, txlock.PairKey(1, 2).Keyspace())
}

// An invalid key is an invalid argument: its error matches both sentinels,
// and ErrInvalidArgument alone does not match ErrInvalidKey.
func TestInvalidKeyIsInvalidArgument(t *testing.T) {
	for _, k := range []txlock.Key{{}, txlock.StringKey(""), txlock.StringKey("a\x00"), txlock.NewKeyspace("").Key("a")} {
		err := k.Err()
		assert.ErrorIs(t, err, txlock.ErrInvalidKey)
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	}
	assert.NotErrorIs(t, txlock.ErrInvalidArgument, txlock.ErrInvalidKey)
}
