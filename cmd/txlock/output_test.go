package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestColourOnlyOnATerminal: colour is chosen only for a character device,
// never for a pipe, a file or a buffer, and never with NO_COLOR set.
func TestColourOnlyOnATerminal(t *testing.T) {
	dev, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer dev.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "out"))
	require.NoError(t, err)
	defer file.Close()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.True(t, isTerminal(dev), "a character device")
	assert.False(t, isTerminal(file))
	assert.False(t, isTerminal(w))
	assert.False(t, isTerminal(&bytes.Buffer{}))

	for _, tc := range []struct {
		noColour string
		want     bool
	}{{"", true}, {"1", false}} {
		e := newEnv(func(k string) string {
			if k == "NO_COLOR" {
				return tc.noColour
			}
			return ""
		}, dev, dev)
		assert.Equal(t, tc.want, e.colour, "NO_COLOR=%q", tc.noColour)
		assert.True(t, e.terminal, "NO_COLOR=%q: a terminal is one with or without colour", tc.noColour)
	}
}

var sgr = regexp.MustCompile("\x1b\\[[0-9;]*m")

// TestTableAligned: columns line up by visible characters, with colour or
// without, and with characters of several bytes.
func TestTableAligned(t *testing.T) {
	tab := table{header: []string{"A", "BB", "C"}}
	tab.rows = [][]cell{
		{{text: "ünï"}, {text: "held", colour: green}, {text: "x"}},
		{{text: "1"}, {text: "waiting", colour: yellow}, {text: "yy"}},
	}
	for _, colour := range []bool{false, true} {
		var buf bytes.Buffer
		tab.write(&buf, colour)
		out := buf.String()
		assert.Equal(t, colour, strings.Contains(out, "\x1b["), "colour %v", colour)
		lines := strings.Split(strings.TrimSuffix(sgr.ReplaceAllString(out, ""), "\n"), "\n")
		require.Len(t, lines, 3)
		col := -1
		for _, l := range lines {
			i := strings.LastIndex(l, " ")
			c := utf8.RuneCountInString(l[:i+1])
			if col >= 0 {
				assert.Equal(t, col, c, "the last column starts at the same place: %q", lines)
			}
			col = c
		}
	}
}
