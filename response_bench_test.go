package tollgate

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// statusNext answers with status and the X-Usage header usage.
func statusNext(status int, usage string) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		if usage != "" {
			w.Header().Set("X-Usage", usage)
		}
		w.WriteHeader(status)
		return nil
	})
}

// BenchmarkServeHTTPResponse is BenchmarkServeHTTP's allowed path for the
// response options on the memory store: a plain zone (the baseline), a
// count_response zone whose response matches (nothing to settle) and one
// whose response does not (a give-back), and a cost_response zone
// settled from a header to more than its estimate, by the header alone
// and by an expression that reads it twice.
func BenchmarkServeHTTPResponse(b *testing.B) {
	matcher := &caddyhttp.ResponseMatcher{StatusCode: []int{401}}
	cases := []struct {
		name string
		zone Zone
		next caddyhttp.Handler
	}{
		{"plain", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}, statusNext(200, "")},
		{"count_response/matching", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), CountResponse: matcher}, statusNext(401, "")},
		{"count_response/give-back", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), CountResponse: matcher}, statusNext(200, "")},
		{"cost_response/header", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), CostResponse: "{http.response.header.X-Usage}"}, statusNext(200, "3")},
		{"cost_response/expression", Zone{Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9), CostResponse: "({http.response.header.X-Usage} - 1) * 3 + {http.response.header.X-Usage} * 15 / 1000"}, statusNext(200, "3")},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			z := c.zone
			h := &Handler{RateLimits: map[string]*Zone{"bench": &z}}
			provisionBench(b, h)
			reqs := benchRequests(100)
			w := &nopWriter{h: make(http.Header)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				clear(w.h)
				if err := h.ServeHTTP(w, reqs[i%len(reqs)], c.next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// streamSize is the body of BenchmarkStreamScan: 10 MB of events.
const streamSize = 10 << 20

// sseStream writes streamSize bytes of OpenAI-style chunks, flushed every
// 16, and a last chunk with the usage; gzip-compressed (as `encode gzip`
// sends it, flushed with each flush) for a request that asks with
// X-Gzip.
func sseStream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	var out io.Writer = w
	flush := w.(http.Flusher).Flush
	if r.Header.Get("X-Gzip") != "" {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out, flush = gz, func() { gz.Flush(); w.(http.Flusher).Flush() }
	}
	chunk := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 900) + "\"}}],\"usage\":null}\n\n")
	for n, i := 0, 0; n < streamSize; n, i = n+len(chunk), i+1 {
		out.Write(chunk)
		if i%16 == 0 {
			flush()
		}
	}
	io.WriteString(out, "data: {\"choices\":[],\"usage\":{\"total_tokens\":12345}}\n\ndata: [DONE]\n\n")
}

// BenchmarkStreamScan streams a 10 MB event stream from an upstream
// through the handler and a reverse proxy to a client, over loopback TCP:
// scan=off through a zone without cost_response, scan=on through one
// settling from the stream's usage, and scan=on,enc=gzip the same stream
// gzip-compressed (MB/s of the stream before compression). The throughput
// of the first two (MB/s) is the body scanner's cost; B/op shows what a
// request holds.
func BenchmarkStreamScan(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(sseStream))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		proxy.ServeHTTP(w, r)
		return nil
	})
	for _, c := range []struct {
		name       string
		scan, gzip bool
	}{{"scan=off", false, false}, {"scan=on", true, false}, {"scan=on,enc=gzip", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			z := Zone{Key: "static", Algorithm: "token_bucket", Events: 1 << 30, Window: caddy.Duration(3600e9)}
			if c.scan {
				z.CostResponse = "{http.rate_limit.response.json.usage.total_tokens}"
			}
			h := &Handler{RateLimits: map[string]*Zone{"bench": &z}, Headers: []string{"none"}}
			provisionBench(b, h)
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				repl := caddy.NewReplacer()
				r = caddyhttp.PrepareRequest(r, repl, w, nil)
				if err := h.ServeHTTP(w, r, next); err != nil {
					http.Error(w, err.Error(), 500)
				}
			}))
			defer front.Close()
			client := front.Client()
			b.SetBytes(streamSize)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodGet, front.URL, nil)
				least := int64(streamSize)
				if c.gzip {
					// Asked for by name: the client does not decompress.
					req.Header.Set("Accept-Encoding", "gzip")
					req.Header.Set("X-Gzip", "1")
					least = 1
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || n < least {
					b.Fatalf("status %d, %d bytes", resp.StatusCode, n)
				}
			}
		})
	}
}
