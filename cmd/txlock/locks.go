package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/interop"
)

const locksAbout = `Show the advisory locks of the database: who holds each and who waits for
it, with the session's pid, application_name, client address, state,
transaction age, wait age, the pids a waiter waits for, and its query.

Keys are shown by name wherever a name is known: keyspaces from --keyspace
and from the keyspace registry (txlock.Registry), key names from --name
(txlock.StringKey, and keys of every known keyspace), and the locks of other
tools (golang-migrate, Prisma Migrate, Rails, Flyway, and with --name those of
name-hashing lock libraries). A lock of a prepared transaction has no pid: it
shows as prepared 'gid', with its owner and the time since it was prepared,
until COMMIT PREPARED or ROLLBACK PREPARED ends it. Through PgBouncer, the
client address is PgBouncer's. The query and client of other roles' sessions
are shown only to superusers and members of pg_read_all_stats. Control
characters of what the server returns are shown as escapes (\x1b).`

// locksOpts are the flags of locks.
type locksOpts struct {
	db                                string
	keyspaces, names, migrate, flyway stringList
	registry                          string
	registryGiven                     bool // --registry was on the command line
	watch, json                       bool
	interval                          time.Duration
	queryWidth                        int
}

func locksCmd(ctx context.Context, e *env, args []string) int {
	fs := newFlags("locks", "[flags]", locksAbout)
	var o locksOpts
	fs.StringVar(&o.db, "db", "", "PostgreSQL `URL` (default $DATABASE_URL)")
	fs.Var(&o.keyspaces, "keyspace", "a keyspace `SERVICE` name to decode (repeatable)")
	fs.Var(&o.names, "name", "a key `NAME` to decode, as a StringKey, in every known keyspace, and in other tools' name-hashing schemes (repeatable)")
	fs.StringVar(&o.registry, "registry", txlock.DefaultRegistrySchema+"."+txlock.DefaultRegistryTable, "the keyspace registry `SCHEMA.TABLE` to read names from; empty to read none (a missing registry is warned about only when this flag is given)")
	fs.Var(&o.migrate, "migrate-table", "golang-migrate's migrations `SCHEMA.TABLE`, if not public.schema_migrations, split at the first dot (repeatable); golang-migrate splits x-migrations-table only with x-migrations-table-quoted, so its unquoted x-migrations-table=app.migrations is the table \"app.migrations\" in current_schema(): give public.app.migrations")
	fs.Var(&o.flyway, "flyway-table", "Flyway's schema history `SCHEMA.TABLE`, if not public.flyway_schema_history (repeatable)")
	fs.BoolVar(&o.watch, "watch", false, "refresh the view every --interval until interrupted")
	fs.DurationVar(&o.interval, "interval", 2*time.Second, "how often --watch refreshes")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per lock and line")
	fs.IntVar(&o.queryWidth, "query-width", 60, "show at most `N` characters of each query (the JSON has it whole)")
	pos, code, stop := parse(e, fs, args)
	if stop {
		return code
	}
	if len(pos) > 0 {
		return usageError(e, fs, "unexpected argument %q", pos[0])
	}
	if o.db == "" {
		o.db = e.getenv("DATABASE_URL") // not the flag's default, which --help would show, password and all
	}
	if o.db == "" {
		return usageError(e, fs, "no database: give --db URL or set DATABASE_URL")
	}
	if o.interval <= 0 {
		return usageError(e, fs, "--interval must be positive, got %v", o.interval)
	}
	if o.queryWidth < 1 {
		return usageError(e, fs, "--query-width must be at least 1, got %d", o.queryWidth)
	}
	o.registryGiven = flagSet(fs, "registry")
	var reg *txlock.Registry
	if o.registry != "" {
		schema, table, ok := strings.Cut(o.registry, ".")
		if !ok || schema == "" || table == "" {
			return usageError(e, fs, "--registry %q: want SCHEMA.TABLE, such as public.txlock_keyspaces", o.registry)
		}
		reg = &txlock.Registry{Schema: schema, Table: table}
		if _, err := reg.DDL(); err != nil {
			return usageError(e, fs, "--registry: %v", err)
		}
	}
	flagSpaces := map[int32]txlock.Keyspace{}
	for _, name := range o.keyspaces {
		ks := txlock.NewKeyspace(name)
		if err := ks.Err(); err != nil {
			return usageError(e, fs, "--keyspace: %v", err)
		}
		flagSpaces[ks.Namespace()] = ks
	}
	for _, name := range o.names {
		if err := txlock.StringKey(name).Err(); err != nil {
			return usageError(e, fs, "--name: %v", err)
		}
	}

	db, target, err := openDB(o.db, "txlock locks")
	if err != nil {
		return usageError(e, fs, "--db: %v", err)
	}
	defer db.Close()
	for frame := 0; ; frame++ {
		if err := locksFrame(ctx, e, db, target, &o, reg, flagSpaces, frame); err != nil {
			if o.watch && ctx.Err() != nil {
				return exitOK
			}
			fmt.Fprintf(e.stderr, "txlock locks: %s: %s\n", target, visible(err.Error()))
			return exitFail
		}
		if !o.watch {
			return exitOK
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(o.interval):
		}
	}
}

// lockRow is one row of pg_locks, with its session, or its prepared
// transaction, and its decoded key.
type lockRow struct {
	PID        *int     `json:"pid"`  // null for a prepared transaction's lock
	Lock       string   `json:"lock"` // held or waiting
	Mode       string   `json:"mode"` // pg_locks.mode: ExclusiveLock or ShareLock
	Key        string   `json:"key"`  // bigint(n) or pair(a,b)
	ClassID    uint32   `json:"classid"`
	ObjID      uint32   `json:"objid"`
	ObjSubID   int      `json:"objsubid"`
	Tool       string   `json:"tool,omitempty"` // txlock, or the tool of another's lock
	Keyspace   string   `json:"keyspace,omitempty"`
	Name       string   `json:"name,omitempty"`
	Label      string   `json:"label,omitempty"`
	App        string   `json:"application_name"`
	ClientAddr string   `json:"client_addr,omitempty"`
	ClientPort int      `json:"client_port,omitempty"`
	State      string   `json:"state"`
	XactAge    *float64 `json:"xact_age_seconds"` // null outside a transaction (a session lock), and for a prepared transaction
	// WaitAge is null for a held lock, and on PostgreSQL 14 and later also
	// for a moment after a wait begins, until the waiter sets
	// pg_locks.waitstart.
	WaitAge  *float64 `json:"wait_age_seconds"`
	WaitsFor []int    `json:"waits_for"` // the pids a waiter waits for (pg_blocking_pids), where 0 is a prepared transaction
	// WaitsForPrepared are the gids of the prepared transactions that hold
	// the key a waiter waits for, when WaitsFor holds a 0.
	WaitsForPrepared []string      `json:"waits_for_prepared,omitempty"`
	Prepared         *preparedXact `json:"prepared,omitempty"` // the prepared transaction that holds the lock
	Query            string        `json:"query"`
	Database         string        `json:"database"`
	At               string        `json:"at"` // when the frame was read, RFC 3339
	key              txlock.Key
}

// preparedXact is a prepared transaction (pg_prepared_xacts), which holds
// its locks without a session until COMMIT PREPARED or ROLLBACK PREPARED.
type preparedXact struct {
	GID   string  `json:"gid"`
	Owner string  `json:"owner"`
	Age   float64 `json:"age_seconds"` // since PREPARE TRANSACTION
}

// locksFrame reads the locks once and prints them.
func locksFrame(ctx context.Context, e *env, db *sql.DB, target string, o *locksOpts, reg *txlock.Registry, flagSpaces map[int32]txlock.Keyspace, frame int) error {
	rows, database, err := readLocks(ctx, db)
	if err != nil {
		return err
	}
	d := decoder{spaces: map[int32]txlock.Keyspace{}, names: o.names,
		hints: interop.Hints{Database: database, Names: o.names, MigrateTables: o.migrate, FlywayTables: o.flyway}}
	var warn string
	if reg != nil {
		ks, err := reg.Keyspaces(ctx, db)
		switch state := txlock.SQLState(err); {
		case err == nil:
			for _, k := range ks {
				d.spaces[k.Namespace()] = k
			}
		case state == "42P01" || state == "3F000": // undefined_table, invalid_schema_name
			if o.registryGiven {
				warn = fmt.Sprintf("the keyspace registry %s (--registry) does not exist: no keyspace is named from it (create it with txlock.Registry.Create, or give --registry= to read none)", registryName(reg))
			}
			// Without --registry, no registry at the default place: nothing to read.
		default:
			warn = fmt.Sprintf("keyspace registry not read: %v", err)
		}
	}
	for ns, ks := range flagSpaces {
		d.spaces[ns] = ks
	}
	at := time.Now().UTC()
	for i := range rows {
		rows[i].Database = database
		rows[i].At = at.Format(time.RFC3339)
		d.decode(&rows[i])
	}
	if o.json {
		if warn != "" {
			fmt.Fprintf(e.stderr, "txlock locks: %s\n", visible(warn))
		}
		enc := json.NewEncoder(e.stdout)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	if o.watch {
		if e.terminal {
			fmt.Fprint(e.stdout, "\x1b[H\x1b[2J") // refresh in place
		} else if frame > 0 {
			fmt.Fprintln(e.stdout)
		}
		if warn != "" {
			// A line of the frame: on stderr, the next redraw would wipe it.
			fmt.Fprintf(e.stdout, "txlock locks: %s\n", visible(warn))
		}
	} else if warn != "" {
		fmt.Fprintf(e.stderr, "txlock locks: %s\n", visible(warn))
	}
	writeLocks(e, rows, database, target, at, o.queryWidth)
	return nil
}

// registryName is the schema-qualified name of r's table, quoted where it
// needs to be.
func registryName(r *txlock.Registry) string {
	return quoteIdent(r.Schema) + "." + quoteIdent(r.Table)
}

// locksQuery reads the advisory locks of the current database, with their
// sessions or prepared transactions; %s is the wait start
// (pg_locks.waitstart from PostgreSQL 14, the query's start before). Ages
// are measured with clock_timestamp(), when the row is read: now() is the
// start of this statement's transaction, which a wait or a transaction that
// began since would precede. A lock of a prepared transaction has no pid;
// the prepared transaction is the one whose transactionid lock has the
// same virtualtransaction. pg_locks is read once, so that both come from
// one view of the lock table. The query takes no parameters, and qualifies
// every name and operator, as the library's statements do (IS DISTINCT FROM
// would look = up through the search_path).
const locksQuery = `WITH locks AS MATERIALIZED (SELECT * FROM pg_catalog.pg_locks)
SELECT l.pid, l.granted, l.mode,
	CAST(l.classid AS bigint), CAST(l.objid AS bigint), CAST(l.objsubid AS integer),
	COALESCE(a.application_name, ''), COALESCE(pg_catalog.host(a.client_addr), ''),
	COALESCE(a.client_port, 0), COALESCE(a.state, ''),
	EXTRACT(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) a.xact_start),
	CASE WHEN NOT l.granted THEN EXTRACT(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) %s) END,
	CASE WHEN NOT l.granted THEN pg_catalog.array_to_string(pg_catalog.pg_blocking_pids(l.pid), ',') ELSE '' END,
	COALESCE(a.query, ''),
	p.gid, CAST(p.owner AS pg_catalog.text), EXTRACT(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) p.prepared)
FROM locks l
	LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
	LEFT JOIN LATERAL (
		SELECT px.gid, px.owner, px.prepared
		FROM locks x JOIN pg_catalog.pg_prepared_xacts px ON px.transaction OPERATOR(pg_catalog.=) x.transactionid
		WHERE l.pid IS NULL AND x.pid IS NULL AND x.locktype OPERATOR(pg_catalog.=) 'transactionid'
			AND x.virtualtransaction OPERATOR(pg_catalog.=) l.virtualtransaction
		LIMIT 1) p ON true
WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
	AND l.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
	AND COALESCE(l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid(), true)`

// queryer is what readLocks reads through: a *sql.DB, or a *sql.Tx.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readLocks returns the advisory locks of the database db is connected to,
// and its name.
func readLocks(ctx context.Context, db queryer) ([]lockRow, string, error) {
	var version int
	var database string
	if err := db.QueryRowContext(ctx, `SELECT CAST(pg_catalog.current_setting('server_version_num') AS integer), pg_catalog.current_database()`).Scan(&version, &database); err != nil {
		return nil, "", err
	}
	waitStart := "a.query_start"
	if version >= 140000 {
		waitStart = "l.waitstart"
	}
	q, err := db.QueryContext(ctx, fmt.Sprintf(locksQuery, waitStart))
	if err != nil {
		return nil, "", fmt.Errorf("reading pg_locks: %w", err)
	}
	defer q.Close()
	var out []lockRow
	for q.Next() {
		var r lockRow
		var pid sql.NullInt64
		var granted bool
		var classid, objid int64
		var xact, wait, prepAge sql.NullFloat64
		var blocking string
		var gid, owner sql.NullString
		if err := q.Scan(&pid, &granted, &r.Mode, &classid, &objid, &r.ObjSubID, &r.App, &r.ClientAddr, &r.ClientPort,
			&r.State, &xact, &wait, &blocking, &r.Query, &gid, &owner, &prepAge); err != nil {
			return nil, "", fmt.Errorf("reading pg_locks: %w", err)
		}
		if pid.Valid {
			p := int(pid.Int64)
			r.PID = &p
		}
		if gid.Valid {
			r.Prepared = &preparedXact{GID: gid.String, Owner: owner.String, Age: prepAge.Float64}
		}
		r.ClassID, r.ObjID = uint32(classid), uint32(objid)
		r.Lock = "held"
		if !granted {
			r.Lock = "waiting"
		}
		if xact.Valid {
			r.XactAge = &xact.Float64
		}
		if wait.Valid {
			r.WaitAge = &wait.Float64
		}
		r.WaitsFor = []int{}
		for _, p := range strings.Split(blocking, ",") {
			if n, err := strconv.Atoi(p); err == nil {
				r.WaitsFor = append(r.WaitsFor, n)
			}
		}
		k, err := txlock.KeyFromPgLocks(r.ClassID, r.ObjID, r.ObjSubID)
		if err != nil {
			return nil, "", err
		}
		r.key = k
		r.Key = k.String()
		out = append(out, r)
	}
	if err := q.Err(); err != nil {
		return nil, "", fmt.Errorf("reading pg_locks: %w", err)
	}
	preparedBlockers(out)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case a.ObjSubID != b.ObjSubID:
			return a.ObjSubID < b.ObjSubID
		case a.ClassID != b.ClassID:
			return a.ClassID < b.ClassID
		case a.ObjID != b.ObjID:
			return a.ObjID < b.ObjID
		case a.Lock != b.Lock:
			return a.Lock == "held"
		case a.WaitAge != nil && b.WaitAge != nil && *a.WaitAge != *b.WaitAge:
			return *a.WaitAge > *b.WaitAge // the longest waiter first
		case (a.PID == nil) != (b.PID == nil):
			return a.PID == nil // prepared transactions first
		case a.PID == nil:
			return a.Prepared != nil && (b.Prepared == nil || a.Prepared.GID < b.Prepared.GID)
		}
		return *a.PID < *b.PID
	})
	return out, database, nil
}

// preparedBlockers fills WaitsForPrepared of each waiter that waits for a
// prepared transaction (pg_blocking_pids reports it as pid 0): the gids of
// the prepared transactions that hold its key in a conflicting mode.
func preparedBlockers(rows []lockRow) {
	for i := range rows {
		w := &rows[i]
		if w.Lock != "waiting" || !slices.Contains(w.WaitsFor, 0) {
			continue
		}
		for _, h := range rows {
			if h.Prepared != nil && h.Lock == "held" && h.ClassID == w.ClassID && h.ObjID == w.ObjID && h.ObjSubID == w.ObjSubID && (h.Mode == "ExclusiveLock" || w.Mode == "ExclusiveLock") {
				w.WaitsForPrepared = append(w.WaitsForPrepared, h.Prepared.GID)
			}
		}
		slices.Sort(w.WaitsForPrepared)
	}
}

// decoder turns keys back into names.
type decoder struct {
	spaces map[int32]txlock.Keyspace // known keyspaces by namespace
	names  []string                  // known key names
	hints  interop.Hints
}

// decode fills r's Tool, Keyspace, Name and Label from its key, where a
// name is known.
func (d *decoder) decode(r *lockRow) {
	if a, b, ok := r.key.Pair(); ok {
		if ks, ok := d.spaces[a]; ok {
			r.Tool, r.Keyspace = "txlock", ks.String()
			for _, name := range d.names {
				if _, y, _ := ks.Key(name).Pair(); y == b {
					r.Name, r.Label = name, ks.String()+"/"+name
					return
				}
			}
			// The id of Keyspace.ID, or the hash of a name not given.
			r.Label = ks.String() + "/#" + strconv.FormatInt(int64(b), 10)
			return
		}
	}
	if n, ok := r.key.Int64(); ok {
		for _, name := range d.names {
			if v, _ := txlock.StringKey(name).Int64(); v == n {
				r.Tool, r.Name, r.Label = "txlock", name, name
				return
			}
		}
	}
	if m, ok := interop.Identify(r.key, d.hints); ok {
		r.Tool, r.Label = m.Tool, m.Label
	}
}

// writeLocks prints rows as an aligned table, under a line that says what
// was read. Every cell the server supplies goes through visible.
func writeLocks(e *env, rows []lockRow, database, target string, at time.Time, queryWidth int) {
	held := 0
	keys := map[[3]int64]bool{}
	for _, r := range rows {
		if r.Lock == "held" {
			held++
		}
		keys[[3]int64{int64(r.ClassID), int64(r.ObjID), int64(r.ObjSubID)}] = true
	}
	stamp := at.Format("2006-01-02 15:04:05 MST")
	if len(rows) == 0 {
		fmt.Fprintf(e.stdout, "no advisory locks in database %q on %s at %s\n", database, target, stamp)
		return
	}
	// A key can have several requests: a holder and its waiters, or several
	// shared holders.
	fmt.Fprintf(e.stdout, "%d advisory lock %s on %d %s in database %q on %s at %s: %d held, %d waiting\n",
		len(rows), plural(len(rows), "request", "requests"), len(keys), plural(len(keys), "key", "keys"),
		database, target, stamp, held, len(rows)-held)
	t := table{header: []string{"PID", "LOCK", "KEY", "NAME", "APPLICATION", "CLIENT", "STATE", "XACT", "WAIT", "WAITS FOR", "QUERY"}}
	for _, r := range rows {
		lock := r.Lock
		if r.Mode == "ShareLock" {
			lock += " (shared)"
		}
		colour := green
		if r.Lock != "held" {
			colour = yellow
		}
		client := "-" // a background process, or a prepared transaction
		switch {
		case r.ClientAddr != "":
			client = r.ClientAddr + ":" + strconv.Itoa(r.ClientPort)
		case r.ClientPort == -1:
			client = "local" // a Unix-domain socket
		}
		pid, state, xact := "-", r.State, r.XactAge
		switch {
		case r.PID != nil:
			pid = strconv.Itoa(*r.PID)
		case r.Prepared != nil:
			state = "prepared " + quoteGID(r.Prepared.GID) + " by " + r.Prepared.Owner
			xact = &r.Prepared.Age
		default:
			state = "prepared" // ended between the reads of pg_locks and pg_prepared_xacts
		}
		var waitsFor []string
		var pids []string
		for _, p := range r.WaitsFor {
			if p != 0 {
				pids = append(pids, strconv.Itoa(p))
			}
		}
		if len(pids) > 0 {
			waitsFor = append(waitsFor, "pid "+strings.Join(pids, ", "))
		}
		for _, gid := range r.WaitsForPrepared {
			waitsFor = append(waitsFor, "prepared "+quoteGID(gid))
		}
		if slices.Contains(r.WaitsFor, 0) && len(r.WaitsForPrepared) == 0 {
			waitsFor = append(waitsFor, "a prepared transaction")
		}
		t.rows = append(t.rows, []cell{
			{text: pid},
			{text: lock, colour: colour},
			{text: r.Key},
			{text: orDash(visible(r.Label)), colour: bold},
			{text: orDash(visible(r.App))},
			{text: visible(client)},
			{text: orDash(visible(state))},
			{text: age(xact)},
			{text: age(r.WaitAge)},
			{text: orDash(strings.Join(waitsFor, "; "))},
			{text: shorten(r.Query, queryWidth)},
		})
	}
	t.write(e.stdout, e.colour)
}

// quoteGID quotes a prepared transaction's gid as the SQL literal that
// COMMIT PREPARED takes, escaped by visible.
func quoteGID(gid string) string {
	return visible("'" + strings.ReplaceAll(gid, "'", "''") + "'")
}

// visible returns s with every control character escaped, so that text
// from the server (a query, an application_name, a keyspace name) cannot
// move the cursor, clear the screen or set the terminal's title: \t, \n
// and \r by name, the other C0 characters and DEL as \xHH, C1 characters
// as \u00HH, and a byte that is not UTF-8 as \xHH. Backslashes are left as
// they are; the JSON output holds the exact text.
func visible(s string) string {
	clean := true
	for _, r := range s {
		if r < 0x20 || 0x7f <= r && r <= 0x9f || r == utf8.RuneError {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var sb strings.Builder
	for _, u := range visibleUnits(s) {
		sb.WriteString(u)
	}
	return sb.String()
}

// visibleUnits splits s into what visible shows of it: one unit per
// character, where a control character's unit is its escape.
func visibleUnits(s string) []string {
	var units []string
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			units = append(units, fmt.Sprintf(`\x%02x`, s[i]))
		case r == '\t':
			units = append(units, `\t`)
		case r == '\n':
			units = append(units, `\n`)
		case r == '\r':
			units = append(units, `\r`)
		case r < 0x20 || r == 0x7f:
			units = append(units, fmt.Sprintf(`\x%02x`, r))
		case 0x80 <= r && r <= 0x9f:
			units = append(units, fmt.Sprintf(`\u%04x`, r))
		default:
			units = append(units, s[i:i+n])
		}
		i += n
	}
	return units
}

// age renders seconds for a table: "-" for none, then 0.25s, 12.3s, 4m05s,
// 2h03m.
func age(s *float64) string {
	if s == nil {
		return "-"
	}
	d := time.Duration(*s * float64(time.Second))
	switch {
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// shorten collapses the white space of q, escapes its control characters
// (visible), and cuts the result to at most n characters, ending in "…"
// when cut. It cuts between escapes, never inside one.
func shorten(q string, n int) string {
	units := visibleUnits(strings.Join(strings.Fields(q), " "))
	width := 0
	for _, u := range units {
		width += utf8.RuneCountInString(u)
	}
	if width <= n {
		return orDash(strings.Join(units, ""))
	}
	var sb strings.Builder
	width = 0
	for _, u := range units {
		w := utf8.RuneCountInString(u)
		if width+w > n-1 {
			break
		}
		sb.WriteString(u)
		width += w
	}
	return sb.String() + "…"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// A table of aligned columns, with colour on a terminal.
type table struct {
	header []string
	rows   [][]cell
}

type cell struct {
	text   string
	colour string // an SGR sequence, or ""
}

const (
	green  = "\x1b[32m"
	yellow = "\x1b[33m"
	red    = "\x1b[31m"
	bold   = "\x1b[1m"
	reset  = "\x1b[0m"
)

func (t *table) write(w io.Writer, colour bool) {
	widths := make([]int, len(t.header))
	for i, h := range t.header {
		widths[i] = len([]rune(h))
	}
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c.text)))
		}
	}
	line := func(cells []cell) {
		var sb strings.Builder
		for i, c := range cells {
			text := c.text
			if i < len(cells)-1 {
				text += strings.Repeat(" ", widths[i]-len([]rune(c.text))+2)
			}
			if colour && c.colour != "" {
				text = c.colour + strings.TrimRight(text, " ") + reset + text[len(strings.TrimRight(text, " ")):]
			}
			sb.WriteString(text)
		}
		fmt.Fprintln(w, strings.TrimRight(sb.String(), " "))
	}
	h := make([]cell, len(t.header))
	for i, s := range t.header {
		h[i] = cell{text: s}
	}
	line(h)
	for _, r := range t.rows {
		line(r)
	}
}
