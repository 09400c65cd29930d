// Package progress prints an example program's report together with a
// live progress line, for the programs that sell from a stock (inventory,
// pgbouncer).
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Printer serialises the report and the progress line. On a terminal the
// progress line is rewritten in place; otherwise (a pipe, a file, a test) a
// plain line is printed every half second. Its methods are safe for
// concurrent use.
type Printer struct {
	mu   sync.Mutex
	w    io.Writer
	tty  bool
	line bool // a progress line is on screen
}

// NewPrinter returns a Printer that writes to w.
func NewPrinter(w io.Writer) *Printer {
	p := &Printer{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// Printf prints a line of the report, clearing the progress line first.
func (p *Printer) Printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintf(p.w, format, args...)
}

func (p *Printer) clearLocked() {
	if p.line {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.line = false
	}
}

// Progress shows the line status returns, until stop is called; stop
// returns the time since Progress was called, and may be called more than
// once.
func (p *Printer) Progress(status func(elapsed time.Duration) string) (stop func() time.Duration) {
	start := time.Now()
	every := 500 * time.Millisecond
	if p.tty {
		every = 100 * time.Millisecond
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			p.mu.Lock()
			if p.tty {
				fmt.Fprint(p.w, "\r"+status(time.Since(start))+"\x1b[K")
				p.line = true
			} else {
				fmt.Fprintln(p.w, status(time.Since(start)))
			}
			p.mu.Unlock()
		}
	}()
	var once sync.Once
	return func() time.Duration {
		once.Do(func() { close(done) })
		<-finished
		p.mu.Lock()
		p.clearLocked()
		p.mu.Unlock()
		return time.Since(start)
	}
}
