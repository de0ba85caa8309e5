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
// differ, so no client is shared): to Redis, three Caddy instances. Its
// zone takes no quota leases: these tests hold one round trip a decision
// to within 1% of B + r*T from below as well, which leases out when the
// load stops may miss by their bound (leased keys across instances are
// lease_test.go's and lease_kill_test.go's).
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
				lease off
			}
			storage redis {
				%s
				pool_size %d
				timeout `+testTimeout+`
			}
		}
		respond "ok"
	}`, i, storage, 16+i)
	}
	return cfg
}

// load is what hammer saw: the admitted count, the failures, and the
// times that bound when Redis decided (between the first request sent and
// the last answer received; after the first answer and the last request
// sent were in flight, every instant was covered by a pending request).
type load struct {
	admitted, other                          int64
	firstSend, firstRecv, lastSend, lastRecv time.Time
}

// hammer sends requests for key from clients goroutines, spread over the
// three instances, for d.
func hammer(t *testing.T, tester *caddytest.Tester, key string, clients int, d time.Duration) load {
	t.Helper()
	var ok, bad atomic.Int64
	var mu sync.Mutex
	var l load
	var wg sync.WaitGroup
	l.firstSend = time.Now()
	stop := l.firstSend.Add(d)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			url := fmt.Sprintf("http://localhost:908%d/", 1+c%3)
			for {
				sent := time.Now()
				if !sent.Before(stop) {
					return
				}
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Client", key)
				resp, err := tester.Client.Do(req)
				recv := time.Now()
				mu.Lock()
				if l.firstRecv.IsZero() || recv.Before(l.firstRecv) {
					l.firstRecv = recv
				}
				if sent.After(l.lastSend) {
					l.lastSend = sent
				}
				mu.Unlock()
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
	l.lastRecv = time.Now()
	l.admitted, l.other = ok.Load(), bad.Load()
	return l
}

// checkExact asserts the admitted count is never above B + r*T for the
// longest span the decisions can have taken (first send to last answer),
// and within 1% of B + r*T for the shortest span the load surely covered
// (first answer to last send): the measurement's own latency is kept out
// of the 1%.
func checkExact(t *testing.T, l load) {
	t.Helper()
	const burst, rate = 50, 100.0
	upper := burst + rate*l.lastRecv.Sub(l.firstSend).Seconds()
	lower := burst + rate*l.lastSend.Sub(l.firstRecv).Seconds()
	t.Logf("admitted %d; B + r*T between %.1f and %.1f", l.admitted, lower, upper)
	if l.other != 0 {
		t.Errorf("%d requests failed or got a status other than 200/429", l.other)
	}
	if float64(l.admitted) > upper+1 {
		t.Errorf("admitted %d, above B + r*T = %.1f: the instances over-admitted", l.admitted, upper)
	}
	if float64(l.admitted) < 0.99*lower {
		t.Errorf("admitted %d, below 99%% of B + r*T = %.1f", l.admitted, lower)
	}
}

// TestRedisExactAcrossThreeInstances: three Caddy sites on one Redis admit
// B + r*T between them, pipelined or not, deciding by FCALL of the
// function library (the default) or by EVALSHA (functions off).
func TestRedisExactAcrossThreeInstances(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	for _, tc := range []struct{ pipeline, functions string }{{"on", "on"}, {"off", "on"}, {"on", "off"}} {
		name := "pipeline=" + tc.pipeline + "/functions=" + tc.functions
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(threeInstances("addresses "+srv.Addr+"\n\t\t\t\tpipeline "+tc.pipeline+"\n\t\t\t\tfunctions "+tc.functions), "caddyfile")
			if tc.functions == "on" {
				// The library loads in the background after the first
				// decisions, which go as EVALSHA meanwhile: how long that
				// takes depends on the machine's load, so the count starts
				// once every instance has made an FCALL.
				for i := 1; i <= 3; i++ {
					url := fmt.Sprintf("http://localhost:908%d/", i)
					waitFor(t, "an FCALL from instance "+url, func() bool {
						before := redistest.Calls(t, c, "fcall")
						req, _ := http.NewRequest(http.MethodGet, url, nil)
						req.Header.Set("X-Client", "warm-up")
						if resp, err := tester.Client.Do(req); err == nil {
							resp.Body.Close()
						}
						return redistest.Calls(t, c, "fcall") > before
					})
				}
			}
			fcalls, evalshas := redistest.Calls(t, c, "fcall"), redistest.Calls(t, c, "evalsha")
			l := hammer(t, tester, "one-key-"+tc.pipeline+"-"+tc.functions, 48, 3*time.Second)
			checkExact(t, l)
			fcalls, evalshas = redistest.Calls(t, c, "fcall")-fcalls, redistest.Calls(t, c, "evalsha")-evalshas
			t.Logf("%d FCALLs, %d EVALSHAs", fcalls, evalshas)
			if tc.functions == "off" && fcalls != 0 {
				t.Errorf("%d FCALLs with functions off", fcalls)
			}
			if tc.functions == "on" && fcalls < 9*(fcalls+evalshas)/10 {
				t.Errorf("%d FCALLs and %d EVALSHAs with functions on: want nearly all FCALLs", fcalls, evalshas)
			}
		})
	}
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
		checkExact(t, hammer(t, tester, key, 24, 2*time.Second))
	}
}

// TestRedisClusterBehindOneAddress: a Cluster given by one of its nodes
// with cluster (as a managed Cluster's configuration endpoint), in the
// Caddyfile and as a URL: the keys on other nodes are found (no MOVED
// errors) and decided exactly. Without the flag one address is a
// standalone Redis, which a Cluster answers with MOVED: store errors.
func TestRedisClusterBehindOneAddress(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	for _, storage := range []string{
		"addresses " + cluster.Addrs[0] + "\n\t\t\t\tcluster",
		"url redis+cluster://" + cluster.Addrs[1] + "/0",
	} {
		tester := caddytest.NewTester(t)
		tester.InitServer(threeInstances(storage), "caddyfile")
		for _, key := range []string{"alpha", "bravo", "charlie"} {
			checkExact(t, hammer(t, tester, key+"-"+storage[:3], 12, time.Second))
		}
	}
}
