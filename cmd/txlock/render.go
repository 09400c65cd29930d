package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// How txlock locks writes what it found: the table, and the text helpers
// that keep the server's strings visible and short.

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
