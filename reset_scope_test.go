package tollgate

import (
	"errors"
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// resetScopeSite is two handlers of one zone on one Redis, each with its
// own client (their timeouts differ): /a's answers in 10s, /b's in 100ms,
// so that a stall opens /b's breaker only.
func resetScopeSite(addr string) string {
	handler := func(path, timeout string) string {
		return fmt.Sprintf(`
		route %s {
			rate_limit {
				zone rs {
					key {http.request.header.X-Client}
					events 4
					window 1h
				}
				storage redis {
					addresses %s
					timeout %s
				}
			}
			respond "ok"
		}`, path, addr, timeout)
	}
	return globalOptions + "\n\tlocalhost:9080 {" + handler("/a", "10s") + handler("/b", "100ms") + "\n\t}"
}

// TestResetAppliedThroughOneClientAnswersApplied: a reset of a zone that
// two handlers define on one Redis, each with its own client, was sent
// through each client in turn. When the first client's reset was applied
// and the second's breaker was still open (Redis back, its retry time not
// come), the admin API answered 503 for a reset Redis had applied: the
// operator (and the interaction test, which then kept the key's history)
// took the key for unchanged while its limit had started afresh. A reset
// is made once per Redis scope, as a grant is: the answer is 200, and
// the key starts afresh.
func TestResetAppliedThroughOneClientAnswersApplied(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(resetScopeSite(srv.Addr), "caddyfile")
	const client = "reset-scope"
	for i := 1; i <= 4; i++ {
		if resp, _ := get(t, tester, "/a", "X-Client: "+client); resp.StatusCode != 200 {
			t.Fatalf("request %d of 4: status %d, want 200", i, resp.StatusCode)
		}
	}
	if resp, _ := get(t, tester, "/a", "X-Client: "+client); resp.StatusCode != 429 {
		t.Fatalf("request 5 of 4: status %d, want 429", resp.StatusCode)
	}

	var limiters []*shared.Limiter // in the order the admin API resets them
	for _, lz := range zonesNamed("rs") {
		l, ok := lz.z.Limiter.(*shared.Limiter)
		if !ok {
			t.Fatalf("limiter %T, want a Redis one", lz.z.Limiter)
		}
		limiters = append(limiters, l)
	}
	if len(limiters) != 2 || limiters[0].Runtime() == limiters[1].Runtime() {
		t.Fatalf("want two handlers' limiters on two clients, got %d", len(limiters))
	}

	// A stall opens /b's breaker: its decisions time out until it does.
	srv.Pause()
	var down *shared.Breaker
	for i := 0; down == nil; i++ {
		if i == 10*shared.FailStreak {
			srv.Resume()
			t.Fatalf("%d decisions timed out and no breaker opened", i)
		}
		if resp, _ := get(t, tester, "/b", fmt.Sprintf("X-Client: stall-%d", i)); resp.StatusCode != 200 {
			srv.Resume()
			t.Fatalf("stalled: status %d, want 200 (on_storage_error local)", resp.StatusCode)
		}
		for j, l := range limiters {
			if l.Runtime().Breaker.Down() {
				down = &limiters[j].Runtime().Breaker
				if j != 1 {
					srv.Resume()
					t.Fatalf("/b's client is the first the admin API resets through: this test wants it second")
				}
			}
		}
	}
	srv.Resume()
	if limiters[0].Runtime().Breaker.Down() {
		t.Fatalf("/a's breaker is open: want only /b's")
	}
	// Its retry time is RetryEvery from now: the reset comes before it,
	// as an operator's reset does in the moment after Redis returns.
	down.Open(errors.New("stalled"))

	if code := adminDo(t, "DELETE", "/rate_limit/zones/rs/keys/"+client, nil); code != 200 {
		t.Fatalf("reset applied through /a's client, /b's breaker open: status %d, want 200", code)
	}
	for i := 1; i <= 4; i++ {
		if resp, _ := get(t, tester, "/a", "X-Client: "+client); resp.StatusCode != 200 {
			t.Fatalf("after the reset, request %d of 4: status %d, want 200", i, resp.StatusCode)
		}
	}
	if resp, _ := get(t, tester, "/a", "X-Client: "+client); resp.StatusCode != 429 {
		t.Fatalf("after the reset, request 5 of 4: status %d, want 429", resp.StatusCode)
	}
}
