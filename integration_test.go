package tollgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
)

// fakeNow is the clock of every handler the tests provision: µs since the
// Unix epoch, moved only by the tests.
var fakeNow atomic.Int64

func init() {
	fakeNow.Store(1_700_000_000 * microsPerSecond)
	clock = fakeNow.Load
}

// advance moves the fake clock forward.
func advance(d time.Duration) { fakeNow.Add(d.Microseconds()) }

// globalOptions starts every test Caddyfile: caddytest's admin port, plain
// HTTP on 9080.
var globalOptions = `{
	skip_install_trust
	admin ` + testAdmin + `
	http_port 9080
	https_port 9443
	grace_period 1ns
	auto_https off
}
`

const base = "http://localhost:9080"

// jsonConfig is a caddytest JSON config: one server on 9080 whose one
// route runs handlers (JSON objects, comma-separated), and more apps
// (`"name": {...}` entries, comma-terminated) before the HTTP app.
func jsonConfig(apps, handlers string) string {
	return `{
		"admin": {"listen": "` + testAdmin + `"},
		"apps": {` + apps + `
			"http": {"http_port": 9080, "servers": {"srv0": {
				"listen": [":9080"],
				"automatic_https": {"disable": true},
				"routes": [{"handle": [` + handlers + `]}]
			}}}
		}
	}`
}

// get sends a GET with the given header pairs ("Name: value").
func get(t *testing.T, tester *caddytest.Tester, path string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp, err := sendUnread(t, tester.Client, req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// sendUnread sends req, and sends it again (its body, if any, from GetBody), up to
// three times, while the connection is reset or closed before any
// response. Caddy binds its listeners with SO_REUSEPORT and pools them
// across reloads: just after a test loads its config, a connection can
// be taken by the config before (shutting down), which closes it unread,
// so no handler decided it. Under CPU load (a shared CI machine), this
// happens to a test's first requests now and then. A handler that aborts
// a response is not sent through here.
func sendUnread(t *testing.T, client *http.Client, req *http.Request) (*http.Response, error) {
	t.Helper()
	resp, err := client.Do(req)
	for try := 0; try < 3 && err != nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)); try++ {
		t.Logf("%s %s: %v; sending it again", req.Method, req.URL, err)
		time.Sleep(50 * time.Millisecond)
		if req.GetBody != nil {
			req.Body, _ = req.GetBody() // the body again, from its start
		}
		resp, err = client.Do(req)
	}
	return resp, err
}

// statuses sends n GETs, cycling through paths, and returns their status
// codes as "200 200 429 ".
func statuses(t *testing.T, tester *caddytest.Tester, n int, paths []string, headers ...string) string {
	t.Helper()
	out := ""
	for i := 0; i < n; i++ {
		resp, _ := get(t, tester, paths[i%len(paths)], headers...)
		out += fmt.Sprint(resp.StatusCode, " ")
	}
	return out
}

// want is an expected response: status and exact header values ("" means
// the header must be absent).
type want struct {
	status  int
	headers map[string]string
	body    string
}

func check(t *testing.T, step string, resp *http.Response, body string, w want) {
	t.Helper()
	if resp.StatusCode != w.status {
		t.Errorf("%s: status = %d, want %d", step, resp.StatusCode, w.status)
	}
	for name, v := range w.headers {
		if got := resp.Header.Get(name); got != v {
			t.Errorf("%s: %s = %q, want %q", step, name, got, v)
		}
	}
	if w.body != "" && body != w.body {
		t.Errorf("%s: body = %q, want %q", step, body, w.body)
	}
}

func TestCaddyfileTokenBucketHeaders(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone per_client {
				key {http.request.header.X-Client}
				rate 3/h
			}
		}
		respond "ok"
	}`, "caddyfile")

	// 3 per hour: one event refills in 1200s.
	steps := []want{
		{200, map[string]string{"RateLimit-Policy": `"per_client";q=3;w=3600`, "RateLimit": `"per_client";r=2;t=1200`, "Retry-After": ""}, "ok"},
		{200, map[string]string{"RateLimit": `"per_client";r=1;t=2400`}, "ok"},
		{200, map[string]string{"RateLimit": `"per_client";r=0;t=3600`}, "ok"},
		{429, map[string]string{"RateLimit": `"per_client";r=0;t=1200`, "Retry-After": "1200", "RateLimit-Policy": `"per_client";q=3;w=3600`}, ""},
	}
	for i, w := range steps {
		resp, body := get(t, tester, "/", "X-Client: alice")
		check(t, fmt.Sprintf("step %d", i), resp, body, w)
	}
	// Another key is not affected.
	resp, body := get(t, tester, "/", "X-Client: bob")
	check(t, "bob", resp, body, want{200, map[string]string{"RateLimit": `"per_client";r=2;t=1200`}, "ok"})

	// 1200s later one event is back for alice.
	advance(1200 * time.Second)
	resp, body = get(t, tester, "/", "X-Client: alice")
	check(t, "alice after 1200s", resp, body, want{200, map[string]string{"RateLimit": `"per_client";r=0;t=3600`}, "ok"})
}

func TestJSONConfig(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(jsonConfig("", `
		{"handler": "rate_limit",
		 "rate_limits": {"json_zone": {
			"key": "{http.request.header.X-Client}",
			"algorithm": "fixed_window",
			"events": 2, "window": "1h", "cost": 1}},
		 "headers": ["ietf-draft-03", "x-ratelimit"]},
		{"handler": "static_response", "body": "ok"}`), "json")

	now := fakeNow.Load()
	windowEnd := now - now%(3600*microsPerSecond) + 3600*microsPerSecond
	toEnd := ratelimitheader.CeilSeconds(windowEnd - now)
	resetAt := fmt.Sprint(ratelimitheader.CeilSeconds(now) + toEnd)
	for i, w := range []want{
		{200, map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "1", "RateLimit-Reset": fmt.Sprint(toEnd), "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": resetAt, "RateLimit": ""}, "ok"},
		{200, map[string]string{"RateLimit-Remaining": "0"}, "ok"},
		{429, map[string]string{"RateLimit-Remaining": "0", "Retry-After": fmt.Sprint(toEnd), "RateLimit-Reset": fmt.Sprint(toEnd)}, ""},
	} {
		resp, body := get(t, tester, "/", "X-Client: json")
		check(t, fmt.Sprintf("step %d", i), resp, body, w)
	}
}

func TestMultiZoneAllOrNothing(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone wide {
				key {http.request.header.X-Client}
				rate 5/h
			}
			zone narrow {
				match {
					path /narrow/*
				}
				key {http.request.header.X-Client}
				rate 1/h
			}
		}
		respond "ok"
	}`, "caddyfile")

	resp, body := get(t, tester, "/narrow/a", "X-Client: c")
	check(t, "first narrow", resp, body, want{200, map[string]string{
		"RateLimit-Policy": `"wide";q=5;w=3600, "narrow";q=1;w=3600`,
		"RateLimit":        `"wide";r=4;t=720, "narrow";r=0;t=3600`,
	}, "ok"})
	// narrow rejects: wide must not be charged for the rejected requests.
	for i := 0; i < 3; i++ {
		resp, _ := get(t, tester, "/narrow/a", "X-Client: c")
		if resp.StatusCode != 429 {
			t.Fatalf("narrow %d: status %d, want 429", i, resp.StatusCode)
		}
	}
	// A path only wide applies to: wide still has 4.
	resp, body = get(t, tester, "/other", "X-Client: c")
	check(t, "wide after rejections", resp, body, want{200, map[string]string{
		"RateLimit-Policy": `"wide";q=5;w=3600`,
		"RateLimit":        `"wide";r=3;t=1440`,
	}, "ok"})
}

func TestReloadKeepsState(t *testing.T) {
	config := func(body string) string {
		return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone reload {
				key {http.request.header.X-Client}
				rate 2/h
			}
		}
		respond "` + body + `"
	}`
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(config("one"), "caddyfile")
	resp, _ := get(t, tester, "/", "X-Client: r")
	check(t, "before reload", resp, "", want{200, map[string]string{"RateLimit": `"reload";r=1;t=1800`}, ""})

	tester.InitServer(config("two"), "caddyfile") // a real reload: the config differs
	resp, body := get(t, tester, "/", "X-Client: r")
	check(t, "after reload", resp, body, want{200, map[string]string{"RateLimit": `"reload";r=0;t=3600`}, "two"})
	resp, _ = get(t, tester, "/", "X-Client: r")
	check(t, "exhausted", resp, "", want{429, nil, ""})
}

func TestHandleErrorsSeesPlaceholders(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone errs {
				key {http.request.header.X-Client}
				rate 1/m
			}
			status 503
		}
		handle_errors {
			respond "{err.status_code} zone={http.rate_limit.zone} exceeded={http.rate_limit.exceeded.name} retry={http.rate_limit.retry_after} limit={http.rate_limit.limit} remaining={http.rate_limit.remaining}"
		}
		respond "ok"
	}`, "caddyfile")
	get(t, tester, "/", "X-Client: e")
	resp, body := get(t, tester, "/", "X-Client: e")
	check(t, "rejected", resp, body, want{503, map[string]string{"Retry-After": "60", "RateLimit": `"errs";r=0;t=60`},
		"503 zone=errs exceeded=errs retry=60 limit=1 remaining=0"})
}

// TestPlaceholdersOfSeveralHandlers: when two rate_limit handlers decide
// one request, the placeholders report the last one to decide (not the
// tighter), and those of a rejection appear only once one rejects, from
// whichever handler rejects.
func TestPlaceholdersOfSeveralHandlers(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		route {
			rate_limit {
				zone outer {
					key {http.request.header.X-Client}
					rate 3/h
				}
			}
			rate_limit {
				zone inner {
					key {http.request.header.X-Inner}
					rate 10/h
				}
				status 503
			}
			respond "limit={http.rate_limit.limit} remaining={http.rate_limit.remaining} zone={http.rate_limit.zone}"
		}
		handle_errors {
			respond "{err.status_code} zone={http.rate_limit.zone} exceeded={http.rate_limit.exceeded.name} retry={http.rate_limit.retry_after} limit={http.rate_limit.limit} remaining={http.rate_limit.remaining}"
		}
	}`, "caddyfile")
	// Allowed by both: the inner handler decided last.
	for i := range 3 {
		resp, body := get(t, tester, "/", "X-Client: a", "X-Inner: a")
		check(t, fmt.Sprintf("allowed %d", i), resp, body, want{200, nil, fmt.Sprintf("limit=10 remaining=%d zone={http.rate_limit.zone}", 9-i)})
	}
	// The outer handler rejects the fourth: its placeholders, the
	// rejection's included.
	resp, body := get(t, tester, "/", "X-Client: a", "X-Inner: a")
	check(t, "rejected by outer", resp, body, want{429, nil, "429 zone=outer exceeded=outer retry=1200 limit=3 remaining=0"})
	// The inner handler rejects after the outer one admitted: the inner
	// one's.
	for i := range 7 {
		get(t, tester, "/", fmt.Sprintf("X-Client: c%d", i), "X-Inner: a")
	}
	resp, body = get(t, tester, "/", "X-Client: last", "X-Inner: a")
	check(t, "rejected by inner", resp, body, want{503, nil, "503 zone=inner exceeded=inner retry=360 limit=10 remaining=0"})
}

func TestRejectionWithoutHandleErrorsHasEmptyBody(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone empty {
				key {http.request.header.X-Client}
				rate 1/m
			}
			headers none
		}
		respond "ok"
	}`, "caddyfile")
	get(t, tester, "/", "X-Client: x")
	resp, body := get(t, tester, "/", "X-Client: x")
	check(t, "rejected", resp, body, want{429, map[string]string{"Retry-After": "60", "RateLimit": "", "RateLimit-Policy": ""}, ""})
	if body != "" {
		t.Errorf("body = %q, want empty", body)
	}
}

func TestJitterIsDeterministicPerIdentity(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone jit {
				key {http.request.header.X-Client}
				rate 1/h
			}
			jitter 1
		}
		respond "ok"
	}`, "caddyfile")
	seen := map[string]bool{}
	for i := 0; i < 8; i++ {
		client := fmt.Sprintf("X-Client: j%d", i)
		get(t, tester, "/", client)
		first, _ := get(t, tester, "/", client)
		again, _ := get(t, tester, "/", client)
		ra := first.Header.Get("Retry-After")
		if ra != again.Header.Get("Retry-After") {
			t.Errorf("client %d: Retry-After %s then %s, want the same for one identity", i, ra, again.Header.Get("Retry-After"))
		}
		var secs int
		fmt.Sscan(ra, &secs)
		if secs < 3600 || secs > 7200 {
			t.Errorf("client %d: Retry-After %d, want in [3600, 7200] with jitter 1", i, secs)
		}
		if got := first.Header.Get("RateLimit"); got != fmt.Sprintf(`"jit";r=0;t=%s`, ra) {
			t.Errorf("client %d: RateLimit %q, want t equal to Retry-After %s", i, got, ra)
		}
		seen[ra] = true
	}
	if len(seen) < 4 {
		t.Errorf("8 identities got only %d distinct Retry-After values, want a spread", len(seen))
	}
}

func TestDefaultKeyIsClientIPAndEmptyKeyIsShared(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone ip {
				match {
					path /ip
				}
				rate 1/h
			}
			zone hdr {
				match {
					path /hdr
				}
				key {http.request.header.X-Missing}
				rate 1/h
			}
		}
		respond "ok"
	}`, "caddyfile")
	// A spoofed X-Forwarded-For does not mint a new identity: no proxy is trusted.
	resp, _ := get(t, tester, "/ip", "X-Forwarded-For: 1.2.3.4")
	check(t, "ip first", resp, "", want{200, nil, ""})
	resp, _ = get(t, tester, "/ip", "X-Forwarded-For: 5.6.7.8")
	check(t, "ip spoofed", resp, "", want{429, nil, ""})
	// An empty key is one shared identity, not a bypass.
	resp, _ = get(t, tester, "/hdr")
	check(t, "empty key first", resp, "", want{200, nil, ""})
	resp, _ = get(t, tester, "/hdr")
	check(t, "empty key second", resp, "", want{429, nil, ""})
}

// TestAdaptGolden compares `caddy adapt` output for each
// testdata/adapt/*.caddyfile with the .json beside it. Run with
// TOLLGATE_UPDATE_GOLDEN=1 to rewrite the golden files.
func TestAdaptGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/adapt/*.caddyfile")
	if len(files) == 0 {
		t.Fatal("no testdata/adapt/*.caddyfile")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(in, map[string]any{"filename": f})
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			var pretty strings.Builder
			var v any
			_ = json.Unmarshal(out, &v)
			enc := json.NewEncoder(&pretty)
			enc.SetIndent("", "\t")
			enc.SetEscapeHTML(false)
			_ = enc.Encode(v)
			golden := strings.TrimSuffix(f, ".caddyfile") + ".json"
			if os.Getenv("TOLLGATE_UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(golden, []byte(pretty.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with TOLLGATE_UPDATE_GOLDEN=1 to create it)", err)
			}
			if pretty.String() != string(want) {
				t.Errorf("adapt %s:\n%s\nwant:\n%s", f, pretty.String(), want)
			}
			// The adapted config must also load.
			var cfg caddy.Config
			if err := json.Unmarshal(out, &cfg); err != nil {
				t.Fatal(err)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Errorf("validate %s: %v", f, err)
			}
		})
	}
}

// validate adapts a Caddyfile body and runs caddy.Validate on it, as
// `caddy validate` does.
func validate(caddyfile string) error {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		return err
	}
	var cfg caddy.Config
	if err := json.Unmarshal(out, &cfg); err != nil {
		return err
	}
	return caddy.Validate(&cfg)
}

var _ = context.Background

func TestPlaceholdersForLaterHandlers(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone loose {
				key {http.request.header.X-Client}
				rate 10/h
			}
			zone tight {
				key {http.request.header.X-Client}
				rate 3/h
			}
		}
		respond "limit={http.rate_limit.limit} remaining={http.rate_limit.remaining}"
	}`, "caddyfile")
	// The most restrictive zone's quota: tight, 3 per hour.
	for i, w := range []string{"limit=3 remaining=2", "limit=3 remaining=1"} {
		resp, body := get(t, tester, "/", "X-Client: later")
		check(t, fmt.Sprintf("step %d", i), resp, body, want{200, nil, w})
	}
}
