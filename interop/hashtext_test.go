package interop_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/interop"
)

// hashtextInputs are the strings Hashtext is compared on with the server:
// every length from 0 to 40 bytes (across three of hash_bytes' 12-byte
// blocks and every tail length), multi-byte UTF-8 whose characters straddle
// the block boundaries, bytes of 0x80 and above in every tail position,
// long strings, and random UTF-8.
func hashtextInputs() []string {
	var in []string
	const ascii = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	for n := 0; n <= 40; n++ {
		in = append(in, ascii[:n])
	}
	for _, s := range []string{"ü", "✓", "😀", "ÿ"} {
		for n := 1; n <= 13; n++ {
			in = append(in, strings.Repeat(s, n), "ab"+strings.Repeat(s, n), strings.Repeat(s, n)+"x")
		}
	}
	in = append(in, "orders:42", "nightly-report-job", "ünïcødé ✓", "😀 lock", " ", "'", `"`, `\`,
		strings.Repeat("x", 1000), strings.Repeat("ünï", 3333), strings.Repeat("0123456789ab", 100))
	r := rand.New(rand.NewPCG(12, 2026))
	for range 200 {
		var sb strings.Builder
		for n := r.IntN(50); n > 0; n-- {
			c := rune(r.IntN(0x10FFFF) + 1)
			if r.IntN(3) > 0 {
				c = rune(r.IntN(0x7F) + 1)
			}
			if utf8.ValidRune(c) {
				sb.WriteRune(c)
			}
		}
		in = append(in, sb.String())
	}
	return in
}

// TestHashtextMatchesServer compares Hashtext with the server's own
// hashtext() on every input, on whatever version the harness runs (the
// Makefile's matrix runs it on every supported major version).
func TestHashtextMatchesServer(t *testing.T) {
	db := locktest.Open(t, pgtest.Postgres(t), 2)
	ctx := context.Background()
	var enc string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('server_encoding')`).Scan(&enc))
	if enc != "UTF8" {
		pgtest.Unavailable(t, "the server's encoding is %s: Hashtext reproduces hashtext() of UTF8 databases only", enc)
	}
	var version string
	var num int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_catalog.version(), pg_catalog.current_setting('server_version_num')::int`).Scan(&version, &num))
	t.Logf("server: %s", version)
	if want := os.Getenv("TXLOCK_TEST_PG_MAJOR"); want != "" {
		require.Equal(t, want, strconv.Itoa(num/10000), "the server is not the PostgreSQL major version TXLOCK_TEST_PG_MAJOR names")
	}
	in := hashtextInputs()
	rows, err := db.QueryContext(ctx,
		`SELECT u.s, pg_catalog.hashtext(u.s) FROM pg_catalog.unnest($1::pg_catalog.text[]) WITH ORDINALITY AS u(s, i) ORDER BY u.i`, in)
	require.NoError(t, err)
	defer rows.Close()
	n := 0
	for rows.Next() {
		var s string
		var want int32
		require.NoError(t, rows.Scan(&s, &want))
		require.Equal(t, in[n], s, "the server returned another string than sent")
		if got := interop.Hashtext(s); got != want {
			t.Errorf("Hashtext(%q) (%d bytes) = %d, server's hashtext = %d", s, len(s), got, want)
		}
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(in), n)
}
