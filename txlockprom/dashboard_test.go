package txlockprom_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/txlockprom"
)

// The dashboard's Grafana JSON, as far as the test reads it.
type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []dashboardVar `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboardVar struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or an object with a field query
	Definition string          `json:"definition"`
	Datasource *datasourceRef  `json:"datasource"`
}

type dashboardPanel struct {
	ID         int              `json:"id"`
	Type       string           `json:"type"`
	Title      string           `json:"title"`
	Datasource *datasourceRef   `json:"datasource"`
	Targets    []panelTarget    `json:"targets"`
	Panels     []dashboardPanel `json:"panels"` // a collapsed row's
}

type panelTarget struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// notOnDashboard are the metrics the dashboard leaves out on purpose, and
// why. A metric txlockprom exports is on the dashboard or here.
var notOnDashboard = map[string]string{
	"txlock_acquisitions_total": "it counts what the count of txlock_wait_seconds with outcome acquired counts",
}

// TestDashboard checks grafana-dashboard.json, as Dashboard returns it,
// against the series a registry holds once txlockprom has counted real lock
// calls and every other event: each query of each panel names only series
// that exist (a histogram's through _bucket, _sum and _count), with labels
// and label values those series have, filters by the keyspace variable, and
// goes to the datasource variable; and each metric is on the dashboard.
func TestDashboard(t *testing.T) {
	raw := txlockprom.Dashboard()
	file, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	require.Equal(t, file, raw, "Dashboard() is not the module's grafana-dashboard.json")
	raw[0] = 'x'
	require.Equal(t, file, txlockprom.Dashboard(), "changing what Dashboard returned changed what it returns")

	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(file))
	require.NoError(t, dec.Decode(&d), "grafana-dashboard.json does not parse")
	require.False(t, dec.More(), "grafana-dashboard.json holds more than one JSON value")
	assert.NotEmpty(t, d.UID)
	assert.NotEmpty(t, d.Title)
	assert.Positive(t, d.SchemaVersion)

	exported := exportedSeries(t)
	vars := checkVariables(t, d.Templating.List, exported)

	panels := flattenPanels(d.Panels)
	require.NotEmpty(t, panels, "the dashboard has no panels")
	ids := map[int]string{}
	used := map[string]bool{} // the series the queries name
	for _, p := range panels {
		if p.Type == "row" {
			continue
		}
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: panel %q has the same id", where, other)
		}
		ids[p.ID] = p.Title
		checkDatasource(t, where, p.Datasource)
		if !assert.NotEmpty(t, p.Targets, "%s has no queries", where) {
			continue
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			where := fmt.Sprintf("%s, query %s", where, tg.RefID)
			assert.False(t, refs[tg.RefID], "%s: two queries have this refId", where)
			refs[tg.RefID] = true
			if tg.Datasource != nil {
				checkDatasource(t, where, tg.Datasource)
			}
			names, errs := checkExpr(tg.Expr, exported, vars)
			for _, err := range errs {
				t.Errorf("%s: %s: %v", where, tg.Expr, err)
			}
			for _, n := range names {
				used[n] = true
			}
		}
	}

	// Every metric is on the dashboard, but those left out on purpose.
	families := map[string]bool{}
	for _, s := range exported {
		families[s.family] = true
	}
	for _, family := range sortedKeys(families) {
		if notOnDashboard[family] == "" && !usesFamily(used, exported, family) {
			t.Errorf("no panel shows %s: add a query of it, or say in notOnDashboard why it is left out", family)
		}
	}
	for family := range notOnDashboard {
		assert.True(t, hasFamily(exported, family), "notOnDashboard names %s, which txlockprom does not export", family)
	}
}

// TestDashboardCheck checks that the check of TestDashboard refuses the
// mistakes it is there for, so that it cannot pass by checking nothing.
func TestDashboardCheck(t *testing.T) {
	exported := exportedSeries(t)
	vars := map[string]bool{"keyspace": true, "datasource": true}
	for _, tc := range []struct {
		expr, want string // want "": no error
	}{
		{`sum by (outcome) (rate(txlock_wait_seconds_count{keyspace=~"$keyspace"}[$__rate_interval]))`, ""},
		{`histogram_quantile(0.99, sum by (le) (rate(txlock_hold_seconds_bucket{keyspace=~"${keyspace}", outcome="committed"}[5m])))`, ""},
		{`sum(rate(txlock_wait_seconds_total{keyspace=~"$keyspace"}[5m]))`, "txlock_wait_seconds_total is not a series txlockprom exports"},
		{`sum(rate(txlock_wait_seconds{keyspace=~"$keyspace"}[5m]))`, "txlock_wait_seconds is not a series txlockprom exports"},
		{`sum(rate(txlock_timeout_total{keyspace=~"$keyspace"}[5m]))`, "txlock_timeout_total is not a series"},
		{`sum by (outcome) (rate(txlock_timeouts_total{keyspace=~"$keyspace"}[5m]))`, "label outcome of a label list (by, without, on...) is not a label of txlock_timeouts_total"},
		{`sum(rate(txlock_stale_writes_total{keyspace=~"$keyspace", mode="shared"}[5m]))`, "label mode is not a label of txlock_stale_writes_total"},
		{`sum by (le) (rate(txlock_wait_seconds_count{keyspace=~"$keyspace"}[5m]))`, "label le of a label list (by, without, on...) is not a label of txlock_wait_seconds_count"},
		{`sum(rate(txlock_wait_seconds_count{keyspace=~"$keyspace", outcome="aquired"}[5m]))`, `no series of txlock_wait_seconds_count has outcome="aquired"`},
		{`sum(rate(txlock_wait_seconds_count[5m]))`, `txlock_wait_seconds_count is not filtered by keyspace=~"$keyspace"`},
		{`sum(rate(txlock_wait_seconds_count{keyspace=~"$keyspace"}[$interval]))`, "variable $interval is not one of the dashboard's"},
		{`sum(rate(txlock_wait_seconds_count{keyspace=~"$keyspaces"}[5m]))`, "variable $keyspaces is not one of the dashboard's"},
		{`summ(rate(txlock_wait_seconds_count{keyspace=~"$keyspace"}[5m]))`, "unknown function summ"},
		{`sum(rate({keyspace=~"$keyspace"}[5m]))`, "a selector without a metric name"},
		{`sum(rate(txlock_wait_seconds_count{keyspace=~"$keyspace"}[5m])`, "unbalanced"},
		{``, "an empty query"},
	} {
		_, errs := checkExpr(tc.expr, exported, vars)
		if tc.want == "" {
			assert.Empty(t, errs, tc.expr)
			continue
		}
		msgs := fmt.Sprint(errs)
		assert.Contains(t, msgs, tc.want, tc.expr)
	}
}

// An exported series: one name a query can select, the metric family it
// belongs to, and the values of each of its labels.
type exportedSeriesInfo struct {
	family string
	labels map[string]map[string]bool
}

// exportedSeries registers an Observer with a registry of its own, counts
// real lock calls on the test server (an acquisition, a hold, a timeout
// behind a holder, busy attempts) and then, through the same Observe, every
// other kind of event, so that every metric has series; and returns the
// series names the registry's families expose, by name.
func exportedSeries(t *testing.T) map[string]exportedSeriesInfo {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := txlockprom.New(reg)
	require.NoError(t, err)
	db := open(t, pgtest.Postgres(t))
	locker, err := txlock.New(db, txlock.WithObserver(obs))
	require.NoError(t, err)
	ctx := context.Background()
	ks := txlock.NewKeyspace("dashboard")
	noop := func(context.Context, *sql.Tx) error { return nil }
	require.NoError(t, locker.WithLock(ctx, ks.Key(uniq(t)), noop))
	held := ks.Key(uniq(t))
	hold(t, db, held)
	require.ErrorIs(t, locker.WithLock(ctx, held, noop, txlock.WithTimeout(50*time.Millisecond)), txlock.ErrLockTimeout)
	// The events no quick call on one server meets (a standby, a lost term,
	// a stale write...), and both modes and both ends of a hold: every
	// kind there is, until String says it knows no more.
	for k := txlock.EventKind(1); !strings.HasPrefix(k.String(), "EventKind("); k++ {
		for _, shared := range []bool{false, true} {
			for _, committed := range []bool{false, true} {
				obs.Observe(ctx, txlock.Event{Kind: k, Keys: []txlock.Key{ks.Key("k")}, Shared: shared, Committed: committed,
					Attempts: 1, Waited: time.Millisecond, Held: time.Millisecond})
			}
		}
	}

	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]exportedSeriesInfo{}
	add := func(family, name string, m *dto.Metric, extra map[string][]string) {
		s, ok := out[name]
		if !ok {
			s = exportedSeriesInfo{family: family, labels: map[string]map[string]bool{}}
			out[name] = s
		}
		for _, l := range m.GetLabel() {
			if s.labels[l.GetName()] == nil {
				s.labels[l.GetName()] = map[string]bool{}
			}
			s.labels[l.GetName()][l.GetValue()] = true
		}
		for label, values := range extra {
			if s.labels[label] == nil {
				s.labels[label] = map[string]bool{}
			}
			for _, v := range values {
				s.labels[label][v] = true
			}
		}
	}
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, "txlock_") {
			continue
		}
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				var le []string
				for _, b := range m.GetHistogram().GetBucket() {
					le = append(le, strconv.FormatFloat(b.GetUpperBound(), 'f', -1, 64))
				}
				add(name, name+"_bucket", m, map[string][]string{"le": append(le, "+Inf")})
				add(name, name+"_sum", m, nil)
				add(name, name+"_count", m, nil)
			case dto.MetricType_SUMMARY:
				var q []string
				for _, v := range m.GetSummary().GetQuantile() {
					q = append(q, strconv.FormatFloat(v.GetQuantile(), 'f', -1, 64))
				}
				add(name, name, m, map[string][]string{"quantile": q})
				add(name, name+"_sum", m, nil)
				add(name, name+"_count", m, nil)
			default:
				add(name, name, m, nil)
			}
		}
	}
	// What the package's documentation lists: the exercise above reached
	// every metric.
	for _, family := range []string{"txlock_wait_seconds", "txlock_hold_seconds", "txlock_acquisitions_total",
		"txlock_timeouts_total", "txlock_fail_opens_total", "txlock_stale_writes_total", "txlock_standby_refusals_total",
		"txlock_hold_timeouts_total", "txlock_busy_attempts_total", "txlock_serialization_retries_total", "txlock_terms_lost_total"} {
		assert.True(t, hasFamily(out, family), "the registry holds no series of %s", family)
	}
	return out
}

func hasFamily(exported map[string]exportedSeriesInfo, family string) bool {
	for _, s := range exported {
		if s.family == family {
			return true
		}
	}
	return false
}

// usesFamily reports whether a query names a series of family.
func usesFamily(used map[string]bool, exported map[string]exportedSeriesInfo, family string) bool {
	for name := range used {
		if exported[name].family == family {
			return true
		}
	}
	return false
}

func flattenPanels(ps []dashboardPanel) []dashboardPanel {
	var out []dashboardPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flattenPanels(p.Panels)...)
	}
	return out
}

// checkDatasource checks that ref is the datasource variable.
func checkDatasource(t *testing.T, where string, ref *datasourceRef) {
	t.Helper()
	if ref == nil || ref.Type != "prometheus" || ref.UID != "${datasource}" {
		t.Errorf("%s: datasource %+v; want the variable: {\"type\": \"prometheus\", \"uid\": \"${datasource}\"}", where, ref)
	}
}

var labelValuesQuery = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// checkVariables checks the dashboard's variables, datasource (a Prometheus
// data source) and keyspace (the values of the label keyspace), and returns
// their names.
func checkVariables(t *testing.T, list []dashboardVar, exported map[string]exportedSeriesInfo) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	byName := map[string]dashboardVar{}
	for _, v := range list {
		assert.False(t, vars[v.Name], "two variables are named %q", v.Name)
		vars[v.Name] = true
		byName[v.Name] = v
	}
	ds, ok := byName["datasource"]
	if assert.True(t, ok, "the dashboard has no variable datasource") {
		assert.Equal(t, "datasource", ds.Type, "variable datasource")
		assert.Equal(t, "prometheus", queryText(t, ds.Query), "variable datasource's data source type")
	}
	ks, ok := byName["keyspace"]
	if assert.True(t, ok, "the dashboard has no variable keyspace") {
		assert.Equal(t, "query", ks.Type, "variable keyspace")
		checkDatasource(t, "variable keyspace", ks.Datasource)
		q := queryText(t, ks.Query)
		m := labelValuesQuery.FindStringSubmatch(q)
		if assert.NotNil(t, m, "variable keyspace's query %q is not label_values(metric, label)", q) {
			s, found := exported[m[1]]
			assert.True(t, found, "variable keyspace's query names %s, which is not a series txlockprom exports", m[1])
			assert.Equal(t, "keyspace", m[2], "variable keyspace's query")
			if found {
				assert.Contains(t, s.labels, m[2], "variable keyspace's query: %s has no label %s", m[1], m[2])
			}
		}
		if ks.Definition != "" {
			assert.Equal(t, q, ks.Definition, "variable keyspace's definition and query differ")
		}
	}
	return vars
}

// queryText returns a variable's query: a string, or the field query of an
// object.
func queryText(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	require.NoError(t, json.Unmarshal(raw, &o), "a variable's query is neither a string nor an object: %s", raw)
	return o.Query
}

// grafanaVars are Grafana's own variables a query may use.
var grafanaVars = map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}

// PromQL's aggregation operators and functions.
var promqlFuncs = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
		abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year days_in_month
		delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
		histogram_sum hour idelta increase irate label_join label_replace ln log2 log10 minute month predict_linear rate resets
		round scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year
		avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time
		stdvar_over_time last_over_time present_over_time mad_over_time
		acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg rad pi start end`) {
		promqlFuncs[f] = true
	}
}

// PromQL's keywords: those followed by a list of label names, and the
// others.
var (
	promqlLabelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	promqlKeywords   = map[string]bool{"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true, "inf": true, "nan": true}
)

type tokenKind int

const (
	tokIdent tokenKind = iota
	tokString
	tokNumber // a number or a duration
	tokVar    // a Grafana variable: $name or ${name...}
	tokOp     // punctuation and operators
)

type token struct {
	kind tokenKind
	text string // a string's value, unquoted; a variable's name
}

var varRef = regexp.MustCompile(`\$(?:\{([a-zA-Z_][a-zA-Z0-9_]*)[^}]*\}|([a-zA-Z_][a-zA-Z0-9_]*))`)

// lex splits a PromQL expression, with Grafana's variables in it, into
// tokens.
func lex(expr string) ([]token, error) {
	var toks []token
	isIdent := func(c byte, first bool) bool {
		return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case isIdent(c, true):
			j := i
			for j < len(expr) && isIdent(expr[j], false) {
				j++
			}
			toks = append(toks, token{tokIdent, expr[i:j]})
			i = j
		case '0' <= c && c <= '9' || c == '.':
			j := i
			for j < len(expr) && (isIdent(expr[j], false) || expr[j] == '.') {
				j++
			}
			toks = append(toks, token{tokNumber, expr[i:j]})
			i = j
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("an unterminated string at %d", i)
			}
			s := expr[i+1 : j]
			var err error
			switch c {
			case '"':
				s, err = strconv.Unquote(expr[i : j+1])
			case '\'':
				s, err = strconv.Unquote(`"` + strings.ReplaceAll(strings.ReplaceAll(s, `\'`, `'`), `"`, `\"`) + `"`)
			}
			if err != nil {
				return nil, fmt.Errorf("the string at %d: %v", i, err)
			}
			toks = append(toks, token{tokString, s})
			i = j + 1
		case c == '$':
			m := varRef.FindStringSubmatch(expr[i:])
			if m == nil {
				return nil, fmt.Errorf("a $ that starts no variable at %d", i)
			}
			toks = append(toks, token{tokVar, m[1] + m[2]})
			i += len(m[0])
		default:
			op := string(c)
			if i+1 < len(expr) && slices.Contains([]string{"=~", "!~", "!=", "==", "<=", ">="}, expr[i:i+2]) {
				op = expr[i : i+2]
			} else if !strings.ContainsRune("+-*/%^<>=(){}[],@", rune(c)) {
				return nil, fmt.Errorf("an unexpected %q at %d", c, i)
			}
			toks = append(toks, token{tokOp, op})
			i += len(op)
		}
	}
	return toks, nil
}

// checkExpr checks a panel's PromQL query against the exported series and
// the dashboard's variables, and returns the series it names. A metric name
// must be an exported series; a label in a selector must be one of that
// series, with a value one of its series has when the matcher is = with no
// variable; a label of by, without, on, ignoring, group_left or
// group_right must be one of every series the query names (so a query
// names series that share their labels); every selector of a series with
// a keyspace label has keyspace=~"$keyspace"; and every variable is the
// dashboard's or Grafana's.
func checkExpr(expr string, exported map[string]exportedSeriesInfo, vars map[string]bool) (names []string, errs []error) {
	if strings.TrimSpace(expr) == "" {
		return nil, []error{fmt.Errorf("an empty query")}
	}
	toks, err := lex(expr)
	if err != nil {
		return nil, []error{err}
	}
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	checkVar := func(name string) {
		if !vars[name] && !grafanaVars[name] {
			fail("variable $%s is not one of the dashboard's, nor Grafana's", name)
		}
	}
	depth := map[string]int{}
	var grouping []string
	next := func(i int) token {
		if i+1 < len(toks) {
			return toks[i+1]
		}
		return token{kind: -1}
	}
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		switch tk.kind {
		case tokVar:
			checkVar(tk.text)
		case tokString:
			for _, m := range varRef.FindAllStringSubmatch(tk.text, -1) {
				checkVar(m[1] + m[2])
			}
		case tokOp:
			switch tk.text {
			case "(", "[":
				depth[tk.text]++
			case ")":
				depth["("]--
			case "]":
				depth["["]--
			case "{":
				fail("a selector without a metric name")
				depth["{"]++
			case "}":
				depth["{"]--
			}
		case tokIdent:
			switch {
			case promqlLabelLists[tk.text]:
				if n := next(i); n.kind != tokOp || n.text != "(" {
					continue // group_left with no labels
				}
				for i += 2; i < len(toks) && !(toks[i].kind == tokOp && toks[i].text == ")"); i++ {
					if l := toks[i]; l.kind == tokIdent || l.kind == tokString {
						grouping = append(grouping, l.text)
					} else if l.kind != tokOp || l.text != "," {
						fail("%q in the label list of %s", l.text, tk.text)
					}
				}
			case promqlKeywords[tk.text] || promqlFuncs[tk.text]:
			case next(i).kind == tokOp && next(i).text == "(":
				fail("unknown function %s", tk.text)
			default:
				name := tk.text
				names = append(names, name)
				s, found := exported[name]
				if !found {
					fail("%s is not a series txlockprom exports (its series: %s)", name, strings.Join(seriesNames(exported), ", "))
				}
				filtered := false
				if n := next(i); n.kind == tokOp && n.text == "{" {
					for i += 2; i < len(toks) && !(toks[i].kind == tokOp && toks[i].text == "}"); i++ {
						if toks[i].kind == tokOp && toks[i].text == "," {
							continue
						}
						if i+2 >= len(toks) || toks[i].kind != tokIdent && toks[i].kind != tokString ||
							toks[i+1].kind != tokOp || !slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[i+1].text) ||
							toks[i+2].kind != tokString {
							fail("a label matcher of %s that is not label op \"value\"", name)
							break
						}
						label, op, value := toks[i].text, toks[i+1].text, toks[i+2].text
						i += 2
						for _, m := range varRef.FindAllStringSubmatch(value, -1) {
							checkVar(m[1] + m[2])
						}
						if label == "keyspace" && op == "=~" && (value == "$keyspace" || value == "${keyspace}") {
							filtered = true
						}
						if !found {
							continue
						}
						values, ok := s.labels[label]
						switch {
						case !ok:
							fail("label %s is not a label of %s (its labels: %s)", label, name, strings.Join(sortedKeys(s.labels), ", "))
						case op == "=" && !strings.Contains(value, "$") && !values[value]:
							fail("no series of %s has %s=%q (it has %s)", name, label, value, strings.Join(sortedKeys(values), ", "))
						}
					}
					if i >= len(toks) {
						fail("unbalanced {} after %s", name)
					}
				}
				if _, has := s.labels["keyspace"]; found && has && !filtered {
					fail(`%s is not filtered by keyspace=~"$keyspace"`, name)
				}
			}
		}
	}
	for what, n := range depth {
		if n != 0 {
			fail("unbalanced %s", what)
		}
	}
	for _, label := range grouping {
		for _, name := range names {
			if s, found := exported[name]; found && s.labels[label] == nil {
				fail("label %s of a label list (by, without, on...) is not a label of %s (its labels: %s)", label, name, strings.Join(sortedKeys(s.labels), ", "))
			}
		}
	}
	return names, errs
}

func seriesNames(exported map[string]exportedSeriesInfo) []string {
	return sortedKeys(exported)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
