package main

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

type doc struct {
	name    string
	lines   []string
	inCode  []bool // a fence, or a line inside a fenced block
	blocks  []block
	heads   []heading
	anchors map[string]bool
}

type block struct {
	lang, directive string
	fence           int // the opening fence's line (1-based)
	text            string
}

type heading struct {
	line, level int
	text        string
}

var (
	fenceRE  = regexp.MustCompile("^([ \t]*)(`{3,}|~{3,})[ \t]*([^`\\s]*)")
	headRE   = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	dirRE    = regexp.MustCompile(`^<!--\s*docs:\s*(.*?)\s*-->$`)
	htmlIDRE = regexp.MustCompile(`<a\s[^>]*(?:id|name)\s*=\s*"([^"]+)"`)
	linkRE   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

func parse(name string, src []byte) *doc {
	d := &doc{name: name, lines: strings.Split(strings.ReplaceAll(string(src), "\r\n", "\n"), "\n"), anchors: map[string]bool{}}
	d.inCode = make([]bool, len(d.lines))
	seen, prev := map[string]int{}, "" // prev: the last line that is not blank
	for i := 0; i < len(d.lines); i++ {
		if m := fenceRE.FindStringSubmatch(d.lines[i]); m != nil {
			b := block{lang: m[3], fence: i + 1}
			if m := dirRE.FindStringSubmatch(prev); m != nil {
				b.directive = m[1]
			}
			var body []string
			for d.inCode[i] = true; i+1 < len(d.lines); {
				i++
				l, t := d.lines[i], strings.TrimSpace(d.lines[i])
				if d.inCode[i] = true; len(t) >= len(m[2]) && strings.Trim(t, m[2][:1]) == "" {
					break
				}
				body = append(body, l[min(len(m[1]), len(l)-len(strings.TrimLeft(l, " \t"))):])
			}
			b.text, prev = strings.Join(body, "\n"), ""
			d.blocks = append(d.blocks, b)
			continue
		}
		if t := strings.TrimSpace(d.lines[i]); t != "" {
			prev = t
		}
		if m := headRE.FindStringSubmatch(d.lines[i]); m != nil {
			d.heads = append(d.heads, heading{i + 1, len(m[1]), m[2]})
			s := slug(m[2])
			if seen[s]++; seen[s] > 1 {
				s = fmt.Sprintf("%s-%d", s, seen[s]-1)
			}
			d.anchors[s] = true
		}
		for _, m := range htmlIDRE.FindAllStringSubmatch(d.lines[i], -1) {
			d.anchors[m[1]] = true
		}
	}
	return d
}

// slug is GitHub's anchor for a heading's text, before duplicates are
// numbered.
func slug(h string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' {
			return '-'
		} else if r == '-' || unicode.In(r, unicode.L, unicode.M, unicode.Nd, unicode.Pc) {
			return r
		}
		return -1
	}, strings.ToLower(linkRE.ReplaceAllString(h, "$1")))
}

// prose returns each line outside code blocks with its code spans blanked
// out, and the code spans that start on each line (a span may go on over
// the next lines of its paragraph).
func (d *doc) prose() (text []string, spans [][]string) {
	text, spans = make([]string, len(d.lines)), make([][]string, len(d.lines))
	in, start := false, 0
	var cur []rune
	for i, line := range d.lines {
		if d.inCode[i] || strings.TrimSpace(line) == "" {
			in, cur = false, nil
			continue
		}
		out := []rune(line)
		for j, r := range out {
			switch {
			case r == '`' && in:
				spans[start] = append(spans[start], strings.Join(strings.Fields(string(cur)), " "))
				in, cur = false, nil
			case r == '`':
				in, start = true, i
			case in:
				cur = append(cur, r)
			default:
				continue
			}
			out[j] = ' '
		}
		cur = append(cur, ' ')
		text[i] = string(out)
	}
	return text, spans
}

var (
	targetRE = []*regexp.Regexp{
		regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+["'(][^)]*)?\)`), // [text](target "title")
		regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)`),          // [ref]: target
		regexp.MustCompile(`\b(?:href|src)\s*=\s*"([^"]*)"`),
	}
	schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

func (c *checker) links(d *doc, text []string) {
	for i, t := range text {
		for _, re := range targetRE {
			for _, m := range re.FindAllStringSubmatch(t, -1) {
				if p, frag, _ := strings.Cut(m[1], "#"); m[1] != "" && !schemeRE.MatchString(m[1]) {
					if msg := c.resolve(d, p, frag); msg != "" {
						c.report(d.name, i+1, "link", "link %q: %s", m[1], msg)
					}
				}
			}
		}
	}
}

// resolve returns what is wrong with a link from d to the path p (relative
// to d, or to the root if it starts with /) and its anchor frag, or "".
func (c *checker) resolve(d *doc, p, frag string) string {
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	file := d.name
	if strings.HasPrefix(p, "/") {
		file = path.Clean(p[1:])
	} else if p != "" {
		file = path.Join(path.Dir(d.name), p)
	}
	if fi, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(file))); err != nil {
		return file + " does not exist"
	} else if frag == "" || fi.IsDir() || !strings.HasSuffix(file, ".md") {
		return ""
	}
	if t, err := c.doc(file); err != nil {
		return err.Error()
	} else if !t.anchors[frag] {
		return fmt.Sprintf("%s has no heading or id with the anchor #%s", file, frag)
	}
	return ""
}

var (
	figureRE = regexp.MustCompile(`(?:^|[^\p{L}\p{N}_.,])(\d+(?:[.,]\d+)*(?:[ \x{a0}\x{202f}]?(?:acq/s|ms|[µμ]s|ns|s|×|%)|x))(?:$|[^\p{L}\p{N}_])`)
	cmdRE    = regexp.MustCompile(`^(?:\$\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:(?:go (?:run|test)|make|bash)(?:\s|$)|(?:\./)?scripts/)`)
)

func (c *checker) figures(d *doc, text []string, spans [][]string) {
	cmd := make([]bool, len(d.lines)+1) // by line, 1-based
	for i, l := range d.lines {
		cmd[i+1] = d.inCode[i] && cmdRE.MatchString(strings.TrimSpace(l)) || slices.ContainsFunc(spans[i], cmdRE.MatchString)
	}
	has := func(from, to int) bool { return slices.Contains(cmd[from:to], true) }
	// The file's text before its first heading is a section of level 0,
	// which encloses the others; the last heading only marks the end.
	hs := append(append([]heading{{1, 0, ""}}, d.heads...), heading{len(d.lines) + 1, 0, ""})
	covered := func(k int) bool {
		end := k + 1
		for end < len(hs)-1 && hs[end].level > hs[k].level {
			end++
		}
		if has(hs[k].line, hs[end].line) {
			return true
		}
		for j, lvl := k-1, hs[k].level; j >= 0; j-- {
			if hs[j].level < lvl {
				if lvl = hs[j].level; has(hs[j].line, hs[j+1].line) {
					return true
				}
			}
		}
		return false
	}
	for k := 0; k+1 < len(hs); k++ {
		var figs []string
		first := 0
		for l := hs[k].line; l < hs[k+1].line; l++ {
			for _, m := range figureRE.FindAllStringSubmatch(text[l-1], -1) {
				if figs = append(figs, m[1]); first == 0 {
					first = l
				}
			}
		}
		if len(figs) == 0 || covered(k) {
			continue
		}
		name, more := "before the first heading", ""
		if k > 0 {
			name = fmt.Sprintf("%q", strings.Repeat("#", hs[k].level)+" "+hs[k].text)
		}
		if len(figs) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(figs)-1)
		}
		c.report(d.name, first, "figure", "%q%s in section %s, with no command that measured it (a go run, go test, make, "+
			"scripts/ or bash code span or code block line, in the section or an enclosing one's opening text)", figs[0], more, name)
	}
}
