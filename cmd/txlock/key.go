package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/txlock/txlock"
)

const keyAbout = `Show the key txlock derives from NAME (txlock.StringKey), or from NAME in
the keyspace SERVICE (txlock.NewKeyspace(SERVICE).Key(NAME)): its numbers,
the (classid, objid, objsubid) under which pg_locks shows it, and the SQL
that takes the same lock, by its numbers and from the name. With --slots N,
NAME names a semaphore (txlock.WithSemaphore) of N slots, and key shows
each slot's key (txlock.SlotKey) instead, as "semaphore NAME, slot i of N".`

func keyCmd(_ context.Context, e *env, args []string) int {
	fs := newFlags("key", "[--keyspace SERVICE] [--slots N] NAME...", keyAbout)
	keyspace := fs.String("keyspace", "", "the keyspace (service name) NAME belongs to; none for a StringKey")
	slots := fs.Int("slots", 0, fmt.Sprintf("show the keys of the `N` slots of the semaphore NAME (1 to %d), not NAME's key", txlock.MaxKeys))
	names, code, stop := parse(e, fs, args)
	if stop {
		return code
	}
	if len(names) == 0 {
		return usageError(e, fs, "no NAME given")
	}
	semaphore := flagSet(fs, "slots")
	if semaphore {
		if err := checkSlots(*slots); err != nil {
			return usageError(e, fs, "--slots: %v", err)
		}
	}
	inKeyspace := flagSet(fs, "keyspace")
	var ks txlock.Keyspace
	if inKeyspace {
		ks = txlock.NewKeyspace(*keyspace)
		if err := ks.Err(); err != nil {
			return usageError(e, fs, "--keyspace: %v", err)
		}
	}
	for i, name := range names {
		var k txlock.Key
		if inKeyspace {
			k = ks.Key(name)
		} else {
			k = txlock.StringKey(name)
		}
		if err := k.Err(); err != nil {
			return usageError(e, fs, "NAME %d: %v", i+1, err)
		}
		if !semaphore {
			if i > 0 {
				fmt.Fprintln(e.stdout)
			}
			writeKey(e.stdout, ks, inKeyspace, name, k)
			continue
		}
		for slot := range *slots {
			if i > 0 || slot > 0 {
				fmt.Fprintln(e.stdout)
			}
			writeSlot(e.stdout, ks, inKeyspace, name, k, slot, *slots)
		}
	}
	return exitOK
}

// checkSlots checks a semaphore's number of slots, as WithSemaphore does.
func checkSlots(n int) error {
	if n < 1 || n > txlock.MaxKeys {
		return fmt.Errorf("a semaphore has 1 to %d slots (txlock.MaxKeys), got %d", txlock.MaxKeys, n)
	}
	return nil
}

// slotLabel describes slot i of the semaphore named label (a key's name,
// or keyspace/name) of n slots, as key and locks show it.
func slotLabel(label string, i, n int) string {
	return fmt.Sprintf("semaphore %s, slot %d of %d", label, i, n)
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// writeKey prints k, made from name (in ks when inKeyspace), as key shows
// it.
func writeKey(w io.Writer, ks txlock.Keyspace, inKeyspace bool, name string, k txlock.Key) {
	classid, objid, objsubid := pgLocks(k)
	var rows [][2]string
	if inKeyspace {
		rows = append(rows, [2]string{"keyspace", fmt.Sprintf("%s, namespace %d", ks, ks.Namespace())})
	}
	rows = append(rows,
		[2]string{"key", k.String()},
		[2]string{"pg_locks", fmt.Sprintf("classid=%d objid=%d objsubid=%d", classid, objid, objsubid)},
		[2]string{"sql", "pg_advisory_xact_lock(" + numbers(k) + ")"},
	)
	if inKeyspace {
		rows = append(rows, [2]string{"from name", "pg_advisory_xact_lock(" + hash32SQL(ks.String()) + ", " + hash32SQL(name) + ")"})
	} else {
		rows = append(rows, [2]string{"from name", "pg_advisory_xact_lock(" + hash64SQL(name) + ")"})
	}
	for _, r := range rows {
		fmt.Fprintf(w, "%-10s %s\n", r[0]+":", r[1])
	}
}

// writeSlot prints the key of slot i of the semaphore of n slots whose key
// is k, made from name (in ks when inKeyspace), as key --slots shows it.
func writeSlot(w io.Writer, ks txlock.Keyspace, inKeyspace bool, name string, k txlock.Key, i, n int) {
	sk := txlock.SlotKey(k, i)
	classid, objid, objsubid := pgLocks(sk)
	label, fromName := name, slotSQL("\\x01", "int8send("+hash64SQL(name)+")", i)
	var rows [][2]string
	if inKeyspace {
		label = ks.String() + "/" + name
		fromName = slotSQL("\\x02", "int4send("+hash32SQL(ks.String())+") || int4send("+hash32SQL(name)+")", i)
		rows = append(rows, [2]string{"keyspace", fmt.Sprintf("%s, namespace %d", ks, ks.Namespace())})
	}
	rows = append(rows,
		[2]string{"name", slotLabel(label, i, n)}, // as locks names it
		[2]string{"slot", strconv.Itoa(i)},
		[2]string{"key", sk.String()},
		[2]string{"pg_locks", fmt.Sprintf("classid=%d objid=%d objsubid=%d", classid, objid, objsubid)},
		[2]string{"sql", "pg_advisory_xact_lock(" + numbers(sk) + ")"},
		[2]string{"from name", "pg_advisory_xact_lock(" + fromName + ")"},
	)
	for _, r := range rows {
		fmt.Fprintf(w, "%-10s %s\n", r[0]+":", r[1])
	}
}

// slotSQL is SlotKey's SQL (semaphore.go) for slot i of the key whose
// bytes the SQL expression key gives, after the tag byte of its kind.
func slotSQL(tag, key string, i int) string {
	return "('x' || left(encode(sha256('" + tag + "'::bytea || " + key + " || int4send(" + strconv.Itoa(i) + ")), 'hex'), 16))::bit(64)::bigint"
}

// pgLocks returns the (classid, objid, objsubid) under which pg_locks shows
// k: txlock.KeyFromPgLocks's inverse.
func pgLocks(k txlock.Key) (classid, objid uint32, objsubid int) {
	if a, b, ok := k.Pair(); ok {
		return uint32(a), uint32(b), 2
	}
	v, _ := k.Int64()
	return uint32(uint64(v) >> 32), uint32(v), 1
}

// numbers renders k as the arguments of an advisory lock function, in
// decimal. The smallest bigint and int4 need no casts: PostgreSQL folds the
// minus sign into the literal, so -9223372036854775808 is a bigint and
// -2147483648 an integer (TestKeySQLOnServer takes both).
func numbers(k txlock.Key) string {
	if a, b, ok := k.Pair(); ok {
		return strconv.FormatInt(int64(a), 10) + ", " + strconv.FormatInt(int64(b), 10)
	}
	v, _ := k.Int64()
	return strconv.FormatInt(v, 10)
}

// hash64SQL is StringKey's SQL (keyspace.go) for name.
func hash64SQL(name string) string {
	return "('x' || left(encode(sha256(convert_to(" + sqlLiteral(name) + ", 'UTF8')), 'hex'), 16))::bit(64)::bigint"
}

// hash32SQL is the SQL of NewKeyspace's namespace and of Keyspace.Key's
// second half (keyspace.go) for name.
func hash32SQL(name string) string {
	return "('x' || left(encode(sha256(convert_to(" + sqlLiteral(name) + ", 'UTF8')), 'hex'), 8))::bit(32)::int4"
}

// sqlLiteral quotes s as an SQL string literal: '…' with each ' doubled, or,
// if s holds a backslash, E'…' with each \ doubled too, which reads the same
// whatever standard_conforming_strings says.
func sqlLiteral(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		q = "E'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", "''") + "'"
	}
	return q
}
