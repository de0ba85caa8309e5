package tollgate

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// TestBanThroughCaddy: a login zone (rate 2/m, ban 10m after 2
// rejections) on the memory store and on Redis. Two requests pass; the
// third is rejected by the rate (a strike); the fourth is rejected and
// starts the ban; from then on every request is refused with Retry-After
// the time left, even once the rate has refilled, without touching the
// rate; another key is not banned. The admin API shows the ban, and
// lifting it lets the key in again.
func TestBanThroughCaddy(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(withGlobal("metrics")+`
	localhost:9080 {
		rate_limit {
			zone login {
				key {http.request.header.X-Client}
				rate 2/m
				ban 10m
				ban_after 2
			}
			`+storage(t)+`
		}
		respond "ok"
	}`, "caddyfile")
			client := "X-Client: banme-" + name
			before := scrape(t)[requests("login", "banned")]
			for i, w := range []want{
				{200, map[string]string{"RateLimit-Policy": `"login";q=2;w=60`, "RateLimit": `"login";r=1;t=30`}, ""},
				{200, nil, ""},
				{429, nil, ""}, // strike 1: Retry-After 30 (29 on Redis's clock after a slow second)
				{429, map[string]string{"Retry-After": "600", "RateLimit-Policy": `"login";q=2;w=60`}, ""}, // strike 2: banned
				{429, nil, ""}, // banned
			} {
				resp, body := get(t, tester, "/", client)
				check(t, fmt.Sprintf("request %d", i+1), resp, body, w)
				if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); i == 2 && (ra < 29 || ra > 30) {
					t.Errorf("request 3: Retry-After %q, want the rate's 30", resp.Header.Get("Retry-After"))
				}
			}
			resp, _ := get(t, tester, "/", client)
			if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != 429 || ra < 590 || ra > 600 {
				t.Errorf("banned: status %d, Retry-After %q, want 429 and about 600", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if resp, _ := get(t, tester, "/", "X-Client: other-"+name); resp.StatusCode != 200 {
				t.Errorf("another key: status %d, want 200", resp.StatusCode)
			}
			if name == "memory" {
				// The rate refills; the ban holds.
				advance(2 * time.Minute)
				resp, _ := get(t, tester, "/", client)
				check(t, "after 2 minutes", resp, "", want{429, map[string]string{"Retry-After": "480"}, ""})
			}
			got := scrape(t)[requests("login", "banned")] - before
			if want := 2.0; name == "memory" {
				want = 3
				if got != want {
					t.Errorf("banned requests counted %v, want %v", got, want)
				}
			} else if got != want {
				t.Errorf("banned requests counted %v, want %v", got, want)
			}

			var st adminapi.KeyState
			if code := adminDo(t, "GET", "/rate_limit/zones/login/bans/banme-"+name, &st); code != 200 || st.Ban == nil || !st.Ban.Banned || st.Ban.Left < 400 {
				t.Fatalf("GET ban: %d %+v (ban %+v), want banned for several minutes", code, st, st.Ban)
			}
			if code := adminDo(t, "DELETE", "/rate_limit/zones/login/bans/banme-"+name, nil); code != 200 {
				t.Fatalf("DELETE ban: %d", code)
			}
			if code := adminDo(t, "GET", "/rate_limit/zones/login/keys/banme-"+name, &st); code != 200 || st.Ban == nil || st.Ban.Banned {
				t.Fatalf("GET key after lifting: %d %+v", code, st.Ban)
			}
			resp, _ = get(t, tester, "/", client)
			if name == "memory" {
				check(t, "lifted", resp, "", want{200, nil, ""}) // the rate refilled
			} else {
				check(t, "lifted", resp, "", want{429, nil, ""}) // its rate is left as it was
				if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra > 30 {
					t.Errorf("lifted: Retry-After %d, want the rate's wait, not a ban's", ra)
				}
			}
			if code := adminDo(t, "DELETE", "/rate_limit/zones/login/bans/nobody", nil); code != 404 {
				t.Errorf("DELETE a ban nobody has: %d, want 404", code)
			}
		})
	}
}

// TestBannedRetryAfterCoversTheRate: a ban (1m) shorter than its rate's
// wait (1/h). A banned request's Retry-After is when the rate admits it
// too, not the ban's end: before, it was the ban's 60s, and a client that
// obeyed came back to the rate's rejection, a strike, and a new ban.
func TestBannedRetryAfterCoversTheRate(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone short_ban {
				key {http.request.header.X-Client}
				rate 1/h
				ban 1m
			}
			`+storage(t)+`
		}
		respond "ok"
	}`, "caddyfile")
			client := "X-Client: obeys-" + name
			retryAfter := func(step string, status int) int {
				t.Helper()
				resp, _ := get(t, tester, "/", client)
				if resp.StatusCode != status {
					t.Fatalf("%s: status %d, want %d", step, resp.StatusCode, status)
				}
				ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
				return ra
			}
			retryAfter("first", 200)
			if ra := retryAfter("second, starting the ban", 429); ra < 3599 || ra > 3600 {
				t.Errorf("second: Retry-After %d, want the rate's 3600 (longer than the ban's 60)", ra)
			}
			if ra := retryAfter("banned", 429); ra < 3599 || ra > 3600 {
				t.Errorf("banned: Retry-After %d, want the rate's 3600, not the ban's 60", ra)
			}
			if name == "memory" {
				advance(2 * time.Minute) // the ban is over, the rate still refuses
				if ra := retryAfter("after the ban", 429); ra != 3480 {
					t.Errorf("after the ban: Retry-After %d, want 3480", ra)
				}
			}
		})
	}
}

// TestBanEventAndJSON: the JSON config (ban, ban_after), the
// rate_limit_banned event once per ban, and rate_limit_exceeded on every
// rejection, banned ones too.
func TestBanEventAndJSON(t *testing.T) {
	recorded.Lock()
	recorded.events = nil
	recorded.Unlock()

	tester := caddytest.NewTester(t)
	tester.InitServer(jsonConfig(`
		"events": {"subscriptions": [{
			"events": ["rate_limit_exceeded", "rate_limit_banned"],
			"handlers": [{"handler": "tollgate_test_recorder"}]
		}]},`, `
		{"handler": "rate_limit",
		 "rate_limits": {
			"jb": {"key": "{http.request.header.X-Client}", "events": 1, "window": "1h", "ban": "1h30m", "ban_after": 1}
		 }},
		{"handler": "static_response", "body": "ok"}`), "json")
	for i, w := range []int{200, 429, 429, 429} {
		resp, _ := get(t, tester, "/", "X-Client: jb")
		check(t, fmt.Sprintf("step %d", i), resp, "", want{status: w})
	}
	waitEvents(4)
	time.Sleep(100 * time.Millisecond)
	evs := waitEvents(4)
	names := ""
	for _, e := range evs {
		names += e.name + " "
	}
	if names != "rate_limit_banned rate_limit_exceeded rate_limit_exceeded rate_limit_exceeded " {
		t.Fatalf("events %q, want banned and exceeded for the second request, exceeded for the two banned ones", names)
	}
	if evs[0].data["zone"] != "jb" || evs[0].data["wait"] != 5400.0 {
		t.Errorf("banned event data %v, want zone jb, wait 5400", evs[0].data)
	}
}

// TestZoneListShowsGuards: the admin API's zone list gives a zone's
// concurrency and ban.
func TestZoneListShowsGuards(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone both {
				rate 5/m
				ban 90s
				ban_after 3
				concurrency 4
			}
			zone slots_only {
				concurrency 2
				concurrency_lease 10s
			}
		}
		respond "ok"
	}`, "caddyfile")
	var zones []map[string]any
	if code := adminDo(t, "GET", "/rate_limit/zones", &zones); code != 200 || len(zones) != 2 {
		t.Fatalf("GET zones: %d %v", code, zones)
	}
	both, only := zones[0], zones[1]
	if both["events"] != 5.0 || both["concurrency"] != 4.0 || both["concurrency_lease"] != 30.0 || both["ban"] != 90.0 || both["ban_after"] != 3.0 {
		t.Errorf("zone both: %v", both)
	}
	if only["algorithm"] != "" || only["events"] != 0.0 || only["concurrency"] != 2.0 || only["concurrency_lease"] != 10.0 || only["ban"] != nil {
		t.Errorf("zone slots_only: %v", only)
	}
}

// TestBanOnLocalFallbackBesideAZoneThatFailsOpen: Redis is down; the
// first zone fails open (dropped), the second falls back to local memory
// with its ban, whose parts must still find each other.
func TestBanOnLocalFallbackBesideAZoneThatFailsOpen(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone open {
				key {http.request.header.X-Client}
				rate 100/m
				on_storage_error allow
			}
			zone guarded {
				key {http.request.header.X-Client}
				rate 1/m
				ban 1h
				on_storage_error local
			}
			storage redis {
				addresses 127.0.0.1:`+fmt.Sprint(redistest.FreePort(t))+`
				timeout 50ms
			}
		}
		respond "ok"
	}`, "caddyfile")
	for i, w := range []want{
		{200, nil, ""},
		{429, map[string]string{"Retry-After": "3600"}, ""}, // rejected: the ban starts
		{429, map[string]string{"Retry-After": "3600"}, ""}, // banned
	} {
		resp, body := get(t, tester, "/", "X-Client: fallback")
		check(t, fmt.Sprintf("request %d", i+1), resp, body, w)
	}
}
