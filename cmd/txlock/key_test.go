package main

import (
	"context"
	"flag"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/ from the command's output")

// keyCases are the command lines of the golden file, each with the key the
// library gives for it.
var keyCases = []struct {
	args []string
	want []txlock.Key
}{
	{[]string{"orders:42"}, []txlock.Key{txlock.StringKey("orders:42")}},
	{[]string{"--keyspace", "billing", "inv-7"}, []txlock.Key{txlock.NewKeyspace("billing").Key("inv-7")}},
	{[]string{"inv-7", "inv-8", "--keyspace=billing"}, []txlock.Key{txlock.NewKeyspace("billing").Key("inv-7"), txlock.NewKeyspace("billing").Key("inv-8")}},
	{[]string{"it's a \\ name"}, []txlock.Key{txlock.StringKey(`it's a \ name`)}},
	{[]string{"--keyspace", "émission", "ünïcode"}, []txlock.Key{txlock.NewKeyspace("émission").Key("ünïcode")}},
	{[]string{"--", "--not-a-flag"}, []txlock.Key{txlock.StringKey("--not-a-flag")}},
	{[]string{"--slots", "3", "orders-export"}, slotKeys(txlock.StringKey("orders-export"), 3)},
	{[]string{"--keyspace", "billing", "inv-7", "--slots=2"}, slotKeys(txlock.NewKeyspace("billing").Key("inv-7"), 2)},
}

// slotKeys returns the keys of the n slots of the semaphore of k.
func slotKeys(k txlock.Key, n int) []txlock.Key {
	keys := make([]txlock.Key, n)
	for i := range keys {
		keys[i] = txlock.SlotKey(k, i)
	}
	return keys
}

// keyOutput runs every case and returns the golden text: each command line,
// then what it printed.
func keyOutput(t *testing.T) (string, [][]block) {
	var sb strings.Builder
	var blocks [][]block
	for i, tc := range keyCases {
		r := cli(t, append([]string{"key"}, tc.args...)...)
		require.Equal(t, 0, r.code, "%q: %+v", tc.args, r)
		require.Empty(t, r.stderr)
		if i > 0 {
			sb.WriteString("\n")
		}
		sb.WriteString("$ txlock key " + strings.Join(quoteArgs(tc.args), " ") + "\n" + r.stdout)
		blocks = append(blocks, parseKeyOutput(t, r.stdout))
	}
	return sb.String(), blocks
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if strings.ContainsAny(a, ` '\`) {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return out
}

// block is one key as key printed it.
type block struct {
	classid, objid uint32
	objsubid       int
	sql, fromName  string
	key, name      string // key's line, and name's (for a slot of --slots)
	slot           string
}

var pgLocksLine = regexp.MustCompile(`^classid=(\d+) objid=(\d+) objsubid=(\d+)$`)

func parseKeyOutput(t *testing.T, out string) []block {
	t.Helper()
	var bs []block
	for _, chunk := range strings.Split(strings.TrimSpace(out), "\n\n") {
		var b block
		for _, line := range strings.Split(chunk, "\n") {
			label, value, ok := strings.Cut(line, ":")
			require.True(t, ok, "line %q", line)
			value = strings.TrimSpace(value)
			switch label {
			case "pg_locks":
				m := pgLocksLine.FindStringSubmatch(value)
				require.NotNil(t, m, "pg_locks line %q", value)
				c, _ := strconv.ParseUint(m[1], 10, 32)
				o, _ := strconv.ParseUint(m[2], 10, 32)
				b.classid, b.objid = uint32(c), uint32(o)
				b.objsubid, _ = strconv.Atoi(m[3])
			case "sql":
				b.sql = value
			case "key":
				b.key = value
			case "name":
				b.name = value
			case "slot":
				b.slot = value
			case "from name":
				b.fromName = value
			}
		}
		bs = append(bs, b)
	}
	return bs
}

// TestKeyGolden pins key's output (go test -run TestKeyGolden -update
// rewrites it), and checks that every pg_locks triple it prints decodes,
// with txlock.KeyFromPgLocks, to the library's key.
func TestKeyGolden(t *testing.T) {
	got, blocks := keyOutput(t)
	path := filepath.Join("testdata", "key.golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, string(want), got, "key's output differs from %s (rewrite it with -update if the change is meant)", path)

	for i, tc := range keyCases {
		require.Len(t, blocks[i], len(tc.want), "%q", tc.args)
		for j, b := range blocks[i] {
			k, err := txlock.KeyFromPgLocks(b.classid, b.objid, b.objsubid)
			require.NoError(t, err)
			w := tc.want[j]
			if n, ok := w.Int64(); ok {
				v, ok := k.Int64()
				assert.True(t, ok && v == n, "%q: pg_locks gives %v, the library %v", tc.args, k, w)
			} else {
				wa, wb, _ := w.Pair()
				a, b, ok := k.Pair()
				assert.True(t, ok && a == wa && b == wb, "%q: pg_locks gives %v, the library %v", tc.args, k, w)
			}
		}
	}
}

// TestKeySQLOnServer: both SQL forms key prints take, on the server, the
// lock pg_locks shows under the triple key prints.
func TestKeySQLOnServer(t *testing.T) {
	db := openPool(t, pgtest.Postgres(t))
	_, blocks := keyOutput(t)
	ctx := context.Background()
	for i, bs := range blocks {
		for _, b := range bs {
			for _, expr := range []string{b.sql, b.fromName} {
				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				_, err = tx.Exec("SELECT " + expr)
				require.NoError(t, err, "%q: %s", keyCases[i].args, expr)
				var classid, objid int64
				var objsubid int
				err = tx.QueryRow(`SELECT classid::int8, objid::int8, objsubid FROM pg_locks
					WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&classid, &objid, &objsubid)
				require.NoError(t, err, "%s", expr)
				assert.Equal(t, []int64{int64(b.classid), int64(b.objid), int64(b.objsubid)}, []int64{classid, objid, int64(objsubid)},
					"%q: %s", keyCases[i].args, expr)
				require.NoError(t, tx.Rollback())
			}
		}
	}

	// The extremes, which no name in the cases gives, as numbers renders
	// them: plain decimals, which the server reads as a bigint and an
	// integer (as a numeric or a bigint, no advisory lock function would
	// take them).
	assert.Equal(t, "-9223372036854775808", numbers(txlock.Int64Key(math.MinInt64)))
	assert.Equal(t, "-2147483648, 2147483647", numbers(txlock.PairKey(math.MinInt32, math.MaxInt32)))
	var bigintType, intType string
	require.NoError(t, db.QueryRow(`SELECT pg_typeof(-9223372036854775808)::text, pg_typeof(-2147483648)::text`).Scan(&bigintType, &intType))
	assert.Equal(t, []string{"bigint", "integer"}, []string{bigintType, intType})
	for _, k := range []txlock.Key{txlock.Int64Key(math.MinInt64), txlock.Int64Key(math.MaxInt64), txlock.PairKey(math.MinInt32, math.MaxInt32), txlock.PairKey(-1, math.MinInt32)} {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.Exec("SELECT pg_advisory_xact_lock(" + numbers(k) + ")")
		require.NoError(t, err, "%v: %s", k, numbers(k))
		var classid, objid int64
		var objsubid int
		require.NoError(t, tx.QueryRow(`SELECT classid::int8, objid::int8, objsubid FROM pg_locks
			WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&classid, &objid, &objsubid))
		c, o, sub := pgLocks(k)
		assert.Equal(t, []int64{int64(c), int64(o), int64(sub)}, []int64{classid, objid, int64(objsubid)}, "%v", k)
		require.NoError(t, tx.Rollback())
	}
}

// TestKeySlots: key --slots 8 prints the 8 slots of the semaphore, in
// order, each with its index, the description locks gives it, and the
// numbers of txlock.SlotKey; --slots names the semaphore in a keyspace
// too, and a number of slots out of 1 to MaxKeys is a usage error.
func TestKeySlots(t *testing.T) {
	r := cli(t, "key", "--slots", "8", "orders-export")
	require.Equal(t, 0, r.code, "%+v", r)
	require.Empty(t, r.stderr)
	t.Log("\n" + r.stdout)
	blocks := parseKeyOutput(t, r.stdout)
	require.Len(t, blocks, 8)
	for i, b := range blocks {
		sk := txlock.SlotKey(txlock.StringKey("orders-export"), i)
		v, ok := sk.Int64()
		require.True(t, ok)
		n := strconv.FormatInt(v, 10)
		assert.Equal(t, strconv.Itoa(i), b.slot)
		assert.Equal(t, "semaphore orders-export, slot "+strconv.Itoa(i)+" of 8", b.name)
		assert.Equal(t, "bigint("+n+")", b.key)
		assert.Equal(t, "pg_advisory_xact_lock("+n+")", b.sql)
		c, o, sub := pgLocks(sk)
		assert.Equal(t, []int64{int64(c), int64(o), int64(sub)}, []int64{int64(b.classid), int64(b.objid), int64(b.objsubid)})
		assert.Contains(t, b.fromName, "int4send("+strconv.Itoa(i)+")")
	}

	ks := txlock.NewKeyspace("billing")
	r = cli(t, "key", "--keyspace", "billing", "--slots", "2", "a", "b")
	require.Equal(t, 0, r.code, "%+v", r)
	blocks = parseKeyOutput(t, r.stdout)
	require.Len(t, blocks, 4, "two slots of each NAME")
	for j, b := range blocks {
		name, i := []string{"a", "b"}[j/2], j%2
		v, _ := txlock.SlotKey(ks.Key(name), i).Int64()
		assert.Equal(t, "semaphore billing/"+name+", slot "+strconv.Itoa(i)+" of 2", b.name)
		assert.Equal(t, "pg_advisory_xact_lock("+strconv.FormatInt(v, 10)+")", b.sql)
	}

	for _, n := range []string{"0", "-1", "1001"} {
		r := cli(t, "key", "--slots", n, "orders-export")
		assert.Equal(t, 2, r.code, "--slots %s: %+v", n, r)
		assert.Empty(t, r.stdout)
		assert.True(t, strings.HasPrefix(r.stderr, "txlock key: --slots: a semaphore has 1 to 1000 slots (txlock.MaxKeys), got "+n+"\n"), "--slots %s: %q", n, r.stderr)
		assert.Contains(t, r.stderr, "Usage: txlock key")
	}
	r = cli(t, "key", "--slots", strconv.Itoa(txlock.MaxKeys), "x")
	require.Equal(t, 0, r.code, "--slots MaxKeys is allowed: %+v", r.stderr)
	blocks = parseKeyOutput(t, r.stdout)
	require.Len(t, blocks, txlock.MaxKeys)
	assert.Equal(t, "semaphore x, slot 999 of 1000", blocks[len(blocks)-1].name)
}
