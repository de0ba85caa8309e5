package tollgate

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// TestShowTellsGrant: `caddy rate-limit show` and the admin API's key
// state tell the grant a key holds in its current window (grants added
// up) for fixed_window, sliding_window and sliding_log, on memory and
// Redis, and nothing once a reset has forgotten it; on memory, the fake
// clock then moves past the windows that held the grants, which end with
// them. A token bucket's key tells no grant: it takes none.
func TestShowTellsGrant(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			setClock(t, time.Date(2026, 7, 1, 18, 0, 0, 0, time.UTC))
			zones := ""
			for zone, algorithm := range map[string]string{"fixed": "fixed_window", "slide": "sliding_window", "log": "sliding_log", "bucket": "token_bucket"} {
				zones += fmt.Sprintf(`
			zone %s {
				match {
					path /%[1]s
				}
				key {http.request.header.X-API-Key}
				algorithm %s
				rate 2/d
			}`, zone, algorithm)
			}
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {`+zones+`
			`+storage(t)+`
		}
		respond "ok"
	}`, "caddyfile")
			key := "show-grant-" + name
			request := func(zone string) {
				t.Helper()
				if resp, _ := get(t, tester, "/"+zone, "X-API-Key: "+key); resp.StatusCode != 200 {
					t.Fatalf("a request in zone %s: status %d", zone, resp.StatusCode)
				}
			}
			// shows checks that show tells the grant want (none if 0),
			// in its table and in the admin API's JSON.
			shows := func(zone, want string) {
				t.Helper()
				out, err := runCLI(t, "--address", testAdmin, "show", zone, key)
				if err != nil {
					t.Fatalf("caddy rate-limit show %s: %v", zone, err)
				}
				row, ok := keyTable(t, out)["granted"]
				body := adminBody(t, "/rate_limit/zones/"+zone+"/keys/"+key)
				switch {
				case want == "" && (ok || strings.Contains(body, `"granted"`)):
					t.Fatalf("zone %s tells a grant where none is:\n%s%s", zone, out, body)
				case want != "" && row != want+" more events for the current window":
					t.Fatalf("zone %s: show tells granted %q, want %s:\n%s", zone, row, want, out)
				case want != "" && !regexp.MustCompile(`"granted":`+want+`[,}]`).MatchString(body):
					t.Fatalf("zone %s: the key's state lacks \"granted\":%s: %s", zone, want, body)
				}
			}
			windows := []string{"fixed", "slide", "log"}
			grant := func() {
				t.Helper()
				for _, zone := range windows {
					if _, err := runCLI(t, "--address", testAdmin, "grant", zone, key, "3"); err != nil {
						t.Fatalf("caddy rate-limit grant %s: %v", zone, err)
					}
					shows(zone, "3")
					if code := adminPost(t, "/rate_limit/zones/"+zone+"/keys/"+key+"/grant", `{"amount": 0.5}`, nil); code != 200 {
						t.Fatalf("zone %s: a second grant: %d", zone, code)
					}
					shows(zone, "3.5")
				}
			}
			for _, zone := range append(windows, "bucket") {
				request(zone)
				shows(zone, "")
			}
			grant()
			shows("bucket", "")

			// A reset forgets the grant with the rest of the key's state.
			for _, zone := range windows {
				if _, err := runCLI(t, "--address", testAdmin, "reset", zone, key); err != nil {
					t.Fatalf("caddy rate-limit reset %s: %v", zone, err)
				}
				request(zone)
				shows(zone, "")
			}
			if name != "memory" {
				return // Redis keeps its own clock
			}
			// The grants' windows end: the next day for fixed_window and
			// sliding_window, a day after the grant for sliding_log.
			grant()
			advance(24*time.Hour + time.Minute)
			for _, zone := range windows {
				request(zone)
				shows(zone, "")
			}
		})
	}
}
