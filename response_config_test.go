package tollgate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestResponseOptionsBadValues: count_response and cost_response's bad
// values fail `caddy adapt` with the file and line of the option, and the
// same values in JSON fail at provision with the same message. The line
// marked "# <-" is where the error must point.
func TestResponseOptionsBadValues(t *testing.T) {
	cases := []struct {
		name      string
		caddyfile string // the rate_limit block's body
		json      string // the handler's fields; "" for a Caddyfile-only case
		want      string
	}{
		{"status not a code", "zone z {\n\trate 5/m\n\tcount_response status 42 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "count_response": {"status_code": [42]}}}`, "count_response: status 42 is neither a class"},
		{"status not a number", "zone z {\n\trate 5/m\n\tcount_response status abc # <-\n}",
			"", "bad status value 'abc'"},
		{"empty matcher", "zone z {\n\trate 5/m\n\tcount_response { # <-\n\t}\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "count_response": {}}}`, "count_response: give a status or a header to match"},
		{"unknown matcher", "zone z {\n\trate 5/m\n\tcount_response {\n\t\tpath /x # <-\n\t}\n}",
			"", "unrecognized response matcher path"},
		{"count_response without a rate", "zone z {\n\tconcurrency 2\n\tcount_response status 401 # <-\n}",
			`"rate_limits": {"z": {"concurrency": 2, "count_response": {"status_code": [401]}}}`, "count_response: needs a rate"},
		{"cost_response a number", "zone z {\n\trate 5/m\n\tcost_response 5 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "cost_response": "5"}}`, `cost_response: must be a placeholder template such as {http.response.header.X-Usage}, got "5"`},
		{"cost_response on sliding_log", "zone z {\n\talgorithm sliding_log\n\trate 5/m\n\tcost_response {http.response.size} # <-\n}",
			`"rate_limits": {"z": {"algorithm": "sliding_log", "events": 5, "window": "1m", "cost_response": "{http.response.size}"}}`, "cost_response: sliding_log keeps one timestamp per admitted event"},
		{"cost_response empty json path", "zone z {\n\trate 5/m\n\tcost_response {http.rate_limit.response.json.usage..total} # <-\n}",
			`"rate_limits": {"z": {"algorithm": "token_bucket", "events": 5, "window": "1m", "cost_response": "{http.rate_limit.response.json.usage..total}"}}`, "has no empty segment"},
		{"cost_response twice", "zone z {\n\trate 5/m\n\tcost_response {http.response.size}\n\tcost_response {http.response.size} # <-\n}",
			"", "option 'cost_response' given twice"},
		{"cost_response no argument", "zone z {\n\trate 5/m\n\tcost_response # <-\n}",
			"", "wrong argument count"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			site := ":8080 {\n\trate_limit {\n" + c.caddyfile + "\n\t}\n\trespond ok\n}\n"
			line := 2
			for i, l := range strings.Split(site, "\n") {
				if strings.HasSuffix(l, "# <-") {
					line = i + 1
				}
			}
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), map[string]any{"filename": "Caddyfile"})
			at := fmt.Sprintf(", at Caddyfile:%d", line)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasSuffix(err.Error(), at) {
				t.Errorf("adapt = %v, want an error containing %q and ending %q", err, c.want, at)
			}
			if c.json == "" {
				return
			}
			cfg := `{"apps": {"http": {"servers": {"s": {"listen": [":8080"], "routes": [{"handle": [{"handler": "rate_limit", ` + c.json + `}]}]}}}}}`
			if err := validateJSON([]byte(cfg)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("JSON: provision = %v, want an error containing %q", err, c.want)
			}
		})
	}
}
