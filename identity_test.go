package tollgate

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	"golang.org/x/crypto/bcrypt"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// basicAuth is the Authorization header of user with password pw.
func basicAuth(user, pw string) string {
	return "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pw))
}

// TestKeyFromBasicAuth is recipes.md's basic_auth recipe: with rate_limit
// after basic_auth in a route, a zone keyed by {http.auth.user.id} limits
// each user on their own, and a request without valid credentials never
// reaches the zone. (The global `order` option would do too, but Caddy
// keeps it for every later config of the process: here, every later
// test's.)
func TestKeyFromBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		route {
			basic_auth {
				alice `+string(hash)+`
				bob `+string(hash)+`
			}
			rate_limit {
				zone per_user {
					key {http.auth.user.id}
					rate 2/h
				}
			}
			respond "ok"
		}
	}`, "caddyfile")
	advance(2 * time.Hour) // a zone per_user of an earlier test is full again

	alice, bob := basicAuth("alice", "pw"), basicAuth("bob", "pw")
	for _, s := range []struct {
		step   string
		header string
		status int
		limit  string // RateLimit, "" when the zone did not apply
	}{
		{"alice 1", alice, 200, `"per_user";r=1;t=1800`},
		{"alice, wrong password", basicAuth("alice", "guess"), 401, ""},
		{"no credentials", "X-Forwarded-User: alice", 401, ""},
		{"alice 2", alice, 200, `"per_user";r=0;t=3600`},
		{"alice 3", alice, 429, `"per_user";r=0;t=1800`},
		{"bob 1", bob, 200, `"per_user";r=1;t=1800`},
	} {
		resp, body := get(t, tester, "/", s.header)
		check(t, s.step, resp, body, want{s.status, map[string]string{"RateLimit": s.limit}, ""})
	}
}

// newAuthService is a forward_auth service: a request with
// "Authorization: Bearer token-<name>" is <name>, answered 200 with
// X-User: <name>; any other request is answered 401.
func newAuthService(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer token-")
		if !ok || name == "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-User", name)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestKeyFromForwardAuth is recipes.md's forward_auth recipe: in a route
// after forward_auth, a zone keyed by the header forward_auth copies from
// the auth service's answer gets the service's user, never the header the
// client sent. With the default order (rate_limit first) the same zone
// takes the client's header, and a client that sends a new one on each
// request is never limited.
func TestKeyFromForwardAuth(t *testing.T) {
	auth := newAuthService(t)
	zone := `
			rate_limit {
				zone per_user {
					key {http.request.header.X-User}
					rate 2/h
				}
			}`
	forwardAuth := `
			forward_auth ` + auth + ` {
				uri /check
				copy_headers X-User
			}`
	for _, c := range []struct {
		name, site string
		mallory    string // the statuses of mallory's 3 requests, each with another X-User
	}{
		{"route", "route {" + forwardAuth + zone + "\nrespond \"ok\"\n}", "200 200 429 "},
		{"default order", forwardAuth + zone + "\nrespond \"ok\"", "200 200 200 "},
	} {
		t.Run(c.name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+"\nlocalhost:9080 {\n"+c.site+"\n}\n", "caddyfile")
			advance(2 * time.Hour) // the zone of the case before is full again
			got := ""
			for _, forged := range []string{"alice", "bob", "carol"} {
				resp, _ := get(t, tester, "/", "Authorization: Bearer token-mallory", "X-User: "+forged)
				got += fmt.Sprint(resp.StatusCode, " ")
			}
			if got != c.mallory {
				t.Errorf("mallory with X-User alice, bob, carol: statuses %q, want %q", got, c.mallory)
			}
			if c.name != "route" {
				return
			}
			resp, body := get(t, tester, "/", "Authorization: Bearer token-alice")
			check(t, "alice after mallory's requests", resp, body, want{200, map[string]string{"RateLimit": `"per_user";r=1;t=1800`}, ""})
			resp, body = get(t, tester, "/", "X-User: alice")
			check(t, "no token, X-User: alice", resp, body, want{401, map[string]string{"RateLimit": ""}, ""})
		})
	}
}

// TestEmptyKeyWarning checks that a zone whose key resolves empty on a
// request it applies to is logged at warn once per zone, saying what to
// do: a key from basic_auth under the default order (rate_limit runs
// first), and keys written with placeholders Caddy does not have.
func TestEmptyKeyWarning(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tester := caddytest.NewTester(t)
	tester.InitServer(withGlobal(`log {
		output file `+logFile+`
		format json
		level INFO
	}`)+`
	localhost:9080 {
		basic_auth /auth {
			alice `+string(hash)+`
		}
		rate_limit {
			zone by_user {
				match {
					path /auth
				}
				key {http.auth.user.id}
				rate 100/h
			}
			zone remote_ip {
				match {
					path /ip
				}
				key {remote_ip}
				rate 100/h
			}
			zone request_remote_ip {
				match {
					path /ip
				}
				key {http.request.remote_ip}
				rate 100/h
			}
			zone client {
				key {client_ip}
				rate 100/h
			}
			zone unmatched {
				match {
					path /never
				}
				key {http.auth.user.id}
				rate 100/h
			}
		}
		respond "ok"
	}`, "caddyfile")

	for i := 0; i < 3; i++ {
		get(t, tester, "/auth", basicAuth("alice", "pw"))
		get(t, tester, "/ip")
	}
	var warned map[string]int
	deadline := time.Now().Add(5 * time.Second)
	for {
		warned = map[string]int{}
		for _, l := range logLines(t, logFile, "http.handlers.rate_limit") {
			if l["msg"] != "rate limit key resolved empty" {
				continue
			}
			zone, _ := l["zone"].(string)
			warned[zone]++
			hint, _ := l["hint"].(string)
			if l["level"] != "warn" || l["key"] == "" || !strings.Contains(hint, "route") || !strings.Contains(hint, "{remote_ip}") {
				t.Errorf("warning %v: want level warn, the key, and a hint naming route and {remote_ip}", l)
			}
		}
		if len(warned) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, zone := range []string{"by_user", "remote_ip", "request_remote_ip"} {
		if warned[zone] != 1 {
			t.Errorf("zone %s: %d warnings, want 1 (warnings: %v)", zone, warned[zone], warned)
		}
	}
	for _, zone := range []string{"client", "unmatched"} {
		if warned[zone] != 0 {
			t.Errorf("zone %s: %d warnings, want none: its key is set, or it never applied", zone, warned[zone])
		}
	}
}

// TestClientIPBehindProxies is recipes.md's load balancer recipe: with
// the proxy trusted, {client_ip} is the address the proxy reports, so
// clients behind it are limited one by one; with the proxy not trusted,
// the headers are ignored and every client is the proxy's one address,
// whatever it sends.
func TestClientIPBehindProxies(t *testing.T) {
	for _, c := range []struct {
		name, servers string
		header        string // the header the proxy reports the client in
		statuses      string // 2 requests from client A, 1 from client B
	}{
		{"trusted", "trusted_proxies static 127.0.0.1/32 ::1/128", "X-Forwarded-For", "200 429 200 "},
		{"trusted, strict", "trusted_proxies static 127.0.0.1/32 ::1/128\n\t\ttrusted_proxies_strict", "X-Forwarded-For", "200 429 200 "},
		{"client_ip_headers", "trusted_proxies static 127.0.0.1/32 ::1/128\n\t\tclient_ip_headers X-Real-IP", "X-Real-IP", "200 429 200 "},
		{"not trusted", "trusted_proxies static 10.0.0.0/8", "X-Forwarded-For", "200 429 429 "},
		{"no trusted_proxies", "", "X-Forwarded-For", "200 429 429 "},
	} {
		t.Run(c.name, func(t *testing.T) {
			servers := ""
			if c.servers != "" {
				servers = "servers {\n\t\t" + c.servers + "\n\t}"
			}
			tester := caddytest.NewTester(t)
			tester.InitServer(withGlobal(servers)+`
			localhost:9080 {
				rate_limit {
					zone per_client {
						key {client_ip}
						rate 1/h
					}
				}
				respond "ok"
			}`, "caddyfile")
			advance(2 * time.Hour) // the zone of the case before is full again
			got := ""
			for _, client := range []string{"203.0.113.7", "203.0.113.7", "198.51.100.9"} {
				resp, _ := get(t, tester, "/", c.header+": "+client)
				got += fmt.Sprint(resp.StatusCode, " ")
			}
			if got != c.statuses {
				t.Errorf("clients A, A, B: statuses %q, want %q", got, c.statuses)
			}
		})
	}
}

// TestSameZoneNameOnOneRedis: two rate_limit blocks of one configuration
// with a zone of the same name and algorithm on the same Redis would read
// the same keys under two limits: the configuration is refused, naming
// the zone. The same limits, another algorithm, or memory load.
func TestSameZoneNameOnOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	block := func(zone string, storage bool) string {
		s := "rate_limit {\n\tzone " + zone + "\n"
		if storage {
			s += "\tstorage redis {\n\t\turl redis://" + srv.Addr + "\n\t}\n"
		}
		return s + "}\n"
	}
	for _, c := range []struct {
		name, a, b string
		redis      bool
		fails      bool
	}{
		{"other limits", "api {\n\t\trate 10/m\n\t}", "api {\n\t\trate 20/m\n\t}", true, true},
		{"same limits", "api {\n\t\trate 10/m\n\t}", "api {\n\t\trate 10/m\n\t}", true, false},
		{"other algorithms", "api {\n\t\trate 10/m\n\t}", "api {\n\t\tevents 20\n\t\twindow 1m\n\t}", true, false},
		{"memory", "api {\n\t\trate 10/m\n\t}", "api {\n\t\trate 20/m\n\t}", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ":8080 {\n\thandle /a {\n" + block(c.a, c.redis) + "\t}\n\thandle /b {\n" + block(c.b, c.redis) + "\t}\n}\n"
			err := validateCaddyfile(t, cfg)
			switch {
			case c.fails && (err == nil || !strings.Contains(err.Error(), `zone "api": another rate_limit block of this configuration has a zone of that name with other limits on the same Redis`)):
				t.Errorf("load = %v, want the zone refused", err)
			case !c.fails && err != nil:
				t.Errorf("load = %v, want it loaded", err)
			}
		})
	}
}

// validateCaddyfile adapts a Caddyfile and provisions it, as `caddy
// validate` does.
func validateCaddyfile(t *testing.T, body string) error {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(body), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	return validateJSON(out)
}
