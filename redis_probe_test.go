package tollgate

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// probeZones are a local zone on /local and a deny zone on /deny, both
// keyed by X-Client, on one Redis (one client, one breaker).
const probeZones = `
			zone probe_local {
				match {
					path /local
				}
				key {http.request.header.X-Client}
				events 3
				window 1000h
			}
			zone probe_deny {
				match {
					path /deny
				}
				key {http.request.header.X-Client}
				events 1
				window 1000h
				on_storage_error deny
			}`

// liveRedisZone returns the live zone name's Redis limiter.
func liveRedisZone(t *testing.T, name string) (*zone, *shared.Limiter) {
	t.Helper()
	for _, lz := range liveZones() {
		if lz.z.name == name {
			l, ok := lz.z.Limiter.(*shared.Limiter)
			if !ok {
				t.Fatalf("zone %s: limiter %T, want a Redis one", name, lz.z.Limiter)
			}
			return lz.z, l
		}
	}
	t.Fatalf("no live zone %s", name)
	return nil, nil
}

// liveRedisStore returns the Redis store of the one live handler.
func liveRedisStore(t *testing.T) *redisstore.Store {
	t.Helper()
	live.mu.Lock()
	defer live.mu.Unlock()
	for _, h := range live.handlers {
		if h.redis != nil && h.redis.client != nil {
			return h.redis.client.Store()
		}
	}
	t.Fatal("no live handler on Redis")
	return nil
}

// TestResetFollowedWhileRedisRecoversReturnsTheProbe: after a stall opens
// the breaker, the first call once the retry time has come is its one
// probe. When that call was an instance following an admin API reset (the
// local copy reading the key back), it took the probe and never reported
// back: the breaker stayed open for good with Redis healthy, and a deny
// zone answered every request with 503 (issue 27, item 1). Now the probe
// is taken and returned in one function, and the follow's answer closes
// the breaker.
func TestResetFollowedWhileRedisRecoversReturnsTheProbe(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", probeZones), "caddyfile")
	const client = "reset-probe"
	if resp, _ := get(t, tester, "/local", "X-Client: "+client); resp.StatusCode != 200 {
		t.Fatalf("through Redis: status %d, want 200", resp.StatusCode)
	}
	c := srv.Client()
	channel := redisstore.DefaultPrefix + redisstore.ResetChannel
	waitFor(t, "the instance to listen for resets", func() bool {
		n, err := c.PubSubNumSub(context.Background(), channel).Result()
		return err == nil && n[channel] > 0
	})
	local, l := liveRedisZone(t, "probe_local")
	h := &l.Runtime().Breaker

	// A stall opens the breaker: decisions time out until it does.
	srv.Pause()
	for i := 0; !h.Down(); i++ {
		if i == 10*shared.FailStreak {
			srv.Resume()
			t.Fatalf("%d decisions timed out and the breaker is still closed", i)
		}
		if resp, _ := get(t, tester, "/local", fmt.Sprintf("X-Client: stall-%d", i)); resp.StatusCode != 200 {
			t.Fatalf("stalled, local zone: status %d, want 200 (decided locally)", resp.StatusCode)
		}
	}
	srv.Resume()
	h.RetryNow() // the retry time has come: the next call probes

	// The reset, heard of by this instance, which follows it on its local copy:
	// the first call since the retry time came. A hook registered after
	// the local copy's is called after it: once it has been, the local copy's follow
	// is under way, and done when it has given its place back.
	heard := make(chan string, 1)
	stop := liveRedisStore(t).OnReset(l.Inner(), func(key string, _ int64) {
		select {
		case heard <- key:
		default:
		}
	})
	defer stop()
	if code := adminDo(t, "DELETE", "/rate_limit/zones/probe_local/keys/"+client, nil); code != 200 {
		t.Fatalf("DELETE: %d", code)
	}
	waitFor(t, "the instance to hear of the reset", func() bool { return len(heard) == 1 })
	waitFor(t, "the local copy to follow the reset", func() bool { return l.Following() == 0 })
	if _, held, _ := local.Memory.Peek(context.Background(), client, monotonicMicros()); held {
		t.Fatalf("the local copy holds the key after the reset, want it forgotten")
	}

	// Redis is healthy: a deny zone's request is decided there.
	for i := 1; i <= 3; i++ {
		if resp, _ := get(t, tester, "/deny", fmt.Sprintf("X-Client: after-%d", i)); resp.StatusCode != 200 {
			t.Fatalf("deny zone, Redis healthy, request %d after the reset: status %d, want 200 (the breaker is stuck open: its probe was never returned)", i, resp.StatusCode)
		}
	}
	if h.Down() {
		t.Errorf("breaker open after Redis answered, want closed")
	}
}

// TestDenyCacheHitDoesNotCloseTheBreaker: a request the deny cache
// answers never reached Redis, so it says nothing of Redis's health.
// Before, when such a request held the breaker's probe, it counted as an
// answer and closed the breaker while Redis was still frozen (issue 27,
// item 1). Now the breaker stays open, the probe goes back, and the next
// request that Redis really answers closes it.
func TestDenyCacheHitDoesNotCloseTheBreaker(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", probeZones), "caddyfile")
	_, l := liveRedisZone(t, "probe_deny")
	h := &l.Runtime().Breaker
	// A cached rejection is trusted for a second of this instance's
	// clock: a round whose second ran out before its cached request is
	// tried again with another client (the status tells: 429 from the
	// cache, 503 from a frozen Redis with on_storage_error deny).
	for round := 0; ; round++ {
		if round == 5 {
			t.Fatalf("%d rounds, none answered from the deny cache within its second", round)
		}
		client := fmt.Sprintf("X-Client: cached-%d", round)
		if resp, _ := get(t, tester, "/deny", client); resp.StatusCode != 200 {
			t.Fatalf("first request through Redis: status %d, want 200", resp.StatusCode)
		}
		if resp, _ := get(t, tester, "/deny", client); resp.StatusCode != 429 {
			t.Fatalf("second request through Redis: status %d, want 429 (now in the deny cache)", resp.StatusCode)
		}
		srv.Pause()
		h.Open(errors.New("test: Redis frozen")) // as a streak of timeouts does
		h.RetryNow()                             // and the retry time has come
		resp, _ := get(t, tester, "/deny", client)
		if resp.StatusCode == 503 {
			srv.Resume()
			waitFor(t, "the breaker to close", func() bool {
				get(t, tester, "/local", "X-Client: wake")
				return !h.Down()
			})
			continue
		}
		if resp.StatusCode != 429 {
			srv.Resume()
			t.Fatalf("with Redis frozen, the cached request: status %d, want 429 (the deny cache) or 503", resp.StatusCode)
		}
		if !h.Down() {
			srv.Resume()
			t.Fatal("a request the deny cache answered closed the breaker while Redis is frozen")
		}
		break
	}
	srv.Resume()
	// The probe went back: the next request probes, Redis answers, and
	// the breaker closes.
	if resp, _ := get(t, tester, "/deny", "X-Client: fresh"); resp.StatusCode != 200 {
		t.Fatalf("Redis answering again, a fresh client: status %d, want 200", resp.StatusCode)
	}
	if h.Down() {
		t.Error("breaker open after Redis answered a probe, want closed")
	}
}
