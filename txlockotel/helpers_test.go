package txlockotel_test

import (
	"database/sql"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The helpers shared with the library's tests.
var uniq = locktest.Uniq

func open(t *testing.T, url string) *sql.DB { return locktest.Open(t, url, 20) }

func hold(t *testing.T, db *sql.DB, k txlock.Key) (release func()) {
	return locktest.Hold(t, db, k, false)
}
