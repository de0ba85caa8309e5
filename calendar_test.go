package tollgate

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// setClock sets the fake clock to tm until the test ends.
func setClock(t *testing.T, tm time.Time) {
	t.Helper()
	old := fakeNow.Load()
	fakeNow.Store(tm.UnixMicro())
	t.Cleanup(func() { fakeNow.Store(old) })
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestCalendarHeaders: a calendar window's t and Retry-After count the
// seconds to its local midnight (a request at 23:59:30 is told 30), and
// its w is its own window's length: a DST day's 23 hours, a leap
// February's 29 days.
func TestCalendarHeaders(t *testing.T) {
	kolkata, ny := mustZone(t, "Asia/Kolkata"), mustZone(t, "America/New_York")
	cases := []struct {
		name, window, tz string
		at               time.Time
		w, t             int64 // the policy's w and the first answer's t
	}{
		{"23:59:30 in Kolkata", "1d", "Asia/Kolkata", time.Date(2026, 5, 4, 23, 59, 30, 0, kolkata), 86400, 30},
		{"the spring DST day in New York", "1d", "America/New_York", time.Date(2026, 3, 8, 12, 0, 0, 0, ny), 82800, 12 * 3600},
		{"the autumn DST day in New York", "1d", "America/New_York", time.Date(2026, 11, 1, 0, 30, 0, 0, ny), 90000, 24*3600 + 1800},
		{"a leap February", "1mo", "America/New_York", time.Date(2028, 2, 29, 23, 0, 0, 0, ny), 29 * 86400, 3600},
		{"a week from Monday", "1w", "Asia/Kolkata", time.Date(2026, 5, 10, 22, 0, 0, 0, kolkata), 7 * 86400, 7200},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := fmt.Sprintf("X-API-Key: headers-%d", ci) // the store outlives each reload
			setClock(t, c.at)
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone quota {
				key {http.request.header.X-API-Key}
				algorithm fixed_window
				events 2
				window `+c.window+`
				align calendar
				timezone `+c.tz+`
			}
		}
		respond "ok"
	}`, "caddyfile")
			policy := fmt.Sprintf(`"quota";q=2;w=%d`, c.w)
			for i, w := range []want{
				{200, map[string]string{"RateLimit-Policy": policy, "RateLimit": fmt.Sprintf(`"quota";r=1;t=%d`, c.t)}, "ok"},
				{200, map[string]string{"RateLimit": fmt.Sprintf(`"quota";r=0;t=%d`, c.t)}, "ok"},
				{429, map[string]string{"Retry-After": fmt.Sprint(c.t), "RateLimit-Policy": policy}, ""},
			} {
				resp, body := get(t, tester, "/", key)
				check(t, fmt.Sprintf("request %d", i+1), resp, body, w)
			}
			// A second before the window ends: still refused; at its end,
			// a new window.
			advance(time.Duration(c.t-1) * time.Second)
			resp, body := get(t, tester, "/", key)
			check(t, "a second before the end", resp, body, want{429, map[string]string{"Retry-After": "1"}, ""})
			advance(time.Second)
			resp, body = get(t, tester, "/", key)
			check(t, "at the end", resp, body, want{200, nil, "ok"})
		})
	}
}

// TestCalendarAdapt: a calendar zone and its tiers adapt to JSON with the
// window of months as "1mo", which loads.
func TestCalendarAdapt(t *testing.T) {
	site := `:8080 {
	rate_limit {
		zone monthly {
			key {header.X-API-Key}
			algorithm fixed_window
			rate 100000/mo
			align calendar
			timezone Europe/Berlin
			tier {header.X-Plan} {
				pro 5000000/mo
				trial 1000/2w
			}
		}
	}
	respond ok
}
`
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"window":"1mo"`, `"align":"calendar"`, `"timezone":"Europe/Berlin"`, `"pro":{"events":5000000,"window":"1mo"}`, `"trial":{"events":1000,"window":1209600000000000}`} {
		if !strings.Contains(string(cfg), s) {
			t.Errorf("adapted config lacks %s:\n%s", s, cfg)
		}
	}
	if err := validateJSON(cfg); err != nil {
		t.Fatalf("the adapted config does not load: %v", err)
	}
}

// TestZonesCommandCalendar: `caddy rate-limit zones` writes a calendar
// zone's limit, and its tiers', as `rate` spells it (100000/mo, not the
// nominal 30d) with its time zone, from what the admin API lists.
func TestZonesCommandCalendar(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone monthly {
				key {header.X-API-Key}
				algorithm fixed_window
				rate 100000/mo
				align calendar
				timezone Europe/Berlin
				tier {header.X-Plan} {
					pro 5000000/3mo
					trial 1000/2w
				}
			}
		}
		respond ok
	}`, "caddyfile")
	var zones []adminapi.ZoneInfo
	if code := adminDo(t, "GET", "/rate_limit/zones", &zones); code != 200 || len(zones) != 1 {
		t.Fatalf("GET zones: %d %+v", code, zones)
	}
	if z := zones[0]; z.Calendar != "1mo" || z.Tiers["pro"].Calendar != "3mo" || z.Tiers["trial"].Calendar != "2w" {
		t.Errorf("GET zones: calendar %q, tiers %+v; want 1mo, pro 3mo and trial 2w", z.Calendar, z.Tiers)
	}
	out, err := runCLI(t, "--address", testAdmin, "zones")
	if err != nil {
		t.Fatal(err)
	}
	want := "100000/mo  100000  memory   0     calendar Europe/Berlin; tiers by {http.request.header.X-Plan}: pro 5000000/3mo, trial 1000/2w"
	if !strings.Contains(out, want) {
		t.Errorf("caddy rate-limit zones printed\n%s\nwant a row with %q", out, want)
	}
}

// adminPost posts body to the admin API and decodes the JSON answer into
// out; it returns the status.
func adminPost(t *testing.T, path, body string, out any) int {
	t.Helper()
	resp, err := http.Post(adminBase+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Errorf("POST %s: %v in %q", path, err, b)
		}
	}
	return resp.StatusCode
}

// TestGrantThroughAdmin: a grant through the admin API (and `caddy
// rate-limit grant`) gives one key more for its current calendar day, on
// memory and Redis: two grants add up, show counts them, the event
// rate_limit_granted is emitted, another key gets nothing, and a token
// bucket zone refuses a grant. On memory, the fake clock then crosses
// midnight: the grant has ended with its day.
func TestGrantThroughAdmin(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			setClock(t, time.Date(2026, 7, 1, 20, 0, 0, 0, berlin))
			recorded.Lock()
			recorded.events = nil
			recorded.Unlock()
			cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone daily {
				key {http.request.header.X-API-Key}
				algorithm fixed_window
				rate 2/d
				align calendar
				timezone Europe/Berlin
			}
			zone bucket {
				match {
					path /bucket
				}
				key {http.request.header.X-API-Key}
				rate 100/m
			}
			`+storage(t)+`
		}
		respond "ok"
	}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			var c map[string]any
			if err := json.Unmarshal(cfg, &c); err != nil {
				t.Fatal(err)
			}
			c["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
				"events": []string{"rate_limit_granted"}, "handlers": []any{map[string]any{"handler": "tollgate_test_recorder"}}}}}
			full, _ := json.Marshal(c)
			tester := caddytest.NewTester(t)
			tester.InitServer(string(full), "json")
			key := "X-API-Key: grant-" + name
			day := func(want ...int) {
				t.Helper()
				for i, w := range want {
					resp, _ := get(t, tester, "/", key)
					if resp.StatusCode != w {
						t.Fatalf("request %d: status %d, want %d", i+1, resp.StatusCode, w)
					}
				}
			}
			day(200, 200, 429)
			var out struct {
				Granted float64           `json:"granted"`
				State   adminapi.KeyState `json:"state"`
			}
			if code := adminPost(t, "/rate_limit/zones/daily/keys/grant-"+name+"/grant", `{"amount": 2}`, &out); code != 200 || out.Granted != 2 || out.State.Remaining != 2 {
				t.Fatalf("grant 2: %d %+v", code, out)
			}
			// The CLI, for scripts and for people.
			if out, err := runCLI(t, "--address", testAdmin, "--json", "grant", "daily", "grant-"+name, "0.5"); err != nil || !strings.Contains(out, `"granted":0.5`) {
				t.Fatalf("caddy rate-limit --json grant: %v, %s", err, out)
			}
			if out, err := runCLI(t, "--address", testAdmin, "grant", "daily", "grant-"+name, "0.5"); err != nil || !strings.Contains(out, `granted key "grant-`+name+`" in zone daily 0.5 more events for its current window: 3 remaining`) {
				t.Fatalf("caddy rate-limit grant: %v, %s", err, out)
			}
			var st adminapi.KeyState
			if code := adminDo(t, "GET", "/rate_limit/zones/daily/keys/grant-"+name, &st); code != 200 || st.Remaining != 3 || !st.Allowed {
				t.Fatalf("show after grants of 2 and 1: %d %+v, want 3 remaining", code, st)
			}
			day(200, 200, 200, 429)
			if resp, _ := get(t, tester, "/", "X-API-Key: other-"+name); resp.StatusCode != 200 {
				t.Fatalf("another key: %d", resp.StatusCode)
			}
			var e map[string]any
			if code := adminPost(t, "/rate_limit/zones/bucket/keys/grant-"+name+"/grant", `{"amount": 2}`, &e); code != 400 || !strings.Contains(fmt.Sprint(e["error"]), "grants are for fixed_window") {
				t.Fatalf("a token bucket grant: %d %v", code, e)
			}
			if code := adminPost(t, "/rate_limit/zones/daily/keys/grant-"+name+"/grant", `{"amount": -1}`, &e); code != 400 {
				t.Fatalf("a negative grant: %d %v", code, e)
			}
			evs := waitEvents(3) // 2, then 0.5 twice from the CLI
			if len(evs) != 3 || evs[0].name != "rate_limit_granted" || evs[0].data["zone"] != "daily" || evs[0].data["key"] != "grant-"+name || evs[0].data["amount"] != 2.0 {
				t.Fatalf("events: %+v", evs)
			}
			var zones []adminapi.ZoneInfo
			if code := adminDo(t, "GET", "/rate_limit/zones", &zones); code != 200 {
				t.Fatalf("GET zones: %d", code)
			}
			for _, z := range zones {
				if z.Zone == "daily" && (z.Calendar != "1d" || z.Timezone != "Europe/Berlin" || z.Window != 86400) {
					t.Errorf("zone daily listed as %+v", z)
				}
			}
			if name == "memory" {
				advance(4 * time.Hour) // past midnight in Berlin
				day(200, 200, 429)
			}
		})
	}
}

// TestGrantSlidingThroughAdmin: sliding_window and sliding_log zones take
// grants through the admin API and the CLI, on memory and Redis: the
// window admits the rate and the grant. On memory, the fake clock then
// moves to the middle of the sliding window's next window, which weighs
// only what the window admitted beyond its grant, and walks the
// sliding_log's grant to its end, a window after it was given, when the
// log counts its entries against the rate alone. A sliding_log grant
// past its cap is refused.
func TestGrantSlidingThroughAdmin(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			setClock(t, time.Date(2026, 7, 1, 18, 0, 0, 0, time.UTC))
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone hourly {
				match {
					not path /log
				}
				key {http.request.header.X-API-Key}
				algorithm sliding_window
				rate 2/h
			}
			zone log {
				match {
					path /log
				}
				key {http.request.header.X-API-Key}
				algorithm sliding_log
				rate 2/h
			}
			`+storage(t)+`
		}
		respond "ok"
	}`, "caddyfile")
			key := "X-API-Key: slide-" + name
			path := "/"
			expect := func(want ...int) {
				t.Helper()
				for i, w := range want {
					resp, _ := get(t, tester, path, key)
					if resp.StatusCode != w {
						t.Fatalf("request %d: status %d, want %d", i+1, resp.StatusCode, w)
					}
				}
			}
			expect(200, 200, 429)
			if out, err := runCLI(t, "--address", testAdmin, "grant", "hourly", "slide-"+name, "3"); err != nil || !strings.Contains(out, `3 more events for its current window: 3 remaining`) {
				t.Fatalf("caddy rate-limit grant: %v, %s", err, out)
			}
			var st adminapi.KeyState
			if code := adminDo(t, "GET", "/rate_limit/zones/hourly/keys/slide-"+name, &st); code != 200 || st.Remaining != 3 {
				t.Fatalf("show after a grant of 3: %d %+v", code, st)
			}
			expect(200, 200, 200, 429)
			if name == "memory" {
				// The next window weighs 5 - 3 = 2 admitted: at its
				// middle, 1; without the grant's end it would weigh 3.
				advance(90 * time.Minute)
				expect(200, 429)
			}

			// A sliding_log: the grant lasts an hour from when it is
			// given; its entries count for an hour from when they were
			// admitted.
			path = "/log"
			expect(200, 200, 429) // at T
			if name == "memory" {
				advance(10 * time.Minute)
			}
			if code := adminPost(t, "/rate_limit/zones/log/keys/slide-"+name+"/grant", `{"amount": 2}`, nil); code != 200 {
				t.Fatalf("grant 2 to a sliding_log: %d", code)
			}
			expect(200, 200, 429) // at T+10m, the grant's
			var e map[string]any
			if code := adminPost(t, "/rate_limit/zones/log/keys/slide-"+name+"/grant", `{"amount": 100001}`, &e); code != 400 || !strings.Contains(fmt.Sprint(e["error"]), "at most 100000 events, got 100001") {
				t.Fatalf("a sliding_log grant past its cap: %d %v", code, e)
			}
			if name == "memory" {
				advance(55 * time.Minute) // T+65m: T's left, the grant lasts
				expect(200, 200, 429)
				advance(6 * time.Minute) // T+71m: the grant and T+10m's have ended
				expect(429)
				advance(55 * time.Minute) // T+126m: T+65m's have left
				expect(200, 200, 429)
			}
		})
	}
}

// TestGrantAcrossInstances: three instances on one Redis (three handlers,
// each with its own client) each cached the key's rejection; a grant made
// through one admin API is the grant, once, on every instance: they all
// forget the rejection, and together admit exactly the grant more, for
// each window algorithm. Before, the one Caddy holding the three handlers
// granted three times, once per client (12 admitted after a grant of 4).
func TestGrantAcrossInstances(t *testing.T) {
	srv := redistest.Start(t)
	for _, algo := range []string{"fixed_window", "sliding_window", "sliding_log"} {
		t.Run(algo, func(t *testing.T) {
			cfg := globalOptions
			for i := 1; i <= 3; i++ {
				cfg += fmt.Sprintf(`
	http://localhost:908%d {
		rate_limit {
			zone plan {
				key {http.request.header.X-Client}
				algorithm %s
				rate 3/h
			}
			storage redis {
				addresses %s
				pool_size %d
				timeout `+testTimeout+`
			}
		}
		respond "ok"
	}`, i, algo, srv.Addr, 4+i)
			}
			tester := caddytest.NewTester(t)
			tester.InitServer(cfg, "caddyfile")
			key := "grant-across-" + algo
			// Requests in turn on instances 1, 2, 3, 1...: their statuses.
			statuses := func() string {
				out := ""
				for i := 0; i < 12; i++ {
					req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://localhost:908%d/", 1+i%3), nil)
					req.Header.Set("X-Client", key)
					resp, err := tester.Client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					out += fmt.Sprint(resp.StatusCode, " ")
				}
				return out
			}
			rest := strings.Repeat("429 ", 8)
			if got := statuses(); got != "200 200 200 "+rest+"429 " {
				t.Fatalf("before the grant: %s, want 3 admitted across three instances", got)
			}
			var out struct {
				State adminapi.KeyState `json:"state"`
			}
			if code := adminPost(t, "/rate_limit/zones/plan/keys/"+key+"/grant", `{"amount": 4}`, &out); code != 200 || out.State.Remaining != 4 {
				t.Fatalf("grant 4: %d %+v, want 4 remaining", code, out)
			}
			// The first three on three instances: each forgot the rejection
			// it had cached.
			if got := statuses(); got != "200 200 200 200 "+rest {
				t.Fatalf("after a grant of 4: %s, want 4 admitted, the first on each instance", got)
			}
		})
	}
}
