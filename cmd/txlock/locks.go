package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgident"
	"github.com/txlock/txlock/interop"
)

const locksAbout = `Show the advisory locks of the database: who holds each and who waits for
it, with the session's pid, application_name, client address, state,
transaction age, wait age, the pids a waiter waits for, and its query.

Keys are shown by name wherever a name is known: keyspaces from --keyspace
and from the keyspace registry (txlock.Registry), key names from --name
(txlock.StringKey, and keys of every known keyspace), and the locks of other
tools (golang-migrate, Prisma Migrate, Rails, Flyway, and with --name those of
name-hashing lock libraries). With --semaphore NAME=N, a lock of slot i of
the semaphore NAME (txlock.WithSemaphore, as a StringKey and in every known
keyspace) shows as "semaphore NAME, slot i of N". A lock of a prepared
transaction has no pid: it shows as prepared 'gid', with its owner and the
time since it was prepared, until COMMIT PREPARED or ROLLBACK PREPARED ends
it. Through PgBouncer, the client address is PgBouncer's. The query and
client of other roles' sessions are shown only to superusers and members of
pg_read_all_stats. Control characters of what the server returns are shown
as escapes (\x1b).`

// locksOpts are the flags of locks.
type locksOpts struct {
	db                                string
	keyspaces, names, migrate, flyway stringList
	semaphores                        semaphoreList
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
	fs.Var(&o.semaphores, "semaphore", fmt.Sprintf("a semaphore `NAME=N` to decode the N slots of (1 to %d), as a StringKey and in every known keyspace (repeatable; split at the last =)", txlock.MaxKeys))
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

	for _, s := range o.semaphores {
		if err := txlock.StringKey(s.name).Err(); err != nil {
			return usageError(e, fs, "--semaphore %q: %v", s.flag, err)
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
	// Semaphore is the slot of a --semaphore that the key is; Name is then
	// the semaphore's name, and Label "semaphore NAME, slot i of N".
	Semaphore *semaphoreSlot `json:"semaphore,omitempty"`
	Query     string         `json:"query"`
	Database  string         `json:"database"`
	At        string         `json:"at"` // when the frame was read, RFC 3339
	key       txlock.Key
}

// preparedXact is a prepared transaction (pg_prepared_xacts), which holds
// its locks without a session until COMMIT PREPARED or ROLLBACK PREPARED.
type preparedXact struct {
	GID   string  `json:"gid"`
	Owner string  `json:"owner"`
	Age   float64 `json:"age_seconds"` // since PREPARE TRANSACTION
}

// semaphoreSlot is slot Slot (from 0) of a semaphore of Slots slots.
type semaphoreSlot struct {
	Slot  int `json:"slot"`
	Slots int `json:"slots"`
}

// semaphore is a --semaphore NAME=N.
type semaphore struct {
	flag string // as given
	name string
	n    int
}

// semaphoreList is the repeatable --semaphore flag.
type semaphoreList []semaphore

func (l *semaphoreList) String() string {
	flags := make([]string, len(*l))
	for i, s := range *l {
		flags[i] = s.flag
	}
	return strings.Join(flags, ",")
}

// Set parses NAME=N, split at the last =, so that a name may hold one.
func (l *semaphoreList) Set(v string) error {
	i := strings.LastIndexByte(v, '=')
	if i < 0 {
		return fmt.Errorf("want NAME=N, such as orders-export=8")
	}
	n, err := strconv.Atoi(v[i+1:])
	if err != nil {
		return fmt.Errorf("want NAME=N, such as orders-export=8: N %q is not a number", v[i+1:])
	}
	if err := checkSlots(n); err != nil {
		return err
	}
	*l = append(*l, semaphore{flag: v, name: v[:i], n: n})
	return nil
}

// locksFrame reads the locks once and prints them.
func locksFrame(ctx context.Context, e *env, db *sql.DB, target string, o *locksOpts, reg *txlock.Registry, flagSpaces map[int32]txlock.Keyspace, frame int) error {
	rows, database, err := readLocks(ctx, db)
	if err != nil {
		return err
	}
	d := decoder{spaces: map[int32]txlock.Keyspace{}, names: o.names, semaphores: o.semaphores,
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
	return pgident.QuoteIfNeeded(r.Schema) + "." + pgident.QuoteIfNeeded(r.Table)
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
	spaces     map[int32]txlock.Keyspace // known keyspaces by namespace
	names      []string                  // known key names
	semaphores []semaphore               // known semaphores
	hints      interop.Hints
	slots      map[int64]slotOf // the slot keys of semaphores, made on first use (slotKeys)
}

// slotOf is what a slot key is: slot of the semaphore name of n slots, in
// keyspace ks if inKeyspace.
type slotOf struct {
	ks         txlock.Keyspace
	inKeyspace bool
	name       string
	slot, n    int
}

// slotKeys returns the keys of the slots of d's semaphores, each as a
// StringKey and in every known keyspace. Where two semaphores share a slot
// key (one NAME given twice), the first given names it.
func (d *decoder) slotKeys() map[int64]slotOf {
	if d.slots != nil {
		return d.slots
	}
	d.slots = map[int64]slotOf{}
	spaces := make([]txlock.Keyspace, 0, len(d.spaces))
	for _, ks := range d.spaces {
		spaces = append(spaces, ks)
	}
	sort.Slice(spaces, func(i, j int) bool { return spaces[i].Namespace() < spaces[j].Namespace() })
	add := func(k txlock.Key, s slotOf) {
		for i := range s.n {
			v, ok := txlock.SlotKey(k, i).Int64()
			if _, seen := d.slots[v]; ok && !seen {
				s.slot = i
				d.slots[v] = s
			}
		}
	}
	for _, s := range d.semaphores {
		add(txlock.StringKey(s.name), slotOf{name: s.name, n: s.n})
		for _, ks := range spaces {
			add(ks.Key(s.name), slotOf{ks: ks, inKeyspace: true, name: s.name, n: s.n})
		}
	}
	return d.slots
}

// decode fills r's Tool, Keyspace, Name, Label and Semaphore from its key,
// where a name is known.
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
		if s, ok := d.slotKeys()[n]; ok {
			label := s.name
			if s.inKeyspace {
				r.Keyspace = s.ks.String()
				label = s.ks.String() + "/" + s.name
			}
			r.Tool, r.Name, r.Label = "txlock", s.name, slotLabel(label, s.slot, s.n)
			r.Semaphore = &semaphoreSlot{Slot: s.slot, Slots: s.n}
			return
		}
	}
	if m, ok := interop.Identify(r.key, d.hints); ok {
		r.Tool, r.Label = m.Tool, m.Label
	}
}
