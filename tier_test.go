package tollgate

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// tierSite is docs/recipes.md's API plans: Caddy's map turns the API key into
// a plan, and the plan picks the zone's limit.
func tierSite(storage string) string {
	return globalOptions + `
	localhost:9080 {
		map {http.request.header.Authorization} {plan} {
			"Bearer gold-key"     gold
			"Bearer free-key"     free
			"Bearer internal-key" internal
			default               unknown
		}
		rate_limit {
			zone api {
				key {http.request.header.Authorization}
				rate 2/m
				tier {plan} {
					gold     5/m burst 6
					free     1/m
					internal unlimited
				}
			}
			` + storage + `
		}
		respond "ok"
	}`
}

// TestTiersThroughCaddy: each plan gets its tier's limit (and headers and
// placeholders report it), a value not listed gets the zone's own, an
// unlimited tier is not limited (and gets no RateLimit headers), on the
// memory store and on Redis.
func TestTiersThroughCaddy(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(tierSite(storage(t)), "caddyfile")
			for _, c := range []struct {
				auth, policy, statuses string
			}{
				{"Bearer gold-key", `"api";q=5;w=60`, "200 200 200 200 200 200 429 "},
				{"Bearer free-key", `"api";q=1;w=60`, "200 429 429 "},
				{"Bearer someone-" + name, `"api";q=2;w=60`, "200 200 429 "},
			} {
				got := ""
				for i := range strings.Count(c.statuses, " ") {
					resp, _ := get(t, tester, "/", "Authorization: "+c.auth)
					got += fmt.Sprint(resp.StatusCode, " ")
					if p := resp.Header.Get("RateLimit-Policy"); p != c.policy {
						t.Errorf("%s, request %d: RateLimit-Policy %q, want %q", c.auth, i, p, c.policy)
					}
				}
				if got != c.statuses {
					t.Errorf("%s: %s, want %s", c.auth, got, c.statuses)
				}
			}
			for i := 0; i < 20; i++ {
				resp, _ := get(t, tester, "/", "Authorization: Bearer internal-key")
				if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
					t.Fatalf("internal, request %d: status %d, RateLimit %q: want 200 and no headers", i, resp.StatusCode, resp.Header.Get("RateLimit"))
				}
			}

			// The key's state is kept per tier: in the admin API, and
			// reset per tier or in every tier.
			var st adminapi.KeyState
			if code := adminDo(t, "GET", "/rate_limit/zones/api/keys/Bearer%20gold-key?tier=gold", &st); code != 200 || st.Tier != "gold" || st.Remaining != 0 {
				t.Errorf("GET gold tier: %d %+v", code, st)
			}
			if code := adminDo(t, "GET", "/rate_limit/zones/api/keys/Bearer%20gold-key?tier=silver", nil); code != 404 {
				t.Errorf("GET an unknown tier: %d, want 404", code)
			}
			if code := adminDo(t, "DELETE", "/rate_limit/zones/api/keys/Bearer%20gold-key?tier=gold", nil); code != 200 {
				t.Errorf("DELETE gold tier: %d", code)
			}
			if resp, _ := get(t, tester, "/", "Authorization: Bearer gold-key"); resp.StatusCode != 200 {
				t.Errorf("gold after its reset: %d", resp.StatusCode)
			}
		})
	}
}

// TestTierStateIsPerTier: one key under two tiers (a header picks the
// tier, the key is the client) has two states; JSON tier_key and tiers.
func TestTierStateIsPerTier(t *testing.T) {
	for name, storage := range map[string]func(t *testing.T) string{
		"memory": func(*testing.T) string { return "" },
		"redis": func(t *testing.T) string {
			return `, "storage": {"module": "redis", "addresses": ["` + redistest.Start(t).Addr + `"], "timeout": "` + testTimeout + `"}`
		},
	} {
		t.Run(name, func(t *testing.T) { tierStatePerTier(t, storage(t)) })
	}
}

func tierStatePerTier(t *testing.T, storage string) {
	tester := caddytest.NewTester(t)
	tester.InitServer(jsonConfig("", `
		{"handler": "rate_limit",
		 "rate_limits": {"jt": {
			"key": "{http.request.header.X-Client}",
			"events": 1, "window": "1h",
			"tier_key": "{http.request.header.X-Plan}",
			"tiers": {"pro": {"events": 3, "window": "1h"}, "staff": {"unlimited": true}}
		 }}`+storage+`},
		{"handler": "static_response", "body": "ok"}`), "json")
	for i, step := range []struct {
		plan   string
		status int
	}{
		{"pro", 200}, {"pro", 200}, {"", 200}, {"", 429}, {"pro", 200}, {"pro", 429}, {"staff", 200}, {"basic", 429},
	} {
		resp, _ := get(t, tester, "/", "X-Client: same", "X-Plan: "+step.plan)
		check(t, fmt.Sprintf("step %d (%q)", i, step.plan), resp, "", want{status: step.status})
	}
	var zones []map[string]any
	adminDo(t, "GET", "/rate_limit/zones", &zones)
	if len(zones) != 1 || zones[0]["tier_key"] != "{http.request.header.X-Plan}" || fmt.Sprint(zones[0]["tiers"]) != "map[pro:map[burst:3 events:3 window:3600] staff:map[unlimited:true]]" {
		t.Errorf("zones: %v", zones)
	}
}

// TestTiersExactAcrossThreeInstances: a tier's limit holds exactly across
// three instances hammered at once, on one Redis and on a Cluster: gold
// (40/h, so nothing refills during the test) admits 40, and the zone's
// own limit (1/h) one, for another client.
func TestTiersExactAcrossThreeInstances(t *testing.T) {
	for _, c := range []struct {
		name  string
		addrs func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return redistest.Start(t).Addr }},
		{"cluster", func(t *testing.T) string { return strings.Join(redistest.StartCluster(t, 3).Addrs, " ") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := globalOptions
			addrs := c.addrs(t)
			for i := 1; i <= 3; i++ {
				cfg += fmt.Sprintf(`
	http://localhost:908%d {
		rate_limit {
			zone plans {
				key {http.request.header.X-Client}
				rate 1/h
				tier {http.request.header.X-Plan} {
					gold 40/h
				}
			}
			storage redis {
				addresses %s
				pool_size %d
				timeout %s
			}
		}
		respond "ok"
	}`, i, addrs, 16+i, testTimeout)
			}
			tester := caddytest.NewTester(t)
			tester.InitServer(cfg, "caddyfile")
			for _, w := range []struct {
				client, plan string
				want         int64
			}{{"c-gold", "gold", 40}, {"c-basic", "basic", 1}} {
				var admitted, other atomic.Int64
				var wg sync.WaitGroup
				for g := 0; g < 24; g++ {
					wg.Add(1)
					go func(g int) {
						defer wg.Done()
						for i := 0; i < 8; i++ {
							url := fmt.Sprintf("http://localhost:908%d/", 1+(g+i)%3)
							resp, err := sendUnread(t, tester.Client, mustRequest(t, url, "X-Client: "+w.client, "X-Plan: "+w.plan))
							if err != nil {
								other.Add(1)
								continue
							}
							resp.Body.Close()
							switch resp.StatusCode {
							case 200:
								admitted.Add(1)
							case 429:
							default:
								other.Add(1)
							}
						}
					}(g)
				}
				wg.Wait()
				if admitted.Load() != w.want || other.Load() != 0 {
					t.Errorf("%s: admitted %d of 192 across three instances at once, want %d (%d errors)", w.plan, admitted.Load(), w.want, other.Load())
				}
			}
		})
	}
}

// mustRequest is a GET of url with header pairs ("Name: value").
func mustRequest(t *testing.T, url string, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return req
}

// TestTierWithBanAndConcurrency: a tier replaces the zone's rate, beside
// the zone's ban and concurrency, which every tier shares; a dry-run
// zone's ban refuses nothing but is counted.
func TestTierWithBanAndConcurrency(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(withGlobal("metrics")+`
	localhost:9080 {
		rate_limit {
			zone combo {
				match {
					path /
				}
				key {http.request.header.X-Client}
				rate 1/m
				ban 1h
				concurrency 5
				tier {http.request.header.X-Plan} {
					gold 3/m
				}
			}
			zone rehearsal {
				match {
					path /dry
				}
				key {http.request.header.X-Client}
				rate 1/m
				ban 1h
				dry_run
			}
		}
		respond "ok"
	}`, "caddyfile")
	got := ""
	for i := 0; i < 5; i++ {
		resp, _ := get(t, tester, "/", "X-Client: combo", "X-Plan: gold")
		got += fmt.Sprint(resp.StatusCode, " ")
		if i == 0 {
			check(t, "gold", resp, "", want{200, map[string]string{
				"RateLimit-Policy": `"combo";q=3;w=60, "combo/concurrency";q=5;qu="concurrent-requests"`,
				"RateLimit":        `"combo";r=2;t=20, "combo/concurrency";r=4;t=1`,
			}, ""})
		}
	}
	if got != "200 200 200 429 429 " {
		t.Errorf("gold: %s, want 3 admitted, then rejected and banned", got)
	}
	// The ban is the zone's: the key is banned in every tier.
	resp, _ := get(t, tester, "/", "X-Client: combo")
	if ra := resp.Header.Get("Retry-After"); resp.StatusCode != 429 || ra != "3600" {
		t.Errorf("the banned key without a plan: %d, Retry-After %q, want 429 and the ban's 3600", resp.StatusCode, ra)
	}

	before := scrape(t)[requests("rehearsal", "dry_run_rejected")]
	for i := 0; i < 4; i++ {
		if resp, _ := get(t, tester, "/dry", "X-Client: rehearsal"); resp.StatusCode != 200 {
			t.Fatalf("dry run %d: status %d, want 200", i, resp.StatusCode)
		}
	}
	if n := scrape(t)[requests("rehearsal", "dry_run_rejected")] - before; n != 3 {
		t.Errorf("dry run: %v would-be rejections counted, want 3 (one by the rate, two by the ban it started)", n)
	}
}

// TestExampleCaddyfileIsValid: the README's first command runs
// examples/Caddyfile; it must adapt and validate.
func TestExampleCaddyfileIsValid(t *testing.T) {
	body, err := os.ReadFile("examples/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	if err := validate(string(body)); err != nil {
		t.Fatalf("examples/Caddyfile: %v", err)
	}
}
