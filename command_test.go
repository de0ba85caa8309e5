package tollgate

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
)

// runCLI runs `caddy rate-limit args...` as Caddy's command line would,
// from the command's registration, and returns what it printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c, ok := caddycmd.Commands()["rate-limit"]
	if !ok {
		t.Fatal("no command rate-limit registered")
	}
	cmd := &cobra.Command{Use: c.Name, Short: c.Short, Long: c.Long, SilenceUsage: true, SilenceErrors: true}
	c.CobraFunc(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// adminBody is the raw answer of the admin API to GET path.
func adminBody(t *testing.T, path string) string {
	t.Helper()
	resp, err := http.Get(adminBase + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", path, resp.StatusCode, body)
	}
	return string(body)
}

// tableRows splits an aligned table into its rows' cells, checking that
// every cell of a column starts where the column's first cell does (a
// cell is a run of characters up to two spaces; a cell may be empty only
// at the end of a row).
func tableRows(t *testing.T, table string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	if len(lines) == 0 {
		t.Fatalf("empty table")
	}
	cellStart := regexp.MustCompile(`(^|  )(\S)`)
	header := cellStart.FindAllStringSubmatchIndex(lines[0], -1)
	var starts []int
	for _, m := range header {
		starts = append(starts, m[4])
	}
	var rows [][]string
	for _, l := range lines {
		if strings.HasSuffix(l, " ") {
			t.Errorf("table line %q ends in spaces", l)
		}
		var cells []string
		for i, s := range starts {
			if s > len(l) {
				break
			}
			if s > 0 && l[s-1] != ' ' {
				t.Errorf("table line %q: column %d does not start at %d, where its header does:\n%s", l, i, s, table)
			}
			end := len(l)
			if i+1 < len(starts) && starts[i+1] <= len(l) {
				end = starts[i+1]
			}
			cells = append(cells, strings.TrimSpace(l[s:end]))
		}
		rows = append(rows, cells)
	}
	return rows
}

// keyTable reads the two-column table of `show` into a map.
func keyTable(t *testing.T, out string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, cells := range tableRows(t, out) {
		if len(cells) == 2 {
			m[cells[0]] = cells[1]
		}
	}
	return m
}

func TestRateLimitCommand(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone cli {
				match {
					path /
				}
				key {http.request.header.X-Key}
				ipv6_prefix 64
				rate 5/h
			}
			zone guard {
				match {
					path /guard
				}
				key {http.request.header.X-Key}
				rate 1/h
				ban 1h
				tier {http.request.header.X-Plan} {
					gold 2/h
				}
			}
			zone slots {
				match {
					path /slots
				}
				concurrency 2
			}
		}
		respond "ok"
	}`, "caddyfile")

	// Keys that a hand-made curl call gets wrong, each with the key the
	// zone stores, and the requests it made.
	keys := []struct {
		name, key, stored string
		requests          int
	}{
		{"slash and space", "a/b c", "a/b c", 1},
		{"double slash", "a//b", "a//b", 2},
		{"percent, query and fragment", "100%?x#y", "100%?x#y", 1},
		{"dot-dot", "..", "..", 1},
		{"dot", ".", ".", 1},
		{"IPv6 address, grouped by ipv6_prefix", "2001:db8::1", "2001:db8::/64", 3},
		{"IPv4 address", "203.0.113.7", "203.0.113.7", 1},
		{"unicode", "ключ", "ключ", 1},
	}
	for _, k := range keys {
		for range k.requests {
			get(t, tester, "/", "X-Key: "+k.key)
		}
	}
	// guard: key k spends its 1/h and is banned at its first rejection;
	// key g spends one of gold's 2/h.
	get(t, tester, "/guard", "X-Key: k")
	get(t, tester, "/guard", "X-Key: k")
	get(t, tester, "/guard", "X-Key: g", "X-Plan: gold")

	addr := "--address=" + testAdmin

	// zones --json prints the API's answer, byte for byte.
	out, err := runCLI(t, addr, "--json", "zones")
	if err != nil {
		t.Fatalf("rate-limit --json zones: %v", err)
	}
	if want := adminBody(t, "/rate_limit/zones"); out != want {
		t.Errorf("rate-limit --json zones printed %q, want the API's %q", out, want)
	}

	var listed []adminapi.ZoneInfo
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 3 || listed[1].Keys == nil {
		t.Fatalf("rate-limit --json zones: %v, want 3 zones in %s", err, out)
	}
	guardKeys := strconv.Itoa(*listed[1].Keys) // the API's count, over the zone's stores

	// zones prints an aligned table.
	out, err = runCLI(t, addr, "zones")
	if err != nil {
		t.Fatalf("rate-limit zones: %v", err)
	}
	rows := tableRows(t, out)
	wantRows := [][]string{
		{"ZONE", "ALGORITHM", "LIMIT", "BURST", "STORAGE", "KEYS", "ALSO"},
		{"cli", "token_bucket", "5/h", "5", "memory", "8"},
		{"guard", "token_bucket", "1/h", "1", "memory", guardKeys, "ban 1h after 1; tiers by {http.request.header.X-Plan}: gold 2/h"},
		{"slots", "-", "-", "-", "memory", "0", "concurrency 2"},
	}
	if len(rows) != len(wantRows) {
		t.Fatalf("rate-limit zones printed %d rows, want %d:\n%s", len(rows), len(wantRows), out)
	}
	for i, want := range wantRows {
		if got := strings.Join(rows[i], "|"); got != strings.Join(want, "|") {
			t.Errorf("rate-limit zones, row %d: got %q, want %q; printed:\n%s", i, got, strings.Join(want, "|"), out)
		}
	}

	for _, k := range keys {
		out, err := runCLI(t, addr, "--json", "show", "cli", k.key)
		if err != nil {
			t.Errorf("show --json %s: %v", k.name, err)
			continue
		}
		var got struct {
			Zone      string `json:"zone"`
			Key       string `json:"key"`
			Remaining int64  `json:"remaining"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Errorf("show --json %s: %v in %q", k.name, err, out)
			continue
		}
		if got.Zone != "cli" || got.Key != k.stored || got.Remaining != int64(5-k.requests) {
			t.Errorf("show --json %s: got zone %q key %q remaining %d, want cli %q %d (printed %q)",
				k.name, got.Zone, got.Key, got.Remaining, k.stored, 5-k.requests, out)
		}
	}

	// show prints the key as a table, times in human units.
	out, err = runCLI(t, addr, "show", "cli", "2001:db8::1")
	if err != nil {
		t.Fatalf("show: %v", err)
	}
	kt := keyTable(t, out)
	for field, want := range map[string]string{"zone": "cli", "key": "2001:db8::/64", "allowed": "yes", "remaining": "2"} {
		if kt[field] != want {
			t.Errorf("show: %s is %q, want %q; printed:\n%s", field, kt[field], want, out)
		}
	}
	// 3 of 5 spent at 5/h: whole again in 36 minutes, less the time since.
	if !regexp.MustCompile(`^in 3[56]m\d*s?$`).MatchString(kt["reset"]) {
		t.Errorf("show: reset is %q, want about 36m; printed:\n%s", kt["reset"], out)
	}

	out, err = runCLI(t, addr, "show", "guard", "k")
	if err != nil {
		t.Fatalf("show guard: %v", err)
	}
	kt = keyTable(t, out)
	if !strings.HasPrefix(kt["ban"], "banned for ") || !strings.HasPrefix(kt["allowed"], "no, next in ") || kt["remaining"] != "0" {
		t.Errorf("show guard k: want banned, not allowed, 0 remaining; printed:\n%s", out)
	}
	out, err = runCLI(t, addr, "--tier", "gold", "show", "guard", "g")
	if err != nil {
		t.Fatalf("show --tier gold: %v", err)
	}
	if kt = keyTable(t, out); kt["tier"] != "gold" || kt["remaining"] != "1" {
		t.Errorf("show --tier gold guard g: want tier gold, 1 remaining; printed:\n%s", out)
	}

	out, err = runCLI(t, addr, "unban", "guard", "k")
	if want := `lifted the ban of key "k" in zone guard (its rate's state stays)` + "\n"; err != nil || out != want {
		t.Errorf("unban: printed %q, %v; want %q", out, err, want)
	}
	out, _ = runCLI(t, addr, "show", "guard", "k")
	if kt = keyTable(t, out); kt["ban"] != "no (1 strikes left)" || kt["remaining"] != "0" {
		t.Errorf("show guard k after unban: want no ban and the rate's 0 remaining; printed:\n%s", out)
	}

	for i, k := range keys {
		args := []string{addr, "reset", "cli", k.key}
		if i%2 == 0 {
			args = []string{addr, "--json", "reset", "cli", k.key}
		}
		out, err := runCLI(t, args...)
		if err != nil {
			t.Errorf("reset %s: %v", k.name, err)
			continue
		}
		if i%2 == 0 {
			var got map[string]any
			if err := json.Unmarshal([]byte(out), &got); err != nil || got["key"] != k.stored || got["reset"] != true {
				t.Errorf("reset --json %s: printed %q, want key %q reset true", k.name, out, k.stored)
			}
		} else if want := "reset key " + strconv.Quote(k.stored) + " in zone cli\n"; out != want {
			t.Errorf("reset %s: printed %q, want %q", k.name, out, want)
		}
		_, err = runCLI(t, addr, "show", "cli", k.key)
		if err == nil || !strings.Contains(err.Error(), "holds no key") || !strings.Contains(err.Error(), "nothing to show or reset") {
			t.Errorf("show %s after reset: error %v, want the key not held, and why", k.name, err)
		}
	}

	// Errors say what to do.
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown zone", []string{addr, "show", "nozone", "k"}, []string{`unknown zone "nozone"`, "cli, guard, slots", "caddy rate-limit zones"}},
		{"unknown tier", []string{addr, "--tier", "silver", "show", "guard", "g"}, []string{`has no tier "silver"`, "--tier takes one of"}},
		{"unban in a zone without ban", []string{addr, "unban", "cli", "k"}, []string{`has no ban`, "use reset"}},
	} {
		_, err := runCLI(t, c.args...)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want it to say %q", c.name, err, w)
			}
		}
	}
	if _, err := runCLI(t, addr, "show", "cli"); err == nil {
		t.Error("show with one argument: no error")
	}
	if _, err := runCLI(t, addr, "zones", "extra"); err == nil {
		t.Error("zones with an argument: no error")
	}
}

// TestRateLimitCommandWrongAddress: an admin API that is not there, or is
// not a Caddy with Tollgate, gets an error that says what to do.
func TestRateLimitCommandWrongAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "localhost:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, err = runCLI(t, "--address", closed, "zones")
	for _, w := range []string{"cannot reach Caddy's admin API at " + closed, "--address", "CADDY_ADMIN"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("zones at %s, where nothing listens: error %v, want it to say %q", closed, err, w)
		}
	}

	for _, c := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"a Caddy without Tollgate", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":"not found"}`)
		}},
		{"a web site", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }},
	} {
		srv := httptest.NewServer(c.handler)
		address := strings.TrimPrefix(srv.URL, "http://")
		for _, args := range [][]string{{"zones"}, {"show", "api", "k"}} {
			_, err := runCLI(t, append([]string{"--address", address}, args...)...)
			if err == nil || !strings.Contains(err.Error(), "has no rate-limit endpoint") || !strings.Contains(err.Error(), "built with Tollgate") {
				t.Errorf("%s, %v: error %v, want it to say there is no rate-limit endpoint", c.name, args, err)
			}
		}
		srv.Close()
	}
}

// TestRateLimitCommandHelp: help lists every subcommand with its example.
func TestRateLimitCommandHelp(t *testing.T) {
	out, err := runCLI(t, "help")
	if err != nil {
		t.Fatalf("help: %v", err)
	}
	for _, sub := range cliSubcommands {
		usage := strings.Join(append([]string{sub.name}, sub.args...), " ")
		if !strings.Contains(out, "  "+usage+" ") || !strings.Contains(out, "e.g. "+sub.example+"\n") {
			t.Errorf("help lacks %q or its example %q:\n%s", usage, sub.example, out)
		}
		if !strings.HasPrefix(sub.example, "caddy rate-limit "+sub.name) {
			t.Errorf("subcommand %s: example %q does not run it", sub.name, sub.example)
		}
	}
}

// TestGrantAmountChecked: `caddy rate-limit grant` refuses an amount that
// is not a number of events > 0 before it asks the API.
func TestGrantAmountChecked(t *testing.T) {
	for _, amount := range []string{"0", "-5", "lots", "NaN", "Inf"} {
		_, err := runCLI(t, "--address", "localhost:1", "grant", "--", "z", "k", amount)
		if err == nil || !strings.Contains(err.Error(), "grant: amount must be a number of events > 0") {
			t.Errorf("grant z k %s: %v, want the amount refused", amount, err)
		}
	}
}

// cliChildEnv, when set, makes the test binary Caddy's command line
// (caddycmd.Main) run with the arguments it holds, separated by spaces
// (see TestMain): the exit status as a user sees it, without building a
// binary.
const cliChildEnv = "TOLLGATE_TEST_CHILD_CLI"

// runChildCLI runs Caddy's command line with args and exits with its
// status.
func runChildCLI(args string) {
	os.Args = append([]string{"caddy"}, strings.Fields(args)...)
	caddycmd.Main()
	os.Exit(0)
}

// TestRateLimitCommandUnknownSubcommand: `caddy rate-limit bogus a b`
// exits non-zero with an error naming bogus; `caddy rate-limit` alone
// prints the help and exits 0.
func TestRateLimitCommandUnknownSubcommand(t *testing.T) {
	for _, c := range []struct {
		args     string
		exit     int
		contains string
	}{
		{"rate-limit bogus a b", 1, `unknown subcommand "bogus"`},
		{"rate-limit", 0, "caddy rate-limit zones"},
	} {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), cliChildEnv+"="+c.args)
		out, err := cmd.CombinedOutput()
		exit := 0
		if ee, ok := err.(*exec.ExitError); ok {
			exit = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("caddy %s: %v", c.args, err)
		}
		if exit != c.exit || !strings.Contains(string(out), c.contains) {
			t.Errorf("caddy %s: exit %d, output:\n%s\nwant exit %d and %q", c.args, exit, out, c.exit, c.contains)
		}
	}
}
