package tollgate

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/klauspost/compress/zstd"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
)

// Tests of what count_response and cost_response read: the response as
// the upstream wrote it, in a site with the directives that sit beside a
// rate limiter (encode, header), and the request's JSON read only where a
// zone reads it.

// padding makes a body long enough for `encode` to compress it (its
// minimum_length is 512 bytes).
var padding = strings.Repeat("lorem ipsum ", 100)

// paddedUsageUpstream answers /json with a JSON body and /sse with an
// event stream, each with the usage the request's X-Tokens names after
// content long enough to be compressed. With X-Compress, it compresses
// the body itself in that encoding.
func paddedUsageUpstream(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens := r.Header.Get("X-Tokens")
		var body string
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			body = fmt.Sprintf(`{"choices":[{"message":{"content":%q}}],"usage":{"prompt_tokens":1,"total_tokens":%s}}`, padding, tokens)
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			body = fmt.Sprintf("data: {\"choices\":[{\"delta\":{\"content\":%q}}],\"usage\":null}\n\n", padding) +
				fmt.Sprintf("data: {\"choices\":[],\"usage\":{\"total_tokens\":%s}}\n\ndata: [DONE]\n\n", tokens)
		}
		enc := r.Header.Get("X-Compress")
		if enc == "" {
			io.WriteString(w, body)
			return
		}
		w.Header().Set("Content-Encoding", enc)
		w.Write(compress(t, enc, body))
	}))
	t.Cleanup(s.Close)
	return s
}

// compress encodes body in enc (gzip, zstd, br, deflate, or
// deflate-raw: deflate without its zlib wrapping).
func compress(t testing.TB, enc, body string) []byte {
	var buf bytes.Buffer
	var w io.WriteCloser
	switch enc {
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "zstd":
		w, _ = zstd.NewWriter(&buf)
	case "br":
		w = brotli.NewWriter(&buf)
	case "deflate": // zlib-wrapped, as RFC 9110 has it
		w = zlib.NewWriter(&buf)
	case "deflate-raw": // raw, as some servers send deflate
		w, _ = flate.NewWriter(&buf, flate.DefaultCompression)
	default:
		t.Errorf("no encoder for %q", enc)
		return nil
	}
	io.WriteString(w, body)
	w.Close()
	return buf.Bytes()
}

// tokensSite is a site whose zone of rate tokens reserves cost and
// settles to the usage in the response body; before is what the site
// holds besides rate_limit and reverse_proxy.
func tokensSite(up *httptest.Server, before, rate, cost string) string {
	return globalOptions + `
	localhost:9080 {
		` + before + `
		rate_limit {
			zone tokens {
				key {http.request.header.X-Client}
				rate ` + rate + `
				cost ` + cost + `
				cost_response {http.rate_limit.response.json.usage.total_tokens}
			}
		}
		reverse_proxy ` + strings.TrimPrefix(up.URL, "http://") + `
	}`
}

// TestCostResponseReadsCompressedBodies: the usage in a JSON body and in
// a stream is read whatever Content-Encoding the response carries to the
// client: compressed by `encode` in the site (gzip, zstd), or by the
// upstream itself for a client that accepted it (gzip, zstd, br). 5,000
// tokens reported are charged: remaining 94,000 after the next request
// reserves its 1,000, not the 98,000 of an estimate kept.
func TestCostResponseReadsCompressedBodies(t *testing.T) {
	up := paddedUsageUpstream(t)
	for _, site := range []struct {
		name, before string
		encodings    []string
		byUpstream   bool
	}{
		{"encode", "encode zstd gzip", []string{"gzip", "zstd"}, false},
		{"upstream", "", []string{"gzip", "zstd", "br"}, true},
	} {
		t.Run(site.name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(tokensSite(up, site.before, "100000/h", "1000"), "caddyfile")
			for _, enc := range site.encodings {
				for _, path := range []string{"/json", "/sse"} {
					client := "X-Client: " + site.name + "-" + enc + path
					headers := []string{client, "Accept-Encoding: " + enc, "X-Tokens: 5000"}
					if site.byUpstream {
						headers = append(headers, "X-Compress: "+enc)
					}
					resp, _ := get(t, tester, path, headers...)
					step := fmt.Sprintf("%s %s %s", site.name, enc, path)
					check(t, step, resp, "", want{status: 200, headers: map[string]string{"Content-Encoding": enc}})
					resp, _ = get(t, tester, path, client, "X-Tokens: 1")
					if r := remaining(t, resp); r != 94000 {
						t.Errorf("%s: then r = %d, want 94000 (5,000 read from the compressed body, then 1,000 reserved)", step, r)
					}
				}
			}
		})
	}
}

// negotiatingUpstream answers /json with the usage X-Tokens asks for, in
// the first coding of the request's Accept-Encoding it speaks, as
// Express's compression or aiohttp negotiate: deflate (zlib-wrapped, or
// raw for X-Raw), or x-custom, a coding no client library reads (here
// gzip's bytes under another name); else identity. X-Force answers
// x-custom whatever the request accepts. Each request's Accept-Encoding
// is sent on seen.
func negotiatingUpstream(t *testing.T) (s *httptest.Server, seen chan string) {
	seen = make(chan string, 100)
	s = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ae := r.Header.Get("Accept-Encoding")
		seen <- ae
		w.Header().Set("Content-Type", "application/json")
		body := fmt.Sprintf(`{"choices":[{"message":{"content":%q}}],"usage":{"total_tokens":%s}}`, padding, r.Header.Get("X-Tokens"))
		enc := ""
		for item := range strings.SplitSeq(ae, ",") {
			coding, _, _ := strings.Cut(item, ";")
			if c := strings.TrimSpace(coding); c == "deflate" || c == "x-custom" {
				enc = c
				break
			}
		}
		if r.Header.Get("X-Force") != "" {
			enc = "x-custom"
		}
		switch enc {
		case "":
			io.WriteString(w, body)
		case "deflate":
			w.Header().Set("Content-Encoding", "deflate")
			if r.Header.Get("X-Raw") != "" {
				w.Write(compress(t, "deflate-raw", body))
			} else {
				w.Write(compress(t, "deflate", body))
			}
		case "x-custom":
			w.Header().Set("Content-Encoding", "x-custom")
			w.Write(compress(t, "gzip", body))
		}
	}))
	t.Cleanup(s.Close)
	return s, seen
}

// TestCostResponseReadsDeflate: an upstream that negotiates its coding
// answers a client that accepts deflate in deflate, zlib-wrapped or raw:
// the usage of 5,000 tokens is read from either (remaining 94,000 after
// the next request reserves its 1,000). A client that accepts only a
// coding the body scanner cannot read has the upstream asked for
// identity instead: the usage is read, and the client gets the body
// uncompressed. Before, deflate and x-custom kept the estimate (98,000).
// An upstream that answers x-custom unasked still keeps the estimate:
// no reader for it.
func TestCostResponseReadsDeflate(t *testing.T) {
	up, seen := negotiatingUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(tokensSite(up, "", "100000/h", "1000"), "caddyfile")
	for _, c := range []struct {
		name, accept, extra string
		wantEncoding        string // the client's Content-Encoding
		wantSeen            string // the upstream's Accept-Encoding
		wantRemaining       int64
	}{
		{"zlib", "deflate", "", "deflate", "deflate", 94000},
		{"raw", "deflate", "X-Raw: 1", "deflate", "deflate", 94000},
		{"preferred", "x-custom;q=1, deflate;q=0.5", "", "deflate", "deflate;q=0.5", 94000},
		{"unreadable", "x-custom", "", "", "identity", 94000},
		{"unasked", "gzip", "X-Force: 1", "x-custom", "gzip", 98000},
	} {
		client := "X-Client: deflate-" + c.name
		headers := []string{client, "Accept-Encoding: " + c.accept, "X-Tokens: 5000"}
		if c.extra != "" {
			headers = append(headers, c.extra)
		}
		resp, _ := get(t, tester, "/json", headers...)
		check(t, c.name, resp, "", want{status: 200, headers: map[string]string{"Content-Encoding": c.wantEncoding}})
		if got := <-seen; got != c.wantSeen {
			t.Errorf("%s: the upstream was sent Accept-Encoding %q, want %q", c.name, got, c.wantSeen)
		}
		resp, _ = get(t, tester, "/json", client, "X-Tokens: 1")
		<-seen
		if r := remaining(t, resp); r != c.wantRemaining {
			t.Errorf("%s: then r = %d, want %d", c.name, r, c.wantRemaining)
		}
	}
}

// TestResponseHeadersAsWritten: a `header` directive that hides the
// upstream's X-Usage or X-Failed from clients removes it after the
// settlement took the headers: cost_response settles to the X-Usage of
// 50 the upstream sent, and count_response { header X-Failed } counts the
// failures, while clients see neither header.
func TestResponseHeadersAsWritten(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("X-Usage"); u != "" {
			w.Header().Set("X-Usage", u)
		}
		if r.Header.Get("X-Fail") != "" {
			w.Header().Set("X-Failed", "1")
		}
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		header -X-Usage
		header -X-Failed
		rate_limit {
			zone usage {
				match {
					path /usage
				}
				key {http.request.header.X-Client}
				rate 100/h
				cost 1
				cost_response {http.response.header.X-Usage}
			}
			zone failures {
				match {
					path /login
				}
				key {http.request.header.X-Client}
				rate 3/h
				count_response {
					header X-Failed 1
				}
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
	resp, _ := get(t, tester, "/usage", "X-Client: a", "X-Usage: 50")
	check(t, "usage", resp, "ok", want{status: 200, headers: map[string]string{"X-Usage": ""}})
	resp, _ = get(t, tester, "/usage", "X-Client: a", "X-Usage: 1")
	if r := remaining(t, resp); r != 49 {
		t.Errorf("after an answer of X-Usage 50: r = %d, want 49 (50 charged, then 1 reserved)", r)
	}
	for i := 0; i < 5; i++ {
		resp, _ = get(t, tester, "/login", "X-Client: b")
		check(t, fmt.Sprintf("success %d", i+1), resp, "ok", want{status: 200})
	}
	if got, want := statuses(t, tester, 4, []string{"/login"}, "X-Client: b", "X-Fail: 1"), "200 200 200 429 "; got != want {
		t.Errorf("failures (X-Failed hidden from clients): %q, want %q (3 an hour, successes not counted)", got, want)
	}
}

// TestRequestJSONReadOnlyWhereApplied: with a zone that reads max_tokens
// for POST /v1/chat/completions, a PUT /upload whose body comes in two
// parts reaches the upstream with the first part, before the client
// sends the second; and a request the zone applies to is read only as
// far as its JSON document: it reaches the upstream while the client
// keeps its body open, and its max_tokens is reserved.
func TestRequestJSONReadOnlyWhereApplied(t *testing.T) {
	reached := make(chan string, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached <- r.Method + " " + r.URL.Path
		if r.URL.Path == "/upload" {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "stored")
			return
		}
		var doc map[string]any
		if err := json.NewDecoder(r.Body).Decode(&doc); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"usage":{"total_tokens":10}}`)
	}))
	defer up.Close()
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
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+` {
			flush_interval -1
		}
	}`, "caddyfile")

	// send starts a request whose body is first, then what the test
	// writes to the returned pipe, and returns the pipe and the answer to
	// come.
	send := func(method, path, first string) (*io.PipeWriter, chan *http.Response) {
		pr, pw := io.Pipe()
		req, _ := http.NewRequest(method, base+path, pr)
		req.Header.Set("Authorization", "Bearer k")
		answer := make(chan *http.Response, 1)
		go func() {
			resp, err := tester.Client.Do(req)
			if err != nil {
				t.Errorf("%s %s: %v", method, path, err)
				answer <- nil
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answer <- resp
		}()
		go pw.Write([]byte(first))
		return pw, answer
	}
	// awaitUpstream waits until the upstream has the request, before the
	// client ends its body. The deadline fails a request that never gets
	// there without the body's end; it does not time anything.
	awaitUpstream := func(want, why string) {
		t.Helper()
		select {
		case got := <-reached:
			if got != want {
				t.Fatalf("reached %q, want %s", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatal(why)
		}
	}

	pw, answer := send(http.MethodPut, "/upload", "part one;")
	awaitUpstream("PUT /upload", "PUT /upload, which no zone reading the request's JSON applies to, did not reach the upstream until its body ended")
	pw.Write([]byte("part two"))
	pw.Close()
	if resp := <-answer; resp != nil && resp.StatusCode != 200 {
		t.Errorf("PUT /upload: status %d, want 200", resp.StatusCode)
	}

	pw, answer = send(http.MethodPost, "/v1/chat/completions", `{"model":"m","max_tokens":300}`)
	awaitUpstream("POST /v1/chat/completions", "a request whose body stays open after its JSON document did not reach the upstream: its body was read past the document")
	pw.Close()
	if resp := <-answer; resp != nil {
		check(t, "a body kept open after its document", resp, "", want{status: 200})
		if r := remaining(t, resp); r != 700 {
			t.Errorf("a body kept open after its document: r = %d, want 700 (max_tokens 300 reserved)", r)
		}
	}
}

// TestRemainingNeverNegative: after an answer owes an excess (X-Usage
// 1000 against 100 an hour), every algorithm that settles reports 0
// remaining, not below, in RateLimit's r, X-RateLimit-Remaining,
// {http.rate_limit.remaining} and the admin API, on memory and Redis.
func TestRemainingNeverNegative(t *testing.T) {
	up := usageUpstream(t)
	stores := multiZoneStores(t)
	redis := stores["redis"](t)
	for _, c := range []struct{ store, alg string }{
		{"", "token_bucket"}, {"", "gcra"}, {"", "leaky_bucket"}, {"", "sliding_window"}, {"", "fixed_window"},
		{redis, "token_bucket"}, {redis, "fixed_window"}, {redis, "sliding_window"},
	} {
		alg, name := c.alg, c.alg+"/memory"
		if c.store != "" {
			name = c.alg + "/redis"
		}
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		header >X-Remaining {http.rate_limit.remaining}
		rate_limit {
			zone usage {
				key {http.request.header.X-Client}
				algorithm `+alg+`
				rate 100/h
				cost 10
				cost_response {http.response.header.X-Usage}
			}
			headers ietf x-ratelimit
			`+c.store+`
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
			client := "X-Client: owes-" + strings.ReplaceAll(name, "/", "-")
			resp, _ := get(t, tester, "/", client, "X-Usage: 1000")
			check(t, "the answer that owes", resp, "", want{status: 200})
			for _, step := range []string{"next", "again"} {
				resp, _ = get(t, tester, "/", client)
				check(t, step, resp, "", want{status: 429, headers: map[string]string{
					"X-RateLimit-Remaining": "0",
					"X-Remaining":           "0",
				}})
				if r := remaining(t, resp); r != 0 {
					t.Errorf("%s: RateLimit r = %d, want 0", step, r)
				}
			}
			var st adminapi.KeyState
			if code := adminDo(t, "GET", "/rate_limit/zones/usage/keys/"+strings.TrimPrefix(client, "X-Client: "), &st); code != 200 || st.Remaining != 0 {
				t.Errorf("admin API: %d, remaining %d; want 200, remaining 0", code, st.Remaining)
			}
		})
	}
}

// TestCutOffBodiesKeepTheEstimate: an upstream that aborts mid-write
// leaves a number cut off ("total_tokens":12 of 12345); it is not read,
// in a JSON body, in an SSE line without its line end, and in an SSE
// event without its empty line: the estimate of 100 is kept.
func TestCutOffBodiesKeepTheEstimate(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"usage":{"total_tokens":12`)
		case "/sse-line":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"usage\":{\"total_tokens\":7}}\n\ndata: {\"usage\":{\"total_tokens\":12")
		case "/sse-event":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"usage\":{\"total_tokens\":7}}\n\ndata: {\"usage\":{\"total_tokens\":12}}\n")
		default:
			io.WriteString(w, "ok")
			return
		}
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	defer up.Close()
	tester := caddytest.NewTester(t)
	tester.InitServer(tokensSite(up, "", "1000/h", "100"), "caddyfile")
	for path, want := range map[string]int64{
		"/json":      800, // 100 kept, 100 reserved
		"/sse-line":  893, // the event before: 7
		"/sse-event": 893,
	} {
		client := "X-Client: cut" + path
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header.Set("X-Client", strings.TrimPrefix(client, "X-Client: "))
		if resp, err := tester.Client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		resp, _ := get(t, tester, "/next", client)
		if r := remaining(t, resp); r != want {
			t.Errorf("%s cut off: then r = %d, want %d", path, r, want)
		}
	}
}

// TestJSONReadAsParsersRead: of a key given twice the last counts, and a
// key written with escapes is the key, in the request's JSON (the
// reservation) and in the response's (the settlement).
func TestJSONReadAsParsersRead(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, r.Header.Get("X-Answer"))
	}))
	defer up.Close()
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone tokens {
				key {http.request.header.X-Client}
				rate 100000/h
				cost {http.rate_limit.request.json.max_tokens}
				default_cost 1
				cost_response {http.rate_limit.response.json.usage.total_tokens}
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
	post := func(step, client, body, answer string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/", strings.NewReader(body))
		req.Header.Set("X-Client", client)
		req.Header.Set("X-Answer", answer)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	const noUsage = `{}`
	for _, c := range []struct {
		name, body string
		want       int64
	}{
		{"duplicate", `{"max_tokens":1,"max_tokens":5000}`, 5000},
		{"escaped", `{"max\u005ftokens":5000}`, 5000},
		// Of the keys some parser takes for the path, the largest:
		// JSON.parse keeps the last, Go's encoding/json (Ollama) the last
		// that folds to max_tokens, without regard to case and with
		// Unicode folding (ſ is s, the Kelvin sign is k).
		{"escaped duplicate", `{"max_tokens":5000,"max\u005Ftokens":7}`, 5000},
		{"upper case", `{"max_tokens":1,"MAX_TOKENS":50000}`, 50000},
		{"upper case first", `{"MAX_TOKENS":50000,"max_tokens":1}`, 50000},
		{"Kelvin sign", `{"max_tokens":1,"max_to\u212Aens":50000}`, 50000},
		{"Kelvin sign in UTF-8", "{\"max_tokens\":1,\"max_to\u212Aens\":50000}", 50000},
		{"long s", "{\"max_tokens\":1,\"max_token\u017F\":50000}", 50000},
	} {
		resp := post("request "+c.name, "req-"+c.name, c.body, noUsage)
		if r := remaining(t, resp); r != 100000-c.want {
			t.Errorf("request JSON %s %s: r = %d, want %d (max_tokens %d reserved)", c.name, c.body, r, 100000-c.want, c.want)
		}
	}
	for _, c := range []struct {
		name, answer string
		want         int64
	}{
		{"duplicate", `{"usage":{"total_tokens":1,"total_tokens":4000}}`, 4000},
		{"escaped", `{"usage":{"total\u005ftokens":4000}}`, 4000},
		{"duplicate object", `{"usage":{"total_tokens":1},"usage":{"total_tokens":4000}}`, 4000},
	} {
		post("answer "+c.name, "resp-"+c.name, `{"max_tokens":10}`, c.answer)
		resp := post("after "+c.name, "resp-"+c.name, `{"max_tokens":10}`, noUsage)
		if r := remaining(t, resp); r != 100000-c.want-10 {
			t.Errorf("response JSON %s %s: then r = %d, want %d (%d settled, then 10 reserved)", c.name, c.answer, r, 100000-c.want-10, c.want)
		}
	}
}
