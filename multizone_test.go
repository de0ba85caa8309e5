package tollgate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// multiZoneStores runs a test on the memory store and on Redis: the
// Caddyfile storage line for each.
func multiZoneStores(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"memory": func(*testing.T) string { return "" },
		"redis": func(t *testing.T) string {
			srv := redistest.Start(t)
			return "storage redis {\n\t\t\t\taddresses " + srv.Addr + "\n\t\t\t\ttimeout " + testTimeout + "\n\t\t\t}"
		},
	}
}

// TestRetryAfterWaitsForEveryZone: zones a (1/s) and b (1/min) on one key.
// The second request is rejected by a, and also by b: Retry-After is the
// time until both would admit it (60), not a's (1), and the rejecting
// zone's t in RateLimit is the same; every applied zone is listed. When
// one zone can never admit the request, there is no Retry-After at all.
func TestRetryAfterWaitsForEveryZone(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone a {
				key {http.request.header.X-Client}
				rate 1/s
			}
			zone b {
				key {http.request.header.X-Client}
				rate 1/m
			}
			zone c {
				match {
					path /weighted
				}
				key {http.request.header.X-Client}
				rate 5/h
				cost {http.request.header.X-Cost}
			}
			`+storage(t)+`
		}
		respond "ok"
	}`, "caddyfile")

			resp, _ := get(t, tester, "/", "X-Client: "+name)
			check(t, "first", resp, "", want{200, map[string]string{
				"RateLimit": `"a";r=0;t=1, "b";r=0;t=60`,
			}, ""})
			resp, _ = get(t, tester, "/", "X-Client: "+name)
			check(t, "second", resp, "", want{429, map[string]string{
				"Retry-After":      "60",
				"RateLimit-Policy": `"a";q=1;w=1, "b";q=1;w=60`,
				"RateLimit":        `"a";r=0;t=60, "b";r=0;t=60`,
			}, ""})

			// c can never admit a cost of 10 (capacity 5): a and b would,
			// in time, but the request can never pass.
			resp, _ = get(t, tester, "/weighted", "X-Client: "+name, "X-Cost: 10")
			check(t, "never", resp, "", want{429, map[string]string{"Retry-After": ""}, ""})
		})
	}
}

// TestRejectedRequestNeverHoldsQuota: zone wide (2/h) applies to every
// request, zone narrow (1/h) to /narrow only, on the memory store. For each
// of many clients: one /narrow request spends narrow and leaves wide one
// event; then, while two goroutines flood that client's /narrow (each
// rejected by narrow), one request to /wide must pass. A handler that
// charged wide first and gave it back after narrow rejected would turn it
// away whenever it came while wide's last event was held. (Redis decides
// in one script; this is the memory store's one step.) Driven in process,
// so that the requests are fast enough to meet in that moment.
func TestRejectedRequestNeverHoldsQuota(t *testing.T) {
	h := &Handler{
		RateLimits: map[string]*Zone{
			"wide":   {Key: "{http.request.header.X-Client}", Events: 2, Window: caddy.Duration(time.Hour)},
			"narrow": {Key: "{http.request.header.X-Client}", Events: 1, Window: caddy.Duration(time.Hour), MatcherSetsRaw: caddyhttp.RawMatcherSets{{"path": json.RawMessage(`["/narrow"]`)}}},
		},
		ZoneOrder: []string{"wide", "narrow"},
	}
	provisionBench(t, h)
	serve := func(path, client string) int {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("X-Client", client)
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), nil, nil)
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, nextOK); err != nil {
			var he caddyhttp.HandlerError
			if errors.As(err, &he) {
				return he.StatusCode
			}
			return 500
		}
		return w.Code
	}
	const rounds = 2000
	turnedAway := 0
	for round := 0; round < rounds; round++ {
		client := strconv.Itoa(round)
		if st := serve("/narrow", client); st != 200 {
			t.Fatalf("round %d: first /narrow: status %d, want 200", round, st)
		}
		var stop atomic.Bool
		var flood sync.WaitGroup
		var floodBad atomic.Int64
		for g := 0; g < 2; g++ {
			flood.Add(1)
			go func() {
				defer flood.Done()
				for i := 0; i < 20 && !stop.Load(); i++ {
					if st := serve("/narrow", client); st != 429 {
						floodBad.Add(1)
					}
				}
			}()
		}
		runtime.Gosched()
		if serve("/wide", client) != 200 {
			turnedAway++
		}
		stop.Store(true)
		flood.Wait()
		if n := floodBad.Load(); n != 0 {
			t.Fatalf("round %d: %d /narrow requests were not rejected", round, n)
		}
		if st := serve("/wide", client); st != 429 {
			t.Fatalf("round %d: wide after its 2 events: status %d, want 429", round, st)
		}
	}
	if turnedAway > 0 {
		t.Errorf("%d of %d requests to /wide were turned away while rejected /narrow requests held wide's last event", turnedAway, rounds)
	}
}

// TestMetricsOneStoreDecisionPerRequest: a request that applies two zones
// is one store decision (one latency observation), and each zone counts
// its own result.
func TestMetricsOneStoreDecisionPerRequest(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(withGlobal("metrics")+`
	localhost:9080 {
		rate_limit {
			zone m_one {
				key {http.request.header.X-Client}
				rate 3/h
			}
			zone m_two {
				key {http.request.header.X-Client}
				rate 2/h
			}
		}
		respond "ok"
	}`, "caddyfile")
	latency := `caddy_http_rate_limit_storage_seconds_count{backend="memory"}`
	before := scrape(t)
	for i, status := range []int{200, 200, 429, 429} {
		resp, _ := get(t, tester, "/", "X-Client: m")
		check(t, fmt.Sprintf("step %d", i), resp, "", want{status: status})
	}
	after := scrape(t)
	if got := after[latency] - before[latency]; got != 4 {
		t.Errorf("%s grew by %v for 4 requests of two zones, want 4", latency, got)
	}
	checkSeries(t, "after 4 requests", after, map[string]float64{
		requests("m_one", "allowed"):  4, // m_one admits all four; m_two rejects the last two
		requests("m_one", "rejected"): 0,
		requests("m_two", "allowed"):  2,
		requests("m_two", "rejected"): 2,
	})
}
