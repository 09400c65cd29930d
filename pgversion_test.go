package txlock_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envPGMajor names the PostgreSQL major version a test run is meant to be
// on. `make test` sets it for every run, with TXLOCK_TEST_PG_BINDIR.
const envPGMajor = "TXLOCK_TEST_PG_MAJOR"

// TestServerVersion checks that the tests run on the PostgreSQL major version
// the test command asked for, and that PgBouncer is in front of that same
// server. When a version is asked for it also prints the server's version(),
// which `go test` shows when run without package arguments, as the Makefile
// runs the version matrix: the output of each run names its server.
func TestServerVersion(t *testing.T) {
	db := direct(t)
	var version string
	var num int
	require.NoError(t, db.QueryRow(`SELECT pg_catalog.version(), pg_catalog.current_setting('server_version_num')::int`).Scan(&version, &num))
	if want := os.Getenv(envPGMajor); want == "" {
		t.Logf("server: %s", version)
	} else {
		fmt.Printf("server: %s\n", version)
		assert.Equal(t, want, strconv.Itoa(num/10000), "%s=%s, but the server's server_version_num is %d", envPGMajor, want, num)
	}

	t.Run("PgBouncer", func(t *testing.T) {
		pooled, _ := bouncer(t, "exec")
		var pooledNum int
		require.NoError(t, pooled.QueryRow(`SELECT pg_catalog.current_setting('server_version_num')::int`).Scan(&pooledNum))
		assert.Equal(t, num, pooledNum, "PgBouncer is in front of another server than the one the direct tests use")
	})
}
