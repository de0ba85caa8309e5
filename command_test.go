package tollgate

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// runCLI runs `caddy rate-limit args...` as Caddy's command line would,
// from the command's registration, and returns what it printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c, ok := caddycmd.Commands()["rate-limit"]
	if !ok {
		t.Fatal("no command rate-limit registered")
	}
	cmd := &cobra.Command{Use: c.Name, Short: c.Short, SilenceUsage: true, SilenceErrors: true}
	c.CobraFunc(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// adminBody is the raw answer of the admin API to GET path.
func adminBody(t *testing.T, path string) string {
	t.Helper()
	resp, err := http.Get(adminBase + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", path, resp.StatusCode, body)
	}
	return string(body)
}

func TestRateLimitCommand(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone cli {
				key {http.request.header.X-Key}
				ipv6_prefix 64
				rate 5/h
			}
		}
		respond "ok"
	}`, "caddyfile")

	// Keys that a hand-made curl call gets wrong, each with the key the
	// zone stores, and the requests it made.
	keys := []struct {
		name, key, stored string
		requests          int
	}{
		{"slash and space", "a/b c", "a/b c", 1},
		{"double slash", "a//b", "a//b", 2},
		{"percent, query and fragment", "100%?x#y", "100%?x#y", 1},
		{"dot-dot", "..", "..", 1},
		{"dot", ".", ".", 1},
		{"IPv6 address, grouped by ipv6_prefix", "2001:db8::1", "2001:db8::/64", 3},
		{"IPv4 address", "203.0.113.7", "203.0.113.7", 1},
		{"unicode", "ключ", "ключ", 1},
	}
	for _, k := range keys {
		for range k.requests {
			get(t, tester, "/", "X-Key: "+k.key)
		}
	}

	// zones prints the API's answer, byte for byte.
	out, err := runCLI(t, "--address", "localhost:2999", "zones")
	if err != nil {
		t.Fatalf("rate-limit zones: %v", err)
	}
	if want := adminBody(t, "/rate_limit/zones"); out != want {
		t.Errorf("rate-limit zones printed %q, want the API's %q", out, want)
	}
	if !strings.Contains(out, `"zone":"cli"`) || !strings.Contains(out, `"keys":8`) {
		t.Errorf("rate-limit zones printed %q, want zone cli with 8 keys", out)
	}

	for _, k := range keys {
		out, err := runCLI(t, "--address", "localhost:2999", "show", "cli", k.key)
		if err != nil {
			t.Errorf("show %s: %v", k.name, err)
			continue
		}
		var got struct {
			Zone      string `json:"zone"`
			Key       string `json:"key"`
			Remaining int64  `json:"remaining"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Errorf("show %s: %v in %q", k.name, err, out)
			continue
		}
		if got.Zone != "cli" || got.Key != k.stored || got.Remaining != int64(5-k.requests) {
			t.Errorf("show %s: got zone %q key %q remaining %d, want cli %q %d (printed %q)",
				k.name, got.Zone, got.Key, got.Remaining, k.stored, 5-k.requests, out)
		}
	}

	for _, k := range keys {
		out, err := runCLI(t, "--address", "localhost:2999", "reset", "cli", k.key)
		if err != nil {
			t.Errorf("reset %s: %v", k.name, err)
			continue
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil || got["key"] != k.stored || got["reset"] != true {
			t.Errorf("reset %s: printed %q, want key %q reset true", k.name, out, k.stored)
		}
		_, err = runCLI(t, "--address", "localhost:2999", "show", "cli", k.key)
		if err == nil || !strings.Contains(err.Error(), "HTTP 404") || !strings.Contains(err.Error(), "holds no key") {
			t.Errorf("show %s after reset: error %v, want the API's 404", k.name, err)
		}
	}

	// Errors: an unknown zone quotes the API; wrong arguments and an
	// admin endpoint that is not there fail before or at the request.
	if _, err := runCLI(t, "--address", "localhost:2999", "show", "nozone", "k"); err == nil || !strings.Contains(err.Error(), `unknown zone \"nozone\"`) {
		t.Errorf("show in unknown zone: error %v, want the API's unknown zone", err)
	}
	if _, err := runCLI(t, "--address", "localhost:2999", "show", "cli"); err == nil {
		t.Error("show with one argument: no error")
	}
	if _, err := runCLI(t, "--address", "localhost:2999", "zones", "extra"); err == nil {
		t.Error("zones with an argument: no error")
	}
	ln, err := net.Listen("tcp", "localhost:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if _, err := runCLI(t, "--address", closed, "zones"); err == nil {
		t.Errorf("zones at %s, where nothing listens: no error", closed)
	}
}

func TestKeyURI(t *testing.T) {
	for _, c := range []struct{ zone, key, want string }{
		{"api", "customer-42", "/rate_limit/zones/api/keys/customer-42"},
		{"api", "a/b c", "/rate_limit/zones/api/keys/a%2Fb%20c"},
		{"api", "100%?x#y", "/rate_limit/zones/api/keys/100%25%3Fx%23y"},
		{"api", "..", "/rate_limit/zones/api/keys/%2E%2E"},
		{"api", ".", "/rate_limit/zones/api/keys/%2E"},
		{"api", "a..b", "/rate_limit/zones/api/keys/a..b"},
		{"api", "2001:db8::1", "/rate_limit/zones/api/keys/2001:db8::1"},
		{"api", "", "/rate_limit/zones/api/keys/"},
	} {
		if got := keyURI(c.zone, "keys", c.key); got != c.want {
			t.Errorf("keyURI(%q, %q) = %q, want %q", c.zone, c.key, got, c.want)
		}
	}
}

// TestGrantAmountChecked: `caddy rate-limit grant` refuses an amount that
// is not a number of events > 0 before it asks the API.
func TestGrantAmountChecked(t *testing.T) {
	for _, amount := range []string{"0", "-5", "lots", "NaN", "Inf"} {
		var out strings.Builder
		err := rateLimitRequest(&out, "localhost:1", "POST", "keys", "", []string{"z", "k", amount})
		if err == nil || !strings.Contains(err.Error(), "grant: amount must be a number of events > 0") {
			t.Errorf("grant z k %s: %v, want the amount refused", amount, err)
		}
	}
}
