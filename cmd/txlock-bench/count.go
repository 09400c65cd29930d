package main

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Counting what each implementation sends: statements to PostgreSQL (a pgx
// tracer) and commands to Redis (a go-redis hook).

// counter counts statements sent to PostgreSQL, except those of the
// guarded work itself (marked with a leading /*fn*/ comment). A query of
// several statements (pgxlock's polling attempt: the lock statement, then
// BEGIN) counts those that ran: all of them when it succeeds, the first
// only when it fails, as a busy attempt's lock statement does, which ends
// the query before its BEGIN.
type counter struct {
	n atomic.Int64
	// The statements after the first of each connection's query in flight,
	// if it has several: a map, not a context value, so that counting
	// allocates nothing per query once the map has room for the
	// connections.
	mu       sync.Mutex
	more     map[*pgx.Conn]int64
	inFlight atomic.Int64 // entries of more, read without mu
}

func (c *counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "/*fn*/") {
		return ctx
	}
	c.n.Add(1)
	if strings.IndexByte(d.SQL, ';') < 0 {
		return ctx
	}
	if n := countStatements(d.SQL); n > 1 {
		c.mu.Lock()
		if c.more == nil {
			c.more = map[*pgx.Conn]int64{}
		}
		c.more[conn] = int64(n - 1)
		c.inFlight.Add(1)
		c.mu.Unlock()
	}
	return ctx
}

func (c *counter) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	if c.inFlight.Load() == 0 { // the usual case: one statement per query
		return
	}
	c.mu.Lock()
	n, ok := c.more[conn]
	if ok {
		delete(c.more, conn)
		c.inFlight.Add(-1)
	}
	c.mu.Unlock()
	if ok && d.Err == nil {
		c.n.Add(n)
	}
}

// countStatements returns the number of statements in query: its
// semicolons outside quotes, identifiers and comments, plus one unless the
// text after the last of them is empty. It knows the SQL this program and
// the library send, dollar quoting included (its window is a DO block).
func countStatements(query string) int {
	n := 0
	pending := false // text after the last semicolon
	for i := 0; i < len(query); i++ {
		switch ch := query[i]; {
		case ch == '$' && dollarTag(query[i:]) != "":
			tag := dollarTag(query[i:])
			j := strings.Index(query[i+len(tag):], tag)
			if j < 0 {
				i = len(query)
			} else {
				i += len(tag) + j + len(tag) - 1
			}
			pending = true
		case ch == '\'' || ch == '"':
			j := strings.IndexByte(query[i+1:], ch)
			if j < 0 {
				i = len(query)
			} else {
				i += j + 1 // a doubled quote is two quoted strings, side by side
			}
			pending = true
		case ch == '-' && strings.HasPrefix(query[i:], "--"):
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query) - i
			}
			i += j
		case ch == '/' && strings.HasPrefix(query[i:], "/*"):
			j := strings.Index(query[i+2:], "*/")
			if j < 0 {
				i = len(query)
			} else {
				i += j + 3
			}
		case ch == ';':
			if pending {
				n++
			}
			pending = false
		case ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r':
			pending = true
		}
	}
	if pending {
		n++
	}
	return n
}

// dollarTag returns the dollar quote that s begins with ($$ or $tag$),
// or "" if it begins with none (a parameter such as $1, or no $).
func dollarTag(s string) string {
	for i := 1; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '$':
			return s[:i+1]
		case ch == '_' || 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || i > 1 && '0' <= ch && ch <= '9':
		default:
			return ""
		}
	}
	return ""
}

type redisCounter struct{ n *atomic.Int64 }

func (h redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
