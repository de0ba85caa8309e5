package tollgate

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// TestTimedOutDecisionGoesOnFromTheSharedState: with on_storage_error
// local (the default), a decision Redis does not answer in time is made
// from this instance's memory. That memory follows what Redis decided on
// this instance, so a key Redis has spent stays spent: before, the
// fallback started from a fresh key, and a client over its limit got a
// whole burst again each time Redis was slow (a loaded machine, a stall).
// A key Redis never saw is still fresh, and the fallback never rejects
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
			// deny cache, which answers before the fallback is reached.
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
				t.Errorf("with Redis frozen, a client Redis has spent: status %d, want 429 (the fallback started from a fresh key)", resp.StatusCode)
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
// admitted. Had the copy kept B's place, C would have to wait about 4s,
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
