package tollgate

import (
	"context"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
)

// adaptiveSite is a site whose /dl requests are held by up until
// released, behind a zone of concurrency adaptive alone whose limit is
// pinned to 1 (min = max): the second request in flight is shed.
func adaptiveSite(up, settings, also string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone cap {
				key {http.request.header.X-Client}
				concurrency adaptive {
					min 1
					max 1
					` + settings + `
				}
				` + also + `
			}
		}
		reverse_proxy ` + strings.TrimPrefix(up, "http://") + `
	}`
}

// adaptiveKey reads a key's controller from the admin API.
func adaptiveKey(t *testing.T, zone, key string) *adminapi.AdaptiveState {
	t.Helper()
	var st adminapi.KeyState
	if code := adminDo(t, "GET", "/rate_limit/zones/"+zone+"/keys/"+key, &st); code != 200 {
		return nil
	}
	return st.Adaptive
}

// TestAdaptiveShedsThroughCaddy: a request above the limit is shed with
// 503 and Retry-After, another key has its own limit, and the place comes
// back when the request in flight ends, however it ends.
func TestAdaptiveShedsThroughCaddy(t *testing.T) {
	up := newUpstream(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(adaptiveSite(up.URL, "", ""), "caddyfile")
	ctx := context.Background()

	status, done := startRequest(t, ctx, tester.Client, base+"/dl", "a")
	if status != 200 {
		t.Fatalf("first: status %d, want 200", status)
	}
	resp, _ := get(t, tester, "/fast", "X-Client: a")
	check(t, "second, shed", resp, "", want{503, map[string]string{"Retry-After": "1", "RateLimit": ""}, ""})
	if st := adaptiveKey(t, "cap", "a"); st == nil || st.InFlight != 1 || st.Limit != 1 {
		t.Errorf("key a: %+v, want 1 in flight of 1", st)
	}
	status, done2 := startRequest(t, ctx, tester.Client, base+"/dl", "b")
	if status != 200 {
		t.Fatalf("another key: status %d, want 200", status)
	}
	up.release <- struct{}{}
	up.release <- struct{}{}
	<-done
	<-done2
	waitFor(t, "a's place back", func() bool { st := adaptiveKey(t, "cap", "a"); return st != nil && st.InFlight == 0 })

	// A client that leaves mid-request gives its place back.
	cctx, cancel := context.WithCancel(ctx)
	if status, _ := startRequest(t, cctx, tester.Client, base+"/dl", "a"); status != 200 {
		t.Fatalf("after: status %d, want 200", status)
	}
	cancel()
	waitFor(t, "a's place back after the client left", func() bool { st := adaptiveKey(t, "cap", "a"); return st != nil && st.InFlight == 0 })
	var zones []adminapi.ZoneInfo
	adminDo(t, "GET", "/rate_limit/zones", &zones)
	if len(zones) != 1 || zones[0].Adaptive == nil || zones[0].Adaptive.Shed != 1 || zones[0].Adaptive.Max != 1 || zones[0].Algorithm != "" {
		t.Errorf("zones: %+v, want the adaptive zone with 1 shed", zones)
	}
}

// TestAdaptiveStatusAndDryRun: status changes a shed request's status,
// and a dry run lets it through.
func TestAdaptiveStatusAndDryRun(t *testing.T) {
	for _, tc := range []struct {
		name, settings, also string
		status               int
	}{
		{"status", "status 429", "", 429},
		{"dry run", "", "dry_run", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			tester := caddytest.NewTester(t)
			tester.InitServer(adaptiveSite(up.URL, tc.settings, tc.also), "caddyfile")
			status, done := startRequest(t, context.Background(), tester.Client, base+"/dl", "a")
			if status != 200 {
				t.Fatalf("first: status %d, want 200", status)
			}
			resp, _ := get(t, tester, "/sleep", "X-Client: a")
			check(t, "second", resp, "", want{tc.status, nil, ""})
			up.release <- struct{}{}
			<-done
		})
	}
}
