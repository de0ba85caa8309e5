package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// quotaSite is a zone of 3 events a day per client (fixed_window) on
// Redis at addr, reached with the given extra storage lines.
func quotaSite(addr, storageExtra, zoneExtra string) string {
	return globalOptions + `
	localhost:9080 {
		rate_limit {
			zone quota {
				key {http.request.header.X-Client}
				algorithm fixed_window
				rate 3/d
				` + zoneExtra + `
			}
			storage redis {
				addresses ` + addr + `
				` + storageExtra + `
			}
		}
		respond "ok"
	}`
}

// grantAnswer is the admin API's answer to a grant.
type grantAnswer struct {
	Granted  float64           `json:"granted"`
	Repeated bool              `json:"repeated"`
	State    adminapi.KeyState `json:"state"`
	Error    string            `json:"error"`
}

// postGrant posts a grant of amount to key in zone quota with id (none
// if ""), as an Idempotency-Key header.
func postGrant(t *testing.T, key string, amount int, id string) (int, grantAnswer) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, adminBase+"/rate_limit/zones/quota/keys/"+key+"/grant",
		strings.NewReader(fmt.Sprintf(`{"amount": %d}`, amount)))
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		req.Header.Set("Idempotency-Key", id)
	}
	var ans grantAnswer
	code := doJSON(t, req, &ans)
	return code, ans
}

// TestGrantTellsTheTruth: a grant through a Redis ACL user that may not
// publish (Redis 7's default for new users) is applied: 200, with the
// key's state after it, and sent again with the same id it is not
// applied twice. Before, the answer was 503 while the grant was applied,
// and each retry granted again. A reset through the same user is applied
// too: 200, not 503.
func TestGrantTellsTheTruth(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser("nopublish", "pw", "resetchannels")
	tester := caddytest.NewTester(t)
	tester.InitServer(quotaSite(srv.Addr, "username nopublish\n\t\t\t\tpassword pw\n\t\t\t\ttimeout "+testTimeout, "on_storage_error deny"), "caddyfile")
	if got, want := statuses(t, tester, 4, []string{"/"}, "X-Client: acl"), "200 200 200 429 "; got != want {
		t.Fatalf("before the grant: %q, want %q", got, want)
	}
	code, ans := postGrant(t, "acl", 2, "grant-acl-1")
	if code != 200 || ans.Repeated || ans.State.Remaining != 2 {
		t.Fatalf("grant: status %d, %+v; want 200, applied, 2 remaining", code, ans)
	}
	code, ans = postGrant(t, "acl", 2, "grant-acl-1")
	if code != 200 || !ans.Repeated || ans.State.Remaining != 2 {
		t.Fatalf("the same grant again: status %d, %+v; want 200, repeated, 2 remaining", code, ans)
	}
	if got, want := statuses(t, tester, 3, []string{"/"}, "X-Client: acl"), "200 200 429 "; got != want {
		t.Fatalf("after the grant sent twice: %q, want %q (granted once)", got, want)
	}
	// The CLI gives each grant an id, which its own retries reuse.
	if out, err := runCLI(t, "--address", testAdmin, "--json", "grant", "quota", "acl", "1"); err != nil || !strings.Contains(out, `"id":"cli-`) {
		t.Fatalf("caddy rate-limit grant: %q, %v; want an answer naming the grant's id", out, err)
	}
	var reset map[string]any
	if code := adminDo(t, http.MethodDelete, "/rate_limit/zones/quota/keys/acl", &reset); code != 200 {
		t.Fatalf("reset: status %d (%v), want 200: it was applied", code, reset)
	}
	if got, want := statuses(t, tester, 1, []string{"/"}, "X-Client: acl"), "200 "; got != want {
		t.Fatalf("after the reset: %q, want %q", got, want)
	}
}

// TestGrantRetriedAfterStall: a grant sent while Redis is frozen is not
// confirmed (503, which says to send it again with the same id), lands
// when Redis resumes, and the operator's retry with the same id grants
// nothing more: 2 granted, not 4. The retry is the first answer that
// says the grant was applied: it answers it granted, not repeated (and
// the grant is logged and emitted then; before, it never was, nor
// announced to the other instances); a second retry is repeated. Another instance's store
// sending the same id grants nothing either.
func TestGrantRetriedAfterStall(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(quotaSite(srv.Addr, "timeout 300ms", "on_storage_error deny"), "caddyfile")
	if got, want := statuses(t, tester, 3, []string{"/"}, "X-Client: stall"), "200 200 200 "; got != want {
		t.Fatalf("before the grant: %q, want %q", got, want)
	}
	srv.Pause()
	code, ans := postGrant(t, "stall", 2, "grant-stall-1")
	srv.Resume()
	if code != 503 || !strings.Contains(ans.Error, `same id "grant-stall-1"`) {
		t.Fatalf("grant while Redis is frozen: status %d, %+v; want 503 saying to send it again with the same id", code, ans)
	}
	waitFor(t, "the frozen grant to land", func() bool {
		var st adminapi.KeyState
		return adminDo(t, http.MethodGet, "/rate_limit/zones/quota/keys/stall", &st) == 200 && st.Remaining == 2
	})
	// The retry, as the CLI's: again while the breaker, open since the
	// stall, has not yet let a probe through.
	waitFor(t, "the retry to be answered", func() bool {
		code, ans = postGrant(t, "stall", 2, "grant-stall-1")
		return code != 503
	})
	if code != 200 || ans.Repeated || ans.State.Remaining != 2 {
		t.Fatalf("the retry: status %d, %+v; want 200, not repeated (its first answer), 2 remaining", code, ans)
	}
	if code, ans = postGrant(t, "stall", 2, "grant-stall-1"); code != 200 || !ans.Repeated || ans.State.Remaining != 2 {
		t.Fatalf("a second retry: status %d, %+v; want 200, repeated, 2 remaining", code, ans)
	}
	// Another instance on the same Redis, the same id: nothing more.
	c := srv.Client()
	other := redisstore.New(c, redisstore.DefaultPrefix).WithDenyCache(c)
	defer other.Close()
	l, err := algorithms.NewLimit(algorithms.FixedWindow, 3, 24*time.Hour, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	z := other.Zone(storage.Zone{Name: "quota", Limit: l}).(storage.OnceGranter)
	if _, applied, err := z.GrantOnce(context.Background(), "stall", 0, 2*algorithms.Milli, "grant-stall-1"); err != nil || applied {
		t.Fatalf("the same id from another instance: applied %v, err %v; want not applied", applied, err)
	}
	if got, want := statuses(t, tester, 3, []string{"/"}, "X-Client: stall"), "200 200 429 "; got != want {
		t.Fatalf("after the grant: %q, want %q (granted once)", got, want)
	}
}

// TestLocalCopyFollowsGrant: with on_storage_error local, a spent key
// (3 a day) granted 5 that used 3 of it through Redis gets 2 more from
// the local copy while Redis is frozen, and one granted 5 that used 1
// gets 4: the local copy follows the grant as it follows any decision. Before,
// the local copy took the grant as a reset with extra room and admitted 5 to
// both.
func TestLocalCopyFollowsGrant(t *testing.T) {
	srv := redistest.Start(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(quotaSite(srv.Addr, "timeout 300ms", "on_storage_error local"), "caddyfile")
	for _, c := range []struct {
		key  string
		used int
	}{
		{"used3", 3},
		{"used1", 1},
	} {
		if got, want := statuses(t, tester, 4, []string{"/"}, "X-Client: "+c.key), "200 200 200 429 "; got != want {
			t.Fatalf("%s: spending the key: %q, want %q", c.key, got, want)
		}
		if code, ans := postGrant(t, c.key, 5, ""); code != 200 || ans.State.Remaining != 5 {
			t.Fatalf("%s: grant: status %d, %+v; want 200, 5 remaining", c.key, code, ans)
		}
		if got, want := statuses(t, tester, c.used, []string{"/"}, "X-Client: "+c.key), strings.Repeat("200 ", c.used); got != want {
			t.Fatalf("%s: using the grant through Redis: %q, want %q", c.key, got, want)
		}
	}
	srv.Pause()
	defer srv.Resume()
	for _, c := range []struct {
		key, want string
	}{
		{"used3", "200 200 429 "},
		{"used1", "200 200 200 200 429 "},
	} {
		if got := statuses(t, tester, strings.Count(c.want, " "), []string{"/"}, "X-Client: "+c.key); got != c.want {
			t.Errorf("%s: while Redis is frozen: %q, want %q (limit + grant, no more, no less)", c.key, got, c.want)
		}
	}
}

// doJSON sends req and decodes its JSON answer into out.
func doJSON(t *testing.T, req *http.Request, out any) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Errorf("%s %s: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode
}
