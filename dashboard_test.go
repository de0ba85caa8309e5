package tollgate

import (
	"bufio"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Tests of the Grafana dashboard and the Prometheus alert rules in docs/:
// every query names only metrics, labels and results that the module
// exports, taken from the code, so that renaming a metric or a result
// without the dashboard fails here.

// exportedMetrics returns the series names Tollgate exports, each with its
// label names: the collectors that provisionMetrics registers, described
// by themselves, a histogram as its _bucket (with le), _sum and _count
// series.
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	descRE := regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)
	out := map[string][]string{}
	for _, c := range rateLimitCollectors() {
		if err := reg.Register(c); err != nil {
			t.Fatalf("registering %T on a fresh registry: %v", c, err)
		}
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := descRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the name and labels of %s", d)
			}
			name, labels := m[1], strings.Split(m[2], ",")
			if m[2] == "" {
				labels = nil
			}
			if _, ok := c.(*prometheus.HistogramVec); ok {
				out[name+"_bucket"] = append(slices.Clone(labels), "le")
				out[name+"_sum"] = labels
				out[name+"_count"] = labels
			} else {
				out[name] = labels
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no exported metrics found")
	}
	return out
}

// knownResults returns the values of the result label: the result*
// constants of metrics.go.
func knownResults(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "metrics.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var results []string
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, id := range spec.Names {
			if !strings.HasPrefix(id.Name, "result") || i >= len(spec.Values) {
				continue
			}
			if lit, ok := spec.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				v, _ := strconv.Unquote(lit.Value)
				results = append(results, v)
			}
		}
		return true
	})
	if len(results) < 2 {
		t.Fatalf("found result values %q in metrics.go, want the result constants", results)
	}
	return results
}

var (
	metricNameRE = regexp.MustCompile(`\bcaddy_[a-zA-Z0-9_:]*`)
	matcherRE    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	byRE         = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelValsRE  = regexp.MustCompile(`label_values\([^,]*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"instance", "job"}

// checkQuery checks one PromQL query: it names at least one metric, only
// exported ones, only their labels, and only known results.
func checkQuery(t *testing.T, where, q string, metrics map[string][]string, results []string, used map[string]bool) {
	t.Helper()
	names := metricNameRE.FindAllString(q, -1)
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) == 0 {
		t.Errorf("%s: query names no Tollgate metric: %s", where, q)
	}
	labels := slices.Clone(targetLabels)
	for _, n := range names {
		ls, ok := metrics[n]
		if !ok {
			t.Errorf("%s: metric %s is not exported (exported: %v)", where, n, slices.Sorted(func(yield func(string) bool) {
				for k := range metrics {
					if !yield(k) {
						return
					}
				}
			}))
			continue
		}
		used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
		used[n] = true
		labels = append(labels, ls...)
	}
	var named []string
	for _, m := range matcherRE.FindAllStringSubmatch(q, -1) {
		named = append(named, m[1])
		if m[1] == "result" {
			for _, v := range strings.Split(m[3], "|") {
				if !slices.Contains(results, v) {
					t.Errorf("%s: result %q is not one the module counts (%q): %s", where, v, results, q)
				}
			}
		}
	}
	for _, m := range byRE.FindAllStringSubmatch(q, -1) {
		for _, l := range strings.Split(m[1], ",") {
			named = append(named, strings.TrimSpace(l))
		}
	}
	for _, m := range labelValsRE.FindAllStringSubmatch(q, -1) {
		named = append(named, m[1])
	}
	slices.Sort(named)
	for _, l := range slices.Compact(named) {
		if !slices.Contains(labels, l) {
			t.Errorf("%s: label %q is not a label of %v: %s", where, l, names, q)
		}
	}
}

func TestGrafanaDashboardQueriesExportedMetrics(t *testing.T) {
	metrics, results := exportedMetrics(t), knownResults(t)
	data, err := os.ReadFile("docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			checkQuery(t, "panel "+strconv.Quote(p.Title)+" query "+strconv.Itoa(i), tg.Expr, metrics, results, used)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
		}
		checkQuery(t, "variable "+v.Name, q.Query, metrics, results, used)
	}
	for name := range metrics {
		if strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") {
			continue
		}
		if !used[name] {
			t.Errorf("the dashboard shows no panel of %s", name)
		}
	}
}

// alertRule is one rule of a Prometheus rules file, as the test reads it.
type alertRule struct {
	name, expr, severity string
}

// readAlertRules reads the alert rules of a Prometheus rules file: each
// "- alert:" with its "expr:" (one line, or a | block) and its severity.
// It reads only the layout docs/prometheus-alerts.yml uses.
func readAlertRules(t *testing.T, file string) []alertRule {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		rules   []alertRule
		inExpr  bool
		exprInd int
	)
	indent := func(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if inExpr {
			if trimmed == "" || indent(line) > exprInd {
				r := &rules[len(rules)-1]
				r.expr += trimmed + "\n"
				continue
			}
			inExpr = false
		}
		switch {
		case strings.HasPrefix(trimmed, "- alert:"):
			rules = append(rules, alertRule{name: strings.TrimSpace(strings.TrimPrefix(trimmed, "- alert:"))})
		case strings.HasPrefix(trimmed, "expr:") && len(rules) > 0:
			v := strings.TrimSpace(strings.TrimPrefix(trimmed, "expr:"))
			if v == "|" || v == ">" || v == "|-" || v == ">-" {
				inExpr, exprInd = true, indent(line)
			} else {
				rules[len(rules)-1].expr = v
			}
		case strings.HasPrefix(trimmed, "severity:") && len(rules) > 0:
			rules[len(rules)-1].severity = strings.TrimSpace(strings.TrimPrefix(trimmed, "severity:"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rules
}

func TestPrometheusAlertsQueryExportedMetrics(t *testing.T) {
	metrics, results := exportedMetrics(t), knownResults(t)
	rules := readAlertRules(t, "docs/prometheus-alerts.yml")
	used := map[string]bool{}
	var all strings.Builder
	for _, r := range rules {
		if r.expr == "" {
			t.Errorf("alert %s has no expr", r.name)
		}
		if r.severity == "" {
			t.Errorf("alert %s has no severity label", r.name)
		}
		checkQuery(t, "alert "+r.name, r.expr, metrics, results, used)
		if r.severity == "page" {
			all.WriteString(r.expr)
		}
	}
	// The cases operators page on: a jump of the rejection ratio, store
	// errors, evictions.
	paged := all.String()
	for _, c := range []struct{ what, needle string }{
		{"rejection ratio", `result!~"allowed|dry_run_rejected|storage_error"`},
		{"store errors", `result="storage_error"`},
		{"evictions", "caddy_http_rate_limit_evictions_total"},
	} {
		if !strings.Contains(paged, c.needle) {
			t.Errorf("no paging alert on %s (an expr with %s)", c.what, c.needle)
		}
	}
}
