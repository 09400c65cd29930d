package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// doctorChecks are the names of the checks doctor runs after connecting.
var doctorChecks = []string{"connect", "primary", "advisory locks", "version", "fence sequence", "replication", "search_path", "exec mode", "latency"}

// marks returns the mark doctor printed for each check, by name.
func marks(t *testing.T, out string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		for _, name := range doctorChecks {
			if strings.HasPrefix(line, "✓ "+name+" ") {
				m[name] = "✓"
			}
			if strings.HasPrefix(line, "✗ "+name+" ") {
				m[name] = "✗"
			}
		}
	}
	return m
}

// failing returns the names of the checks marked with a cross.
func failing(m map[string]string) []string {
	var out []string
	for _, name := range doctorChecks {
		if m[name] == "✗" {
			out = append(out, name)
		}
	}
	return out
}

// withFenceSequence returns the URL of a new database that has the fencing
// sequence.
func withFenceSequence(t *testing.T) string {
	t.Helper()
	url := freshDatabase(t)
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), openPool(t, url)))
	return url
}

func TestDoctorPasses(t *testing.T) {
	url := withFenceSequence(t)
	r := cli(t, "doctor", "--db", url)
	t.Log("\n" + r.stdout)
	require.Equal(t, 0, r.code, "%+v", r)
	m := marks(t, r.stdout)
	for _, name := range doctorChecks {
		assert.Equal(t, "✓", m[name], name)
	}
	assert.Contains(t, r.stdout, "all 9 checks passed")
	assert.Regexp(t, `(?m)^✓ advisory locks +enforced: pid \d+ held a key, pid \d+ was refused it$`, r.stdout)
	assert.Regexp(t, `(?m)^✓ fence sequence +public\.txlock_fence_seq: bigint, CACHE 1, NO CYCLE`, r.stdout)
	assert.Regexp(t, `(?m)^✓ exec mode +cache_statement works here \(no pooler seen\)$`, r.stdout)
	assert.NotContains(t, r.stdout, "\x1b[", "no colour when stdout is not a terminal")
}

// TestDoctorPgBouncer: through PgBouncer in transaction mode, doctor passes
// with default_query_exec_mode=exec, and fails with pgx's default mode,
// telling to set exec.
func TestDoctorPgBouncer(t *testing.T) {
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), openPool(t, pgtest.Postgres(t))))
	url, _ := pgtest.PgBouncer(t)

	r := cli(t, "doctor", "--db", withParam(t, url, "default_query_exec_mode", "exec"))
	t.Log("\n" + r.stdout)
	require.Equal(t, 0, r.code, "%+v", r)
	assert.Empty(t, failing(marks(t, r.stdout)))
	assert.Regexp(t, `(?m)^✓ exec mode +exec works here \(a pooler is likely: the server listens on port \d+, the URL says \d+\)$`, r.stdout)
	assert.Regexp(t, `(?m)^✓ advisory locks +enforced`, r.stdout, "two transactions through PgBouncer contend")

	r = cli(t, "doctor", "--db", url)
	t.Log("\n" + r.stdout)
	assert.Equal(t, 1, r.code, "%+v", r)
	assert.Equal(t, []string{"exec mode"}, failing(marks(t, r.stdout)))
	assert.Regexp(t, `(?m)^✗ exec mode +cache_statement fails here \(a pooler is likely: .*a parameterized query failed on the (first|second) connection \(query [1-6] of 6, alternating between two\)\): .*SQLSTATE (42P05|26000)`, r.stdout)
	// The connection named is the one the failed query ran on: the odd
	// queries run on the first, the even ones on the second.
	if m := regexp.MustCompile(`failed on the (first|second) connection \(query ([1-6]) of 6`).FindStringSubmatch(r.stdout); assert.NotNil(t, m) {
		n, _ := strconv.Atoi(m[2])
		assert.Equal(t, map[bool]string{true: "first", false: "second"}[n%2 == 1], m[1], m[0])
	}
	assert.Regexp(t, `(?m)^ +fix: add default_query_exec_mode=exec to the URL`, r.stdout)
	assert.Contains(t, r.stdout, "1 of 9 checks failed")
}

// TestDoctorStandby runs on a primary of its own, so that the shared one has
// no standby to fail the replication check of the other tests.
func TestDoctorStandby(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), openPool(t, c.URL())))
	r := cli(t, "doctor", "--db", newStandby(t, c).URL())
	t.Log("\n" + r.stdout)
	assert.Equal(t, 1, r.code, "%+v", r)
	m := marks(t, r.stdout)
	assert.Equal(t, "✗", m["primary"])
	assert.Regexp(t, `(?m)^✗ primary +the server is a hot standby \(pg_is_in_recovery\(\) is true\)`, r.stdout)
	assert.Regexp(t, `(?m)^ +fix: point --db at the primary`, r.stdout)
	assert.Equal(t, "✓", m["connect"])
	assert.NotContains(t, m, "replication", "a standby's own replication says nothing of the primary's")
}

func TestDoctorSearchPath(t *testing.T) {
	url := withFenceSequence(t)
	db := openPool(t, url)
	schema := randomName("evil_")
	_, err := db.Exec(`CREATE SCHEMA ` + schema + `;
		CREATE FUNCTION ` + schema + `.pg_try_advisory_xact_lock(bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'`)
	require.NoError(t, err)

	r := cli(t, "doctor", "--db", withParam(t, url, "search_path", schema+",pg_catalog"))
	t.Log("\n" + r.stdout)
	assert.Equal(t, 1, r.code, "%+v", r)
	m := marks(t, r.stdout)
	assert.Equal(t, []string{"search_path"}, failing(m))
	assert.Equal(t, "✓", m["advisory locks"], "doctor's own lock calls are qualified, so the shadow does not fool them")
	assert.Regexp(t, `(?m)^✗ search_path +`+schema+`,pg_catalog puts `+schema+` before pg_catalog: .*; it shadows pg_try_advisory_xact_lock$`, r.stdout)
	assert.Regexp(t, `(?m)^ +fix: list pg_catalog first: search_path=pg_catalog,`+schema+` `, r.stdout)

	// A schema name that holds terminal escapes reaches the terminal
	// escaped.
	escSchema := "e\x1b[2Jvil_" + randomName("")
	_, err = db.Exec(`CREATE SCHEMA "` + escSchema + `"`)
	require.NoError(t, err)
	r = cli(t, "doctor", "--db", withParam(t, url, "search_path", `"`+escSchema+`",pg_catalog`))
	t.Log("\n" + r.stdout)
	assert.Equal(t, 1, r.code, "%+v", r)
	assert.NotContains(t, r.stdout, "\x1b")
	assert.Contains(t, r.stdout, `e\x1b[2Jvil_`)

	// A schema of the path that does not exist is not searched: no cross.
	r = cli(t, "doctor", "--db", withParam(t, url, "search_path", "nosuchschema,pg_catalog"))
	assert.Equal(t, 0, r.code, "%+v", r)
}

func TestDoctorFenceSequence(t *testing.T) {
	url := freshDatabase(t)
	r := cli(t, "doctor", "--db", url)
	t.Log("\n" + r.stdout)
	assert.Equal(t, 1, r.code, "%+v", r)
	assert.Equal(t, []string{"fence sequence"}, failing(marks(t, r.stdout)))
	assert.Regexp(t, `(?m)^✗ fence sequence +public\.txlock_fence_seq does not exist`, r.stdout)
	assert.Regexp(t, `(?m)^ +fix: run migrations/0001_txlock_fence_seq\.sql, or txlock\.Fencer\{\}\.CreateSequence\(ctx, db\)`, r.stdout)

	// Without fencing, the check is left out.
	r = cli(t, "doctor", "--db", url, "--fence-seq=")
	assert.Equal(t, 0, r.code, "%+v", r)
	assert.NotContains(t, r.stdout, "fence sequence")
	assert.Contains(t, r.stdout, "all 7 checks passed")

	// A sequence of another schema, made by hand with a per-session cache.
	db := openPool(t, url)
	_, err := db.Exec(`CREATE SCHEMA fencing; CREATE SEQUENCE fencing.tokens CACHE 20`)
	require.NoError(t, err)
	r = cli(t, "doctor", "--db", url, "--fence-seq", "fencing.tokens")
	assert.Equal(t, 1, r.code, "%+v", r)
	assert.Regexp(t, `(?m)^✗ fence sequence +fencing\.tokens has CACHE 20: `, r.stdout)
	assert.Regexp(t, `(?m)^ +fix: ALTER SEQUENCE fencing\.tokens CACHE 1$`, r.stdout)
	_, err = db.Exec(`ALTER SEQUENCE fencing.tokens CACHE 1`)
	require.NoError(t, err)
	r = cli(t, "doctor", "--db", url, "--fence-seq", "fencing.tokens")
	assert.Equal(t, 0, r.code, "%+v", r)
	assert.Regexp(t, regexp.MustCompile(`(?m)^✓ fence sequence +fencing\.tokens: bigint, CACHE 1`), r.stdout)
}
