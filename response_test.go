package tollgate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// loginUpstream is a login form's backend: "wrong" as X-Password fails
// with 401, anything else logs in with 200. With hold, each request waits
// for release (counting the requests that reached it) before answering.
type loginUpstream struct {
	*httptest.Server
	reached atomic.Int64
	hold    bool
	release chan struct{}
}

func newLoginUpstream(t *testing.T, hold bool) *loginUpstream {
	u := &loginUpstream{hold: hold, release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.reached.Add(1)
		if u.hold {
			select {
			case <-u.release:
			case <-r.Context().Done():
			}
		}
		if r.Header.Get("X-Password") == "wrong" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, "no")
			return
		}
		fmt.Fprint(w, "welcome")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *loginUpstream) addr() string { return strings.TrimPrefix(u.URL, "http://") }

// loginSite is the login recipe on paths /login1../login<n>, each route
// its own rate_limit handler sharing the zone (as instances sharing one
// Redis do): 5 failed logins per 15 minutes per client, then banned for
// an hour; successful logins never count.
func loginSite(up string, routes int, storage string) string {
	site := globalOptions + "\tlocalhost:9080 {\n"
	for i := 1; i <= routes; i++ {
		site += fmt.Sprintf(`
		route /login%d {
			rate_limit {
				zone login {
					key {http.request.header.X-Client}
					rate 5/15m
					count_response status 401 403
					ban 1h
				}
				%s
			}
			reverse_proxy %s
		}`, i, storage, up)
	}
	return site + "\n\t}"
}

// TestLoginRecipe: successful logins never count; the sixth failure in 15
// minutes is refused and bans the client for an hour, successful
// passwords included. On memory (fake clock: the ban ends) and Redis.
func TestLoginRecipe(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := newLoginUpstream(t, false)
			tester := caddytest.NewTester(t)
			tester.InitServer(loginSite(up.addr(), 1, storage(t)), "caddyfile")
			client := "X-Client: login-" + name
			for i := 0; i < 20; i++ {
				resp, _ := get(t, tester, "/login1", client, "X-Password: right")
				check(t, fmt.Sprintf("good login %d", i+1), resp, "welcome", want{status: 200})
			}
			if got, want := statuses(t, tester, 6, []string{"/login1"}, client, "X-Password: wrong"), "401 401 401 401 401 429 "; got != want {
				t.Fatalf("failed logins: %q, want %q (5 per 15 minutes)", got, want)
			}
			resp, _ := get(t, tester, "/login1", client, "X-Password: right")
			check(t, "good login while banned", resp, "", want{status: 429})
			resp, _ = get(t, tester, "/login1", "X-Client: another-"+name, "X-Password: right")
			check(t, "another client", resp, "welcome", want{status: 200})
			if name == "memory" {
				advance(time.Hour + time.Second)
				resp, _ = get(t, tester, "/login1", client, "X-Password: right")
				check(t, "good login after the ban", resp, "welcome", want{status: 200})
			}
		})
	}
}

// TestCountResponseConcurrentFailures: 100 wrong passwords sent at once,
// held by the backend until all are decided, are 100 reservations: 5
// reach the backend, 95 are refused, on memory and on three handlers
// sharing one Redis.
func TestCountResponseConcurrentFailures(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := newLoginUpstream(t, true)
			routes := 1
			if name == "redis" {
				routes = 3
			}
			tester := caddytest.NewTester(t)
			tester.InitServer(loginSite(up.addr(), routes, storage(t)), "caddyfile")
			const n = 100
			var refused atomic.Int64
			var wg sync.WaitGroup
			codes := make([]int, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/login%d", base, 1+i%routes), nil)
					req.Header.Set("X-Client", "storm-"+name)
					req.Header.Set("X-Password", "wrong")
					resp, err := sendUnread(t, tester.Client, req)
					if err != nil {
						t.Errorf("request %d: %v", i, err)
						return
					}
					resp.Body.Close()
					codes[i] = resp.StatusCode
					if resp.StatusCode == 429 {
						refused.Add(1)
					}
				}(i)
			}
			waitFor(t, "every request decided", func() bool { return up.reached.Load()+refused.Load() >= n })
			if got := up.reached.Load(); got != 5 {
				t.Errorf("%d of %d concurrent failed logins reached the backend, want 5 (the limit)", got, n)
			}
			close(up.release)
			wg.Wait()
			count := map[int]int{}
			for _, c := range codes {
				count[c]++
			}
			if count[401] != 5 || count[429] != n-5 {
				t.Errorf("statuses %v, want 5 401s and %d 429s", count, n-5)
			}
		})
	}
}

// usageUpstream answers with the X-Usage header and a body of the size
// the request's X-Size asks for, or, for /json and /sse, token usage in
// a JSON body or an event stream.
func usageUpstream(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens := r.Header.Get("X-Tokens")
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"total_tokens":%s}}`, tokens)
			return
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"h\"}}],\"usage\":null}\n\n")
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":%s}}\n\n", tokens)
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		if u := r.Header.Get("X-Usage"); u != "" {
			w.Header().Set("X-Usage", u)
		}
		var size int
		fmt.Sscan(r.Header.Get("X-Size"), &size)
		w.Write([]byte(strings.Repeat("x", size)))
	}))
	t.Cleanup(s.Close)
	return s
}

// remaining reads r of the RateLimit header's one item.
func remaining(t *testing.T, resp *http.Response) int64 {
	t.Helper()
	v := resp.Header.Get("RateLimit")
	_, after, ok := strings.Cut(v, ";r=")
	if !ok {
		t.Fatalf("RateLimit = %q, want an r parameter", v)
	}
	var r int64
	fmt.Sscan(strings.SplitN(after, ";", 2)[0], &r)
	return r
}

// TestCostResponseHeader: a zone of 100 per hour reserves an estimate of
// 10 and settles to the upstream's X-Usage: less gives back, more is owed
// past the capacity and waited off; no number keeps the estimate.
func TestCostResponseHeader(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := usageUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone usage {
				key {http.request.header.X-Client}
				rate 100/h
				cost 10
				cost_response {http.response.header.X-Usage}
			}
			`+storage(t)+`
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
			client := "X-Client: usage-" + name
			resp, _ := get(t, tester, "/", client, "X-Usage: 2")
			check(t, "first", resp, "", want{status: 200})
			// The header reports the reservation: 90 left.
			if r := remaining(t, resp); r != 90 {
				t.Errorf("first: r = %d, want 90 (the reservation of 10)", r)
			}
			resp, _ = get(t, tester, "/", client, "X-Usage: 50")
			if r := remaining(t, resp); r != 88 {
				t.Errorf("second: r = %d, want 88 (the first settled to 2)", r)
			}
			resp, _ = get(t, tester, "/", client, "X-Usage: abc")
			if r := remaining(t, resp); r != 38 {
				t.Errorf("third: r = %d, want 38 (the second settled to 50)", r)
			}
			resp, _ = get(t, tester, "/", client, "X-Usage: 200")
			if r := remaining(t, resp); r != 28 {
				t.Errorf("fourth: r = %d, want 28 (the third kept its estimate of 10)", r)
			}
			// 2 + 50 + 10 + 200 = 262 charged of 100: owed 162, the key
			// waits until 10 fit again: 172 units of 36s, 103.2 minutes.
			resp, _ = get(t, tester, "/", client)
			check(t, "after the excess", resp, "", want{status: 429})
			if name == "memory" {
				advance(103 * time.Minute)
				resp, _ = get(t, tester, "/", client)
				check(t, "103 minutes on", resp, "", want{status: 429})
				advance(13 * time.Second)
				resp, _ = get(t, tester, "/", client)
				check(t, "103.2 minutes on", resp, "", want{status: 200})
			}
		})
	}
}

// TestDownloadQuotaRecipe: bytes per day settled from {http.response.size}
// with an estimate of 1 byte: a download that fits is admitted, and the
// bytes it wrote are charged, past the quota if need be.
func TestDownloadQuotaRecipe(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := usageUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone downloads {
				key {http.request.header.X-Client}
				rate 1000/d
				cost 1
				cost_response {http.response.size}
			}
			`+storage(t)+`
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
			client := "X-Client: dl-" + name
			if got, want := statuses(t, tester, 4, []string{"/file"}, client, "X-Size: 400"), "200 200 200 429 "; got != want {
				t.Fatalf("400-byte downloads on a 1000-byte daily quota: %q, want %q", got, want)
			}
		})
	}
}

// TestCostResponseJSONAndSSE: tokens per hour settled from the usage in a
// JSON body and in the last event of a stream that holds it.
func TestCostResponseJSONAndSSE(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := usageUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone tokens {
				key {http.request.header.X-Client}
				rate 1000/h
				cost 100
				cost_response {http.rate_limit.response.json.usage.total_tokens}
			}
			`+storage(t)+`
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
			client := "X-Client: tokens-" + name
			resp, _ := get(t, tester, "/json", client, "X-Tokens: 30")
			check(t, "json", resp, "", want{status: 200})
			resp, body := get(t, tester, "/sse", client, "X-Tokens: 450")
			check(t, "sse", resp, "", want{status: 200})
			if !strings.Contains(body, "[DONE]") {
				t.Errorf("sse body %q, want the whole stream", body)
			}
			if r := remaining(t, resp); r != 870 {
				t.Errorf("sse: r = %d, want 870 (json settled to 30, this one reserved 100)", r)
			}
			resp, _ = get(t, tester, "/json", client, "X-Tokens: 0")
			if r := remaining(t, resp); r != 420 {
				t.Errorf("after the stream: r = %d, want 420 (the stream settled to 450)", r)
			}
		})
	}
}

// TestStreamPassesThrough: an event stream's first event reaches the
// client before the upstream sends the second (the upstream waits for
// the client to have read it), and the usage in the last event is
// settled.
func TestStreamPassesThrough(t *testing.T) {
	readFirst := make(chan struct{})
	failed := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-readFirst:
		case <-time.After(20 * time.Second):
			failed <- "the client never got the first event while the upstream held the second"
		}
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":700}}\n\n")
	}))
	defer up.Close()
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone tokens {
				key {http.request.header.X-Client}
				rate 1000/h
				cost 100
				cost_response {http.rate_limit.response.json.usage.output_tokens}
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
	req, _ := http.NewRequest(http.MethodGet, base+"/stream", nil)
	req.Header.Set("X-Client", "stream")
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the first event: %v", err)
		}
		if line == "\n" {
			break
		}
	}
	close(readFirst)
	rest := new(strings.Builder)
	_, _ = bufio.NewReader(rd).WriteTo(rest)
	resp.Body.Close()
	select {
	case msg := <-failed:
		t.Fatal(msg)
	default:
	}
	if !strings.Contains(rest.String(), "message_delta") {
		t.Errorf("rest of the stream %q, want the message_delta event", rest.String())
	}
	resp, _ = get(t, tester, "/stream2", "X-Client: stream")
	if r := remaining(t, resp); r != 200 {
		t.Errorf("after the stream: r = %d, want 200 (settled to 700, then 100 reserved)", r)
	}
}

// llmUpstream is an OpenAI-compatible backend: it answers a request whose
// JSON body it reads whole (400 otherwise) with the usage the request's
// X-Tokens names, as one JSON body or, with "stream": true, as an event
// stream whose last data event before [DONE] holds it; its content is
// long enough for `encode` to compress.
func llmUpstream(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int  `json:"max_tokens"`
			Stream    bool `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad body: "+err.Error(), http.StatusBadRequest)
			return
		}
		tokens := r.Header.Get("X-Tokens")
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[{"message":{"content":%q}}],"usage":{"prompt_tokens":3,"total_tokens":%s}}`, padding, tokens)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}],\"usage\":null}\n\n", padding)
		w.(http.Flusher).Flush()
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":%s}}\n\ndata: [DONE]\n\n", tokens)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestLLMRecipe: tokens per hour per API key, estimated from the request's
// max_tokens and settled from the usage, streamed and not, as recipes.md
// has it: with `encode` in the site, for a client that accepts gzip.
func TestLLMRecipe(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := llmUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone tokens {
				match {
					method POST
					path /v1/chat/completions
				}
				key {http.request.header.Authorization}
				rate 1000/h
				cost {http.rate_limit.request.json.max_tokens}
				default_cost 1000
				cost_response {http.rate_limit.response.json.usage.total_tokens}
			}
			`+storage(t)+`
		}
		encode zstd gzip
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
			post := func(step, body, tokens string) *http.Response {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer key-"+name)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Tokens", tokens)
				req.Header.Set("Accept-Encoding", "gzip")
				resp, err := tester.Client.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 400 {
					t.Fatalf("%s: the backend got a damaged body: %s", step, b)
				}
				return resp
			}
			gzipped := want{status: 200, headers: map[string]string{"Content-Encoding": "gzip"}}
			resp := post("plain", `{"model":"m","max_tokens":300}`, "120")
			check(t, "plain", resp, "", gzipped)
			if r := remaining(t, resp); r != 700 {
				t.Errorf("plain: r = %d, want 700 (max_tokens reserved)", r)
			}
			resp = post("streamed", `{"model":"m","max_tokens":800,"stream":true,"stream_options":{"include_usage":true}}`, "50")
			check(t, "streamed", resp, "", gzipped)
			if r := remaining(t, resp); r != 80 {
				t.Errorf("streamed: r = %d, want 80 (the first settled to 120, 800 reserved)", r)
			}
			resp = post("too many", `{"model":"m","max_tokens":900}`, "1")
			check(t, "max_tokens above what is left", resp, "", want{status: 429})
			resp = post("no max_tokens", `{"model":"m"}`, "1")
			check(t, "no max_tokens: default_cost 1000", resp, "", want{status: 429})
			resp = post("fits", `{"model":"m","max_tokens":830}`, "1")
			check(t, "fits what is left", resp, "", want{status: 200})
		})
	}
}

// TestCountResponseLocalCopy: with on_storage_error local, the instance's
// copy of the Redis state learns the give-backs of successful logins, so
// that when Redis goes away the local copy goes on from the 3 failures Redis
// counted (2 more allowed), not from 6 requests; and a successful login
// decided locally is given back in the local copy.
func TestCountResponseLocalCopy(t *testing.T) {
	srv := redistest.Start(t)
	up := newLoginUpstream(t, false)
	tester := caddytest.NewTester(t)
	tester.InitServer(loginSite(up.addr(), 1, "storage redis {\n\t\t\t\taddresses "+srv.Addr+"\n\t\t\t\ttimeout "+testTimeout+"\n\t\t\t}"), "caddyfile")
	client := "X-Client: copy"
	for i := 0; i < 3; i++ {
		resp, _ := get(t, tester, "/login1", client, "X-Password: right")
		check(t, fmt.Sprintf("good %d", i), resp, "", want{status: 200})
		resp, _ = get(t, tester, "/login1", client, "X-Password: wrong")
		check(t, fmt.Sprintf("wrong %d", i), resp, "", want{status: 401})
	}
	// The last decision Redis made before it went away was a reservation
	// it then gave back: only the give-back tells the local copy.
	resp, _ := get(t, tester, "/login1", client, "X-Password: right")
	check(t, "good before the outage", resp, "", want{status: 200})
	srv.Stop()
	for i := 0; i < 3; i++ {
		resp, _ := get(t, tester, "/login1", client, "X-Password: right")
		check(t, fmt.Sprintf("good %d while Redis is down", i), resp, "", want{status: 200})
	}
	if got, want := statuses(t, tester, 3, []string{"/login1"}, client, "X-Password: wrong"), "401 401 429 "; got != want {
		t.Fatalf("failures while Redis is down: %q, want %q (3 counted on Redis, 5 allowed)", got, want)
	}
}

// TestCountResponseModes: a count_response zone beside a plain rate (a
// request either rejects is charged in neither), in a tier, and in a dry
// run, on memory.
func TestCountResponseModes(t *testing.T) {
	up := newLoginUpstream(t, false)
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone failures {
				key {http.request.header.X-Client}
				rate 2/h
				count_response status 401
				tier {http.request.header.X-Plan} {
					gold 4/h
				}
			}
			zone plain {
				key {http.request.header.X-Client}
				rate 6/h
			}
			zone watch {
				key {http.request.header.X-Client}
				rate 1/h
				count_response status 401
				dry_run
			}
		}
		reverse_proxy `+up.addr()+`
	}`, "caddyfile")
	a := "X-Client: modes-a"
	// Two failures fill failures (and the dry run, which never refuses).
	if got, want := statuses(t, tester, 2, []string{"/"}, a, "X-Password: wrong"), "401 401 "; got != want {
		t.Fatalf("failures: %q, want %q", got, want)
	}
	// Now failures refuses the key, a right password too (refused before
	// it runs), and a refused request is charged in plain neither: plain
	// still has 6 - 2.
	resp, _ := get(t, tester, "/", a, "X-Password: right")
	check(t, "after two failures", resp, "", want{status: 429})
	if h := resp.Header.Get("RateLimit"); !strings.Contains(h, `"plain";r=4;`) {
		t.Errorf("RateLimit = %q, want plain's r=4 (the refused requests charged in no zone)", h)
	}
	if h := resp.Header.Get("RateLimit"); !strings.Contains(h, `"watch";r=0;`) {
		t.Errorf("RateLimit = %q, want the dry run's r=0 (it counted both failures, refusing neither)", h)
	}
	// A gold client's failures count against the gold tier's 4.
	if got, want := statuses(t, tester, 5, []string{"/"}, "X-Client: modes-b", "X-Plan: gold", "X-Password: wrong"), "401 401 401 401 429 "; got != want {
		t.Fatalf("gold failures: %q, want %q", got, want)
	}
	// A gold client's successes cost the tier nothing.
	c := "X-Client: modes-c"
	if got, want := statuses(t, tester, 5, []string{"/"}, c, "X-Plan: gold", "X-Password: right"), "200 200 200 200 200 "; got != want {
		t.Fatalf("gold successes: %q, want %q", got, want)
	}
	resp, _ = get(t, tester, "/", c, "X-Plan: gold", "X-Password: wrong")
	if h := resp.Header.Get("RateLimit"); resp.StatusCode != 401 || !strings.Contains(h, `"failures";r=3;`) {
		t.Errorf("gold failure after 5 successes: %d, RateLimit = %q, want 401 and failures r=3 (4 - this one)", resp.StatusCode, h)
	}
}

// TestCountResponseScriptsPerRequest counts the scripts Redis runs: a
// count_response zone's admitted request whose response matches costs
// one (the decision), as a plain zone's; one that does not match costs
// one more (the give-back); a cost_response settled to its estimate costs
// one, to another cost two.
func TestCountResponseScriptsPerRequest(t *testing.T) {
	srv := redistest.Start(t)
	up := usageUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone counted {
				match {
					path /counted
				}
				key {http.request.header.X-Client}
				rate 1000/h
				count_response header X-Usage *
			}
			zone costed {
				match {
					path /costed
				}
				key {http.request.header.X-Client}
				rate 1000/h
				cost_response {http.response.header.X-Usage}
			}
			zone plain {
				match {
					path /plain
				}
				key {http.request.header.X-Client}
				rate 1000/h
				# One script a request, the reference: a hot key would
				# otherwise be decided from quota leases (which a zone
				# that settles does not take).
				lease off
			}
			storage redis {
				addresses `+srv.Addr+`
				timeout `+testTimeout+`
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
	c := srv.Client()
	// The first script run loads the scripts (EVALSHA, NOSCRIPT, EVAL).
	get(t, tester, "/plain", "X-Client: warm-up")
	for _, step := range []struct {
		name, path, usage string
		want              int64
	}{
		{"plain", "/plain", "", 1},
		{"counted, matching", "/counted", "1", 1},
		{"counted, not matching", "/counted", "", 2},
		{"costed, settled to the estimate", "/costed", "1", 1},
		{"costed, no number", "/costed", "", 1},
		{"costed, settled to 5", "/costed", "5", 2},
	} {
		before := redistest.Calls(t, c, "evalsha", "eval", "fcall")
		const n = 10
		for i := 0; i < n; i++ {
			hdrs := []string{"X-Client: scripts"}
			if step.usage != "" {
				hdrs = append(hdrs, "X-Usage: "+step.usage)
			}
			resp, _ := get(t, tester, step.path, hdrs...)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: status %d", step.name, resp.StatusCode)
			}
		}
		if got := redistest.Calls(t, c, "evalsha", "eval", "fcall") - before; got != step.want*n {
			t.Errorf("%s: %d scripts for %d requests, want %d per request", step.name, got, n, step.want)
		}
	}
}

// TestClientLeavesMidResponse: a download whose client goes away after
// 4,000 bytes is settled to the bytes written, not to the estimate.
func TestClientLeavesMidResponse(t *testing.T) {
	gone := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			return
		}
		w.Write([]byte(strings.Repeat("x", 4000)))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
		close(gone)
	}))
	defer up.Close()
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone bytes {
				key {http.request.header.X-Client}
				rate 10000/d
				cost 1
				cost_response {http.response.size}
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
	req, _ := http.NewRequest(http.MethodGet, base+"/big", nil)
	req.Header.Set("X-Client", "leaver")
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 4000)); err != nil {
		t.Fatalf("reading the first 4000 bytes: %v", err)
	}
	resp.Body.Close() // the client leaves mid-response
	<-gone
	// Each look reserves 1 and gives it back (an empty body): r is what
	// the abandoned download left, less that 1.
	var r int64
	waitFor(t, "the abandoned download settled", func() bool {
		resp, _ := get(t, tester, "/small", "X-Client: leaver")
		r = remaining(t, resp)
		return r == 10000-4000-1
	})
}

// TestResponseOptionsJSON: the same options in a JSON config: a class (4
// for 4xx) in count_response, and cost_response from a header.
func TestResponseOptionsJSON(t *testing.T) {
	up := newLoginUpstream(t, false)
	tester := caddytest.NewTester(t)
	tester.InitServer(jsonConfig("", `{
		"handler": "rate_limit",
		"rate_limits": {"login": {
			"key": "{http.request.header.X-Client}",
			"events": 2, "window": "1h",
			"count_response": {"status_code": [4]}
		}}
	}, {"handler": "reverse_proxy", "upstreams": [{"dial": "`+up.addr()+`"}]}`), "json")
	client := "X-Client: json"
	if got, want := statuses(t, tester, 4, []string{"/"}, client, "X-Password: right"), "200 200 200 200 "; got != want {
		t.Fatalf("successes: %q, want %q", got, want)
	}
	if got, want := statuses(t, tester, 3, []string{"/"}, client, "X-Password: wrong"), "401 401 429 "; got != want {
		t.Fatalf("4xx: %q, want %q", got, want)
	}
}
