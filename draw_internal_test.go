package txlock

// Tests of the draw connection's sharing rules without a database: a fake
// connection stands for the pool's.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeDrawConn is a drawConn whose draws wait for release, or for their own
// context.
type fakeDrawConn struct {
	release chan struct{}
	started chan context.Context
	draws   atomic.Int32
	closed  atomic.Bool
	err     error // what a draw returns
}

func (f *fakeDrawConn) drawRow(ctx context.Context, query string, dest ...any) error {
	f.draws.Add(1)
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

func (f *fakeDrawConn) close() { f.closed.Store(true) }

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
