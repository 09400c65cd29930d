package txlock

// Tests of the draw connection's sharing rules without a database: a fake
// connection stands for the pool's.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeDrawConn is a drawConn whose draws wait for release, or for their own
// context.
type fakeDrawConn struct {
	release   chan struct{}
	started   chan context.Context
	draws     atomic.Int32
	closed    atomic.Bool
	discarded atomic.Bool
	err       error              // what a draw returns
	execErr   func(string) error // what exec returns for a statement, if set

	mu    sync.Mutex
	execs []string // the statements exec ran, with "draw" for each draw
}

func (f *fakeDrawConn) drawRow(ctx context.Context, query string, dest ...any) error {
	f.draws.Add(1)
	f.record("draw")
	if f.started != nil {
		f.started <- ctx
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return f.err
}

func (f *fakeDrawConn) exec(ctx context.Context, query string) error {
	f.record(query)
	if f.execErr != nil {
		return f.execErr(query)
	}
	return nil
}

func (f *fakeDrawConn) record(s string) {
	f.mu.Lock()
	f.execs = append(f.execs, s)
	f.mu.Unlock()
}

func (f *fakeDrawConn) statements() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.execs...)
}

func (f *fakeDrawConn) close(discard bool) {
	f.closed.Store(true)
	f.discarded.Store(discard)
}

func openFake(c *fakeDrawConn) func(context.Context) (drawConn, error) {
	return func(context.Context) (drawConn, error) { return c, nil }
}

// A holder that gives up while its draw runs gets its context's error at
// once, and the draw goes on detached from that context: the connection
// every holder shares is neither cut off nor closed, and the next draw uses
// it.
func TestDrawOutlivesItsCaller(t *testing.T) {
	c := &fakeDrawConn{release: make(chan struct{}), started: make(chan context.Context, 2)}
	handle := new(int)
	d, err := reserveDraw(context.Background(), handle, openFake(c))
	require.NoError(t, err)
	defer d.release()

	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		drawn, err := d.draw(ctx, "draw")
		assert.True(t, drawn)
		res <- err
	}()
	dctx := <-c.started
	cancel()
	select {
	case err := <-res:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the caller was not let go when its context ended")
	}
	assert.NoError(t, dctx.Err(), "the draw's own context ended with its caller's")
	close(c.release) // the detached draw finishes
	drawn, err := d.draw(context.Background(), "draw")
	assert.True(t, drawn)
	assert.NoError(t, err)
	assert.False(t, c.closed.Load(), "the shared connection was closed")
	assert.Equal(t, int32(2), c.draws.Load())
}

// A draw that fails in a way that leaves the connection unusable closes it;
// later draws report that there is none, so that the caller draws as a call
// without WithFencing does, rather than waiting for one to be opened.
func TestDrawClosesABrokenConnection(t *testing.T) {
	c := &fakeDrawConn{err: errors.New("connection reset")}
	d, err := reserveDraw(context.Background(), new(int), openFake(c))
	require.NoError(t, err)
	defer d.release()
	drawn, err := d.draw(context.Background(), "draw")
	assert.True(t, drawn)
	assert.Error(t, err)
	assert.True(t, c.closed.Load())
	drawn, err = d.draw(context.Background(), "draw")
	assert.False(t, drawn, "a draw used a closed connection")
	assert.NoError(t, err)

	// An answer of the server's (a missing sequence) keeps the connection.
	c2 := &fakeDrawConn{err: sqlStateError("42P01")}
	d2, err := reserveDraw(context.Background(), new(int), openFake(c2))
	require.NoError(t, err)
	defer d2.release()
	_, err = d2.draw(context.Background(), "draw")
	assert.Equal(t, "42P01", SQLState(err))
	assert.False(t, c2.closed.Load())
}

// While one call opens the draw connection (waiting for a connection of the
// pool), a draw does not wait for it: it reports that there is none. A
// second reservation waits for the opening, and shares the connection; the
// last release closes it.
func TestDrawNeverWaitsForAnOpening(t *testing.T) {
	handle := new(int)
	c := &fakeDrawConn{}
	opening := make(chan struct{})
	unblock := make(chan struct{})
	open := func(context.Context) (drawConn, error) {
		close(opening)
		<-unblock
		return c, nil
	}
	first := make(chan *drawer, 1)
	go func() {
		d, err := reserveDraw(context.Background(), handle, open)
		assert.NoError(t, err)
		first <- d
	}()
	<-opening
	drawers.Lock()
	d := drawers.m[handle]
	drawers.Unlock()
	require.NotNil(t, d)
	drawn, err := d.draw(context.Background(), "draw")
	assert.False(t, drawn, "a draw waited for, or used, a connection still being opened")
	assert.NoError(t, err)
	second := make(chan *drawer, 1)
	go func() {
		d, err := reserveDraw(context.Background(), handle, func(context.Context) (drawConn, error) {
			t.Error("a second opening while one was under way")
			return nil, errors.New("no")
		})
		assert.NoError(t, err)
		second <- d
	}()
	close(unblock)
	d1, d2 := <-first, <-second
	assert.Same(t, d1, d2)
	d1.release()
	assert.False(t, c.closed.Load(), "closed while a reservation remained")
	d2.release()
	assert.True(t, c.closed.Load(), "the last release did not give the connection back")
	drawers.Lock()
	assert.NotContains(t, drawers.m, any(handle))
	drawers.Unlock()
}

// The draw connection stays in a transaction while it is set aside: it is
// begun when the connection is opened, each draw commits it and begins the
// next in one statement (one message), a draw the server refuses rolls it
// back and begins again, and the last release rolls it back. A draw whose
// commit fails returns no token and discards the connection, as does a
// release whose rollback fails.
func TestDrawPinsItsTransaction(t *testing.T) {
	const commit, again = "COMMIT;\n" + drawPin, "ROLLBACK;\n" + drawPin
	c := &fakeDrawConn{}
	d, err := reserveDraw(context.Background(), new(int), openFake(c))
	require.NoError(t, err)
	assert.Equal(t, []string{drawPin}, c.statements(), "opening")
	drawn, err := d.draw(context.Background(), "draw")
	require.True(t, drawn)
	require.NoError(t, err)
	assert.Equal(t, []string{drawPin, "draw", commit}, c.statements(), "a draw")

	c.err = sqlStateError("42P01")
	_, err = d.draw(context.Background(), "draw")
	assert.Equal(t, "42P01", SQLState(err))
	assert.Equal(t, []string{drawPin, "draw", commit, "draw", again}, c.statements(), "a refused draw")
	assert.False(t, c.closed.Load())
	d.release()
	assert.Equal(t, "ROLLBACK", c.statements()[5], "the release")
	assert.True(t, c.closed.Load())
	assert.False(t, c.discarded.Load(), "a connection rolled back was discarded")

	// The commit fails: no token, and the connection is discarded.
	c2 := &fakeDrawConn{execErr: func(q string) error {
		if q == commit {
			return sqlStateError("40001")
		}
		return nil
	}}
	d2, err := reserveDraw(context.Background(), new(int), openFake(c2))
	require.NoError(t, err)
	_, err = d2.draw(context.Background(), "draw")
	assert.ErrorContains(t, err, "committing the draw")
	assert.True(t, c2.discarded.Load())
	drawn, _ = d2.draw(context.Background(), "draw")
	assert.False(t, drawn, "a draw used a discarded connection")
	d2.release()

	// The rollback at release fails: the connection is discarded.
	c3 := &fakeDrawConn{execErr: func(q string) error {
		if q == "ROLLBACK" {
			return errors.New("connection reset")
		}
		return nil
	}}
	d3, err := reserveDraw(context.Background(), new(int), openFake(c3))
	require.NoError(t, err)
	d3.release()
	assert.True(t, c3.discarded.Load())

	// The transaction cannot be begun: the reservation fails, and the
	// connection is discarded.
	c4 := &fakeDrawConn{execErr: func(string) error { return sqlStateError("25001") }}
	_, err = reserveDraw(context.Background(), new(int), openFake(c4))
	assert.Equal(t, "25001", SQLState(err))
	assert.True(t, c4.discarded.Load())
}

// slowDraws is a fakeLock whose pool takes reserve to set a draw
// connection aside, on the fake clock.
type slowDraws struct {
	*fakeLock
	clk     *fakeClock
	reserve time.Duration
}

func (s slowDraws) drawPool() (any, func(context.Context) (drawConn, error), error) {
	return s, func(context.Context) (drawConn, error) {
		s.clk.advance(s.reserve)
		return &fakeDrawConn{}, nil
	}, nil
}

// Setting the draw connection aside is part of WithFencing's wait: each
// round's wait has what is left of WithTimeout, and the call's config stays
// what the options said.
func TestReservationCountsAgainstTheWait(t *testing.T) {
	clk := newFakeClock()
	c := testConfig(t, clk, WithTimeout(time.Second), WithFencing())
	a := slowDraws{fakeLock: &fakeLock{name: "a", srv: &fakeServer{}}, clk: clk, reserve: 300 * time.Millisecond}
	start := clk.now()
	ok, err := loopOn(context.Background(), c, c.waitMode(false), a, testKeys, nil)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, a.bounds, 1)
	assert.Equal(t, start.Add(time.Second), a.bounds[0].deadline, "the wait ends a second after the call began, the reservation included")
	assert.Equal(t, time.Second, c.timeout, "config is not changed by the call")
}
