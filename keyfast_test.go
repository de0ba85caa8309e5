package tollgate

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
)

// TestHeaderKeyMatchesTheReplacer: a key that is exactly one request
// header is read without the replacer, and must resolve to what the
// replacer makes of it: absent, once, several times, in any case.
func TestHeaderKeyMatchesTheReplacer(t *testing.T) {
	for _, c := range []struct{ template, header string }{
		{"{http.request.header.X-API-Key}", "X-Api-Key"},
		{"{http.request.header.x-api-key}", "X-Api-Key"},
		{"{http.request.header.Authorization}", "Authorization"},
		{"{http.request.header.X-Key:default}", ""}, // a default value: the replacer's
		{"{http.request.header.X-Key}-{http.request.header.Y}", ""},
		{"key-{http.request.header.X-Key}", ""},
		{"{http.request.header.}", ""},
		{"{http.request.host}", ""},
	} {
		if got := headerKey(c.template); got != c.header {
			t.Errorf("headerKey(%q) = %q, want %q", c.template, got, c.header)
		}
		for _, values := range [][]string{nil, {"one"}, {"one", "two"}, {""}, {"a,b", "c"}} {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, v := range values {
				r.Header.Add("X-API-Key", v)
				r.Header.Add("Authorization", v)
				r.Header.Add("X-Key", v)
			}
			repl := caddy.NewReplacer()
			r = caddyhttp.PrepareRequest(r, repl, nil, nil)
			fast := &zone{key: c.template, header: headerKey(c.template), v4bits: 32, v6bits: 128}
			slow := &zone{key: c.template, v4bits: 32, v6bits: 128}
			if f, s := fast.resolveKey(r, repl), slow.resolveKey(r, repl); f != s {
				t.Errorf("%s with %q: %q without the replacer, %q with it", c.template, values, f, s)
			}
		}
	}
}

// TestIETFValueBeyondItsBuffer: a RateLimit value longer than the stack
// buffer (several zones with long names) is written whole.
func TestIETFValueBeyondItsBuffer(t *testing.T) {
	h := &Handler{headers: ratelimitheader.ModeIETF}
	var results []result
	want := ""
	for i, name := range []string{"a-zone-with-a-rather-long-name-0123456789012345678901234", "b-zone-with-a-rather-long-name-0123456789012345678901234", "c-zone-with-a-rather-long-name-0123456789012345678901234"} {
		z := &zone{name: name, quota: ratelimitheader.Quota{Name: name, Policy: `"` + name + `";q=1;w=1`}}
		z.base, z.quota.Limit = z, &z.spec.Limit
		results = append(results, result{Z: z, Zone: &z.Zone, D: algorithms.Decision{Allowed: true, Remaining: int64(i), Reset: 1}})
		if i > 0 {
			want += ", "
		}
		want += `"` + name + `";r=` + strconv.Itoa(i) + ";t=1"
	}
	hdr := http.Header{}
	h.writeHeaders(hdr, results, -1, -1, 0)
	if got := hdr.Get("RateLimit"); got != want || len(want) <= 160 {
		t.Errorf("RateLimit = %q (%d bytes), want %q", got, len(got), want)
	}
}
