package tollgate

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// Issue 45's tests: budgets per model, costs as expressions, the usage of
// each LLM API's answers, streamed and not, and budgets in money.

// providerUpstream is an LLM API backend: it reads the request's JSON
// body whole (400 if it cannot) and answers with the canned answer the
// request's X-Answer names, as an event stream when the answer's first
// line starts with "event:" or "data:".
func providerUpstream(t *testing.T, answers map[string]string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var doc map[string]any
		if err := json.NewDecoder(r.Body).Decode(&doc); err != nil {
			http.Error(w, "bad body: "+err.Error(), http.StatusBadRequest)
			return
		}
		name := r.Header.Get("X-Answer")
		answer, ok := answers[name]
		if !ok {
			http.Error(w, "no answer "+name, http.StatusBadRequest)
			return
		}
		if strings.HasPrefix(answer, "event:") || strings.HasPrefix(answer, "data:") {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range strings.SplitAfter(answer, "\n\n") {
				io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
	t.Cleanup(s.Close)
	return s
}

// llmPost sends body to path with the API key and the canned answer's
// name, reads the answer whole, and fails on a 400 (the upstream did not
// get the body whole).
func llmPost(t *testing.T, tester *caddytest.Tester, step, path, apiKey, answer, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Answer", answer)
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusBadRequest {
		t.Fatalf("%s: the upstream refused: %s", step, b)
	}
	return resp
}

// TestBudgetPerModel: one API key, two models, each with its own budget
// (the model in the key, and a tier per model from the request's JSON),
// on memory and on Redis; a body whose model keys disagree names no
// model (it gets the zone's default rate, under its own key).
func TestBudgetPerModel(t *testing.T) {
	for name, storage := range multiZoneStores(t) {
		t.Run(name, func(t *testing.T) {
			up := providerUpstream(t, map[string]string{"none": `{}`})
			tester := caddytest.NewTester(t)
			tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone tokens {
				key {http.request.header.Authorization}:{http.rate_limit.request.json.model}
				rate 1000/h
				tier {http.rate_limit.request.json.model} {
					big-model 100/h
				}
				cost {http.rate_limit.request.json.max_tokens}
				default_cost 10
			}
			`+storage(t)+`
		}
		header >X-Model-Seen {http.rate_limit.request.json.model}
		reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
	}`, "caddyfile")
			k := "key-" + name
			for i, c := range []struct {
				body   string
				status int
				r      int64 // remaining after, when admitted
				model  string
			}{
				{`{"model":"big-model","max_tokens":60}`, 200, 40, "big-model"},
				{`{"model":"small-model","max_tokens":60}`, 200, 940, "small-model"},
				{`{"model":"big-model","max_tokens":60}`, 429, 0, "big-model"},
				{`{"model":"small-model","max_tokens":600}`, 200, 340, "small-model"},
				{`{"model":"big-model","max_tokens":40}`, 200, 0, "big-model"},
				// The model keys disagree: no model, its own key and the
				// zone's rate (1000).
				{`{"model":"small-model","MODEL":"big-model","max_tokens":10}`, 200, 990, ""},
			} {
				step := fmt.Sprintf("step %d: %s", i, c.body)
				resp := llmPost(t, tester, step, "/v1/chat/completions", k, "none", c.body)
				if resp.StatusCode != c.status {
					t.Fatalf("%s: status %d, want %d", step, resp.StatusCode, c.status)
				}
				if c.status != 200 {
					continue
				}
				if r := remaining(t, resp); r != c.r {
					t.Errorf("%s: r = %d, want %d", step, r, c.r)
				}
				if got := resp.Header.Get("X-Model-Seen"); got != c.model {
					t.Errorf("%s: {http.rate_limit.request.json.model} after the limiter = %q, want %q", step, got, c.model)
				}
			}
		})
	}
}
