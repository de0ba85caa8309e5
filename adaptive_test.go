package tollgate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// adaptiveSite is a site whose /dl requests are held by up until
// released, behind a zone of concurrency adaptive alone whose limit is
// pinned to 1 (min = max): the second request in flight is shed.
func adaptiveSite(up, settings, also string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone cap {
				key {http.request.header.X-Client}
				concurrency adaptive {
					min 1
					max 1
					` + settings + `
				}
				` + also + `
			}
		}
		reverse_proxy ` + strings.TrimPrefix(up, "http://") + `
	}`
}

// adaptiveKey reads a key's controller from the admin API.
func adaptiveKey(t *testing.T, zone, key string) *adminapi.AdaptiveState {
	t.Helper()
	var st adminapi.KeyState
	if code := adminDo(t, "GET", "/rate_limit/zones/"+zone+"/keys/"+key, &st); code != 200 {
		return nil
	}
	return st.Adaptive
}

// TestAdaptiveShedsThroughCaddy: a request above the limit is shed with
// 503 and Retry-After, another key has its own limit, and the place comes
// back when the request in flight ends, however it ends.
func TestAdaptiveShedsThroughCaddy(t *testing.T) {
	up := newUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(adaptiveSite(up.URL, "", ""), "caddyfile")
	ctx := context.Background()

	status, done := startRequest(t, ctx, tester.Client, base+"/dl", "a")
	if status != 200 {
		t.Fatalf("first: status %d, want 200", status)
	}
	resp, _ := get(t, tester, "/fast", "X-Client: a")
	check(t, "second, shed", resp, "", want{503, map[string]string{"Retry-After": "1", "RateLimit": ""}, ""})
	if st := adaptiveKey(t, "cap", "a"); st == nil || st.InFlight != 1 || st.Limit != 1 {
		t.Errorf("key a: %+v, want 1 in flight of 1", st)
	}
	// The command line shows them.
	addr := "--address=" + testAdmin
	out, err := runCLI(t, addr, "zones")
	if rows := tableRows(t, out); err != nil || len(rows) != 2 || strings.Join(rows[1], "|") != "cap|-|-|-|memory|1|concurrency adaptive 1-1: limit 1, 1 in flight, 1 shed" {
		t.Errorf("rate-limit zones: %v, printed:\n%s", err, out)
	}
	out, err = runCLI(t, addr, "show", "cap", "a")
	if kt := keyTable(t, out); err != nil || kt["adaptive limit"] != "1 (1 in flight)" || kt["round trips"] != "none learnt yet" || kt["allowed"] != "no, next in 1ms" {
		t.Errorf("rate-limit show: %v, printed:\n%s", err, out)
	}
	status, done2 := startRequest(t, ctx, tester.Client, base+"/dl", "b")
	if status != 200 {
		t.Fatalf("another key: status %d, want 200", status)
	}
	up.release <- struct{}{}
	up.release <- struct{}{}
	<-done
	<-done2
	waitFor(t, "a's place back", func() bool { st := adaptiveKey(t, "cap", "a"); return st != nil && st.InFlight == 0 })

	// A client that leaves mid-request gives its place back.
	cctx, cancel := context.WithCancel(ctx)
	if status, _ := startRequest(t, cctx, tester.Client, base+"/dl", "a"); status != 200 {
		t.Fatalf("after: status %d, want 200", status)
	}
	cancel()
	waitFor(t, "a's place back after the client left", func() bool { st := adaptiveKey(t, "cap", "a"); return st != nil && st.InFlight == 0 })
	var zones []adminapi.ZoneInfo
	adminDo(t, "GET", "/rate_limit/zones", &zones)
	if len(zones) != 1 || zones[0].Adaptive == nil || zones[0].Adaptive.Shed != 1 || zones[0].Adaptive.Max != 1 || zones[0].Algorithm != "" {
		t.Errorf("zones: %+v, want the adaptive zone with 1 shed", zones)
	}
}

// TestAdaptiveStatusAndDryRun: status changes a shed request's status,
// and a dry run lets it through.
func TestAdaptiveStatusAndDryRun(t *testing.T) {
	for _, tc := range []struct {
		name, settings, also string
		status               int
	}{
		{"status", "status 429", "", 429},
		{"dry run", "", "dry_run", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(adaptiveSite(up.URL, tc.settings, tc.also), "caddyfile")
			done := hold(t, tester, "a")
			resp, _ := get(t, tester, "/sleep", "X-Client: a")
			check(t, "second", resp, "", want{tc.status, nil, ""})
			up.release <- struct{}{}
			<-done
		})
	}
}

// TestAdaptiveAdapts: the Caddyfile's concurrency adaptive, with and
// without its block, is the JSON's concurrency_adaptive, every setting in
// its field.
func TestAdaptiveAdapts(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"concurrency adaptive", `{}`},
		{"rate 5/s\n\t\tconcurrency adaptive {\n\t\t\tmin 2\n\t\t\tmax 50\n\t\t\tinitial 10\n\t\t\twindow 500ms\n\t\t\tmin_samples 10\n\t\t\tpercentile 0.95\n\t\t\ttolerance 1.5\n\t\t\tsmoothing 0.3\n\t\t\tepoch 20\n\t\t\tmax_keys 100\n\t\t\tstatus 429\n\t\t}",
			`{"epoch":20,"initial":10,"max":50,"max_keys":100,"min":2,"min_samples":10,"percentile":0.95,"smoothing":0.3,"status":429,"tolerance":1.5,"window":500000000}`},
	} {
		site := ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t" + tc.body + "\n\t\t}\n\t}\n\trespond ok\n}\n"
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), nil)
		if err != nil {
			t.Fatalf("adapt %q: %v", tc.body, err)
		}
		var c any
		if err := json.Unmarshal(cfg, &c); err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(findKey(c, "concurrency_adaptive"))
		if string(got) != tc.want {
			t.Errorf("adapt %q: concurrency_adaptive %s, want %s", tc.body, got, tc.want)
		}
		if err := validateJSON(cfg); err != nil {
			t.Errorf("validate %q: %v", tc.body, err)
		}
	}
}

// findKey returns the value of the first key named key in a decoded JSON
// value, or nil.
func findKey(v any, key string) any {
	switch v := v.(type) {
	case map[string]any:
		if x, ok := v[key]; ok {
			return x
		}
		for _, x := range v {
			if f := findKey(x, key); f != nil {
				return f
			}
		}
	case []any:
		for _, x := range v {
			if f := findKey(x, key); f != nil {
				return f
			}
		}
	}
	return nil
}

// adaptiveRateSite: zone both with a rate and concurrency adaptive pinned
// to one in flight, on storage, in front of up.
func adaptiveRateSite(up, storage, global string) string {
	return withGlobal(global) + `
	localhost:9080 {
		rate_limit {
			zone both {
				key {http.request.header.X-Client}
				rate 3/h
				concurrency adaptive {
					min 1
					max 1
				}
			}
			` + storage + `
		}
		reverse_proxy ` + strings.TrimPrefix(up, "http://") + `
	}`
}

// TestAdaptiveBesideARate: a request the adaptive part sheds charges the
// rate nothing (it is decided first, and the store is not asked), and a
// request the rate rejects gives its adaptive place back; on memory and
// Redis. The adaptive state survives a reload, with its request in flight.
func TestAdaptiveBesideARate(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			store := storage(t)
			tester.InitServer(adaptiveRateSite(up.URL, store, ""), "caddyfile")
			key := "both-" + name
			done := hold(t, tester, key)
			resp, _ := get(t, tester, "/sleep", "X-Client: "+key)
			check(t, "shed", resp, "", want{503, map[string]string{"Retry-After": "1"}, ""})
			var st adminapi.KeyState
			adminDo(t, "GET", "/rate_limit/zones/both/keys/"+key, &st)
			if st.Remaining != 2 || st.Adaptive == nil || st.Adaptive.InFlight != 1 {
				t.Errorf("after the shed: remaining %d, adaptive %+v; want 2 (the shed request charged nothing) and 1 in flight", st.Remaining, st.Adaptive)
			}

			// A reload keeps what the controller holds.
			reload(t, adaptiveRateSite(up.URL, store, ""))
			if a := adaptiveKey(t, "both", key); a == nil || a.InFlight != 1 {
				t.Errorf("after a reload: %+v, want the request still in flight", a)
			}
			up.release <- struct{}{}
			<-done
			waitFor(t, "the place back", func() bool { a := adaptiveKey(t, "both", key); return a != nil && a.InFlight == 0 })

			for i := 0; i < 2; i++ {
				resp, _ = get(t, tester, "/sleep", "X-Client: "+key)
				check(t, "within the rate", resp, "", want{200, nil, ""})
			}
			resp, _ = get(t, tester, "/sleep", "X-Client: "+key)
			check(t, "over the rate", resp, "", want{429, nil, ""})
			if a := adaptiveKey(t, "both", key); a == nil || a.InFlight != 0 {
				t.Errorf("after the rate rejected: %+v, want nothing in flight", a)
			}
		})
	}
}

// TestAdaptiveLearnsWhatTheUpstreamSaid: the round trip lasts until the
// response's status is written (a body streamed for a second more is not
// the upstream's queue); a 5xx is a drop, which cuts the limit; a client
// gone before an answer teaches nothing. The site compresses its answers
// (encode, outside the zone in Caddy's order), as sites do. Time is the
// tests' fake clock.
func TestAdaptiveLearnsWhatTheUpstreamSaid(t *testing.T) {
	up := newUpstream(t)
	fail := newFixedStatus(t, 502)
	silent := newSilent(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone learn {
				key {http.request.header.X-Client}
				concurrency adaptive {
					window 1ms
					min_samples 1
					initial 20
				}
			}
		}
		encode gzip
		@fail path /fail
		reverse_proxy @fail `+strings.TrimPrefix(fail.URL, "http://")+`
		@silent path /silent
		reverse_proxy @silent `+strings.TrimPrefix(silent.URL, "http://")+`
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")

	// A streamed answer: its status at once, its body a second later.
	done := hold(t, tester, "stream")
	advance(time.Second)
	up.release <- struct{}{}
	<-done
	waitFor(t, "the stream's end", func() bool { a := adaptiveKey(t, "learn", "stream"); return a != nil && a.Windows == 1 })
	if a := adaptiveKey(t, "learn", "stream"); a.Recent > 0.01 {
		t.Errorf("a streamed answer's round trip %gs: the body's second counted as the upstream's", a.Recent)
	}

	// Drops: a window of 5xx cuts the limit by a tenth.
	for i := 0; i < 3; i++ {
		advance(2 * time.Millisecond)
		resp, _ := get(t, tester, "/fail", "X-Client: drops")
		check(t, "a 502", resp, "", want{502, nil, ""})
	}
	if a := adaptiveKey(t, "learn", "drops"); a == nil || a.Limit >= 20 || a.Windows == 0 {
		t.Errorf("after windows of 502s: %+v, want the limit cut below its initial 20", a)
	}

	// A client gone before the answer: nothing learnt. The upstream
	// holds the request without a word until the client leaves.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/silent", nil)
	req.Header.Set("X-Client", "gone")
	go func() { // the client leaves once the upstream holds its request
		for deadline := time.Now().Add(10 * time.Second); silent.held.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		advance(time.Second)
		cancel()
	}()
	if resp, err := tester.Client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the client that left got an answer: %d", resp.StatusCode)
	}
	waitFor(t, "the place back", func() bool { a := adaptiveKey(t, "learn", "gone"); return a != nil && a.InFlight == 0 })
	if a := adaptiveKey(t, "learn", "gone"); a.Windows != 0 {
		t.Errorf("a client gone before the answer taught: %+v", a)
	}
}

// newFixedStatus is an upstream that answers every request with status.
func newFixedStatus(t *testing.T, status int) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
	t.Cleanup(s.Close)
	return s
}

// silent is an upstream that answers nothing until its client leaves,
// counting the requests it holds.
type silent struct {
	*httptest.Server
	held atomic.Int64
}

func newSilent(t *testing.T) *silent {
	s := &silent{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.held.Add(1)
		defer s.held.Add(-1)
		select {
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// TestAdaptiveMetrics: the adaptive series through Caddy's metrics.
func TestAdaptiveMetrics(t *testing.T) {
	up := newUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(withGlobal("metrics")+`
	localhost:9080 {
		rate_limit {
			zone m_adaptive {
				key {http.request.header.X-Client}
				concurrency adaptive {
					min 1
					max 1
				}
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
	done := hold(t, tester, "m")
	resp, _ := get(t, tester, "/sleep", "X-Client: m")
	check(t, "shed", resp, "", want{503, nil, ""})
	checkSeries(t, "one in flight, one shed", scrape(t), map[string]float64{
		`caddy_http_rate_limit_adaptive_limit{zone="m_adaptive"}`:      1,
		`caddy_http_rate_limit_adaptive_in_flight{zone="m_adaptive"}`:  1,
		`caddy_http_rate_limit_adaptive_shed_total{zone="m_adaptive"}`: 1,
		requests("m_adaptive", "allowed"):                              1,
		requests("m_adaptive", "rejected"):                             1,
	})
	up.release <- struct{}{}
	<-done
}

// TestAdaptiveWhenRedisIsDown: a zone with a rate on Redis and
// concurrency adaptive, Redis stopped. Each on_storage_error decides the
// rate as it says; the adaptive limit, in memory, goes on holding and
// shedding, and a request refused for the store (deny) holds no place.
func TestAdaptiveWhenRedisIsDown(t *testing.T) {
	for _, mode := range []string{"deny", "allow", "local"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone down {
				key {http.request.header.X-Client}
				rate 100/h
				on_storage_error `+mode+`
				concurrency adaptive {
					min 1
					max 1
				}
			}
			storage redis {
				addresses `+srv.Addr+`
				timeout `+testTimeout+`
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
			key := "down-" + mode
			resp, _ := get(t, tester, "/sleep", "X-Client: "+key)
			check(t, "Redis up", resp, "", want{200, nil, ""})
			srv.Stop()

			if mode == "deny" {
				resp, _ := get(t, tester, "/sleep", "X-Client: "+key)
				check(t, "Redis down, deny", resp, "", want{503, nil, ""})
				if n := adaptiveInFlight(t, "down"); n != 0 {
					t.Errorf("after a request refused for the store: %d in flight, want none", n)
				}
				return
			}
			done := hold(t, tester, key)
			resp, _ = get(t, tester, "/sleep", "X-Client: "+key)
			check(t, "Redis down, over the adaptive limit", resp, "", want{503, map[string]string{"Retry-After": "1"}, ""})
			up.release <- struct{}{}
			<-done
			waitFor(t, "the place back", func() bool { return adaptiveInFlight(t, "down") == 0 })
		})
	}
}

// adaptiveInFlight reads a zone's requests in flight in its adaptive
// limit from GET /rate_limit/zones, which asks no store (a key's state
// asks the rate's, which a stopped Redis cannot answer).
func adaptiveInFlight(t *testing.T, zone string) int64 {
	t.Helper()
	var zones []adminapi.ZoneInfo
	adminDo(t, "GET", "/rate_limit/zones", &zones)
	for _, z := range zones {
		if z.Zone == zone && z.Adaptive != nil {
			return z.Adaptive.InFlight
		}
	}
	t.Fatalf("zones: no adaptive zone %q in %+v", zone, zones)
	return -1
}

// TestAdaptiveAndAnUnlimitedTier: a request of an unlimited tier is not in
// the zone at all, its adaptive limit included; another tier's is.
func TestAdaptiveAndAnUnlimitedTier(t *testing.T) {
	up := newUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone tiered {
				key upstream
				rate 100/h
				tier {http.request.header.X-Plan} {
					staff unlimited
					gold 1000/h
				}
				concurrency adaptive {
					min 1
					max 1
				}
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
	done := hold(t, tester, "any")
	resp, _ := get(t, tester, "/sleep", "X-Plan: staff")
	check(t, "staff, unlimited", resp, "", want{200, nil, ""})
	resp, _ = get(t, tester, "/sleep", "X-Plan: gold")
	check(t, "gold, over the adaptive limit", resp, "", want{503, nil, ""})
	up.release <- struct{}{}
	<-done
}

// TestAdaptiveRoundTripAfterAShapingDelay: a request a shaping zone holds
// back before it goes on is timed from when it went, not from its
// admission: the delay is not the upstream's queue.
func TestAdaptiveRoundTripAfterAShapingDelay(t *testing.T) {
	followRealTime(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone shaper {
				key shaped
				algorithm leaky_bucket
				events 2
				window 1s
				max_delay 2s
			}
			zone learn {
				key shaped
				concurrency adaptive {
					window 1us
					min_samples 1
				}
			}
		}
		respond "ok"
	}`, "caddyfile")
	for i := 0; i < 4; i++ { // the last ones wait for the bucket
		resp, _ := get(t, tester, "/")
		check(t, "shaped", resp, "", want{200, nil, ""})
	}
	a := adaptiveKey(t, "learn", "shaped")
	if a == nil || a.Windows == 0 || a.Recent > 0.1 {
		t.Errorf("after delayed requests: %+v, want a round trip well under the 500 ms delays", a)
	}
}

// hold starts a request of key that the upstream (newUpstream) holds until
// released, and fails the test unless it was admitted; done closes when
// it has ended.
func hold(t *testing.T, tester *caddytest.Tester, key string) <-chan struct{} {
	t.Helper()
	status, done := startRequest(t, context.Background(), tester.Client, base+"/dl", key)
	if status != 200 {
		t.Fatalf("a held request of %s: status %d, want 200", key, status)
	}
	return done
}
