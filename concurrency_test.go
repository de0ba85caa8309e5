package tollgate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// upstream is a backend that holds each request until released (or until
// its client goes away), counting those it holds.
type upstream struct {
	*httptest.Server
	held    atomic.Int64
	maxHeld atomic.Int64
	release chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.held.Add(1)
		defer u.held.Add(-1)
		for {
			m := u.maxHeld.Load()
			if n <= m || u.maxHeld.CompareAndSwap(m, n) {
				break
			}
		}
		if r.URL.Path == "/sleep" { // a short request, for the load tests
			time.Sleep(20 * time.Millisecond)
			return
		}
		w.Write([]byte("start\n"))
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
		w.Write([]byte("done\n"))
	}))
	t.Cleanup(u.Close)
	return u
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// inFlight reads a key's requests in flight from the admin API.
func inFlight(t *testing.T, zone, key string) int64 {
	t.Helper()
	var st adminapi.KeyState
	if code := adminDo(t, "GET", "/rate_limit/zones/"+zone+"/keys/"+key, &st); code != 200 {
		return 0 // a key the store no longer holds has none in flight
	}
	if st.InFlight == nil {
		t.Fatalf("GET key: %+v has no in_flight", st)
	}
	return *st.InFlight
}

// startRequest sends a GET whose answer's first line it reads before
// returning: the request is then in flight, held by the upstream. Cancel
// ctx to leave in the middle of the response.
func startRequest(t *testing.T, ctx context.Context, client *http.Client, url, key string) (status int, done <-chan struct{}) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("X-Client", key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("GET %s: reading the first line: %v", url, err)
	}
	ch := make(chan struct{})
	go func() {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		close(ch)
	}()
	return 200, ch
}

func concurrencySite(up, storage string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone dl {
				key {http.request.header.X-Client}
				concurrency 2
			}
			zone shaped {
				match {
					path /shaped
				}
				key {http.request.header.X-Client}
				algorithm leaky_bucket
				rate 1/s
				burst 1
				max_delay 10s
				concurrency 5
			}
			` + storage + `
		}
		handle /fast {
			respond "ok"
		}
		handle /down {
			reverse_proxy 127.0.0.1:1
		}
		handle /abort {
			tollgate_test_abort
		}
		handle {
			reverse_proxy ` + strings.TrimPrefix(up, "http://") + `
		}
	}`
}

// TestConcurrencyThroughCaddy: at most two requests of a key in flight;
// the third is rejected with Retry-After: 1 and the policy of
// concurrent requests; another key is not limited; a slot comes back when
// its request ends.
func TestConcurrencyThroughCaddy(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(concurrencySite(up.URL, storage(t)), "caddyfile")
			key := "cc-" + name
			ctx := context.Background()
			var dones []<-chan struct{}
			for i := 0; i < 2; i++ {
				status, done := startRequest(t, ctx, tester.Client, base+"/dl", key)
				if status != 200 {
					t.Fatalf("request %d: status %d, want 200", i+1, status)
				}
				dones = append(dones, done)
			}
			resp, _ := get(t, tester, "/fast", "X-Client: "+key)
			check(t, "third", resp, "", want{429, map[string]string{
				"Retry-After":      "1",
				"RateLimit-Policy": `"dl";q=2;qu="concurrent-requests"`,
				"RateLimit":        `"dl";r=0;t=1`,
			}, ""})
			resp, _ = get(t, tester, "/fast", "X-Client: other-"+key)
			check(t, "another key", resp, "", want{200, map[string]string{"RateLimit": `"dl";r=1;t=1`}, ""})
			if n := inFlight(t, "dl", key); n != 2 {
				t.Errorf("in_flight %d, want 2", n)
			}

			up.release <- struct{}{} // one request ends: whichever the upstream releases
			var other <-chan struct{}
			select {
			case <-dones[0]:
				other = dones[1]
			case <-dones[1]:
				other = dones[0]
			}
			waitFor(t, "the slot back", func() bool { return inFlight(t, "dl", key) == 1 })
			resp, _ = get(t, tester, "/fast", "X-Client: "+key)
			check(t, "after one ended", resp, "", want{200, map[string]string{"RateLimit": `"dl";r=0;t=1`}, ""})
			up.release <- struct{}{}
			<-other
			waitFor(t, "every slot back", func() bool { return inFlight(t, "dl", key) == 0 })
		})
	}
}

// TestResetKeepsRequestsInFlight: an admin reset of a key forgets its
// history (rates, bans), not the requests it has running. Before, a reset
// dropped the slots: a third request was admitted beside the two still
// running, and in memory their ends then counted against the new ones.
func TestResetKeepsRequestsInFlight(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(concurrencySite(up.URL, storage(t)), "caddyfile")
			key := "reset-" + name
			// Round 0 resets the key while two requests run; round 1,
			// once they ended, finds no count gone astray: two, and no
			// third.
			for round := range 2 {
				var dones []<-chan struct{}
				for i := 0; i < 2; i++ {
					status, done := startRequest(t, context.Background(), tester.Client, base+"/dl", key)
					if status != 200 {
						t.Fatalf("round %d, request %d: status %d, want 200", round, i+1, status)
					}
					dones = append(dones, done)
				}
				if round == 0 {
					var reset map[string]any
					if code := adminDo(t, "DELETE", "/rate_limit/zones/dl/keys/"+key, &reset); code != 200 || reset["reset"] != true {
						t.Fatalf("DELETE a key with requests in flight: %d %v, want 200 and reset true", code, reset)
					}
					if n := inFlight(t, "dl", key); n != 2 {
						t.Errorf("in_flight after the reset: %d, want 2", n)
					}
				}
				if resp, _ := get(t, tester, "/fast", "X-Client: "+key); resp.StatusCode != 429 {
					t.Errorf("round %d: a third request: status %d, want 429 (two run)", round, resp.StatusCode)
				}
				for range dones {
					up.release <- struct{}{}
				}
				for _, done := range dones {
					<-done
				}
				waitFor(t, "every slot back", func() bool { return inFlight(t, "dl", key) == 0 })
			}
		})
	}
}

// TestConcurrencySlotsNeverLeak: slots come back however a request ends:
// a client that leaves mid-response, a handler that fails (an upstream
// that is down), a client that leaves while its request is delayed by a
// shaping bucket of the same zone.
func TestConcurrencySlotsNeverLeak(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(concurrencySite(up.URL, storage(t)), "caddyfile")
			key := "leak-" + name

			// Clients leaving mid-response, many times over.
			for round := 0; round < 5; round++ {
				var cancels []context.CancelFunc
				var dones []<-chan struct{}
				for i := 0; i < 2; i++ {
					ctx, cancel := context.WithCancel(context.Background())
					status, done := startRequest(t, ctx, tester.Client, base+"/dl", key)
					if status != 200 {
						t.Fatalf("round %d, request %d: status %d, want 200 (a slot leaked)", round, i+1, status)
					}
					cancels, dones = append(cancels, cancel), append(dones, done)
				}
				for i, cancel := range cancels {
					cancel()
					<-dones[i]
				}
				waitFor(t, "the slots of clients that left", func() bool { return inFlight(t, "dl", key) == 0 })
			}
			waitFor(t, "the upstream to see the clients leave", func() bool { return up.held.Load() == 0 })

			// A failing handler: the upstream is down (502).
			for i := 0; i < 4; i++ {
				resp, _ := get(t, tester, "/down", "X-Client: "+key)
				if resp.StatusCode != 502 {
					t.Fatalf("down %d: status %d, want 502", i, resp.StatusCode)
				}
			}
			if n := inFlight(t, "dl", key); n != 0 {
				t.Errorf("after failing requests: in_flight %d, want 0", n)
			}
			// A handler that panics (as reverse_proxy does with
			// http.ErrAbortHandler to abort a response).
			for i := 0; i < 4; i++ {
				req, _ := http.NewRequest(http.MethodGet, base+"/abort", nil)
				req.Header.Set("X-Client", key)
				if resp, err := tester.Client.Do(req); err == nil {
					resp.Body.Close()
					t.Fatalf("abort %d: status %d, want the connection aborted", i, resp.StatusCode)
				}
			}
			if n := inFlight(t, "dl", key); n != 0 {
				t.Errorf("after panicking handlers: in_flight %d, want 0", n)
			}

			// A shaped request whose client leaves while it is delayed:
			// the first fills the bucket and is held; the second is
			// delayed, and its client gives up.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			status, done := startRequest(t, ctx, tester.Client, base+"/shaped", key)
			if status != 200 {
				t.Fatalf("shaped: status %d, want 200", status)
			}
			short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancelShort()
			req, _ := http.NewRequestWithContext(short, http.MethodGet, base+"/shaped", nil)
			req.Header.Set("X-Client", key)
			if resp, err := tester.Client.Do(req); err == nil {
				resp.Body.Close()
				t.Fatalf("delayed request: status %d before its delay, want the client to give up", resp.StatusCode)
			}
			waitFor(t, "the delayed request's slots", func() bool {
				return inFlight(t, "dl", key) == 1 && inFlight(t, "shaped", key) == 1
			})
			cancel()
			<-done
			waitFor(t, "every slot back", func() bool {
				return inFlight(t, "dl", key) == 0 && inFlight(t, "shaped", key) == 0
			})
		})
	}
}

func init() {
	caddy.RegisterModule(abortHandler{})
	httpcaddyfile.RegisterHandlerDirective("tollgate_test_abort", func(httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return abortHandler{}, nil
	})
	httpcaddyfile.RegisterDirectiveOrder("tollgate_test_abort", httpcaddyfile.Before, "respond")
}

// abortHandler is a test-only handler that panics with
// http.ErrAbortHandler, as reverse_proxy does to abort a response.
type abortHandler struct{}

func (abortHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.tollgate_test_abort",
		New: func() caddy.Module { return abortHandler{} },
	}
}

func (abortHandler) ServeHTTP(http.ResponseWriter, *http.Request, caddyhttp.Handler) error {
	panic(http.ErrAbortHandler)
}

// childEnv, when set, makes the test binary a Caddy that runs the
// Caddyfile it names until killed (see TestMain): an instance a test can
// kill, without building a binary.
const childEnv = "TOLLGATE_TEST_CHILD_CADDYFILE"

// startChildCaddy starts the test binary as a Caddy (see childEnv) serving
// site on a free loopback port, and returns the site's URL and the
// process, killed at the end of the test if still alive. The caller waits
// for it to answer.
func startChildCaddy(t *testing.T, site string) (string, *exec.Cmd) {
	t.Helper()
	port := redistest.FreePort(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf("{\n\tadmin off\n\thttp_port %d\n\tauto_https off\n\tskip_install_trust\n}\nhttp://127.0.0.1:%d {%s\n}\n", port, port, site)
	path := dir + "/Caddyfile"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable() // the test binary; os.Args[0] is "caddy" here
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(self, "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+path, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	return fmt.Sprintf("http://127.0.0.1:%d/", port), child
}

// runChildCaddy runs the Caddyfile at path and blocks.
func runChildCaddy(path string) {
	body, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	cfg, _, err := adapter.Adapt(body, map[string]any{"filename": path})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := caddy.Load(cfg, true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	select {}
}

// TestConcurrencyLeasesOfAKilledInstance: an instance (a child process)
// holds both slots of a key in Redis, renewing their leases (2s) while
// its requests run, so that after 3s another instance is still refused.
// Killed with SIGKILL, it gives nothing back; its slots free once their
// leases end, within about one lease.
func TestConcurrencyLeasesOfAKilledInstance(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	zone := `
		rate_limit {
			zone dl {
				key {http.request.header.X-Client}
				concurrency 2
				concurrency_lease 2s
			}
			storage redis {
				addresses ` + srv.Addr + `
				timeout ` + testTimeout + `
			}
		}
		reverse_proxy ` + strings.TrimPrefix(up.URL, "http://")
	childURL, child := startChildCaddy(t, zone)
	waitFor(t, "the child Caddy", func() bool {
		resp, err := http.Get(childURL + "ping")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	// The probe took and gave back a slot of the empty key; now hold two.
	for i := 0; i < 2; i++ {
		if status, _ := startRequest(t, context.Background(), http.DefaultClient, childURL, "victim"); status != 200 {
			t.Fatalf("child request %d: status %d", i, status)
		}
	}

	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+"\n\tlocalhost:9080 {"+zone+"\n\t}", "caddyfile")
	time.Sleep(3 * time.Second) // longer than a lease: only renewals keep the slots
	resp, _ := get(t, tester, "/", "X-Client: victim")
	check(t, "while the child holds both slots", resp, "", want{429, map[string]string{"Retry-After": "1"}, ""})

	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = child.Wait()
	resp, _ = get(t, tester, "/fast-probe-not-held", "X-Client: victim")
	check(t, "just after the kill", resp, "", want{429, nil, ""})
	// Once admitted, the in-process request is held by the upstream:
	// release it when it arrives.
	go func() {
		for {
			select {
			case up.release <- struct{}{}:
			case <-time.After(20 * time.Second):
				return
			}
		}
	}()
	for {
		resp, _ := get(t, tester, "/", "X-Client: victim")
		if resp.StatusCode == 200 {
			break
		}
		if time.Since(killed) > 5*time.Second {
			t.Fatalf("slots of the killed instance still held %s after the kill (lease 2s)", time.Since(killed))
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(killed)
	t.Logf("the killed instance's slots freed %s after the kill (lease 2s)", took.Round(time.Millisecond))
	if took > 3500*time.Millisecond {
		t.Errorf("slots freed %s after the kill, want within the 2s lease (and some slack)", took)
	}
}

// guardInstances is three servers (9081-9083), each its own handler and
// Redis client: a zone of 3 concurrent requests per key in front of the
// upstream, and a login zone of 5/min with a 1-minute ban.
func guardInstances(up, storage string) string {
	cfg := globalOptions
	for i := 1; i <= 3; i++ {
		cfg += fmt.Sprintf(`
	http://localhost:908%d {
		rate_limit {
			zone slots {
				match {
					path /sleep
				}
				key {http.request.header.X-Client}
				concurrency 3
			}
			zone login {
				match {
					path /login
				}
				key {http.request.header.X-Client}
				rate 5/m
				ban 1m
			}
			storage redis {
				%s
				pool_size %d
				timeout `+testTimeout+`
			}
		}
		handle /login {
			respond "ok"
		}
		reverse_proxy %s
	}`, i, storage, 16+i, strings.TrimPrefix(up, "http://"))
	}
	return cfg
}

// TestGuardsExactAcrossThreeInstances: on one Redis, and on a Cluster,
// three instances never have more than 3 requests of a key in flight at
// the upstream together, and a ban started on one refuses the key on all.
func TestGuardsExactAcrossThreeInstances(t *testing.T) {
	for _, c := range []struct {
		name    string
		storage func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return "addresses " + redistest.Start(t).Addr }},
		{"cluster", func(t *testing.T) string {
			return "addresses " + strings.Join(redistest.StartCluster(t, 3).Addrs, " ")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(guardInstances(up.URL, c.storage(t)), "caddyfile")

			var admitted, rejected, other atomic.Int64
			stop := time.Now().Add(2 * time.Second)
			done := make(chan struct{})
			for w := 0; w < 24; w++ {
				go func(w int) {
					defer func() { done <- struct{}{} }()
					for time.Now().Before(stop) {
						req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://localhost:908%d/sleep", 1+w%3), nil)
						req.Header.Set("X-Client", "crowd-"+c.name)
						resp, err := sendUnread(t, tester.Client, req)
						if err != nil {
							other.Add(1)
							continue
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						switch resp.StatusCode {
						case 200:
							admitted.Add(1)
						case 429:
							rejected.Add(1)
						default:
							other.Add(1)
						}
					}
				}(w)
			}
			for w := 0; w < 24; w++ {
				<-done
			}
			t.Logf("admitted %d, rejected %d; at most %d in flight at the upstream", admitted.Load(), rejected.Load(), up.maxHeld.Load())
			if m := up.maxHeld.Load(); m > 3 {
				t.Errorf("%d requests of one key in flight at once across the instances, want at most 3", m)
			}
			if admitted.Load() < 20 || rejected.Load() == 0 || other.Load() != 0 {
				t.Errorf("admitted %d, rejected %d, other %d: want plenty admitted, some rejected, no errors", admitted.Load(), rejected.Load(), other.Load())
			}

			statuses := ""
			for i := 0; i < 9; i++ {
				req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://localhost:908%d/login", 1+i%3), nil)
				req.Header.Set("X-Client", "intruder-"+c.name)
				resp, err := sendUnread(t, tester.Client, req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				statuses += fmt.Sprint(resp.StatusCode, " ")
				if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); i >= 5 && ra < 50 {
					t.Errorf("request %d on instance %d: Retry-After %q, want the ban's (about 60)", i, 1+i%3, resp.Header.Get("Retry-After"))
				}
			}
			if statuses != "200 200 200 200 200 429 429 429 429 " {
				t.Errorf("login statuses %s, want 5 admitted, then banned on every instance", statuses)
			}
		})
	}
}

// TestConcurrencyJSON: concurrency and concurrency_lease in a JSON config.
func TestConcurrencyJSON(t *testing.T) {
	up := newUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(jsonConfig("", `
		{"handler": "rate_limit",
		 "rate_limits": {"jc": {"key": "{http.request.header.X-Client}", "concurrency": 1, "concurrency_lease": "5s"}}},
		{"handler": "reverse_proxy", "upstreams": [{"dial": "`+strings.TrimPrefix(up.URL, "http://")+`"}]}`), "json")
	status, done := startRequest(t, context.Background(), tester.Client, base+"/", "json")
	if status != 200 {
		t.Fatalf("first: status %d", status)
	}
	resp, _ := get(t, tester, "/", "X-Client: json")
	check(t, "second while the first runs", resp, "", want{429, map[string]string{"Retry-After": "1", "RateLimit-Policy": `"jc";q=1;qu="concurrent-requests"`}, ""})
	up.release <- struct{}{}
	<-done
	waitFor(t, "the slot back", func() bool { return inFlight(t, "jc", "json") == 0 })
}

// TestConcurrencyWhenRedisGoesDown: a request holds a slot in Redis;
// Redis stops; new requests are decided on this instance's memory
// (on_storage_error local, the default), still at most 2 in flight, the
// one Redis holds among them, and never a 5xx; the held request ends
// without error though its slot cannot be given back (its lease will
// end). Before, the local slots knew nothing of the one Redis held: two
// more were admitted beside it, 3 in flight with concurrency 2.
func TestConcurrencyWhenRedisGoesDown(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(concurrencySite(up.URL, "storage redis {\n\t\t\t\taddresses "+srv.Addr+"\n\t\t\t\ttimeout "+testTimeout+"\n\t\t\t}"), "caddyfile")
	status, held := startRequest(t, context.Background(), tester.Client, base+"/dl", "down")
	if status != 200 {
		t.Fatalf("held request: %d", status)
	}
	srv.Stop()
	status, local := startRequest(t, context.Background(), tester.Client, base+"/dl", "down")
	if status != 200 {
		t.Fatalf("local request: status %d, want 200 (one slot of 2 left in this instance)", status)
	}
	resp, _ := get(t, tester, "/fast", "X-Client: down")
	check(t, "a third in flight, decided locally", resp, "", want{429, map[string]string{"Retry-After": "1"}, ""})
	if m := up.maxHeld.Load(); m > 2 {
		t.Errorf("%d requests of one key in flight at once, want at most 2", m)
	}
	for range 2 {
		up.release <- struct{}{}
	}
	<-held
	<-local
	resp, _ = get(t, tester, "/fast", "X-Client: down")
	check(t, "after they ended", resp, "", want{200, nil, ""})
}

// TestConcurrencyThroughAnOutageAndBack: a request that held its slot in
// Redis ends while a request admitted locally during an outage still
// runs; in the next outage the instance still counts that one. Before,
// the end of the Redis-held request also gave back a local slot it never
// took (the running request's): the next outage admitted two more beside
// it, 3 in flight with concurrency 2.
func TestConcurrencyThroughAnOutageAndBack(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(concurrencySite(up.URL, "storage redis {\n\t\t\t\taddresses "+srv.Addr+"\n\t\t\t\ttimeout "+testTimeout+"\n\t\t\t}"), "caddyfile")
	start := func(step string, ctx context.Context) <-chan struct{} {
		t.Helper()
		status, done := startRequest(t, ctx, tester.Client, base+"/dl", "back")
		if status != 200 {
			t.Fatalf("%s: status %d, want 200", step, status)
		}
		return done
	}
	ctxA, endA := context.WithCancel(context.Background())
	defer endA()
	doneA := start("A, on Redis", ctxA)
	srv.Stop()
	doneB := start("B, local while Redis is down", context.Background())
	srv.Restart()
	waitRedisDecides(t, tester, srv)

	// A ends with Redis back: it gives its slot back to Redis, and its
	// own local count, not B's.
	c := srv.Client()
	calls := func() int64 { return redistest.Calls(t, c, "evalsha", "eval", "fcall") }
	before := calls()
	endA()
	<-doneA
	waitFor(t, "A's slot given back to Redis", func() bool { return calls() > before })
	waitFor(t, "A to leave the upstream", func() bool { return up.held.Load() == 1 })
	time.Sleep(100 * time.Millisecond) // room for A's release to finish

	srv.Stop()
	doneC := start("C, local in the next outage", context.Background())
	resp, _ := get(t, tester, "/fast", "X-Client: back")
	check(t, "D, with B and C in flight", resp, "", want{429, map[string]string{"Retry-After": "1"}, ""})
	for range 2 {
		up.release <- struct{}{}
	}
	<-doneB
	<-doneC
}

// waitRedisDecides waits until the dl zone of concurrencySite decides on
// srv again after an outage: a request of a key of its own holds its
// slot there.
func waitRedisDecides(t *testing.T, tester *caddytest.Tester, srv *redistest.Server) {
	t.Helper()
	c := srv.Client()
	key := redisstore.New(nil, redisstore.DefaultPrefix).Key("dl", algorithms.Concurrency, "probe")
	waitFor(t, "Redis to decide again", func() bool {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		status, done := startRequest(t, ctx, tester.Client, base+"/dl", "probe")
		if status != 200 {
			return false
		}
		held := c.Exists(context.Background(), key).Val() == 1
		cancel()
		<-done
		return held
	})
}

// reloadSite is a zone of 2 requests in flight per key, whose storage
// block (and the rest of the handler: extra) each load sets.
func reloadSite(up, zone, storage, extra string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone dl {
				key {http.request.header.X-Client}
				concurrency 2
				` + zone + `
			}
			` + storage + `
			` + extra + `
		}
		handle /fast {
			respond "ok"
		}
		handle {
			reverse_proxy ` + strings.TrimPrefix(up, "http://") + `
		}
	}`
}

// TestReloadKeepsSlotsInFlight: two requests hold both slots of a key; a
// reload changes a setting of the storage (memory: max_keys; Redis: the
// timeout, which makes a new client) while they run; the new
// configuration still refuses a third, and once they end, two run again
// and no more. Before, memory started the counts afresh (a third
// admitted at once), and the reload closed the old Redis client at once:
// the running requests' leases were no longer renewed, and the new
// configuration admitted a third once they lapsed (a lease of 2s here).
// The Redis zone denies when Redis fails, so that only Redis's leases
// count (no local count).
func TestReloadKeepsSlotsInFlight(t *testing.T) {
	srv := redistest.Start(t)
	redisBlock := func(timeout string) string {
		return "storage redis {\n\t\t\t\taddresses " + srv.Addr + "\n\t\t\t\ttimeout " + timeout + "\n\t\t\t}"
	}
	for _, c := range []struct {
		name          string
		zone          string
		before, after string // what the reload changes
		redis         bool
	}{
		{"memory", "", "max_keys 1000", "max_keys 2000", false},
		{"redis", "concurrency_lease 2s\n\t\t\t\ton_storage_error deny", redisBlock(testTimeout), redisBlock("9s"), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			storage, extra := c.before, ""
			if !c.redis {
				storage, extra = "", c.before
			}
			tester.InitServer(reloadSite(up.URL, c.zone, storage, extra), "caddyfile")
			key := "reload-" + c.name
			var old *shared.Pool
			if c.redis {
				old = liveRedisClient(t)
			}
			var dones []<-chan struct{}
			for i := range 2 {
				status, done := startRequest(t, context.Background(), tester.Client, base+"/dl", key)
				if status != 200 {
					t.Fatalf("request %d: status %d, want 200", i+1, status)
				}
				dones = append(dones, done)
			}
			storage, extra = c.after, ""
			if !c.redis {
				storage, extra = "", c.after
			}
			tester.InitServer(reloadSite(up.URL, c.zone, storage, extra), "caddyfile")
			if c.redis {
				if liveRedisClient(t) == old {
					t.Fatal("the reload kept the client: the test changes nothing")
				}
				time.Sleep(4500 * time.Millisecond) // over two leases: only renewals keep the slots
			}
			resp, _ := get(t, tester, "/fast", "X-Client: "+key)
			check(t, "a third after the reload", resp, "", want{429, map[string]string{"Retry-After": "1"}, ""})

			for range dones {
				up.release <- struct{}{}
			}
			for _, done := range dones {
				<-done
			}
			waitFor(t, "every slot back", func() bool { return inFlight(t, "dl", key) == 0 })
			if c.redis {
				waitFor(t, "the old client closed once its last lease ended", func() bool {
					return old.Client().Ping(context.Background()).Err() != nil
				})
			}
			for i := range 2 {
				status, done := startRequest(t, context.Background(), tester.Client, base+"/dl", key)
				if status != 200 {
					t.Fatalf("after: request %d: status %d, want 200", i+1, status)
				}
				dones[i] = done
			}
			resp, _ = get(t, tester, "/fast", "X-Client: "+key)
			check(t, "after: a third", resp, "", want{429, nil, ""})
			for range dones {
				up.release <- struct{}{}
			}
			for _, done := range dones {
				<-done
			}
		})
	}
}

// liveRedisClient is the Redis client of the live handler (there is one).
func liveRedisClient(t *testing.T) *shared.Pool {
	t.Helper()
	live.mu.Lock()
	defer live.mu.Unlock()
	for _, h := range live.handlers {
		if h.redis != nil && h.redis.client != nil {
			return h.redis.client
		}
	}
	t.Fatal("no live handler on Redis")
	return nil
}
