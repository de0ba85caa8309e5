// Package authrecipes tests recipes.md's JWT recipe through a real Caddy
// built with Tollgate and caddy-security. It is a Go module of its own so
// that caddy-security and its dependencies stay out of Tollgate's module
// graph (and so out of every Caddy built with Tollgate).
package authrecipes

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/golang-jwt/jwt/v5"
	_ "github.com/greenpau/caddy-security"

	_ "github.com/caddy-tollgate/tollgate"
)

// secret is the HMAC key the policy verifies tokens with.
const secret = "0e2fdcf8-6868-41a7-884b-7308795fc286"

// token returns a bearer token for sub with the role authp/user, signed
// with key.
func token(t *testing.T, sub, key string) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub":   sub,
		"roles": []string{"authp/user"},
		"exp":   time.Now().Add(time.Hour).Unix(),
		"iat":   time.Now().Unix(),
	}).SignedString([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + s
}

// config is the recipe on caddytest's ports, with route the inside of its
// route block.
func config(route string) string {
	return `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
	auto_https off
	security {
		authorization policy api {
			crypto key verify ` + secret + `
			set token sources header
			validate bearer header
			disable auth redirect
			allow roles authp/user
		}
	}
}

localhost:9080 {
	route {
` + route + `
		respond "ok"
	}
}
`
}

const (
	authorize = "\t\tauthorize with api\n"
	rateLimit = `		rate_limit {
			zone per_user {
				key {http.auth.user.id}
				rate 2/h
			}
		}
`
)

// TestKeyFromJWT: behind `authorize` in a route, a zone keyed by
// {http.auth.user.id} limits each token's subject on its own; a token
// that claims another user's subject without the key is refused before
// the zone and takes nothing from that user's budget.
func TestKeyFromJWT(t *testing.T) {
	alice, mallory := token(t, "alice", secret), token(t, "mallory", secret)
	forged := token(t, "alice", "not-the-secret")
	type step struct {
		who, auth string
		status    int
		limit     string // RateLimit, "" when the zone did not apply
	}
	for _, c := range []struct {
		name, route string
		steps       []step
	}{
		{"authorize first", authorize + rateLimit, []step{
			{"mallory", mallory, 200, `"per_user";r=1;t=1800`},
			{"mallory", mallory, 200, `"per_user";r=0;t=3600`},
			{"mallory", mallory, 429, `"per_user";r=0;t=1800`},
			{"alice forged by mallory", forged, 401, ""},
			{"alice forged by mallory", forged, 401, ""},
			{"no token", "", 401, ""},
			{"alice", alice, 200, `"per_user";r=1;t=1800`},
		}},
		// rate_limit first: the key is empty, one budget for everyone,
		// spent by mallory and by requests that authorize then refuses.
		{"rate_limit first", rateLimit + authorize, []step{
			{"mallory", mallory, 200, `"per_user";r=1;t=1800`},
			{"alice forged by mallory", forged, 401, `"per_user";r=0;t=3600`},
			{"alice", alice, 429, `"per_user";r=0;t=1800`},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tester := caddytest.NewTester(t)
			tester.InitServer(config(c.route), "caddyfile")
			for i, s := range c.steps {
				req, err := http.NewRequest(http.MethodGet, "http://localhost:9080/", nil)
				if err != nil {
					t.Fatal(err)
				}
				if s.auth != "" {
					req.Header.Set("Authorization", s.auth)
				}
				resp, err := tester.Client.Do(req)
				if err != nil {
					t.Fatalf("step %d (%s): %v", i, s.who, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got := fmt.Sprintf("%d %q", resp.StatusCode, resp.Header.Get("RateLimit"))
				if want := fmt.Sprintf("%d %q", s.status, s.limit); got != want {
					t.Errorf("step %d (%s): got %s, want %s", i, s.who, got, want)
				}
			}
		})
	}
}

// TestJWTRecipeLoads adapts and validates the JWT recipe as recipes.md
// writes it (the docs test, built without caddy-security, leaves it to
// this module): the block after <!-- module: internal/authrecipes -->.
func TestJWTRecipeLoads(t *testing.T) {
	page, err := os.ReadFile("../../docs/recipes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(page), "<!-- module: internal/authrecipes -->\n```caddyfile\n")
	if !ok {
		t.Fatal("recipes.md has no caddyfile block marked <!-- module: internal/authrecipes -->")
	}
	block, _, _ := strings.Cut(rest, "\n```\n")
	t.Setenv("JWT_SHARED_KEY", secret)
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(block), map[string]any{"filename": "recipes.md"})
	if err != nil {
		t.Fatalf("adapt the JWT recipe: %v", err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Fatalf("validate the JWT recipe: %v", err)
	}
	if !strings.Contains(string(out), `"key":"{http.auth.user.id}"`) {
		t.Errorf("the JWT recipe's zone is not keyed by {http.auth.user.id}: %s", out)
	}
}
