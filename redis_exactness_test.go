package tollgate

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// threeInstances is one Caddy config with three servers on 9081-9083, each
// its own rate_limit handler with its own Redis client (the pool sizes
// differ, so no client is shared): to Redis, three Caddy instances.
func threeInstances(storage string) string {
	cfg := globalOptions
	for i := 1; i <= 3; i++ {
		cfg += fmt.Sprintf(`
	http://localhost:908%d {
		rate_limit {
			zone exact {
				key {http.request.header.X-Client}
				rate 100/s
				burst 50
			}
			storage redis {
				%s
				pool_size %d
				timeout 1s
			}
		}
		respond "ok"
	}`, i, storage, 16+i)
	}
	return cfg
}

// hammer sends requests for key from clients goroutines, spread over the
// three instances, for d, and returns how many were admitted and the span
// from the first request sent to the last answer.
func hammer(t *testing.T, tester *caddytest.Tester, key string, clients int, d time.Duration) (admitted, other int64, span time.Duration) {
	t.Helper()
	var ok, bad atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			url := fmt.Sprintf("http://localhost:908%d/", 1+c%3)
			for time.Now().Before(stop) {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Client", key)
				resp, err := tester.Client.Do(req)
				if err != nil {
					bad.Add(1)
					continue
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
				case 429:
				default:
					bad.Add(1)
				}
			}
		}(c)
	}
	wg.Wait()
	return ok.Load(), bad.Load(), time.Since(start)
}

// checkExact asserts admitted is at most B + r*T and within 1% of it.
func checkExact(t *testing.T, admitted, other int64, span time.Duration) {
	t.Helper()
	const burst, rate = 50, 100.0
	bound := burst + rate*span.Seconds()
	t.Logf("admitted %d in %s; B + r*T = %.1f", admitted, span, bound)
	if other != 0 {
		t.Errorf("%d requests failed or got a status other than 200/429", other)
	}
	if float64(admitted) > bound+1 {
		t.Errorf("admitted %d, above B + r*T = %.1f: the instances over-admitted", admitted, bound)
	}
	if float64(admitted) < 0.99*bound {
		t.Errorf("admitted %d, below 99%% of B + r*T = %.1f", admitted, bound)
	}
}

func TestRedisExactAcrossThreeInstances(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(threeInstances("addresses "+srv.Addr), "caddyfile")
	admitted, other, span := hammer(t, tester, "one-key", 48, 3*time.Second)
	checkExact(t, admitted, other, span)
}

func TestRedisClusterThroughCaddy(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	addrs := ""
	for _, a := range cluster.Addrs {
		addrs += " " + a
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(threeInstances("addresses"+addrs), "caddyfile")
	// Several keys, which land on different masters, each exact.
	for _, key := range []string{"alpha", "bravo", "charlie"} {
		admitted, other, span := hammer(t, tester, key, 24, time.Second)
		checkExact(t, admitted, other, span)
	}
}
