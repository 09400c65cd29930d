package lockstmt_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/txlock/txlock/internal/lockstmt"
)

// The statements are the library's, for the key asked: Exclusive's is the
// form a transaction of txlock's own reads (a row if granted), and Begin's
// is BEGIN, then that form.
func TestStatements(t *testing.T) {
	for _, key := range []int64{4243, -1, 7777777777777777777} {
		lock := "pg_catalog.pg_try_advisory_xact_lock('" + strconv.FormatInt(key, 10) + "'::bigint)"
		ex := lockstmt.Exclusive(key)
		assert.True(t, strings.HasPrefix(ex, "SELECT 1 WHERE CASE WHEN (pg_catalog.pg_is_in_recovery() OR "), ex)
		assert.Contains(t, ex, lock)
		assert.NotContains(t, ex, "txlock.busy")
		b := lockstmt.Begin(key, 0)
		assert.Equal(t, "BEGIN; "+ex, b)
		assert.NotContains(t, b, "idle_in_transaction_session_timeout")
		assert.Contains(t, lockstmt.Begin(key, 30*time.Second), "idle_in_transaction_session_timeout")
	}
}
