package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// TestGiveBackAfterTheWindowRolled is the reproduction: zones shape
// (leaky_bucket with max_delay, /slow only) and fw (fixed_window, 3 per 2s,
// every path). A /slow request is charged in fw's window W0 and delayed by
// shape; W1 begins and a request is admitted in it; then the delayed client
// leaves. Its give-back belongs to W0, which fw no longer counts: W1 must
// still admit only 3 in all, not 4.
func TestGiveBackAfterTheWindowRolled(t *testing.T) {
	const window = 2 * time.Second
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(shapedBesideFixed(3, "2s", storage(t)), "caddyfile")
			// The memory store runs on the tests' fake clock, Redis on its
			// own: step the one, wait for the other.
			startOfWindow := func() {
				if name == "memory" {
					now := fakeNow.Load()
					w := window.Microseconds()
					fakeNow.Store(now - now%w + w + 100_000)
					return
				}
				for time.Now().UnixMicro()%window.Microseconds() > 300_000 ||
					time.Now().UnixMicro()%window.Microseconds() < 50_000 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			client := "X-Client: giveback-" + name

			startOfWindow() // W0
			resp, _ := get(t, tester, "/slow", client)
			check(t, "first /slow", resp, "", want{status: 200})
			leave := sendDelayed(t, tester, "/slow", client)
			time.Sleep(300 * time.Millisecond) // it waits in shape, charged in fw's W0

			startOfWindow() // W1
			resp, _ = get(t, tester, "/fast", client)
			check(t, "first in W1", resp, "", want{status: 200})
			leave() // the delayed client leaves; its charge was W0's

			if got, want := statuses(t, tester, 3, []string{"/fast"}, client), "200 200 429 "; got != want {
				t.Fatalf("W1 after the give-back: %q, want %q (3 per window)", got, want)
			}
		})
	}
}

// sendDelayed sends a request to path with header (such as "X-Client: c")
// that a shaping zone delays, and returns leave: it cancels the request,
// checks that it was still delayed, and waits for the server to see the
// client go and give its place back.
func sendDelayed(t *testing.T, tester *caddytest.Tester, path, header string) (leave func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		name, value, _ := strings.Cut(header, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
		resp, err := tester.Client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		done <- err
	}()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err == nil || ctx.Err() == nil {
			t.Fatalf("delayed request: %v, want it cancelled while delayed", err)
		}
		time.Sleep(200 * time.Millisecond) // the server sees it go and gives back
	}
}

// TestGiveBackAfterAReset: zones shape (leaky_bucket with max_delay, /slow
// only) and fw (fixed_window, 2 per hour, every path). A /slow request is
// charged in fw and delayed by shape; fw's key is reset through the admin
// API, and spent again by 2 requests; then the delayed client leaves. Its
// charge was made before the reset, which gave it back already: fw must
// still refuse a third request. Before, the give-back was taken from the
// 2 charged since, and a third was admitted.
func TestGiveBackAfterAReset(t *testing.T) {
	const window = time.Hour
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(shapedBesideFixed(2, "1h", storage(t)), "caddyfile")
			// One window throughout: the memory store runs on the tests'
			// fake clock, set at a window's start; Redis on its own, which
			// must not be about to turn to the next hour.
			if name == "memory" {
				now := fakeNow.Load()
				w := window.Microseconds()
				fakeNow.Store(now - now%w + w + 100_000)
			} else {
				for time.Now().UnixMicro()%window.Microseconds() > window.Microseconds()-20*time.Second.Microseconds() {
					time.Sleep(100 * time.Millisecond)
				}
			}
			id := "reset-giveback-" + name
			client := "X-Client: " + id

			resp, _ := get(t, tester, "/slow", client)
			check(t, "first /slow", resp, "", want{status: 200})
			leave := sendDelayed(t, tester, "/slow", client)
			time.Sleep(300 * time.Millisecond) // it waits in shape, charged in fw: 2 of 2

			if code := adminDo(t, "DELETE", "/rate_limit/zones/fw/keys/"+id, nil); code != 200 {
				t.Fatalf("admin reset of fw's key: status %d, want 200", code)
			}
			if got, want := statuses(t, tester, 2, []string{"/fast"}, client), "200 200 "; got != want {
				t.Fatalf("after the reset: %q, want %q (2 per window)", got, want)
			}
			leave() // the delayed client leaves; its charge was made before the reset

			if got, want := statuses(t, tester, 1, []string{"/fast"}, client), "429 "; got != want {
				t.Fatalf("after the give-back: %q, want %q (the reset gave the charge back already)", got, want)
			}
		})
	}
}

// shapedBesideFixed is a site whose /slow requests a shaping zone delays
// (one a 10s, queued up to 30s), beside a fixed_window zone fw of events
// per window on every request, both keyed by X-Client, on storage.
func shapedBesideFixed(events int, window, storage string) string {
	return globalOptions + fmt.Sprintf(`
	localhost:9080 {
		rate_limit {
			zone shape {
				match {
					path /slow
				}
				key {http.request.header.X-Client}
				algorithm leaky_bucket
				events 1
				window 10s
				burst 1
				max_delay 30s
			}
			zone fw {
				key {http.request.header.X-Client}
				algorithm fixed_window
				events %d
				window %s
			}
			%s
		}
		respond "ok"
	}`, events, window, storage)
}
