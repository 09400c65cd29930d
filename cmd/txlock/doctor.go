package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgident"
)

const doctorAbout = `Check that the database is fit for txlock, and print a check mark, or a
cross and a fix, for each check:

  connect         the URL reaches a server
  primary         the server is a primary, not a hot standby
  advisory locks  two connections contend for one key: the second is refused
                  (some engines have advisory functions that always return true)
  version         the server version, and whether transaction_timeout (17+) exists
  fence sequence  the fencing sequence exists, as bigint, CACHE 1, NO CYCLE, usable
  replication     fencing tokens survive a failover: a standby that streams
                  from the server is synchronous (with the fence sequence, on
                  a primary)
  search_path     no schema comes before pg_catalog
  exec mode       pgx's default_query_exec_mode works here, also behind a
                  transaction pooler
  latency         the round trip of a query

The exit status is 1 if any check fails.`

// check is the outcome of one check.
type check struct {
	name   string
	ok     bool
	detail string
	fix    string // for a failed check
}

// doctor runs the checks against one target.
type doctor struct {
	cfg     *pgx.ConnConfig // as the URL gives it
	db      *sql.DB         // the command's own pool (simple protocol)
	fenceSQ [2]string       // schema and name of the fence sequence; empty: not checked
	checks  []check
	info    serverInfo
}

type serverInfo struct {
	version    string // version()
	versionNum int    // server_version_num
	database   string
	user       string
	serverPort sql.NullInt64 // inet_server_port(): NULL over a Unix-domain socket
	inRecovery bool
}

func doctorCmd(ctx context.Context, e *env, args []string) int {
	fs := newFlags("doctor", "[flags]", doctorAbout)
	url := fs.String("db", "", "PostgreSQL `URL` (default $DATABASE_URL)")
	fenceSeq := fs.String("fence-seq", txlock.DefaultFenceSchema+"."+txlock.DefaultFenceSequence, "the fencing sequence `SCHEMA.NAME` (txlock.Fencer's); empty to skip the checks of fencing tokens (the sequence, and replication) when none is used")
	timeout := fs.Duration("timeout", 30*time.Second, "give up on the checks after this long")
	pos, code, stop := parse(e, fs, args)
	if stop {
		return code
	}
	if len(pos) > 0 {
		return usageError(e, fs, "unexpected argument %q", pos[0])
	}
	if *url == "" {
		*url = e.getenv("DATABASE_URL") // not the flag's default, which --help would show, password and all
	}
	if *url == "" {
		return usageError(e, fs, "no database: give --db URL or set DATABASE_URL")
	}
	if *timeout <= 0 {
		return usageError(e, fs, "--timeout must be positive, got %v", *timeout)
	}
	d := &doctor{}
	if *fenceSeq != "" {
		schema, name, ok := strings.Cut(*fenceSeq, ".")
		if !ok || schema == "" || name == "" {
			return usageError(e, fs, "--fence-seq %q: want SCHEMA.NAME, such as public.txlock_fence_seq", *fenceSeq)
		}
		d.fenceSQ = [2]string{schema, name}
	}
	cfg, err := pgx.ParseConfig(*url)
	if err != nil {
		return usageError(e, fs, "--db: %v", err)
	}
	d.cfg = cfg
	db, tgt, err := openDB(*url, "txlock doctor")
	if err != nil {
		return usageError(e, fs, "--db: %v", err)
	}
	defer db.Close()
	d.db = db

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	fmt.Fprintf(e.stdout, "txlock doctor: %s, database %q, user %q\n", tgt, cfg.Database, cfg.User)
	d.run(ctx)
	return d.report(e)
}

func (d *doctor) pass(name, format string, args ...any) {
	d.checks = append(d.checks, check{name: name, ok: true, detail: fmt.Sprintf(format, args...)})
}

func (d *doctor) fail(name, fix, format string, args ...any) {
	d.checks = append(d.checks, check{name: name, detail: fmt.Sprintf(format, args...), fix: fix})
}

func (d *doctor) run(ctx context.Context) {
	if !d.connect(ctx) {
		return
	}
	d.primary()
	d.advisoryLocks(ctx)
	d.version(ctx)
	if d.fenceSQ[1] != "" {
		d.fenceSequence(ctx)
		if !d.info.inRecovery {
			d.replication(ctx)
		}
	}
	d.searchPath(ctx)
	d.execMode(ctx)
	d.latency(ctx)
}

// report prints the checks and returns the exit code.
func (d *doctor) report(e *env) int {
	width := 0
	for _, c := range d.checks {
		width = max(width, len(c.name))
	}
	failed := 0
	for _, c := range d.checks {
		mark, colour := "✓", green
		if !c.ok {
			mark, colour = "✗", red
			failed++
		}
		if e.colour {
			mark = colour + mark + reset
		}
		// Details quote the server (its version, search_path, errors):
		// visible keeps its control characters off the terminal.
		fmt.Fprintf(e.stdout, "%s %-*s  %s\n", mark, width, c.name, visible(c.detail))
		if c.fix != "" {
			fmt.Fprintf(e.stdout, "  %-*s  fix: %s\n", width, "", visible(c.fix))
		}
	}
	if failed > 0 {
		fmt.Fprintf(e.stdout, "%d of %d checks failed\n", failed, len(d.checks))
		return exitFail
	}
	fmt.Fprintf(e.stdout, "all %d checks passed\n", len(d.checks))
	return exitOK
}

func (d *doctor) connect(ctx context.Context) bool {
	i := &d.info
	var num string
	err := d.db.QueryRowContext(ctx, `SELECT pg_catalog.version(), pg_catalog.current_setting('server_version_num'),
		pg_catalog.current_database(), CAST(CURRENT_USER AS pg_catalog.text), pg_catalog.inet_server_port(), pg_catalog.pg_is_in_recovery()`).
		Scan(&i.version, &num, &i.database, &i.user, &i.serverPort, &i.inRecovery)
	if err != nil {
		d.fail("connect", "check the URL, that the server runs and that it accepts this client (pg_hba.conf)", "%v", err)
		return false
	}
	i.versionNum, _ = strconv.Atoi(num)
	d.pass("connect", "database %q as %q", i.database, i.user)
	return true
}

func (d *doctor) primary() {
	if d.info.inRecovery {
		d.fail("primary", "point --db at the primary (a URL with target_session_attrs=read-write finds it among several hosts)",
			"the server is a hot standby (pg_is_in_recovery() is true): a lock taken there excludes nothing on the primary, and txlock refuses it with ErrStandby")
		return
	}
	d.pass("primary", "not in recovery")
}

// advisoryLocks takes a new key in an open transaction of one connection,
// then asks for it from a transaction of another, which must be refused.
// Behind a transaction pooler the two open transactions run on two server
// connections.
func (d *doctor) advisoryLocks(ctx context.Context) {
	const name = "advisory locks"
	fix := "txlock cannot exclude anything on this server: use PostgreSQL, or an engine version with real advisory locks (YugabyteDB 2.25.1 or later with ysql_yb_enable_advisory_locks)"
	var b [8]byte
	_, _ = rand.Read(b[:])
	k := txlock.StringKey("txlock doctor " + hex.EncodeToString(b[:]))
	n, _ := k.Int64()
	try := `SELECT pg_catalog.pg_try_advisory_xact_lock(CAST('` + strconv.FormatInt(n, 10) + `' AS bigint)), pg_catalog.pg_backend_pid()`
	var txs []*sql.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback()
		}
	}()
	var got [2]bool
	var pid [2]int
	for i := range got {
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			d.fail(name, "check the server's logs", "beginning transaction %d: %v", i+1, err)
			return
		}
		txs = append(txs, tx)
		if err := tx.QueryRowContext(ctx, try).Scan(&got[i], &pid[i]); err != nil {
			d.fail(name, fix, "pg_try_advisory_xact_lock failed: %v", err)
			return
		}
	}
	switch {
	case !got[0]:
		d.fail(name, "run doctor again; if it fails again, the server's advisory locks are not usable", "the first connection was refused a key nobody holds (%s)", k)
	case pid[0] == pid[1]:
		d.fail(name, "connect straight to PostgreSQL, or through a pooler in transaction or session mode",
			"both transactions ran on one server session (pid %d): a pooler in statement mode? Then a lock would end with its statement", pid[0])
	case got[1]:
		d.fail(name, fix, "a second connection (pid %d) was granted the key that the first (pid %d) holds: the advisory lock functions are no-ops here, as CockroachDB's were and YugabyteDB's are when a setting silences their 'not implemented' error", pid[1], pid[0])
	default:
		d.pass(name, "enforced: pid %d held a key, pid %d was refused it", pid[0], pid[1])
	}
}

func (d *doctor) version(ctx context.Context) {
	const name = "version"
	i := d.info
	short := i.version
	if f := strings.Fields(short); len(f) >= 2 {
		short = f[0] + " " + f[1]
	}
	var engine string
	switch {
	case strings.Contains(i.version, "CockroachDB"):
		engine = "; CockroachDB: see advisory locks"
	case strings.Contains(i.version, "-YB-"):
		engine = "; YugabyteDB: see advisory locks"
	}
	if i.versionNum < 130000 {
		d.fail(name, "upgrade to PostgreSQL 13 or later (txlock is tested on 13 to 18)",
			"%s: fencing tokens need pg_current_xact_id, new in PostgreSQL 13%s", short, engine)
		return
	}
	var tt sql.NullString
	if err := d.db.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('transaction_timeout', true)`).Scan(&tt); err != nil {
		d.fail(name, "check the server's logs", "reading transaction_timeout: %v", err)
		return
	}
	if tt.Valid {
		d.pass(name, "%s; transaction_timeout available: WithMaxHold also ends a statement that runs past the bound%s", short, engine)
		return
	}
	d.pass(name, "%s; no transaction_timeout (PostgreSQL 17+): WithMaxHold ends an idle holder's session, not a statement that runs past the bound%s", short, engine)
}

func (d *doctor) fenceSequence(ctx context.Context) {
	const name = "fence sequence"
	schema, seq := d.fenceSQ[0], d.fenceSQ[1]
	q := pgident.QuoteIfNeeded(schema) + "." + pgident.QuoteIfNeeded(seq)
	fencer := "txlock.Fencer{}"
	if schema != txlock.DefaultFenceSchema || seq != txlock.DefaultFenceSequence {
		fencer = fmt.Sprintf("txlock.Fencer{Schema: %q, Sequence: %q}", schema, seq)
	}
	var cache int64
	var cycle, usable bool
	var typ string
	err := d.db.QueryRowContext(ctx, `SELECT s.seqcache, s.seqcycle, pg_catalog.format_type(s.seqtypid, NULL),
		pg_catalog.has_sequence_privilege(c.oid, 'USAGE') OR pg_catalog.has_sequence_privilege(c.oid, 'UPDATE')
		FROM pg_catalog.pg_sequence s
		JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.seqrelid
		JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
		WHERE n.nspname OPERATOR(pg_catalog.=) `+sqlLiteral(schema)+` AND c.relname OPERATOR(pg_catalog.=) `+sqlLiteral(seq)).
		Scan(&cache, &cycle, &typ, &usable)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		d.fail(name, "run migrations/0001_txlock_fence_seq.sql, or "+fencer+".CreateSequence(ctx, db), once (or skip this check with --fence-seq= if no fencing token is used)",
			"%s does not exist: fencing tokens (txlock.FenceToken, Fencer.Token) fail without it", q)
	case err != nil:
		d.fail(name, "check the server's logs", "reading %s: %v", q, err)
	case cache > 1:
		d.fail(name, "ALTER SEQUENCE "+q+" CACHE 1", "%s has CACHE %d: each session caches its own values, so tokens come out of order", q, cache)
	case cycle:
		d.fail(name, "ALTER SEQUENCE "+q+" NO CYCLE", "%s cycles: after its maximum, tokens start again from the minimum", q)
	case typ != "bigint":
		d.fail(name, "ALTER SEQUENCE "+q+" AS bigint", "%s is %s, not bigint: it runs out sooner than tokens should", q, typ)
	case !usable:
		d.fail(name, "GRANT USAGE ON SEQUENCE "+q+" TO "+pgident.QuoteIfNeeded(d.info.user), "%q may not draw from %s (no USAGE or UPDATE privilege)", d.info.user, q)
	default:
		d.pass(name, "%s: bigint, CACHE 1, NO CYCLE, usable by %q", q, d.info.user)
	}
}

func (d *doctor) searchPath(ctx context.Context) {
	const name = "search_path"
	var setting string
	if err := d.db.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('search_path')`).Scan(&setting); err != nil {
		d.fail(name, "check the server's logs", "reading search_path: %v", err)
		return
	}
	rows, err := d.db.QueryContext(ctx, `SELECT s FROM pg_catalog.unnest(pg_catalog.current_schemas(true)) WITH ORDINALITY AS u(s, i) ORDER BY i`)
	if err != nil {
		d.fail(name, "check the server's logs", "reading current_schemas: %v", err)
		return
	}
	var before []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			d.fail(name, "check the server's logs", "reading current_schemas: %v", err)
			return
		}
		if s == "pg_catalog" {
			break
		}
		if !strings.HasPrefix(s, "pg_temp_") { // never searched for functions or operators
			before = append(before, s)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		d.fail(name, "check the server's logs", "reading current_schemas: %v", err)
		return
	}
	if len(before) == 0 {
		d.pass(name, "%s: pg_catalog comes first", setting)
		return
	}
	// Which names of pg_catalog do those schemas shadow?
	var lits []string
	for _, s := range before {
		lits = append(lits, sqlLiteral(s))
	}
	var shadows string
	err = d.db.QueryRowContext(ctx, `SELECT COALESCE(pg_catalog.string_agg(DISTINCT p.proname, ', '), '')
		FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
		WHERE n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY[`+strings.Join(lits, ", ")+`])
		AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc c WHERE c.pronamespace OPERATOR(pg_catalog.=) CAST('pg_catalog' AS pg_catalog.regnamespace) AND c.proname OPERATOR(pg_catalog.=) p.proname)`).Scan(&shadows)
	if err != nil {
		shadows = ""
	}
	detail := fmt.Sprintf("%s puts %s before pg_catalog: there, unqualified SQL can reach that schema's functions and operators instead of PostgreSQL's (txlock's lock, token and term statements are qualified; a FencedTable's table without its Schema, and the = between its columns and values, are not, on purpose, and the application's SQL may not be)",
		setting, strings.Join(quoteAll(before), ", "))
	if shadows != "" {
		detail += "; it shadows " + shadows
	}
	fixed := append([]string{"pg_catalog"}, slices.DeleteFunc(strings.Split(setting, ","), func(s string) bool {
		return strings.TrimSpace(s) == "pg_catalog"
	})...)
	for i := range fixed {
		fixed[i] = strings.TrimSpace(fixed[i])
	}
	d.fail(name, fmt.Sprintf("list pg_catalog first: search_path=%s (in the URL, or ALTER ROLE … SET search_path), or take %s out of it",
		strings.Join(fixed, ","), strings.Join(quoteAll(before), ", ")), "%s", detail)
}

// execMode checks pgx's default_query_exec_mode of the URL. A transaction
// pooler is likely when the URL's port is PgBouncer's 6432, or the server
// reports another port than the URL's; the probe runs one parameterized
// query, in the URL's mode, alternately on two connections, which fails in
// cache_statement and describe_exec mode behind a pooler without
// prepared-statement support (PgBouncer before 1.21).
func (d *doctor) execMode(ctx context.Context) {
	const name = "exec mode"
	mode := modeName(d.cfg.DefaultQueryExecMode)
	var why []string
	if d.cfg.Port == 6432 {
		why = append(why, "the port is 6432, PgBouncer's")
	}
	if p := d.info.serverPort; p.Valid && p.Int64 != int64(d.cfg.Port) {
		why = append(why, fmt.Sprintf("the server listens on port %d, the URL says %d", p.Int64, d.cfg.Port))
	}
	probeErr := d.probe(ctx)
	var failed *probeError
	if errors.As(probeErr, &failed) {
		why = append(why, fmt.Sprintf("a parameterized query failed on the %s connection (query %d of %d, alternating between two)", failed.conn, failed.query, probeQueries))
	}
	pooler := "no pooler seen"
	if len(why) > 0 {
		pooler = "a pooler is likely: " + strings.Join(why, "; ")
	}
	fix := "add default_query_exec_mode=exec to the URL (or simple_protocol): PgBouncer before 1.21 has no prepared statements"
	switch {
	case probeErr != nil:
		d.fail(name, fix, "%s fails here (%s): %v", mode, pooler, probeErr)
	case len(why) > 0 && mode == "cache_describe":
		d.pass(name, "%s works here (%s), but goes stale after schema or search_path changes behind a pooler; exec is safer", mode, pooler)
	case len(why) > 0 && (mode == "cache_statement" || mode == "describe_exec"):
		d.pass(name, "%s works here (%s): the pooler supports prepared statements", mode, pooler)
	default:
		d.pass(name, "%s works here (%s)", mode, pooler)
	}
}

// probeQueries is how many queries probe runs, alternately on its two
// connections.
const probeQueries = 6

// probeError is a probe query that failed: the connection it ran on (first
// or second) and its number, from 1.
type probeError struct {
	conn  string
	query int
	err   error
}

func (e *probeError) Error() string { return e.err.Error() }
func (e *probeError) Unwrap() error { return e.err }

// probe runs one parameterized query, in the URL's exec mode, on two
// connections in turn. Its text is new to every run, so that the statement
// it may leave prepared on a pooler's server connections never meets
// another client's. A failed query is a *probeError.
func (d *doctor) probe(ctx context.Context) error {
	cfg := d.cfg.Copy()
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "txlock doctor"
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	var b [8]byte
	_, _ = rand.Read(b[:])
	q := `SELECT CAST($1 AS integer) /* txlock doctor ` + hex.EncodeToString(b[:]) + ` */`
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 2 {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	for i := range probeQueries {
		var n int
		if err := conns[i%2].QueryRowContext(ctx, q, i).Scan(&n); err != nil {
			return &probeError{conn: [2]string{"first", "second"}[i%2], query: i + 1, err: err}
		}
		if n != i {
			return fmt.Errorf("the probe query returned %d for %d", n, i)
		}
	}
	return nil
}

func modeName(m pgx.QueryExecMode) string {
	switch m {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement"
	case pgx.QueryExecModeCacheDescribe:
		return "cache_describe"
	case pgx.QueryExecModeDescribeExec:
		return "describe_exec"
	case pgx.QueryExecModeExec:
		return "exec"
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol"
	}
	return m.String()
}

func (d *doctor) latency(ctx context.Context) {
	const name = "latency"
	c, err := d.db.Conn(ctx)
	if err != nil {
		d.fail(name, "check the server's logs", "%v", err)
		return
	}
	defer c.Close()
	const n = 20
	var rtts []time.Duration
	for range n {
		start := time.Now()
		var one int
		if err := c.QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
			d.fail(name, "check the server's logs", "%v", err)
			return
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	d.pass(name, "round trip %v median, %v min, %v max over %d queries; an uncontended lock costs one", round(rtts[n/2]), round(rtts[0]), round(rtts[n-1]), n)
}

func round(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond)
	case d < time.Second:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = pgident.QuoteIfNeeded(s)
	}
	return out
}
