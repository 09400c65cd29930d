package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// result is what one run of the command printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

// txlockCmd runs the command line args in-process, with environ as its
// whole environment, and returns what it printed.
func txlockCmd(ctx context.Context, environ map[string]string, args ...string) result {
	var out, errb bytes.Buffer
	code := run(ctx, args, func(k string) string { return environ[k] }, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// cli runs args without environment, and a 2-minute bound.
func cli(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return txlockCmd(ctx, nil, args...)
}

// openPool opens a pool on url, closed when the test ends.
func openPool(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, db.Close()) })
	return db
}

// randomName returns prefix followed by random hex digits: an identifier.
func randomName(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// freshDatabase creates a database of its own for the test on the test
// PostgreSQL, and returns its URL; it is dropped when the test ends.
func freshDatabase(t *testing.T) string {
	t.Helper()
	base := pgtest.Postgres(t)
	admin := openPool(t, base)
	name := randomName("txlock_cmd_")
	_, err := admin.Exec(`CREATE DATABASE ` + name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.Exec(`DROP DATABASE ` + name + ` WITH (FORCE)`)
		assert.NoError(t, err)
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// withParam returns url with the query parameter k=v added.
func withParam(t *testing.T, raw, k, v string) string {
	t.Helper()
	return locktest.WithParam(t, raw, k, v)
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string // a substring of stdout
		stderr string // a substring of stderr
	}{
		{nil, 2, "", "Usage:"},
		{[]string{"--help"}, 0, "Commands:", ""},
		{[]string{"-h"}, 0, "Commands:", ""},
		{[]string{"help", "doctor"}, 0, "Usage: txlock doctor", ""},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"key", "--help"}, 0, "Usage: txlock key", ""},
		{[]string{"key"}, 2, "", "no NAME given"},
		{[]string{"key", "--bogus", "x"}, 2, "", "flag provided but not defined: -bogus"},
		{[]string{"key", "--keyspace", "", "x"}, 2, "", "keyspace name is empty"},
		{[]string{"key", "x", "--keyspace="}, 2, "", "keyspace name is empty"},
		{[]string{"key", "a\xffb"}, 2, "", "not valid UTF-8"},
		{[]string{"locks", "--help"}, 0, "Usage: txlock locks", ""},
		{[]string{"locks"}, 2, "", "no database: give --db URL or set DATABASE_URL"},
		{[]string{"locks", "--db", "postgres://x@127.0.0.1/db", "--interval", "0s"}, 2, "", "--interval must be positive"},
		{[]string{"locks", "--db", "postgres://x@127.0.0.1/db", "--registry", "nodot"}, 2, "", "want SCHEMA.TABLE"},
		{[]string{"locks", "--db", "postgres://x@127.0.0.1/db", "--keyspace", ""}, 2, "", "keyspace name is empty"},
		{[]string{"locks", "--db", "postgres://x@127.0.0.1/db", "extra"}, 2, "", `unexpected argument "extra"`},
		{[]string{"locks", "--db", "::not a url"}, 2, "", "--db:"},
		{[]string{"key", "--slots", "0", "x"}, 2, "", "--slots: a semaphore has 1 to 1000 slots (txlock.MaxKeys), got 0"},
		{[]string{"key", "x", "--slots", "many"}, 2, "", `invalid value "many" for flag -slots`},
		{[]string{"locks", "--db", "postgres://x@127.0.0.1/db", "--semaphore", "orders-export=0"}, 2, "", `invalid value "orders-export=0" for flag -semaphore: a semaphore has 1 to 1000 slots (txlock.MaxKeys), got 0`},
		{[]string{"locks", "--db", "postgres://x@127.0.0.1/db", "--semaphore", "=8"}, 2, "", `--semaphore "=8": txlock: invalid key: key name is empty`},
		{[]string{"doctor", "--help"}, 0, "fence sequence", ""},
		{[]string{"doctor"}, 2, "", "no database: give --db URL or set DATABASE_URL"},
		{[]string{"doctor", "--db", "postgres://x@127.0.0.1/db", "--fence-seq", "nodot"}, 2, "", "want SCHEMA.NAME"},
	} {
		r := cli(t, tc.args...)
		assert.Equal(t, tc.code, r.code, "%q: %+v", tc.args, r)
		assert.Contains(t, r.stdout, tc.stdout, "%q", tc.args)
		assert.Contains(t, r.stderr, tc.stderr, "%q", tc.args)
		if tc.code == 2 {
			assert.Contains(t, r.stderr, "Usage:", "%q: the usage follows a bad command line", tc.args)
		}
	}
}

// TestDatabaseURLDefault: --db defaults to $DATABASE_URL.
func TestDatabaseURLDefault(t *testing.T) {
	url := freshDatabase(t)
	r := txlockCmd(context.Background(), map[string]string{"DATABASE_URL": url}, "locks")
	require.Equal(t, 0, r.code, "%+v", r)
	assert.Contains(t, r.stdout, "no advisory locks in database \"txlock_cmd_")
}

// TestUnreachable: a server that cannot be reached is an error that says
// where, with exit status 1, and never shows the password.
func TestUnreachable(t *testing.T) {
	port, err := pgtest.FreePort()
	require.NoError(t, err)
	url := "postgres://u:secret-pw@127.0.0.1:" + strconv.Itoa(port) + "/db?sslmode=disable&connect_timeout=5"
	r := cli(t, "locks", "--db", url)
	assert.Equal(t, 1, r.code, "%+v", r)
	assert.Contains(t, r.stderr, "127.0.0.1:"+strconv.Itoa(port))
	r2 := cli(t, "doctor", "--db", url)
	assert.Equal(t, 1, r2.code, "%+v", r2)
	assert.Contains(t, r2.stdout, "✗ connect")
	for _, out := range []string{r.stdout, r.stderr, r2.stdout, r2.stderr} {
		assert.NotContains(t, out, "secret-pw")
	}
}

// TestHelpHidesDatabaseURL: --help never shows $DATABASE_URL, which may
// hold a password.
func TestHelpHidesDatabaseURL(t *testing.T) {
	for _, cmd := range []string{"locks", "doctor"} {
		r := txlockCmd(context.Background(), map[string]string{"DATABASE_URL": "postgres://u:secret-pw@db.example/app"}, cmd, "--help")
		assert.Equal(t, 0, r.code)
		assert.Contains(t, r.stdout, "default $DATABASE_URL")
		assert.NotContains(t, r.stdout+r.stderr, "secret-pw")
	}
}
