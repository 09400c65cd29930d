package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// slotInt64 is the bigint of slot i of semaphoreKey.
func slotInt64(i int) int64 {
	k, _ := txlock.SlotKey(semaphoreKey, i).Int64()
	return k
}

// holdSlots takes slots of semaphoreKey in a transaction of db, which the
// returned function rolls back, as the test's end does if it has not.
func holdSlots(t *testing.T, db *sql.DB, slots ...int) (release func()) {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range slots {
		if _, err := tx.Exec(fmt.Sprintf("SELECT pg_catalog.pg_advisory_xact_lock('%d'::int8)", slotInt64(i))); err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
	}
	release = func() { _ = tx.Rollback() }
	t.Cleanup(release)
	return release
}

const heldSlotsSQL = `/*fn*/ SELECT '[' || coalesce(string_agg((s.i - 1)::text, ' ' ORDER BY s.i), '') || ']' FROM pg_catalog.unnest($1::int8[]) WITH ORDINALITY AS s(k, i)
	JOIN pg_catalog.pg_locks l ON l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.granted
	AND l.classid::bigint = (s.k >> 32 & 4294967295) AND l.objid::bigint = (s.k & 4294967295) AND l.objsubid = 1`

// heldSlots is a fn that reports which slots of semaphoreKey (from 0, as
// "[0 2]") its own backend holds.
func heldSlots(n int, got *string) work {
	keys := make([]int64, n)
	for i := range keys {
		keys[i] = slotInt64(i)
	}
	return work{
		sql: func(ctx context.Context, tx *sql.Tx, id int) error {
			return tx.QueryRowContext(ctx, heldSlotsSQL, keys).Scan(got)
		},
		pgx: func(ctx context.Context, q pgxQuerier, id int) error {
			return q.QueryRow(ctx, heldSlotsSQL, keys).Scan(got)
		},
	}
}

// TestSlotPoll checks the slots polled by hand: it takes the first free
// slot, in slot order, holding it alone while fn runs; with every slot
// taken it waits, and takes one once they are freed; and its slots are the
// ones that WithSemaphore takes.
func TestSlotPoll(t *testing.T) {
	url := pgtest.Postgres(t)
	other, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	e := testEnv(t, url)
	im := slotPoll("slot-poll", semaphoreSlots, time.Millisecond)
	var got string

	release := holdSlots(t, other, 0, 1)
	if err := im.run(ctx, e, 1, heldSlots(semaphoreSlots, &got), func() {}); err != nil {
		t.Fatal(err)
	}
	if got != "[2]" {
		t.Fatalf("with slots 0 and 1 taken, fn's backend held slots %s, want [2]", got)
	}
	release()

	release = holdSlots(t, other, 0, 1, 2, 3)
	ok, err := txlock.TryWithSemaphore(ctx, e.db, semaphoreKey, semaphoreSlots, func(context.Context, *sql.Tx) error { return nil })
	if err != nil || ok {
		t.Fatalf("with the poll's slots taken, TryWithSemaphore acquired %v, err %v; want false, nil", ok, err)
	}
	done := make(chan error, 1)
	go func() { done <- im.run(ctx, e, 1, heldSlots(semaphoreSlots, &got), func() {}) }()
	select {
	case err := <-done:
		release()
		t.Fatalf("with every slot taken, the poll returned %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the poll did not take a freed slot")
	}
	// A round may have found slots 0 and 1 taken and slot 2 freed: any one
	// slot will do.
	if !oneSlot.MatchString(got) {
		t.Fatalf("once every slot was freed, fn's backend held slots %s, want one slot", got)
	}
}

// oneSlot matches heldSlots's report of one slot of semaphoreSlots.
var oneSlot = regexp.MustCompile(`^\[[0-3]\]$`)

// TestSemaphoreImpls checks the semaphore implementations: fn runs
// holding one slot of the semaphore, on both paths; with every slot taken
// elsewhere, they wait.
func TestSemaphoreImpls(t *testing.T) {
	url := pgtest.Postgres(t)
	other, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	for _, im := range []impl{txlockSemaphoreImpl("txlock-semaphore", semaphoreSlots, theSemaphore), pgxlockSemaphoreImpl("pgxlock-semaphore", semaphoreSlots, theSemaphore)} {
		t.Run(im.name, func(t *testing.T) {
			e := testEnv(t, url)
			var got string
			granted := 0
			if err := im.run(ctx, e, 7, heldSlots(semaphoreSlots, &got), func() { granted++ }); err != nil {
				t.Fatal(err)
			}
			if granted != 1 || !oneSlot.MatchString(got) {
				t.Fatalf("granted %d times, fn's backend held slots %s; want 1 and one slot", granted, got)
			}
			release := holdSlots(t, other, 0, 1, 2, 3)
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			err := im.run(short, e, 7, heldSlots(semaphoreSlots, &got), func() { granted++ })
			release()
			if !errors.Is(err, txlock.ErrLockTimeout) || granted != 1 {
				t.Fatalf("with every slot taken: err %v, granted %d times; want ErrLockTimeout and 1", err, granted)
			}
		})
	}
}
