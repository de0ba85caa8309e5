package tollgate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// step is n requests that must each get status.
type step struct {
	method, path string
	n, status    int
}

// mholtCorpus is what each file of testdata/mholt (mholt/caddy-ratelimit's
// published examples, see its NOTICE) must do in Tollgate. The clock does
// not move during a file's steps, and every zone is written with events
// and window, so is a sliding_log as in mholt: a key gets events requests,
// then a 429.
var mholtCorpus = map[string]struct {
	distributed bool // uses distributed: an error, then run without it
	steps       []step
}{
	"readme_example.caddyfile":           {true, []step{{"GET", "/", 2, 200}, {"GET", "/", 1, 429}}},
	"readme_example.json":                {true, []step{{"GET", "/", 2, 200}, {"GET", "/", 1, 429}}},
	"readme_network_prefix.directive":    {false, []step{{"GET", "/", 100, 200}, {"GET", "/", 1, 429}}},
	"readme_network_prefix.handler.json": {false, []step{{"GET", "/", 100, 200}, {"GET", "/", 1, 429}}},
	"readme_syntax.directive": {false, []step{
		{"GET", "/limited/a", 3, 200}, {"GET", "/limited/b", 1, 429}, {"GET", "/other", 5, 200}}},
	"readme_syntax.handler.json": {false, []step{
		{"GET", "/limited/a", 3, 200}, {"GET", "/limited/b", 1, 429}, {"GET", "/other", 5, 200}}},
	"caddyfile_test.caddyfile":      {false, []step{{"GET", "/", 10, 200}, {"GET", "/", 1, 429}, {"POST", "/", 1, 200}}},
	"handler_test_rate_limits.json": {false, []step{{"GET", "/", 10, 200}, {"GET", "/", 1, 429}, {"POST", "/", 1, 200}}},
	"handler_test_distinct_zones_and_keys.json": {false, []step{
		{"GET", "/path1", 10, 200}, {"GET", "/path1", 1, 429},
		{"GET", "/path2", 10, 200}, {"GET", "/path2", 1, 429},
		{"DELETE", "/path1", 10, 200}, {"DELETE", "/path1", 1, 429},
		{"DELETE", "/path2", 10, 200}, {"DELETE", "/path2", 1, 429}}},
	"metrics_test.json":     {false, []step{{"GET", "/", 2, 200}, {"GET", "/", 1, 429}}},
	"distributed_test.json": {true, []step{{"GET", "/", 10, 200}, {"GET", "/", 1, 429}, {"POST", "/", 1, 200}}},
}

// TestMholtCorpus adapts (a Caddyfile), validates and runs each of
// mholt/caddy-ratelimit's published examples through a real Caddy. The
// only change they may need is dropping `distributed`, which must fail with
// an error that says what to use instead, at its line in a Caddyfile.
func TestMholtCorpus(t *testing.T) {
	files, err := filepath.Glob("testdata/mholt/*")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if name := filepath.Base(f); name != "LICENSE" && name != "NOTICE" {
			names = append(names, name)
		}
	}
	for name := range mholtCorpus {
		if !slices.Contains(names, name) {
			t.Errorf("mholtCorpus lists %s, which is not in testdata/mholt", name)
		}
	}
	for _, name := range names {
		c, ok := mholtCorpus[name]
		if !ok {
			t.Errorf("testdata/mholt/%s: not in mholtCorpus, so nothing checks it", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata/mholt", name))
			if err != nil {
				t.Fatal(err)
			}
			cfg := mholtConfig(t, name, string(raw), c.distributed)
			if err := validateJSON(cfg); err != nil {
				t.Fatalf("validate: %v", err)
			}
			tester := caddytest.NewTester(t)
			tester.InitServer(string(runnable(t, cfg)), "json")
			advance(time.Hour) // every zone of an earlier file is fresh again
			for i, s := range c.steps {
				for j := 0; j < s.n; j++ {
					if got := send(t, tester, s.method, s.path); got != s.status {
						t.Fatalf("step %d: %s %s #%d: status %d, want %d", i, s.method, s.path, j+1, got, s.status)
					}
				}
			}
		})
	}
}

// mholtConfig returns a corpus file as a JSON config: a Caddyfile adapted,
// a directive put in a site, a handler in a route. A file with distributed
// must fail with errDistributed, and is returned without it.
func mholtConfig(t *testing.T, name, raw string, distributed bool) []byte {
	t.Helper()
	raw = strings.ReplaceAll(raw, "STORAGE_DIR", filepath.ToSlash(t.TempDir()))
	switch {
	case strings.HasSuffix(name, ".directive"):
		raw = ":80 {\n" + raw + "\nrespond \"ok\"\n}\n"
		fallthrough
	case strings.HasSuffix(name, ".caddyfile"):
		if distributed {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(raw), map[string]any{"filename": name})
			line := 1 + slices.IndexFunc(strings.Split(raw, "\n"), func(l string) bool { return strings.TrimSpace(l) == "distributed" })
			want := fmt.Sprintf("%v, at %s:%d", errDistributed, name, line)
			if err == nil || !strings.HasSuffix(err.Error(), want) {
				t.Fatalf("adapt = %v, want an error ending %q", err, want)
			}
			raw = regexp.MustCompile(`(?m)^\s*distributed\s*\n`).ReplaceAllString(raw, "")
		}
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(raw), map[string]any{"filename": name})
		if err != nil {
			t.Fatalf("adapt: %v", err)
		}
		return out
	case strings.HasSuffix(name, ".handler.json"):
		raw = `{"apps": {"http": {"servers": {"s": {"listen": [":80"], "routes": [{"handle": [` +
			raw + `, {"handler": "static_response", "body": "ok"}]}]}}}}}`
	}
	if distributed {
		if err := validateJSON([]byte(raw)); err == nil || !strings.Contains(err.Error(), errDistributed.Error()) {
			t.Fatalf("validate = %v, want an error containing %q", err, errDistributed)
		}
		var v any
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			t.Fatal(err)
		}
		dropDistributed(v)
		out, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	return []byte(raw)
}

// dropDistributed deletes "distributed" from every rate_limit handler in v.
func dropDistributed(v any) {
	switch v := v.(type) {
	case map[string]any:
		if v["handler"] == "rate_limit" {
			delete(v, "distributed")
		}
		for _, x := range v {
			dropDistributed(x)
		}
	case []any:
		for _, x := range v {
			dropDistributed(x)
		}
	}
}

// runnable moves a config onto the test ports: the admin API on
// caddytest's, every server on plain HTTP at 9080.
func runnable(t *testing.T, cfg []byte) []byte {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	c["admin"] = map[string]any{"listen": testAdmin}
	apps, _ := c["apps"].(map[string]any)
	httpApp, _ := apps["http"].(map[string]any)
	if httpApp == nil {
		t.Fatal("config has no http app")
	}
	httpApp["http_port"], httpApp["https_port"], httpApp["grace_period"] = 9080, 9443, 1
	servers, _ := httpApp["servers"].(map[string]any)
	for _, s := range servers {
		s := s.(map[string]any)
		s["listen"] = []string{":9080"}
		s["automatic_https"] = map[string]any{"disable": true}
	}
	out, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateJSON(out); err != nil {
		t.Fatalf("validate the config moved to the test ports: %v", err)
	}
	return out
}

// send sends one request and returns its status.
func send(t *testing.T, tester *caddytest.Tester, method, path string) int {
	t.Helper()
	req, err := http.NewRequest(method, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := sendUnread(t, tester.Client, req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestDefaultAlgorithmByHowTheZoneIsWritten: a zone written as mholt
// writes it (events and window, no algorithm) means what it means there,
// at most events in any window (a sliding log): 5 a minute, and 12s after
// them the 6th is refused until the first is a minute old. A zone written
// with rate, or with a burst, is a token bucket: 12s after 5 requests it
// has refilled one. Each zone is checked from a Caddyfile and from JSON.
func TestDefaultAlgorithmByHowTheZoneIsWritten(t *testing.T) {
	for _, c := range []struct {
		name, zone, json string
		after12s         want // the 6th request, 12s after the first 5
	}{
		{"events and window", "events 5\n\t\t\t\twindow 1m", `"events": 5, "window": "1m"`,
			want{429, map[string]string{"Retry-After": "48", "RateLimit": `"z";r=0;t=48`}, ""}},
		{"max_events (mholt's JSON)", "", `"max_events": 5, "window": "1m"`,
			want{429, map[string]string{"Retry-After": "48", "RateLimit": `"z";r=0;t=48`}, ""}},
		{"rate", "rate 5/m", "",
			want{200, map[string]string{"Retry-After": "", "RateLimit": `"z";r=0;t=60`}, ""}},
		{"events, window and burst", "events 5\n\t\t\t\twindow 1m\n\t\t\t\tburst 5", `"events": 5, "window": "1m", "burst": 5`,
			want{200, map[string]string{"Retry-After": "", "RateLimit": `"z";r=0;t=60`}, ""}},
	} {
		configs := map[string]string{}
		if c.zone != "" {
			configs["caddyfile"] = globalOptions + `
			localhost:9080 {
				rate_limit {
					zone z {
						key static
						` + c.zone + `
					}
				}
				respond "ok"
			}`
		}
		if c.json != "" {
			configs["json"] = string(runnableJSON(t, `{"handler": "rate_limit", "rate_limits": {"z": {"key": "static", `+c.json+`}}}, {"handler": "static_response", "body": "ok"}`))
		}
		for adapter, cfg := range configs {
			t.Run(c.name+"/"+adapter, func(t *testing.T) {
				tester := caddytest.NewTester(t)
				tester.InitServer(cfg, adapter)
				advance(time.Hour) // the zone of the case before is whole again
				if got := statuses(t, tester, 6, []string{"/"}); got != "200 200 200 200 200 429 " {
					t.Fatalf("6 requests at once: %q, want 5 admitted", got)
				}
				advance(12 * time.Second)
				resp, body := get(t, tester, "/")
				check(t, "12s later", resp, body, c.after12s)
			})
		}
	}
}

// runnableJSON is a JSON config serving handlers (a JSON list's items)
// on the test ports.
func runnableJSON(t *testing.T, handlers string) []byte {
	t.Helper()
	return runnable(t, []byte(`{"apps": {"http": {"servers": {"s": {"listen": [":80"], "routes": [{"handle": [`+handlers+`]}]}}}}}`))
}
