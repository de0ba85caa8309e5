package tollgate

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// Tests of section 8 of the contract, "Operations": metrics, dry-run,
// logs, the rate_limit_exceeded event and the admin API, all through a
// real Caddy. Each test uses zone names of its own: the metrics and the
// memory store outlive a test's configuration.

func init() {
	caddy.RegisterModule(eventRecorder{})
	caddy.RegisterModule(failingStorage{})
}

var adminBase = "http://" + testAdmin

// withGlobal adds lines to the test global options.
func withGlobal(lines string) string {
	return strings.Replace(globalOptions, "\n}\n", "\n"+lines+"\n}\n", 1)
}

// loggingTo returns the global options with Caddy's log going to a new
// file as JSON at level INFO, and that file.
func loggingTo(t *testing.T) (opts, logFile string) {
	logFile = filepath.Join(t.TempDir(), "caddy.log")
	return withGlobal("log {\n\toutput file " + logFile + "\n\tformat json\n\tlevel INFO\n}"), logFile
}

// scrape fetches Caddy's metrics from the admin endpoint and returns
// Tollgate's series, "name{labels}" to value. A series exposed twice is
// an error.
func scrape(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get(adminBase + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: status %d: %s", resp.StatusCode, body)
	}
	series := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "caddy_http_rate_limit_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		if _, dup := series[line[:i]]; dup {
			t.Errorf("series %s exposed twice", line[:i])
		}
		series[line[:i]] = v
	}
	return series
}

// requests is the name of the requests_total series of zone and result.
func requests(zone, result string) string {
	return `caddy_http_rate_limit_requests_total{result="` + result + `",zone="` + zone + `"}`
}

// checkSeries checks the series in want ("name{labels}" to value; -1
// means the series must be absent).
func checkSeries(t *testing.T, step string, got map[string]float64, want map[string]float64) {
	t.Helper()
	for name, w := range want {
		v, ok := got[name]
		switch {
		case w < 0 && ok:
			t.Errorf("%s: %s = %v, want it absent", step, name, v)
		case w >= 0 && !ok:
			t.Errorf("%s: %s absent, want %v", step, name, w)
		case w >= 0 && v != w:
			t.Errorf("%s: %s = %v, want %v", step, name, v, w)
		}
	}
}

// adminDo sends a request to the admin API and decodes its JSON answer
// into out (if not nil).
func adminDo(t *testing.T, method, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, adminBase+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s %s: Content-Type %q, want application/json (body %q)", method, path, ct, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Errorf("%s %s: %v in %q", method, path, err, body)
		}
	}
	return resp.StatusCode
}

func TestMetricsCountDecisions(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(withGlobal("metrics")+`
	localhost:9080 {
		rate_limit {
			zone m_count {
				key {http.request.header.X-Client}
				rate 2/h
			}
			max_keys 1
		}
		respond "ok"
	}`, "caddyfile")

	before := scrape(t)
	latency := `caddy_http_rate_limit_storage_seconds_count{backend="memory"}`
	// a, a, a (the third rejected), then b evicts a, and c evicts b: the
	// store holds one key.
	for i, c := range []struct {
		client string
		status int
	}{{"a", 200}, {"a", 200}, {"a", 429}, {"b", 200}, {"c", 200}} {
		resp, _ := get(t, tester, "/", "X-Client: "+c.client)
		check(t, fmt.Sprintf("step %d", i), resp, "", want{status: c.status})
	}
	after := scrape(t)
	checkSeries(t, "after 5 requests", after, map[string]float64{
		requests("m_count", "allowed"):                          4,
		requests("m_count", "rejected"):                         1,
		requests("m_count", "dry_run_rejected"):                 -1,
		requests("m_count", "storage_error"):                    0,
		`caddy_http_rate_limit_keys{zone="m_count"}`:            1,
		`caddy_http_rate_limit_evictions_total{zone="m_count"}`: 2,
	})
	if got := after[latency] - before[latency]; got != 5 {
		t.Errorf("%s went up by %v, want 5 (one per store decision)", latency, got)
	}
	for name := range after {
		if strings.Contains(name, "key=") || strings.Contains(name, `"a"`) {
			t.Errorf("series %s has a per-key label", name)
		}
	}
}

func TestNoMetricsWhenCaddyMetricsAreOff(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone m_off {
				key {http.request.header.X-Client}
				rate 1/h
			}
		}
		respond "ok"
	}`, "caddyfile")
	get(t, tester, "/", "X-Client: off")
	get(t, tester, "/", "X-Client: off")
	if got := scrape(t); len(got) != 0 {
		t.Errorf("metrics off: Tollgate series %v, want none", got)
	}
}

// TestMetricsSurviveReloads checks the choice the metrics make across
// config reloads: a zone that stays keeps counting (as its memory state
// stays), no series is registered or exposed twice, and the series of a
// zone the new configuration drops go away.
func TestMetricsSurviveReloads(t *testing.T) {
	config := func(zone, body string) string {
		return withGlobal("metrics") + `
	localhost:9080 {
		rate_limit {
			zone ` + zone + ` {
				key {http.request.header.X-Client}
				rate 2/h
			}
		}
		respond "` + body + `"
	}`
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(config("m_reload", "one"), "caddyfile")
	get(t, tester, "/", "X-Client: r")
	get(t, tester, "/", "X-Client: r")
	checkSeries(t, "config one", scrape(t), map[string]float64{
		requests("m_reload", "allowed"):  2,
		requests("m_reload", "rejected"): 0, // each series exists from the start
	})

	tester.InitServer(config("m_reload", "two"), "caddyfile")
	checkSeries(t, "config two, before requests", scrape(t), map[string]float64{
		requests("m_reload", "allowed"):               2,
		`caddy_http_rate_limit_keys{zone="m_reload"}`: 1,
	})
	resp, body := get(t, tester, "/", "X-Client: r")
	check(t, "config two", resp, body, want{status: 429})

	tester.InitServer(config("m_reload", "three"), "caddyfile")
	resp, body = get(t, tester, "/", "X-Client: r")
	check(t, "config three", resp, body, want{status: 429})
	checkSeries(t, "config three", scrape(t), map[string]float64{
		requests("m_reload", "allowed"):               2,
		requests("m_reload", "rejected"):              2,
		`caddy_http_rate_limit_keys{zone="m_reload"}`: 1,
	})

	// A configuration without the zone: its series go.
	tester.InitServer(config("m_renamed", "four"), "caddyfile")
	get(t, tester, "/", "X-Client: r")
	checkSeries(t, "config four", scrape(t), map[string]float64{
		requests("m_reload", "allowed"):                -1,
		requests("m_reload", "rejected"):               -1,
		`caddy_http_rate_limit_keys{zone="m_reload"}`:  -1,
		requests("m_renamed", "allowed"):               1,
		`caddy_http_rate_limit_keys{zone="m_renamed"}`: 1,
	})
}

func TestDryRunNeverRejectsAndCountsWouldBeRejections(t *testing.T) {
	config := func(dryRun string) string {
		return withGlobal("metrics") + `
	localhost:9080 {
		rate_limit {
			zone dry {
				key {http.request.header.X-Client}
				rate 2/h
				` + dryRun + `
			}
		}
		respond "ok"
	}`
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(config("dry_run"), "caddyfile")
	// Headers as if enforcing; never a 429 and never a Retry-After. A
	// would-be rejection takes nothing, as a rejection would.
	for i, w := range []want{
		{200, map[string]string{"RateLimit": `"dry";r=1;t=1800`, "Retry-After": ""}, "ok"},
		{200, map[string]string{"RateLimit": `"dry";r=0;t=3600`, "Retry-After": ""}, "ok"},
		{200, map[string]string{"RateLimit": `"dry";r=0;t=3600`, "Retry-After": ""}, "ok"},
		{200, map[string]string{"RateLimit": `"dry";r=0;t=3600`, "Retry-After": ""}, "ok"},
	} {
		resp, body := get(t, tester, "/", "X-Client: d")
		check(t, fmt.Sprintf("dry run step %d", i), resp, body, w)
	}
	checkSeries(t, "dry run", scrape(t), map[string]float64{
		requests("dry", "allowed"):          2,
		requests("dry", "dry_run_rejected"): 2,
		requests("dry", "rejected"):         -1, // a dry-run zone rejects nothing
	})

	// Enforcing after the rehearsal: the state is the one the dry run
	// recorded (the memory store's pool key leaves dry_run out).
	tester.InitServer(config(""), "caddyfile")
	resp, body := get(t, tester, "/", "X-Client: d")
	check(t, "enforcing", resp, body, want{429, map[string]string{"Retry-After": "1800", "RateLimit": `"dry";r=0;t=1800`}, ""})
	checkSeries(t, "enforcing", scrape(t), map[string]float64{
		requests("dry", "allowed"):          2,
		requests("dry", "dry_run_rejected"): 2,
		requests("dry", "rejected"):         1,
	})
}

func TestDryRunZoneBesideAnEnforcingOne(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone dry_strict {
				key {http.request.header.X-Client}
				rate 1/h
				dry_run
			}
			zone enforced_loose {
				key {http.request.header.X-Client}
				rate 3/h
			}
		}
		respond "ok"
	}`, "caddyfile")
	got := statuses(t, tester, 4, []string{"/"}, "X-Client: both")
	// The dry-run zone would reject from the second request on; only the
	// enforcing zone's limit of 3 applies.
	if want := "200 200 200 429 "; got != want {
		t.Errorf("statuses %q, want %q", got, want)
	}
}

// TestDryRunShapingZoneDelaysNothing: a dry-run zone never acts on a
// request, and a shaping zone's delay is an act. Before, a dry_run
// leaky_bucket with max_delay held each request as long as it would have
// queued (here a minute for the second): only rejections were dry-run.
func TestDryRunShapingZoneDelaysNothing(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone dry_shaper {
				key {http.request.header.X-Client}
				algorithm leaky_bucket
				rate 1/m
				burst 1
				max_delay 5m
				dry_run
			}
		}
		respond "ok"
	}`, "caddyfile")
	// The tester's transport (its dialer goes to Caddy), with a deadline
	// far below the minute a delayed request would wait.
	client := &http.Client{Transport: tester.Client.Transport, Timeout: 10 * time.Second}
	for i := 1; i <= 3; i++ {
		resp, err := sendUnread(t, client, mustRequest(t, base+"/", "X-Client: shaped"))
		if err != nil {
			t.Fatalf("request %d: %v (held: a dry-run zone delayed it)", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("request %d: status %d, want 200", i, resp.StatusCode)
		}
	}
}

// eventRecorder is a test-only events handler: it records every event it
// is given.
type eventRecorder struct{}

// recorded holds the events eventRecorder was given.
var recorded struct {
	sync.Mutex
	events []recordedEvent
}

type recordedEvent struct {
	name, origin string
	data         map[string]any
}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.tollgate_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	origin := ""
	if e.Origin() != nil {
		origin = string(e.Origin().CaddyModule().ID)
	}
	recorded.Lock()
	defer recorded.Unlock()
	recorded.events = append(recorded.events, recordedEvent{e.Name(), origin, maps.Clone(e.Data)})
	return nil
}

// waitEvents waits up to 5s for n recorded events (they are emitted
// asynchronously) and returns what was recorded.
func waitEvents(n int) []recordedEvent {
	deadline := time.Now().Add(5 * time.Second)
	for {
		recorded.Lock()
		evs := append([]recordedEvent(nil), recorded.events...)
		recorded.Unlock()
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestEventOnEveryRejection(t *testing.T) {
	recorded.Lock()
	recorded.events = nil
	recorded.Unlock()

	tester := caddytest.NewTester(t)
	tester.InitServer(jsonConfig(`
		"events": {"subscriptions": [{
			"events": ["rate_limit_exceeded"],
			"handlers": [{"handler": "tollgate_test_recorder"}]
		}]},`, `
		{"handler": "rate_limit",
		 "rate_limits": {
			"ev": {"key": "{http.request.header.X-Client}", "events": 1, "window": "1h"},
			"ev_dry": {"match": [{"path": ["/dry"]}], "key": "{http.request.header.X-Client}", "events": 1, "window": "1h", "dry_run": true}
		 },
		 "zone_order": ["ev_dry", "ev"]},
		{"handler": "static_response", "body": "ok"}`), "json")

	for i, step := range []struct {
		path, client string
		status       int
	}{
		{"/", "e1", 200},    // allowed: no event
		{"/", "e1", 429},    // ev rejects
		{"/dry", "e2", 200}, // allowed by both: no event
		{"/dry", "e2", 429}, // ev_dry would reject (dry run), then ev rejects
	} {
		resp, _ := get(t, tester, step.path, "X-Client: "+step.client)
		check(t, fmt.Sprintf("step %d", i), resp, "", want{status: step.status})
	}
	waitEvents(3)
	time.Sleep(100 * time.Millisecond) // let any stray event arrive
	evs := waitEvents(3)
	if len(evs) != 3 {
		t.Fatalf("recorded %d events %v, want 3: one per rejection and would-be rejection, none for allowed requests", len(evs), evs)
	}
	for i, w := range []struct {
		zone   string
		dryRun bool
	}{{"ev", false}, {"ev_dry", true}, {"ev", false}} {
		e := evs[i]
		if e.name != "rate_limit_exceeded" || e.origin != "http.handlers.rate_limit" {
			t.Errorf("event %d: name %q from %q, want rate_limit_exceeded from http.handlers.rate_limit", i, e.name, e.origin)
		}
		if e.data["zone"] != w.zone || e.data["dry_run"] != w.dryRun || e.data["wait"] != 3600.0 {
			t.Errorf("event %d: data %v, want zone %s, dry_run %v, wait 3600", i, e.data, w.zone, w.dryRun)
		}
		if ip, _ := e.data["client_ip"].(string); ip == "" {
			t.Errorf("event %d: data %v, want a client_ip", i, e.data)
		}
		if _, ok := e.data["key"]; ok {
			t.Errorf("event %d: data %v has the key without log_key", i, e.data)
		}
	}
}

// TestSubscribed: which configured subscriptions receive an event of
// Tollgate's, as Caddy's events app passes it on (by name or to all
// events; from the module, a namespace above it, or any module).
func TestSubscribed(t *testing.T) {
	const id = "http.handlers.rate_limit"
	sub := func(events []string, modules ...caddy.ModuleID) *caddyevents.Subscription {
		return &caddyevents.Subscription{Events: events, Modules: modules}
	}
	for _, c := range []struct {
		name string
		subs []*caddyevents.Subscription
		want bool
	}{
		{"none", nil, false},
		{"another event", []*caddyevents.Subscription{sub([]string{"cert_obtained"})}, false},
		{"the event", []*caddyevents.Subscription{sub([]string{"cert_obtained"}), sub([]string{eventExceeded})}, true},
		{"all events", []*caddyevents.Subscription{sub(nil)}, true},
		{"all events, by empty name", []*caddyevents.Subscription{sub([]string{""})}, true},
		{"from the module", []*caddyevents.Subscription{sub([]string{eventExceeded}, id)}, true},
		{"from a namespace above", []*caddyevents.Subscription{sub(nil, "http.handlers")}, true},
		{"from the top namespace", []*caddyevents.Subscription{sub(nil, "http")}, true},
		{"from any module, by empty ID", []*caddyevents.Subscription{sub(nil, "")}, true},
		{"from another module", []*caddyevents.Subscription{sub([]string{eventExceeded}, "tls")}, false},
		{"from a module whose ID only starts like it", []*caddyevents.Subscription{sub(nil, "http.handlers.rate")}, false},
		{"from a module below", []*caddyevents.Subscription{sub(nil, id+".x")}, false},
		{"a nil subscription", []*caddyevents.Subscription{nil}, false},
	} {
		if got := subscribed(c.subs, eventExceeded, id); got != c.want {
			t.Errorf("%s: subscribed = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestEventsOnlyWhereSubscribed: an event goes to the events app only
// when a configured subscription can receive it. The events app logs
// every event it is given (at DEBUG), so the log shows whether one was
// emitted; a subscription that can receive it records it.
func TestEventsOnlyWhereSubscribed(t *testing.T) {
	for _, c := range []struct {
		name string
		sub  string // the subscription's events and modules
		want bool
	}{
		{"another event", `"events": ["cert_obtained"]`, false},
		{"from another module", `"events": ["rate_limit_exceeded"], "modules": ["tls"]`, false},
		{"only bans", `"events": ["rate_limit_banned"]`, false},
		{"all events from a namespace above", `"modules": ["http.handlers"]`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			recorded.Lock()
			recorded.events = nil
			recorded.Unlock()
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			config := strings.Replace(jsonConfig(`
				"events": {"subscriptions": [{`+c.sub+`,
					"handlers": [{"handler": "tollgate_test_recorder"}]
				}]},`, `
				{"handler": "rate_limit",
				 "rate_limits": {
					"evsub": {"key": "{http.request.header.X-Client}", "events": 1, "window": "1h"}
				 }},
				{"handler": "static_response", "body": "ok"}`), `"admin"`, `"logging": {"logs": {"default": {
					"writer": {"output": "file", "filename": "`+logFile+`"},
					"encoder": {"format": "json"}, "level": "DEBUG"}}},
				"admin"`, 1)
			tester := caddytest.NewTester(t)
			tester.InitServer(config, "json")
			for i, w := range []int{200, 429, 429} {
				resp, _ := get(t, tester, "/", "X-Client: "+c.name)
				check(t, fmt.Sprintf("step %d", i), resp, "", want{status: w})
			}
			var evs []recordedEvent
			if c.want {
				evs = waitEvents(2)
			} else {
				time.Sleep(200 * time.Millisecond) // let any event arrive
				evs = waitEvents(0)
			}
			emitted := 0
			for _, l := range logLines(t, logFile, "events") {
				if l["msg"] == "event" && l["name"] == eventExceeded {
					emitted++
				}
			}
			want := 0
			if c.want {
				want = 2
			}
			if len(evs) != want || emitted != want {
				t.Errorf("%d events recorded, %d emitted (Caddy's log), want %d", len(evs), emitted, want)
			}
		})
	}
}

func TestAdminAPI(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone adm {
				match {
					not path /net
				}
				key {http.request.header.X-Client}
				rate 3/h
			}
			zone adm_net {
				match {
					path /net
				}
				ipv4_prefix 24
				ipv6_prefix 64
				rate 3/h
				dry_run
			}
		}
		respond /net "{client_ip}"
		respond "ok"
	}`, "caddyfile")

	long := strings.Repeat("k", 300)
	get(t, tester, "/", "X-Client: alice")
	get(t, tester, "/", "X-Client: alice")
	get(t, tester, "/", "X-Client: "+long)
	get(t, tester, "/", "X-Client: a/b c")
	_, ip := get(t, tester, "/net") // the client IP Caddy sees

	var zones []map[string]any
	if st := adminDo(t, "GET", "/rate_limit/zones", &zones); st != 200 {
		t.Fatalf("GET zones: status %d", st)
	}
	byName := map[string]map[string]any{}
	for _, z := range zones {
		byName[z["zone"].(string)] = z
	}
	wantZones := map[string]map[string]any{
		"adm":     {"zone": "adm", "algorithm": "token_bucket", "events": 3.0, "window": 3600.0, "burst": 3.0, "storage": "memory", "dry_run": false, "keys": 3.0},
		"adm_net": {"zone": "adm_net", "algorithm": "token_bucket", "events": 3.0, "window": 3600.0, "burst": 3.0, "storage": "memory", "dry_run": true, "keys": 1.0},
	}
	for name, w := range wantZones {
		if got := byName[name]; fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("GET zones: %s = %v, want %v", name, got, w)
		}
	}

	type keyState struct {
		Zone      string  `json:"zone"`
		Key       string  `json:"key"`
		Allowed   bool    `json:"allowed"`
		Remaining int64   `json:"remaining"`
		Reset     float64 `json:"reset"`
		Wait      float64 `json:"wait"`
		Error     string  `json:"error"`
	}
	keyPath := func(zone, key string) string {
		return "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape(key)
	}
	for _, c := range []struct {
		name, zone, key string
		status          int
		want            keyState
	}{
		{"alice", "adm", "alice", 200, keyState{Zone: "adm", Key: "alice", Allowed: true, Remaining: 1, Reset: 2400}},
		{"long key, hashed as stored", "adm", long, 200, keyState{Zone: "adm", Key: storage.BoundKey(long), Allowed: true, Remaining: 2, Reset: 1200}},
		{"escaped slash and space", "adm", "a/b c", 200, keyState{Zone: "adm", Key: "a/b c", Allowed: true, Remaining: 2, Reset: 1200}},
		{"client IP grouped by prefix", "adm_net", ip, 200, keyState{Zone: "adm_net", Key: storage.MaskIP(ip, 24, 64), Allowed: true, Remaining: 2, Reset: 1200}},
		{"unknown key", "adm", "nobody", 404, keyState{Error: `zone "adm" holds no key "nobody"`}},
		{"unknown zone", "nozone", "alice", 404, keyState{Error: `unknown zone "nozone"`}},
	} {
		var got keyState
		if st := adminDo(t, "GET", keyPath(c.zone, c.key), &got); st != c.status || got != c.want {
			t.Errorf("GET %s: %d %+v, want %d %+v", c.name, st, got, c.status, c.want)
		}
	}

	// Unblock a customer: alice exhausts her quota, is rejected, and is
	// reset.
	get(t, tester, "/", "X-Client: alice")
	resp, _ := get(t, tester, "/", "X-Client: alice")
	check(t, "alice exhausted", resp, "", want{status: 429})
	var blocked keyState
	adminDo(t, "GET", keyPath("adm", "alice"), &blocked)
	if w := (keyState{Zone: "adm", Key: "alice", Remaining: 0, Reset: 3600, Wait: 1200}); blocked != w {
		t.Errorf("GET blocked alice: %+v, want %+v", blocked, w)
	}
	var reset map[string]any
	if st := adminDo(t, "DELETE", keyPath("adm", "alice"), &reset); st != 200 || reset["reset"] != true || reset["key"] != "alice" {
		t.Errorf("DELETE alice: %d %v, want 200 and reset true", st, reset)
	}
	if st := adminDo(t, "GET", keyPath("adm", "alice"), nil); st != 404 {
		t.Errorf("GET alice after DELETE: status %d, want 404", st)
	}
	resp, body := get(t, tester, "/", "X-Client: alice")
	check(t, "alice after reset", resp, body, want{200, map[string]string{"RateLimit": `"adm";r=2;t=1200`}, "ok"})
	if st := adminDo(t, "DELETE", keyPath("adm", "nobody"), nil); st != 404 {
		t.Errorf("DELETE unknown key: status %d, want 404", st)
	}
	if st := adminDo(t, "DELETE", keyPath("nozone", "alice"), nil); st != 404 {
		t.Errorf("DELETE in unknown zone: status %d, want 404", st)
	}
	if st := adminDo(t, "POST", "/rate_limit/zones", nil); st != 405 {
		t.Errorf("POST zones: status %d, want 405", st)
	}
	if st := adminDo(t, "GET", "/rate_limit/nothing", nil); st != 404 {
		t.Errorf("GET /rate_limit/nothing: status %d, want 404", st)
	}
}

func TestAdminAPIWithRedis(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSite(srv.Addr, `
			zone adm_redis {
				key {http.request.header.X-Client}
				rate 3/h
			}`), "caddyfile")
	get(t, tester, "/", "X-Client: rita")

	var zones []map[string]any
	adminDo(t, "GET", "/rate_limit/zones", &zones)
	found := false
	for _, z := range zones {
		if z["zone"] == "adm_redis" {
			found = true
			if z["storage"] != "redis" || z["keys"] != nil {
				t.Errorf("GET zones: %v, want storage redis and keys null", z)
			}
		}
	}
	if !found {
		t.Fatalf("GET zones: %v, want adm_redis", zones)
	}
	var state map[string]any
	if st := adminDo(t, "GET", "/rate_limit/zones/adm_redis/keys/rita", &state); st != 200 || state["remaining"] != 2.0 {
		t.Errorf("GET rita: %d %v, want 200 and remaining 2", st, state)
	}
	if st := adminDo(t, "DELETE", "/rate_limit/zones/adm_redis/keys/rita", nil); st != 200 {
		t.Errorf("DELETE rita: status %d, want 200", st)
	}
	if st := adminDo(t, "GET", "/rate_limit/zones/adm_redis/keys/rita", nil); st != 404 {
		t.Errorf("GET rita after DELETE: status %d, want 404", st)
	}
	// Only the reset's mark stays (see docs/redis.md), until its TTL.
	keys, _ := srv.Client().Keys(context.Background(), "*").Result()
	for _, k := range keys {
		if !strings.HasSuffix(k, "!reset") || srv.Client().PTTL(context.Background(), k).Val() <= 0 {
			t.Errorf("redis holds %q after DELETE, want only reset marks, with a TTL", k)
		}
	}
	if len(keys) != 1 {
		t.Errorf("redis holds %d keys after DELETE, want 1 (the reset's mark): %q", len(keys), keys)
	}
}

// failingStorage is a test-only storage backend whose store always fails.
type failingStorage struct{}

var errStoreDown = errors.New("store down (test)")

func (failingStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit.storage.tollgate_test_failing",
		New: func() caddy.Module { return new(failingStorage) },
	}
}

func (*failingStorage) OpenLimiter(storage.Zone) (storage.Limiter, error) {
	return failingLimiter{}, nil
}

func (*failingStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

type failingLimiter struct{}

func (failingLimiter) Take(context.Context, string, int64, int64) (algorithms.Decision, error) {
	return algorithms.Decision{}, errStoreDown
}
func (failingLimiter) Undo(context.Context, string, int64, int64, algorithms.Decision) error {
	return errStoreDown
}
func (failingLimiter) Peek(context.Context, string, int64) (algorithms.Decision, bool, error) {
	return algorithms.Decision{}, false, errStoreDown
}
func (failingLimiter) Reset(context.Context, string, int64) (bool, error) { return false, errStoreDown }

// logLines returns the JSON log lines of logger in file.
func logLines(t *testing.T, file, logger string) []map[string]any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["logger"] == logger {
			lines = append(lines, m)
		}
	}
	return lines
}

func TestLogsAndStoreErrors(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tester := caddytest.NewTester(t)
	tester.InitServer(withGlobal(`metrics
	log {
		output file `+logFile+`
		format json
		level DEBUG
	}`)+`
	localhost:9080 {
		route /plain {
			rate_limit {
				zone log_plain {
					key {http.request.header.X-Client}
					rate 1/h
				}
			}
		}
		route /keyed {
			rate_limit {
				zone log_keyed {
					key {http.request.header.X-Client}
					rate 1/h
				}
				log_key
			}
		}
		route /down {
			rate_limit {
				zone log_down {
					key {http.request.header.X-Client}
					rate 1/h
					on_storage_error allow
				}
				storage tollgate_test_failing
			}
		}
		respond "ok"
	}`, "caddyfile")

	latency := `caddy_http_rate_limit_storage_seconds_count{backend="tollgate_test_failing"}`
	before := scrape(t)[latency] // the histogram outlives configurations
	get(t, tester, "/plain", "X-Client: secret-1")
	get(t, tester, "/plain", "X-Client: secret-1")
	get(t, tester, "/keyed", "X-Client: shown-2")
	get(t, tester, "/keyed", "X-Client: shown-2")
	// A store outage: of five failures at once and one 5s later, one line
	// is logged; the failure 10s after the first logs the second line,
	// with the count of the five held back.
	for i := 0; i < 5; i++ {
		resp, body := get(t, tester, "/down", "X-Client: x")
		check(t, fmt.Sprintf("store down %d", i), resp, body, want{200, map[string]string{"RateLimit": ""}, "ok"})
	}
	advance(5 * time.Second)
	get(t, tester, "/down", "X-Client: x")
	advance(5 * time.Second)
	get(t, tester, "/down", "X-Client: x")

	var lines []map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for {
		lines = logLines(t, logFile, "http.handlers.rate_limit")
		if len(lines) >= 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var rejects, storeErrs []map[string]any
	for _, l := range lines {
		switch l["msg"] {
		case "rate limit exceeded":
			rejects = append(rejects, l)
		case "rate limit store failed":
			storeErrs = append(storeErrs, l)
		}
	}
	if len(rejects) != 2 {
		t.Fatalf("rejection log lines %v, want 2", rejects)
	}
	for _, l := range rejects {
		if l["level"] != "debug" || l["client_ip"] == "" || l["client_ip"] == nil || l["wait"] == nil {
			t.Errorf("rejection line %v, want level debug with zone, wait and client_ip", l)
		}
		switch l["zone"] {
		case "log_plain":
			if _, ok := l["key"]; ok {
				t.Errorf("rejection line %v has the key without log_key", l)
			}
		case "log_keyed":
			if l["key"] != "shown-2" {
				t.Errorf("rejection line %v, want key shown-2 with log_key", l)
			}
		default:
			t.Errorf("rejection line %v: unexpected zone", l)
		}
	}
	if len(storeErrs) != 2 {
		t.Fatalf("store failure log lines %v, want 2 for 7 failures over 10s", storeErrs)
	}
	for i, wantSuppressed := range []float64{0, 5} {
		l := storeErrs[i]
		if l["level"] != "error" || l["zone"] != "log_down" || l["suppressed"] != wantSuppressed {
			t.Errorf("store failure line %d: %v, want level error, zone log_down, suppressed %v", i, l, wantSuppressed)
		}
	}
	after := scrape(t)
	checkSeries(t, "store down", after, map[string]float64{
		requests("log_down", "storage_error"):         7,
		requests("log_down", "allowed"):               0, // each series exists from the start
		`caddy_http_rate_limit_keys{zone="log_down"}`: -1,
	})
	if got := after[latency] - before; got != 7 {
		t.Errorf("%s went up by %v, want 7", latency, got)
	}
	// The admin API reports the failing store instead of a key state.
	if st := adminDo(t, "GET", "/rate_limit/zones/log_down/keys/x", nil); st != http.StatusServiceUnavailable {
		t.Errorf("GET key in a failing store: status %d, want 503", st)
	}
}

// TestHandleErrorsJSONBody runs the JSON error body of docs/operations.md.
func TestHandleErrorsJSONBody(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone api_docs {
				key  {http.request.header.X-API-Key}
				rate 100/m
			}
		}
		handle_errors 429 {
			header Content-Type application/json
			respond `+"`"+`{"error": "rate_limited", "zone": "{http.rate_limit.zone}", "limit": {http.rate_limit.limit}, "retry_after": "{http.rate_limit.retry_after}"}`+"`"+`
		}
		respond "ok"
	}`, "caddyfile")
	for i := 0; i < 100; i++ {
		get(t, tester, "/", "X-API-Key: docs")
	}
	resp, body := get(t, tester, "/", "X-API-Key: docs")
	check(t, "rejected", resp, body, want{429, map[string]string{"Content-Type": "application/json", "Retry-After": "1"}, ""})
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if w := map[string]any{"error": "rate_limited", "zone": "api_docs", "limit": 100.0, "retry_after": "1"}; fmt.Sprint(got) != fmt.Sprint(w) {
		t.Errorf("body %v, want %v", got, w)
	}
}
