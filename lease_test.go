package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// leasedInstances is threeInstances with a zone of its own: three sites
// on 9081-9083, each its own handler and Redis client, to Redis three
// instances, with a timeout long enough that no request is decided
// without Redis (on_storage_error) on a loaded machine. Functions are off, so that each script Redis runs (an
// EVALSHA) is one decision: the batch function would run several.
func leasedInstances(addr, zone string) string {
	cfg := withGlobal("metrics")
	for i := 1; i <= 3; i++ {
		cfg += fmt.Sprintf(`
	http://localhost:908%d {
		rate_limit {
			zone leased {
				key {http.request.header.X-Client}
				%s
			}
			storage redis {
				addresses %s
				functions off
				pool_size %d
				timeout `+testTimeout+`
			}
		}
		respond "ok"
	}`, i, zone, addr, 16+i)
	}
	return cfg
}

// untilRefused sends requests for key from clients goroutines spread
// over the three instances, each until it is refused refused times in a
// row, and returns the count admitted.
func untilRefused(t *testing.T, tester *caddytest.Tester, key string, clients, refused int) int64 {
	t.Helper()
	var ok, bad atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := fmt.Sprintf("http://localhost:908%d/", 1+c%3)
			for inRow := 0; inRow < refused; {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Client", key)
				resp, err := tester.Client.Do(req)
				if err != nil {
					bad.Add(1)
					return
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
					inRow = 0
				case 429:
					inRow++
				default:
					bad.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Errorf("%d requests failed or got a status other than 200/429", n)
	}
	return ok.Load()
}

// windowCount is the count a fixed_window key holds on Redis, in events.
func windowCount(t *testing.T, c goredis.UniversalClient, rkey string) int64 {
	t.Helper()
	v, err := c.HGet(context.Background(), rkey, "level").Int64()
	if err != nil && err != goredis.Nil {
		t.Fatal(err)
	}
	return v / algorithms.Milli
}

// TestLeasesThroughCaddy: three Caddy instances on one Redis hammer one
// fixed_window key (leases on by default): the count on Redis, which
// holds what was admitted and what the instances lease, never passes N;
// once the load stops, what the instances hold comes back (the count
// falls to what was admitted), and rounds of load until one admits
// nothing admit N in all.
func TestLeasesThroughCaddy(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	calls := func(t *testing.T) int64 { return redistest.Calls(t, c, "fcall", "evalsha") }
	for _, lease := range []string{"on", "off"} {
		t.Run("lease="+lease, func(t *testing.T) { leasesThroughCaddy(t, c, srv.Addr, lease, calls) })
	}
}

// TestLeasesThroughCaddyOnCluster is TestLeasesThroughCaddy's leased run
// on a Redis Cluster of three masters (the lease call's two keys, the
// key and its reset mark, share the key's slot): never over, the leases
// back once the load stops, most decisions made from leases.
func TestLeasesThroughCaddyOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	var nodes []*goredis.Client
	for _, s := range cluster.Servers {
		nodes = append(nodes, s.Client())
	}
	calls := func(t *testing.T) (n int64) {
		for _, c := range nodes {
			n += redistest.Calls(t, c, "fcall", "evalsha")
		}
		return n
	}
	leasesThroughCaddy(t, cluster.Client(), strings.Join(cluster.Addrs, " "), "on", calls)
}

// leasesThroughCaddy runs TestLeasesThroughCaddy on the Redis at addr
// (addresses, as the Caddyfile takes them), whose client is c, and whose
// scripts run calls counts.
func leasesThroughCaddy(t *testing.T, c goredis.UniversalClient, addr, lease string, scripts func(*testing.T) int64) {
	const n = 6000
	tester := caddytest.NewTester(t)
	tester.InitServer(leasedInstances(addr, fmt.Sprintf("algorithm fixed_window\n\t\t\t\tevents %d\n\t\t\t\twindow 1h\n\t\t\t\tlease %s", n, lease)), "caddyfile")
	key := "one-" + lease
	rkey := redisstore.New(c, redisstore.DefaultPrefix).Key("leased", algorithms.FixedWindow, key)
	hour := func() int64 { return time.Now().Unix() / 3600 }
	start := hour()

	calls := scripts(t)
	decisions0 := scrape(t)["caddy_http_rate_limit_lease_decisions_total"]
	var admitted int64
	for round := 0; ; round++ {
		if round == 10 {
			t.Fatalf("still admitting after 10 rounds: %d of %d", admitted, n)
		}
		got := untilRefused(t, tester, key, 24, 40)
		admitted += got
		if held := windowCount(t, c, rkey); held > n {
			t.Fatalf("round %d: Redis counts %d, more than the limit %d", round, held, n)
		}
		// The leases come back: the count falls to what was admitted.
		stopped := time.Now()
		waitFor(t, "the leases to come back", func() bool {
			got := windowCount(t, c, rkey)
			if got != admitted {
				t.Logf("Redis counts %d, admitted %d", got, admitted)
			}
			return got == admitted
		})
		t.Logf("round %d: admitted %d (%d in all); leases back %s after the load stopped", round, got, admitted, time.Since(stopped).Round(time.Millisecond))
		if got == 0 {
			break
		}
		// A rejection another instance's deny cache holds lasts at most
		// DenyCacheFor.
		time.Sleep(time.Duration(redisstore.DenyCacheFor) * time.Microsecond)
	}
	if hour() != start {
		t.Skip("the hour ended during the test")
	}
	if admitted > n {
		t.Fatalf("admitted %d, more than the limit %d", admitted, n)
	}
	// Every request refused is a round trip, but most admitted are not.
	calls = scripts(t) - calls
	t.Logf("%d scripts run on Redis for %d admitted", calls, admitted)
	// The metrics count the decisions made from leases.
	m := scrape(t)
	fromLeases := m["caddy_http_rate_limit_lease_decisions_total"] - decisions0
	t.Logf("metrics: %v decisions from leases, %v leases taken, %v returned, %v expired, %v lost", fromLeases,
		m["caddy_http_rate_limit_leases_taken_total"], m["caddy_http_rate_limit_leases_returned_total"],
		m["caddy_http_rate_limit_leases_expired_total"], m["caddy_http_rate_limit_leases_lost_total"])
	switch {
	case lease == "on" && (fromLeases < float64(admitted)/2 || fromLeases > float64(admitted)):
		t.Errorf("%v decisions from leases for %d admitted: want most, and no more", fromLeases, admitted)
	case lease == "off" && fromLeases != 0:
		t.Errorf("%v decisions from leases with lease off", fromLeases)
	}
	switch {
	case lease == "on" && calls > admitted/2+3*24*40:
		t.Errorf("%d scripts run on Redis for %d admitted: leases decided few", calls, admitted)
	case lease == "off" && calls < admitted:
		t.Errorf("%d scripts run on Redis for %d admitted with lease off: want one a request", calls, admitted)
	}
	if admitted < n*99/100 {
		t.Errorf("admitted %d, less than 99%% of %d once the leases were back", admitted, n)
	}
}

// TestShowTellsLease: GET a key of the admin API tells the lease the
// instance holds on it, while a load keeps it hot.
func TestShowTellsLease(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(leasedInstances(srv.Addr, "rate 1000000/h"), "caddyfile")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := fmt.Sprintf("http://localhost:908%d/", 1+c%3)
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Client", "shown")
				if resp, err := tester.Client.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	var st adminapi.KeyState
	waitFor(t, "a lease in GET .../keys/shown", func() bool {
		resp, err := http.Get(adminBase + "/rate_limit/zones/leased/keys/shown")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		st = adminapi.KeyState{}
		return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&st) == nil && st.Lease != nil
	})
	if st.Lease.Events <= 0 || st.Lease.Left <= 0 || st.Lease.Left > redisstore.DefaultLeaseLife.Seconds() {
		t.Errorf("lease %+v: want events left, for at most %s", *st.Lease, redisstore.DefaultLeaseLife)
	}
}

// TestLeasedBucketThroughCaddy: three Caddy instances on one Redis hammer
// one token_bucket key whose bucket is deep enough to lease: never more
// than burst + rate x t, part of it decided from leases.
func TestLeasedBucketThroughCaddy(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	const rate, burst = 2000, 4000
	tester.InitServer(leasedInstances(srv.Addr, fmt.Sprintf("rate %d/s\n\t\t\t\tburst %d", rate, burst)), "caddyfile")
	decisions0 := scrape(t)["caddy_http_rate_limit_lease_decisions_total"]
	l := hammer(t, tester, "bucket", 24, 2*time.Second)
	fromLeases := scrape(t)["caddy_http_rate_limit_lease_decisions_total"] - decisions0
	upper := burst + rate*l.lastRecv.Sub(l.firstSend).Seconds()
	t.Logf("admitted %d, B + r*T at most %.1f; %v decided from leases", l.admitted, upper, fromLeases)
	if l.other != 0 {
		t.Errorf("%d requests failed or got a status other than 200/429", l.other)
	}
	if float64(l.admitted) > upper+1 {
		t.Errorf("admitted %d, above B + r*T = %.1f: the instances over-admitted", l.admitted, upper)
	}
	if fromLeases == 0 {
		t.Error("no decision from a lease: the test tests nothing")
	}
}
