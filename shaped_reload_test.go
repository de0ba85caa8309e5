package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// shapedSite is a leaky_bucket zone of one request every 10s that delays
// up to 30s (max_delay), on Redis at addr with the given timeout.
func shapedSite(addr, timeout string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone shaped {
				key {http.request.header.X-Client}
				algorithm leaky_bucket
				rate 1/10s
				max_delay 30s
				on_storage_error deny
			}
			storage redis {
				addresses ` + addr + `
				timeout ` + timeout + `
			}
		}
		respond "ok"
	}`
}

// TestReloadKeepsShapedGiveBack: a request takes the key's place, a
// second is delayed 10s after reserving the next place on Redis; a reload
// changes the Redis timeout (a new client, the old one retired) and the
// grace period ends the delayed request's wait. Its place is given back
// through the retired client: the key is whole again 10s after the first
// request, not 20s. Before, nothing held the retired client during the
// wait, the reload closed it, and the give-back failed with "redis:
// client is closed": the key stayed charged for a request that never
// ran.
func TestReloadKeepsShapedGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(shapedSite(srv.Addr, testTimeout), "caddyfile")
	old := liveRedisClient(t)
	first := time.Now()
	resp, _ := get(t, tester, "/", "X-Client: shaped")
	check(t, "the first request", resp, "", want{status: 200})
	// wholeAt is when the key is whole again, as the store says: a time
	// that stays put as the clock runs, so that no check below depends
	// on how fast the test runs.
	wholeAt := func() time.Time {
		var st adminapi.KeyState
		if code := adminDo(t, "GET", "/rate_limit/zones/shaped/keys/shaped", &st); code != 200 {
			return time.Now() // a key the store no longer holds is whole
		}
		return time.Now().Add(time.Duration(st.Reset * float64(time.Second)))
	}
	const slack = time.Second // the first request's round trip, and Redis's clock against this one
	firstPlace := first.Add(10 * time.Second)

	ctx, leave := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
		req.Header.Set("X-Client", "shaped")
		resp, err := tester.Client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		done <- err
	}()
	// The second request reserves the next place on Redis and waits for it.
	waitFor(t, "the second request to reserve its place", func() bool {
		return wholeAt().After(firstPlace.Add(5 * time.Second))
	})

	reload(t, shapedSite(srv.Addr, "9s"))
	if liveRedisClient(t) == old {
		t.Fatal("the reload kept the client: the test changes nothing")
	}
	leave() // its wait ends: it never runs
	if err := <-done; ctx.Err() == nil {
		t.Fatalf("delayed request: %v, want it cancelled while delayed", err)
	}
	waitFor(t, "the delayed request's place given back", func() bool {
		return !wholeAt().After(firstPlace.Add(slack))
	})
	waitFor(t, "the retired client closed once the give-back was made", func() bool {
		return old.Client().Ping(t.Context()).Err() != nil
	})
}
