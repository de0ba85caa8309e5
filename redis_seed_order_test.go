package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// TestLocalCopyKeepsConcurrentReplies: with on_storage_error local (the
// default), each request Redis decides seeds the zone's local copy with
// its own reply, and the replies of concurrent requests arrive in any
// order. The local copy keeps the latest state whatever the order: once Redis
// has admitted a client's whole limit, 16 requests at once, the local copy
// refuses it, and with Redis frozen so does the instance. Before, an
// older reply landing last took the local copy back: in 2 of 12 such rounds
// the local copy left room for 8 more requests. (Whether the replies of a
// round arrive out of order is up to the scheduler; the test runs rounds
// enough that, before, one almost always did: it failed 5 runs of 5.
// With the merge the local copy is the same in every order, so the test
// cannot fail by chance.)
func TestLocalCopyKeepsConcurrentReplies(t *testing.T) {
	algs := []string{"token_bucket", "gcra", "leaky_bucket", "fixed_window", "sliding_window", "sliding_log"}
	var zones strings.Builder
	for _, alg := range algs {
		fmt.Fprintf(&zones, `
			zone order_%s {
				key {http.request.header.X-Client}
				events 16
				window 1000h
				algorithm %s
			}`, alg, alg)
	}
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(redisSiteWithTimeout(srv.Addr, "2s", zones.String()), "caddyfile")

	// A first request, alone: one that a listener of the config before
	// takes and closes is sent again (see sendUnread).
	if resp, _ := get(t, tester, "/", "X-Client: warm-up"); resp.StatusCode != 200 {
		t.Fatalf("a first request: status %d, want 200", resp.StatusCode)
	}
	const rounds, burst = 24, 16
	for r := range rounds {
		client := fmt.Sprintf("round-%d", r)
		codes := make(chan int, burst)
		var wg sync.WaitGroup
		for range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes <- status(tester, client)
			}()
		}
		wg.Wait()
		close(codes)
		for c := range codes {
			if c != 200 {
				t.Fatalf("round %d: a request of %d through Redis got %d, want 200", r, burst, c)
			}
		}
	}

	// Every request's reply was seeded before its response was written.
	for _, lz := range liveZones() {
		if !strings.HasPrefix(lz.z.name, "order_") {
			continue
		}
		if lz.z.Memory == nil {
			t.Fatalf("zone %s has no local copy", lz.z.name)
		}
		room := 0
		for r := range rounds {
			d, held, _ := lz.z.Memory.Peek(context.Background(), fmt.Sprintf("round-%d", r), lz.now())
			if !held || d.Allowed {
				room++
				t.Logf("%s, round %d: the local copy holds %v and decides %+v", lz.z.name, r, held, d)
			}
		}
		if room > 0 {
			t.Errorf("%s: the local copy has room in %d of %d rounds whose %d requests Redis admitted, all of the limit", lz.z.name, room, rounds, burst)
		}
	}

	srv.Pause()
	defer srv.Resume()
	for r := range 2 {
		if c := status(tester, fmt.Sprintf("round-%d", r)); c != 429 {
			t.Errorf("with Redis frozen, a client Redis has spent (round %d): status %d, want 429", r, c)
		}
	}
}

// status sends a GET for client and returns its status code, or 0 if it
// failed. It is safe to call from any goroutine.
func status(tester *caddytest.Tester, client string) int {
	req, err := http.NewRequest(http.MethodGet, base+"/", nil)
	if err != nil {
		return 0
	}
	req.Header.Set("X-Client", client)
	resp, err := tester.Client.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
