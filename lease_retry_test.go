package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// TestLeaseRetryAfterThroughCaddy: three Caddy instances on one Redis
// (leasedInstances, with jitter 1); clients keep instance 1 busy on one
// fixed_window key of a million an hour, so that it holds a lease, taken
// again while the load lasts. A request too dear for what the key has
// left, sent to instance 2, is refused; when Redis's record of the key's
// leases (its back) shows one out for the whole of the request, the
// refusal's Retry-After, and RateLimit's t, are at most the lease's life
// plus a second (1), however the jitter spreads it: the window's end, the
// answer without the lease, is most of an hour away.
func TestLeaseRetryAfterThroughCaddy(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	tester := caddytest.NewTester(t)
	cfg := strings.ReplaceAll(leasedInstances(srv.Addr, "algorithm fixed_window\n\t\t\t\tevents 1000000\n\t\t\t\twindow 1h\n\t\t\t\tcost {http.request.header.X-Cost}"),
		"\t\t\tstorage redis {", "\t\t\tjitter 1\n\t\t\tstorage redis {")
	tester.InitServer(cfg, "caddyfile")
	const key = "retry"
	rkey := redisstore.New(c, redisstore.DefaultPrefix).Key("leased", algorithms.FixedWindow, key)
	hour := func() int64 { return time.Now().Unix() / 3600 }
	start := hour()
	bound := int64((redisstore.DefaultLeaseLife + time.Second) / time.Second) // whole seconds

	// The busy instance.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, "http://localhost:9081/", nil)
				req.Header.Set("X-Client", key)
				if resp, err := tester.Client.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)

	ctx := context.Background()
	redisNow := func() int64 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	leased, probes := 0, 0
	for ; leased < 5 && probes < 300; probes++ {
		// A few a second: instance 2 decides them on Redis, one round
		// trip each, without leasing (the key is not hot there).
		time.Sleep(100 * time.Millisecond)
		t0 := redisNow()
		back, err := c.HGet(ctx, rkey, "back").Int64()
		if err != nil && err != goredis.Nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://localhost:9082/", nil)
		req.Header.Set("X-Client", key)
		req.Header.Set("X-Cost", "999999")
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		t1 := redisNow()
		if resp.StatusCode != http.StatusTooManyRequests {
			if back == 0 {
				continue // the busy instance has not admitted 2 yet
			}
			t.Fatalf("probe %d: status %d, want 429 (the key has spent more than 1 of its million)", probes, resp.StatusCode)
		}
		ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
		if err != nil {
			t.Fatalf("probe %d: Retry-After %q: %v", probes, resp.Header.Get("Retry-After"), err)
		}
		rl := resp.Header.Get("RateLimit")
		if want := fmt.Sprintf(";t=%d", ra); !strings.HasSuffix(rl, want) {
			t.Errorf("probe %d: RateLimit %q, want its t to be Retry-After's %d", probes, rl, ra)
		}
		if back <= t1 {
			// No lease known to be out for the whole request: Retry-After
			// is the window's end, or, if a lease was taken meanwhile, 1.
			if ra > 2*(3600-time.Now().Unix()%3600)+1 {
				t.Errorf("probe %d: Retry-After %d, later than the window's end with the jitter", probes, ra)
			}
			continue
		}
		leased++
		if ra > bound {
			t.Errorf("probe %d: a lease out on the key until %dµs after the request was sent, yet Retry-After is %d, want at most %d (the lease's life + 1s)",
				probes, back-t0, ra, bound)
		}
	}
	if hour() != start {
		t.Skip("the hour ended during the test")
	}
	if leased == 0 {
		t.Fatalf("no probe of %d was refused while a lease was out on the key: the test tests nothing", probes)
	}
	t.Logf("%d probes, %d while a lease was out", probes, leased)
}
