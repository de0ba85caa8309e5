package tollgate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// sdkDir holds the official SDKs the tests drive (testdata/sdk, installed
// with `npm ci` there).
const sdkDir = "testdata/sdk"

// needSDK skips a test when node or the SDK package is not installed,
// except in CI (CI set), where it fails: CI installs them.
func needSDK(t *testing.T, pkg string) {
	t.Helper()
	_, nodeErr := exec.LookPath("node")
	_, pkgErr := os.Stat(filepath.Join(sdkDir, "node_modules", pkg, "package.json"))
	if nodeErr == nil && pkgErr == nil {
		return
	}
	why := fmt.Sprintf("node: %v; %s: %v (install with: cd %s && npm ci)", nodeErr, pkg, pkgErr, sdkDir)
	if os.Getenv("CI") != "" {
		t.Fatalf("CI must run the SDK tests: %s", why)
	}
	t.Skip(why)
}

// TestAnthropicSDK: Anthropic's official Node SDK (@anthropic-ai/sdk,
// the version pinned in testdata/sdk) through the limiter: a message and
// a streamed one are each settled to their input and output tokens (the
// stream's in message_start and message_delta), the SDK reads both
// answers whole, and a request over the budget reaches it as a 429
// (RateLimitError).
func TestAnthropicSDK(t *testing.T) {
	needSDK(t, "@anthropic-ai/sdk")
	up := providerUpstream(t, providerAnswers)
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone tokens {
				match path /v1/messages
				# Anthropic's SDK sends its key as x-api-key or, as this
				# version does, Authorization: Bearer.
				key {http.request.header.X-Api-Key}{http.request.header.Authorization}
				rate 100000/h
				cost "{http.rate_limit.request.json.max_tokens} * 4"
				cost_response "`+recipeAnthropic+`"
			}
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+` {
			flush_interval -1
		}
	}`, "caddyfile")
	sdk := func(mode, answer string, maxTokens int) map[string]any {
		t.Helper()
		cmd := exec.Command("node", "anthropic.mjs", base, mode, answer, fmt.Sprint(maxTokens))
		cmd.Dir = sdkDir
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("node anthropic.mjs %s %s: %v\n%s%s", mode, answer, err, out, stderr)
		}
		var res map[string]any
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("node anthropic.mjs %s %s printed %q: %v", mode, answer, out, err)
		}
		return res
	}
	// after reads what is left of the SDK's key with a request of 1000
	// output tokens (4000 reserved) answered without usage.
	after := func(step string) int64 {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(`{"model":"m","max_tokens":1000}`))
		req.Header.Set("Authorization", "Bearer sdk-key")
		req.Header.Set("X-Answer", "none")
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		resp.Body.Close()
		return remaining(t, resp)
	}
	spent := int64(0)
	for _, mode := range []string{"create", "stream"} {
		answer := "anthropic"
		if mode == "stream" {
			answer = "anthropic-stream"
		}
		res := sdk(mode, answer, 1000)
		usage, _ := res["usage"].(map[string]any)
		if res["status"] != 200.0 || usage["input_tokens"] != 1000.0 || usage["output_tokens"] != 200.0 || res["text"] != "hi" {
			t.Fatalf("SDK %s: %v, want status 200, the text and the usage of 1000 input and 200 output tokens", mode, res)
		}
		// 1000 + 400 × 0.1 + 200 × 4, then 4000 reserved and kept.
		spent += 1840
		if r, want := after(mode), 100000-spent-4000; r != want {
			t.Errorf("after the SDK's %s: r = %d, want %d (settled to 1840, then 4000 reserved)", mode, r, want)
		}
		spent += 4000
	}
	if res := sdk("stream", "anthropic-stream", 30000); res["status"] != 429.0 || res["name"] != "RateLimitError" {
		t.Errorf("SDK, 120,000 reserved of what is left: %v, want status 429, a RateLimitError", res)
	}
}
