// Package docs_test keeps the documentation honest: every example in
// README.md and docs/*.md loads (or fails as it says it does), caddy fmt
// leaves every Caddyfile example as written, the reference lists exactly
// the options the code accepts, each with an example that loads and a bad
// value that fails with the error shown, the config structs' comments (which
// become caddyserver.com's JSON docs) state every field's default, and the
// reference states the same one, and every relative link and anchor
// resolves.
//
// The tests are a package of their own, beside the pages, so that they run
// without the root package's Caddy test server.
package docs_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/caddy-tollgate/tollgate"
)

// pages are the documents whose examples are tested, relative to this
// directory.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../README.md"}, docs...)
}

// block is one fenced code block of a page.
type block struct {
	page  string
	line  int    // of the opening fence
	lang  string // the fence's info string
	body  string // the lines inside, the fence's indentation removed
	fails string // from a preceding <!-- fails: ... --> comment
	// module, from a preceding <!-- module: <dir> --> comment: the block
	// needs a Caddy module this build lacks, and the Go module in <dir>
	// (relative to the repository) loads it.
	module string
}

func (b block) String() string { return fmt.Sprintf("%s:%d", b.page, b.line) }

var (
	failsComment  = regexp.MustCompile(`^<!--\s*fails:\s*(.*?)\s*-->$`)
	moduleComment = regexp.MustCompile(`^<!--\s*module:\s*(\S+)\s*-->$`)
)

// blocks returns the fenced code blocks of a page.
func blocks(t *testing.T, page string) []block {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " ")
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		indent := lines[i][:len(lines[i])-len(trimmed)]
		b := block{page: page, line: i + 1, lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))}
		for j := i - 1; j >= 0; j-- {
			prev := strings.TrimSpace(lines[j])
			if prev == "" {
				continue
			}
			if m := failsComment.FindStringSubmatch(prev); m != nil {
				b.fails = m[1]
			}
			if m := moduleComment.FindStringSubmatch(prev); m != nil {
				b.module = m[1]
			}
			break
		}
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		if i == len(lines) {
			t.Fatalf("%s: the code block opened there is never closed", b)
		}
		b.body = strings.Join(body, "\n") + "\n"
		out = append(out, b)
	}
	return out
}

// handlerOptions are the first words of a snippet that is the inside of a
// rate_limit block; zoneOptions of a zone block.
var (
	handlerOptions = []string{"zone", "storage", "headers", "status", "jitter", "max_keys", "sweep_interval", "log_key", "disable_metrics", "distributed"}
)

// site wraps a Caddyfile snippet into a whole Caddyfile, by its first
// word: a rate_limit directive goes in a site, the inside of a rate_limit
// block in a rate_limit (with a zone, if it has none), and anything else
// (global options, sites) is taken as a whole Caddyfile already.
func site(snippet string) string {
	first := strings.Fields(snippet)
	if len(first) == 0 {
		return snippet
	}
	switch {
	case first[0] == "rate_limit":
		return ":8080 {\n" + snippet + "}\n"
	case contains(handlerOptions, first[0]):
		return inRateLimit(snippet)
	}
	return snippet
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// hasLine reports whether a snippet has a line starting with one of words.
func hasLine(snippet string, words ...string) bool {
	for _, l := range strings.Split(snippet, "\n") {
		if f := strings.Fields(l); len(f) > 0 && contains(words, f[0]) {
			return true
		}
	}
	return false
}

// inRateLimit puts the inside of a rate_limit block in a site, with a zone
// if it has none.
func inRateLimit(snippet string) string {
	zone := ""
	if !hasLine(snippet, "zone") {
		zone = "zone docs {\nrate 10/s\n}\n"
	}
	return ":8080 {\nrate_limit {\n" + zone + snippet + "\n}\n}\n"
}

// inZone puts the inside of a zone block in a site, with a rate if it has
// neither a rate nor concurrency.
func inZone(snippet string) string {
	rate := ""
	if !hasLine(snippet, "rate", "events", "window", "concurrency") {
		rate = "rate 10/s\n"
	}
	return inRateLimit("zone docs {\n" + rate + snippet + "\n}")
}

// load adapts a Caddyfile, or takes a JSON config (a whole one, or a
// handler object, which it puts in a route), and runs caddy.Validate on
// it, as `caddy validate` does.
func load(lang, body string) error {
	var cfgJSON []byte
	switch lang {
	case "caddyfile":
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(body), map[string]any{"filename": "Caddyfile"})
		if err != nil {
			return err
		}
		cfgJSON = out
	case "json":
		var top map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &top); err != nil {
			return fmt.Errorf("not a JSON object: %v", err)
		}
		switch {
		case top["apps"] != nil:
			cfgJSON = []byte(body)
		case top["handler"] != nil:
			cfgJSON = []byte(`{"apps": {"http": {"servers": {"docs": {"listen": [":8080"], "routes": [{"handle": [` + body + `]}]}}}}}`)
		default:
			return fmt.Errorf("a json example must be a whole config (\"apps\") or a handler object (\"handler\")")
		}
	default:
		return fmt.Errorf("no loader for %q", lang)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return err
	}
	return caddy.Validate(&cfg)
}

// checkOutcome compares a load's error with what the docs say it is:
// none, or one that holds fails.
func checkOutcome(t *testing.T, where string, err error, fails string) {
	t.Helper()
	switch {
	case fails == "" && err != nil:
		t.Errorf("%s: does not load: %v", where, err)
	case fails != "" && err == nil:
		t.Errorf("%s: loads, but the docs say it fails with %q", where, fails)
	case fails != "" && !strings.Contains(err.Error(), fails):
		t.Errorf("%s: fails with %q, but the docs say %q", where, err, fails)
	}
}

// TestExamplesLoad adapts and validates every caddyfile and json block.
func TestExamplesLoad(t *testing.T) {
	n := 0
	for _, page := range pages(t) {
		for _, b := range blocks(t, page) {
			if b.lang != "caddyfile" && b.lang != "json" {
				continue
			}
			if b.module != "" {
				// Loaded by that module's tests; it must be one.
				if _, err := os.Stat(filepath.Join("..", b.module, "go.mod")); err != nil {
					t.Errorf("%s: <!-- module: %s -->: %v", b, b.module, err)
				}
				continue
			}
			n++
			body := b.body
			if b.lang == "caddyfile" {
				body = site(body)
			}
			loadAndCheck(t, b.String(), b.lang, body, b.fails)
		}
	}
	if n < 10 {
		t.Errorf("found %d caddyfile and json examples; the pages have more", n)
	}
}

// otherLangs are the fence languages of blocks that are not configs.
var otherLangs = []string{"sh", "console", "text", "promql", "dockerfile"}

// configLike matches a Caddyfile or JSON config of Tollgate: the
// directive with a block, or the handler in JSON; synopsis, a syntax
// summary, which has <placeholders> and cannot load.
var (
	configLike = regexp.MustCompile(`(?m)^\s*rate_limit(\s+\S+)?\s*\{|"handler"\s*:\s*"rate_limit"`)
	synopsis   = regexp.MustCompile(`<[a-z_]+>`)
)

// TestEveryConfigBlockIsLoaded: TestExamplesLoad loads the caddyfile and
// json blocks, so a config in a block of another language (or of none)
// would never be loaded: every block has a language of caddyfile, json or
// otherLangs, and one in otherLangs holds no rate_limit config but a
// syntax summary.
func TestEveryConfigBlockIsLoaded(t *testing.T) {
	for _, page := range pages(t) {
		for _, b := range blocks(t, page) {
			switch {
			case b.lang == "caddyfile" || b.lang == "json":
			case !contains(otherLangs, b.lang):
				t.Errorf("%s: a block of language %q, which the tests neither load nor know: label a config caddyfile or json (else one of %v)", b, b.lang, otherLangs)
			case configLike.MatchString(b.body) && !synopsis.MatchString(b.body):
				t.Errorf("%s: a %s block holds a rate_limit config, which only a caddyfile or json block is loaded as", b, b.lang)
			}
		}
	}
}

// TestCaddyfileExamplesFormatted: caddy fmt leaves every caddyfile block
// as written.
func TestCaddyfileExamplesFormatted(t *testing.T) {
	for _, page := range pages(t) {
		for _, b := range blocks(t, page) {
			if b.lang != "caddyfile" {
				continue
			}
			if got := string(caddyfile.Format([]byte(b.body))); got != b.body {
				t.Errorf("%s: caddy fmt changes the example to:\n%s", b, got)
			}
		}
	}
}

// entry is one option of docs/reference.md.
type entry struct {
	group   string            // the "## " heading
	heading string            // the "### " heading
	names   []string          // the code spans of the heading
	fields  map[string]string // "Caddyfile", "JSON", "Default", ...: the bullet's text
	line    int
}

func (e entry) String() string { return fmt.Sprintf("reference.md:%d (%s)", e.line, e.heading) }

// referenceGroups are the groups of the reference whose entries are options.
var referenceGroups = []string{"Handler", "Zone", "Tier", "Concurrency adaptive", "Storage: redis"}

var (
	codeSpan = regexp.MustCompile("`([^`]*)`")
	bullet   = regexp.MustCompile(`^- \*\*([A-Za-z ]+):\*\* (.*)$`)
)

// referenceEntries parses the option entries of docs/reference.md.
func referenceEntries(t *testing.T) []entry {
	t.Helper()
	data, err := os.ReadFile("reference.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []entry
	group := ""
	for i, l := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(l, "## "):
			group = strings.TrimPrefix(l, "## ")
		case strings.HasPrefix(l, "### ") && contains(referenceGroups, group):
			e := entry{group: group, heading: strings.TrimPrefix(l, "### "), fields: map[string]string{}, line: i + 1}
			for _, m := range codeSpan.FindAllStringSubmatch(e.heading, -1) {
				e.names = append(e.names, m[1])
			}
			out = append(out, e)
		case strings.HasPrefix(l, "### "):
			group = "" // a heading of prose after the options
		case len(out) > 0 && out[len(out)-1].group == group && group != "":
			if m := bullet.FindStringSubmatch(l); m != nil {
				out[len(out)-1].fields[m[1]] = m[2]
			}
		}
	}
	return out
}

// caddyfileOptions returns the subdirectives the Caddyfile parser function
// fn (of receiver recv, or a plain function when recv is "") in file
// accepts: the string cases of its switch on opt.
func caddyfileOptions(t *testing.T, file, recv, fn string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", file), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	found := false
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != fn || receiverName(fd) != recv {
			continue
		}
		found = true
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			sw, ok := n.(*ast.SwitchStmt)
			if !ok {
				return true
			}
			if id, ok := sw.Tag.(*ast.Ident); !ok || id.Name != "opt" {
				return true
			}
			for _, s := range sw.Body.List {
				for _, e := range s.(*ast.CaseClause).List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						out = append(out, v)
					}
				}
			}
			return true
		})
	}
	if !found || len(out) == 0 {
		t.Fatalf("%s: no switch on opt in %s %s: the test must learn where the parser went", file, recv, fn)
	}
	return out
}

func receiverName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	switch r := fd.Recv.List[0].Type.(type) {
	case *ast.StarExpr:
		return r.X.(*ast.Ident).Name
	case *ast.Ident:
		return r.Name
	}
	return ""
}

// jsonFields returns the JSON names of a config struct's fields.
func jsonFields(v any) []string {
	var out []string
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		f := rt.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.IsExported() && name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// groupNames is what each group of the reference must cover: the
// Caddyfile subdirectives and the JSON fields of its structs.
func groupNames(t *testing.T) map[string][]string {
	t.Helper()
	return map[string][]string{
		"Handler": append(caddyfileOptions(t, "caddyfile.go", "Handler", "UnmarshalCaddyfile"),
			jsonFields(tollgate.Handler{})...),
		"Zone": append(caddyfileOptions(t, "caddyfile.go", "Handler", "unmarshalZone"),
			jsonFields(tollgate.Zone{})...),
		"Tier": jsonFields(tollgate.Tier{}),
		"Concurrency adaptive": append(caddyfileOptions(t, "caddyfile.go", "", "unmarshalAdaptive"),
			jsonFields(tollgate.Adaptive{})...),
		"Storage: redis": append(append(caddyfileOptions(t, "storage_redis.go", "RedisStorage", "UnmarshalCaddyfile"),
			jsonFields(tollgate.RedisStorage{})...), jsonFields(tollgate.RedisTLS{})...),
	}
}

func set(names []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestReferenceCoversEveryOption: every subdirective the parser accepts and
// every JSON field has an entry in its group of the reference, and the
// reference has no entry the code does not accept.
func TestReferenceCoversEveryOption(t *testing.T) {
	documented := map[string]map[string]bool{}
	for _, e := range referenceEntries(t) {
		if documented[e.group] == nil {
			documented[e.group] = map[string]bool{}
		}
		if len(e.names) == 0 {
			t.Errorf("%s: the heading names no option in a code span", e)
		}
		for _, n := range e.names {
			if documented[e.group][n] {
				t.Errorf("%s: %q has a second entry in %s", e, n, e.group)
			}
			documented[e.group][n] = true
		}
	}
	for group, names := range groupNames(t) {
		want := set(names)
		for _, n := range sortedKeys(want) {
			if !documented[group][n] {
				t.Errorf("reference.md, %s: no entry for %q, which the code accepts", group, n)
			}
		}
		for _, n := range sortedKeys(documented[group]) {
			if !want[n] {
				t.Errorf("reference.md, %s: an entry for %q, which the code does not accept", group, n)
			}
		}
	}
}

// spans returns the code spans of a bullet's text, before any " → ".
func spans(text string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// entryConfig builds the whole config an entry's example lines go in.
func entryConfig(e entry, lines []string) (lang, body string) {
	if strings.HasPrefix(e.fields["Caddyfile"], "none") {
		return "json", strings.Join(lines, "\n")
	}
	snippet := strings.Join(lines, "\n")
	switch e.group {
	case "Handler":
		return "caddyfile", inRateLimit(snippet)
	case "Zone":
		return "caddyfile", inZone(snippet)
	case "Tier":
		return "caddyfile", inZone("rate 10/s\ntier {http.request.header.X-Plan} {\n" + snippet + "\n}")
	case "Concurrency adaptive":
		return "caddyfile", inZone("concurrency adaptive {\n" + snippet + "\n}")
	case "Storage: redis":
		return "caddyfile", inRateLimit("storage redis {\n" + snippet + "\n}")
	}
	panic("unknown group " + e.group)
}

// TestReferenceEntries: every entry has its lines; its example loads, and
// its bad value fails with the error it shows.
func TestReferenceEntries(t *testing.T) {
	entries := referenceEntries(t)
	if len(entries) < 40 {
		t.Fatalf("reference.md: %d entries; the parser found fewer than the options", len(entries))
	}
	for _, e := range entries {
		for _, f := range []string{"Caddyfile", "JSON", "Type", "Default", "Example", "Bad value"} {
			if e.fields[f] == "" {
				t.Errorf("%s: no %q line", e, f)
			}
		}
		if ex := e.fields["Example"]; ex != "" && !strings.HasPrefix(ex, "none") {
			lang, body := entryConfig(e, spans(ex))
			loadAndCheck(t, e.String()+" example", lang, body, "")
		}
		if bad := e.fields["Bad value"]; bad != "" {
			s := spans(bad)
			if len(s) < 2 || !strings.Contains(bad, " → ") {
				t.Errorf("%s: a bad value is `<snippet>`... → `<part of its error>`, got %q", e, bad)
				continue
			}
			lang, body := entryConfig(e, s[:len(s)-1])
			loadAndCheck(t, e.String()+" bad value", lang, body, s[len(s)-1])
		}
	}
}

// loadAndCheck loads a config in a subtest and checks the outcome. Not in
// parallel: caddy.Validate writes globals. A Redis config that loads
// waits about half a second for its PING at start to fail (nothing
// listens at the examples' addresses; go-redis retries a refused dial),
// which is most of these tests' time.
func loadAndCheck(t *testing.T, where, lang, body, fails string) {
	t.Helper()
	t.Run(where, func(t *testing.T) {
		checkOutcome(t, where, load(lang, body), fails)
	})
}

// configStructs are the config structs whose field comments become
// caddyserver.com's JSON docs: the file each is in, and its reference
// group.
var configStructs = []struct{ file, name, group string }{
	{"module.go", "Handler", "Handler"},
	{"zone.go", "Zone", "Zone"},
	{"tier.go", "Tier", "Tier"},
	{"zone.go", "Adaptive", "Concurrency adaptive"},
	{"storage_redis.go", "RedisStorage", "Storage: redis"},
	{"storage_redis.go", "RedisTLS", "Storage: redis"},
}

// defaultValue is what a field comment's "Default: X." states: X up to the
// sentence's end, a comma, a semicolon or a parenthesis, without quotes.
var defaultValue = regexp.MustCompile(`Default:\s+(.+?)(?:\.\s|\.$|,|;|\s\(|$)`)

// normalize makes defaults comparable: no quotes, backticks or case.
func normalize(s string) string {
	return strings.ToLower(strings.NewReplacer("`", "", `"`, "").Replace(strings.Join(strings.Fields(s), " ")))
}

// TestFieldCommentsStateDefaults: every exported config field has a doc
// comment that states its default, and the reference's entry for it
// states the same default.
func TestFieldCommentsStateDefaults(t *testing.T) {
	refDefault := map[string]map[string]string{} // group -> name -> Default line
	for _, e := range referenceEntries(t) {
		if refDefault[e.group] == nil {
			refDefault[e.group] = map[string]string{}
		}
		for _, n := range e.names {
			refDefault[e.group][n] = e.fields["Default"]
		}
	}
	for _, cs := range configStructs {
		fields := structFields(t, cs.file, cs.name)
		if len(fields) == 0 {
			t.Fatalf("%s: no struct %s with json fields", cs.file, cs.name)
		}
		for _, f := range fields {
			where := fmt.Sprintf("%s: %s.%s", cs.file, cs.name, f.goName)
			if f.doc == "" {
				t.Errorf("%s has no doc comment", where)
				continue
			}
			m := defaultValue.FindStringSubmatch(strings.Join(strings.Fields(f.doc), " "))
			if m == nil {
				t.Errorf("%s: its comment states no default (\"Default: X.\"): %q", where, f.doc)
				continue
			}
			ref, ok := refDefault[cs.group][f.json]
			if !ok {
				continue // TestReferenceCoversEveryOption reports it
			}
			if !statesValue(normalize(ref), normalize(m[1])) {
				t.Errorf("%s: the comment's default is %q, the reference's (%s) is %q", where, m[1], f.json, ref)
			}
		}
	}
}

// statesValue reports whether text states v as a whole value, not as part
// of a longer one (1000000 is not stated by 10000000).
func statesValue(text, v string) bool {
	return regexp.MustCompile(`(^|[^\pL\pN_])` + regexp.QuoteMeta(v) + `($|[^\pL\pN_])`).MatchString(text)
}

type structField struct{ goName, json, doc string }

// structFields returns the fields with a json tag of a struct type in a
// root package file, with their doc comments.
func structFields(t *testing.T, file, name string) []structField {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", file), nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var out []structField
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != name {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		for _, fl := range st.Fields.List {
			if fl.Tag == nil || len(fl.Names) == 0 || !fl.Names[0].IsExported() {
				continue
			}
			tag, _ := strconv.Unquote(fl.Tag.Value)
			jsonName, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
			if jsonName == "" || jsonName == "-" {
				continue
			}
			out = append(out, structField{goName: fl.Names[0].Name, json: jsonName, doc: strings.TrimSpace(fl.Doc.Text())})
		}
		return false
	})
	return out
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// anchors returns the GitHub anchors of a page's headings.
func anchors(t *testing.T, page string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimLeft(l, " "), "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '_', r == '-':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestLinksResolve: every relative link of the pages reaches a file, and
// every anchor a heading of its page.
func TestLinksResolve(t *testing.T) {
	for _, page := range append(pages(t), "../CHANGELOG.md") {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q: %v", page, target, err)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[anchor] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", page, target, file, anchor)
			}
		}
	}
}

// TestReadmeCommands: the README's first block is its two commands, and
// CI runs its test command as written.
func TestReadmeCommands(t *testing.T) {
	bs := blocks(t, "../README.md")
	if len(bs) == 0 || bs[0].lang != "sh" {
		t.Fatal("README.md: the first code block is not the sh block of its two commands")
	}
	var run, test string
	for _, l := range strings.Split(bs[0].body, "\n") {
		cmd, _, _ := strings.Cut(l, "#")
		cmd = strings.TrimSpace(cmd)
		switch {
		case strings.HasPrefix(cmd, "go run "):
			run = cmd
		case strings.HasPrefix(cmd, "go test "):
			test = cmd
		}
	}
	if run != "go run ./cmd/caddy run --config examples/Caddyfile" {
		t.Errorf("README.md: run command %q, want the example's", run)
	}
	if _, err := os.Stat("../examples/Caddyfile"); err != nil {
		t.Errorf("README.md's run command: %v", err)
	}
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if test == "" || !regexp.MustCompile(`(?m)^if ! `+regexp.QuoteMeta(test)+` 2>&1`).Match(ci) {
		t.Errorf("README.md's test command %q is not the one .ci/run runs", test)
	}
}
