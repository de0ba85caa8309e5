package tollgate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// TestTimedOutDecisionGoesOnFromTheSharedState: with on_storage_error
// local (the default), a decision Redis does not answer in time is made
// from this instance's memory. That memory follows what Redis decided on
// this instance, so a key Redis has spent stays spent: before, the
// fallback started from a fresh key, and a client over its limit got a
// whole burst again each time Redis was slow (a loaded machine, a stall).
// A key Redis never saw is still fresh, and the local copy never rejects
// what Redis would admit.
func TestTimedOutDecisionGoesOnFromTheSharedState(t *testing.T) {
	for _, alg := range []string{"token_bucket", "gcra", "leaky_bucket", "fixed_window", "sliding_window", "sliding_log"} {
		t.Run(alg, func(t *testing.T) {
			// A Redis of its own: the client, and its breaker, are
			// shared by every configuration that names the address.
			srv := redistest.Start(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", fmt.Sprintf(`
			zone follow_%s {
				key {http.request.header.X-Client}
				events 3
				window 1000h
				algorithm %s
			}`, alg, alg)), "caddyfile")
			for i := 1; i <= 3; i++ {
				if resp, _ := get(t, tester, "/", "X-Client: spent"); resp.StatusCode != 200 {
					t.Fatalf("request %d of 3 through Redis: status %d, want 200", i, resp.StatusCode)
				}
			}
			// No 4th request through Redis: its rejection would be in the
			// deny cache, which answers before the local copy is reached.
			if resp, _ := get(t, tester, "/", "X-Client: once"); resp.StatusCode != 200 {
				t.Fatalf("another client's first request: status %d, want 200", resp.StatusCode)
			}

			if n := redistest.Calls(t, srv.Client(), "evalsha", "eval", "fcall"); n < 4 {
				t.Fatalf("Redis ran %d scripts, want at least one for each of the 4 requests: they were not decided there", n)
			}
			srv.Pause() // SIGSTOP: every decision times out
			defer srv.Resume()
			resp, _ := get(t, tester, "/", "X-Client: spent")
			if resp.StatusCode != 429 {
				t.Errorf("with Redis frozen, a client Redis has spent: status %d, want 429 (the local copy started from a fresh key)", resp.StatusCode)
			}
			for i := 2; i <= 3; i++ {
				if resp, _ := get(t, tester, "/", "X-Client: once"); resp.StatusCode != 200 {
					t.Errorf("with Redis frozen, request %d of a client with 3: status %d, want 200", i, resp.StatusCode)
				}
			}
			if resp, _ := get(t, tester, "/", "X-Client: once"); resp.StatusCode != 429 {
				t.Errorf("with Redis frozen, a 4th request of a client with 3: status %d, want 429", resp.StatusCode)
			}
			if resp, _ := get(t, tester, "/", "X-Client: new"); resp.StatusCode != 200 {
				t.Errorf("with Redis frozen, a client Redis never saw: status %d, want 200", resp.StatusCode)
			}
		})
	}
}

// TestLocalCopyGetsBackWhatRedisGivesBack: a delayed client that leaves
// gives its place back on Redis, and on the local copy too. Zone: one
// request per 2s, shaped up to 2.5s. A is admitted; B is delayed about 2s
// and leaves; Redis freezes. C, decided locally, waits about 2s behind A:
// admitted. Had the local copy kept B's place, C would have to wait about 4s,
// past max_delay: 429.
func TestLocalCopyGetsBackWhatRedisGivesBack(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", `
			zone shaped {
				key {http.request.header.X-Client}
				algorithm leaky_bucket
				events 1
				window 2s
				burst 1
				max_delay 2500ms
			}`), "caddyfile")
	const client = "leaves"
	if resp, _ := get(t, tester, "/", "X-Client: "+client); resp.StatusCode != 200 {
		t.Fatalf("A: status %d, want 200", resp.StatusCode)
	}
	leave := sendDelayed(t, tester, "/", "X-Client: "+client) // B
	time.Sleep(200 * time.Millisecond)                        // B waits behind A
	leave()

	srv.Pause()
	defer srv.Resume()
	if resp, _ := get(t, tester, "/", "X-Client: "+client); resp.StatusCode != 200 {
		t.Fatalf("C, decided locally with Redis frozen: status %d, want 200 (delayed behind A only: B's place was given back)", resp.StatusCode)
	}
}

// TestLocalCopyFollowsAResetElsewhere: a key that another instance resets
// (its admin API's DELETE) is reset in this instance's local copy too, so
// that a decision Redis does not answer in time admits the client again.
// Before, the local copy kept the client spent until this instance's next
// decision on the key through Redis: with Redis frozen, 429 where the
// shared state admits.
func TestLocalCopyFollowsAResetElsewhere(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", `
			zone elsewhere {
				key {http.request.header.X-Client}
				algorithm token_bucket
				events 3
				window 1000h
			}`), "caddyfile")
	const client = "reset-elsewhere"
	for i := 1; i <= 3; i++ {
		if resp, _ := get(t, tester, "/", "X-Client: "+client); resp.StatusCode != 200 {
			t.Fatalf("request %d of 3 through Redis: status %d, want 200", i, resp.StatusCode)
		}
	}
	// This instance listens for resets from its first decision on.
	c := srv.Client()
	channel := redisstore.DefaultPrefix + redisstore.ResetChannel
	waitFor(t, "the instance to listen for resets", func() bool {
		n, err := c.PubSubNumSub(context.Background(), channel).Result()
		return err == nil && n[channel] > 0
	})

	// Another instance resets the key as its admin API does: its store
	// on the same Redis deletes it and tells every instance.
	other := redisstore.New(c, redisstore.DefaultPrefix).WithDenyCache(c)
	defer other.Close()
	l, err := algorithms.NewLimit(algorithms.TokenBucket, 3, 1000*time.Hour, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := other.Zone(storage.Zone{Name: "elsewhere", Limit: l}).Reset(context.Background(), client, 0); !ok || err != nil {
		t.Fatalf("reset on the other instance: %v, %v", ok, err)
	}
	var (
		local *zone
		now   func() int64 // the handler's clock
	)
	for _, lz := range liveZones() {
		if lz.z.name == "elsewhere" {
			local, now = lz.z, lz.now
		}
	}
	if local == nil || local.Memory == nil {
		t.Fatal("zone elsewhere has no local copy")
	}
	waitFor(t, "this instance's local copy to forget the key reset on another instance", func() bool {
		_, held, _ := local.Memory.Peek(context.Background(), client, now())
		return !held
	})

	// A reset heard of after the key was charged again since (the other
	// instance took one): the local copy takes what Redis holds, not a fresh
	// key.
	zo := other.Zone(storage.Zone{Name: "elsewhere", Limit: l})
	if d, err := zo.Take(context.Background(), client, 0, algorithms.Milli); err != nil || !d.Allowed {
		t.Fatalf("a take on the other instance after the reset: %+v, %v", d, err)
	}
	local.Limiter.(*shared.Limiter).ResetLocal(client)
	waitFor(t, "the local copy to hold what Redis holds after a reset heard of late (2 of 3 left)", func() bool {
		d, held, _ := local.Memory.Peek(context.Background(), client, now())
		return held && d.Remaining == 2
	})

	srv.Pause()
	defer srv.Resume()
	for i := 1; i <= 2; i++ {
		if resp, _ := get(t, tester, "/", "X-Client: "+client); resp.StatusCode != 200 {
			t.Errorf("with Redis frozen, request %d of the 2 left after the reset: status %d, want 200", i, resp.StatusCode)
		}
	}
	if resp, _ := get(t, tester, "/", "X-Client: "+client); resp.StatusCode != 429 {
		t.Errorf("with Redis frozen, a 3rd request after the reset and another instance's: status %d, want 429", resp.StatusCode)
	}
}

// TestReloadBetweenRedisAndMemoryStartsAfresh: a Redis zone's local copy
// is its own, not the state of a memory zone of the same name and limit.
// A reload from Redis to memory starts the memory zone afresh (before, it
// took over the local copy, Redis's clock lead included: a key spent in Redis
// stayed spent, which made TestTiersThroughCaddy fail whenever its Redis
// case ran first), and a reload back to Redis does not make a memory
// zone's state the local copy. A reload from Redis to Redis keeps the local copy.
func TestReloadBetweenRedisAndMemoryStartsAfresh(t *testing.T) {
	srv := redistest.Start(t)
	zone := `
			zone reload_copy {
				key {http.request.header.X-Client}
				events 2
				window 1000h
			}`
	memorySite := globalOptions + `
	localhost:9080 {
		rate_limit {` + zone + `
		}
		respond "ok"
	}`
	statuses := func(tester *caddytest.Tester, client string, n int) string {
		got := ""
		for range n {
			resp, _ := get(t, tester, "/", "X-Client: "+client)
			got += fmt.Sprint(resp.StatusCode, " ")
		}
		return got
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, testTimeout, zone), "caddyfile")
	if got := statuses(tester, "a", 3); got != "200 200 429 " {
		t.Fatalf("through Redis: %s, want 200 200 429", got)
	}
	tester.InitServer(memorySite, "caddyfile")
	if got := statuses(tester, "a", 3); got != "200 200 429 " {
		t.Errorf("in memory after Redis: %s, want 200 200 429 (a fresh zone)", got)
	}
	if got := statuses(tester, "b", 2); got != "200 200 " {
		t.Fatalf("in memory: %s, want 200 200", got)
	}
	// Back to Redis: c spends its 2 there. Then a reload that keeps the
	// zone (a shorter timeout) and a frozen Redis: the local copy is
	// the Redis zone's, kept across that reload, which has c spent and
	// has not seen b, spent in memory only.
	tester.InitServer(redisSiteWithTimeout(srv.Addr, testTimeout, zone), "caddyfile")
	if got := statuses(tester, "c", 2); got != "200 200 " {
		t.Fatalf("back in Redis: %s, want 200 200", got)
	}
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", zone), "caddyfile")
	srv.Pause()
	defer srv.Resume()
	if got := statuses(tester, "b", 1); got != "200 " {
		t.Errorf("Redis frozen, b (spent in memory only): %s, want 200", got)
	}
	if got := statuses(tester, "c", 1); got != "429 " {
		t.Errorf("Redis frozen, c (spent in Redis before a reload): %s, want 429", got)
	}
}

// TestReloadLetsGoOfResetHooks: a reload closes the old configuration's
// Redis limiters, whose reset hooks then stop. A reset heard of after
// three reloads makes one read of Redis (the live zone's local copy follows it),
// not four: every handler the reloads replaced would read it again for a
// local copy nobody uses, and be kept in memory for it.
func TestReloadLetsGoOfResetHooks(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	for i := range 4 {
		// The zone and its storage the same each time (one client, one
		// store), the rest not, so that each load replaces the handler.
		// No pipeline: each read of Redis is one script call to count.
		tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone hooks {
				key {http.request.header.X-Client}
				events 3
				window 1000h
			}
			storage redis {
				addresses `+srv.Addr+`
				timeout `+testTimeout+`
				pipeline off
			}
		}
		respond "ok `+fmt.Sprint(i)+`"
	}`, "caddyfile")
	}
	if resp, _ := get(t, tester, "/", "X-Client: hooked"); resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	c := srv.Client()
	channel := redisstore.DefaultPrefix + redisstore.ResetChannel
	waitFor(t, "the instance to listen for resets", func() bool {
		n, err := c.PubSubNumSub(context.Background(), channel).Result()
		return err == nil && n[channel] > 0
	})
	scripts := func() int64 { return redistest.Calls(t, c, "evalsha", "eval", "fcall") }
	before := scripts()
	if code := adminDo(t, "DELETE", "/rate_limit/zones/hooks/keys/hooked", nil); code != 200 {
		t.Fatalf("DELETE: %d", code)
	}
	waitFor(t, "the local copy to read the reset key back", func() bool { return scripts() > before+1 })
	time.Sleep(300 * time.Millisecond) // room for any other hook's read
	// The reset's own script, then the one local copy's read.
	if n := scripts() - before; n != 2 {
		t.Errorf("a reset made %d script calls, want 2 (the reset and one read): the handlers the reloads replaced still follow resets", n)
	}
}

// TestLocalCopiesKeepRedisClockBesideAConcurrencyZone: the local copies
// of on_storage_error local keep Redis's clock, its lead over this
// instance's set from the decisions Redis makes. A concurrency slot's
// decision carries its lease id where the others carry Redis's time, and
// when a request's first part was one, the lead was set from the lease id
// (issue 27, item 2): off by up to centuries, so that with Redis frozen a
// client Redis had spent was admitted again (local copies in the future), or,
// about one time in five, the local copies ran in the past and refused more than
// the limit. Redis runs on this machine, by this machine's clock: the lead
// is a few ms, here bounded by a minute.
func TestLocalCopiesKeepRedisClockBesideAConcurrencyZone(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "100ms", `
			zone clock_slots {
				key {http.request.header.X-Client}
				concurrency 5
			}
			zone clock_rate {
				key {http.request.header.X-Client}
				events 3
				window 1000h
			}`), "caddyfile")
	const client = "X-Client: spent-beside-slots"
	for i := 1; i <= 3; i++ {
		if resp, _ := get(t, tester, "/", client); resp.StatusCode != 200 {
			t.Fatalf("request %d of 3 through Redis: status %d, want 200", i, resp.StatusCode)
		}
	}
	// The lead is over the handler's clock (a test's fake one).
	var lead, want int64
	live.mu.Lock()
	for _, h := range live.handlers {
		if h.redis != nil && h.redis.client != nil {
			lead, want = h.redis.client.Lead(), time.Now().UnixMicro()-h.now()
		}
	}
	live.mu.Unlock()
	if off := time.Duration(lead-want) * time.Microsecond; off < -time.Minute || off > time.Minute {
		t.Errorf("Redis's clock lead over this instance's, Redis on the same machine: off by %s, want within a minute (read from a lease id)", off)
	}

	srv.Pause()
	defer srv.Resume()
	if resp, _ := get(t, tester, "/", client); resp.StatusCode != 429 {
		t.Errorf("with Redis frozen, a client Redis has spent: status %d, want 429", resp.StatusCode)
	}
	if resp, _ := get(t, tester, "/", "X-Client: new-beside-slots"); resp.StatusCode != 200 {
		t.Errorf("with Redis frozen, a client Redis never saw: status %d, want 200", resp.StatusCode)
	}
}
