package txlockotel_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open returns a pool on url, checking when the test ends that no
// connection is left in use.
func open(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	db.SetMaxOpenConns(20)
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return db.Stats().InUse == 0 }, 5*time.Second, 10*time.Millisecond,
			"connections still in use: %+v", db.Stats())
		require.NoError(t, db.Close())
	})
	return db
}

// uniq returns a string unique to this test run.
func uniq(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "/" + hex.EncodeToString(b[:])
}

// hold takes k on a connection of db of its own, with the blocking
// pg_advisory_xact_lock, and returns the function that releases it.
func hold(t *testing.T, db *sql.DB, k txlock.Key) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	args := ""
	if n, ok := k.Int64(); ok {
		args = fmt.Sprintf("'%d'::int8", n)
	} else {
		a, b, _ := k.Pair()
		args = fmt.Sprintf("'%d'::int4, '%d'::int4", a, b)
	}
	_, err = tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock("+args+")")
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { assert.NoError(t, tx.Rollback()) }) }
	t.Cleanup(release)
	return release
}
