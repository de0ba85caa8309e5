package tollgate

import (
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/internal/bodyscan"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
)

// placeholders are a request's {http.rate_limit.*} values, which later
// handlers and handle_errors read. They are served by a provider of the
// request's replacer (Replacer.Map) rather than put in its map of set
// values with Replacer.Set: that map stays empty, and unallocated, until
// something sets a value, and the first Set allocated it, about 280 bytes
// on every request, the largest allocation Tollgate made for an admitted
// request (and garbage that Caddy's collector then had to find). Every
// rate_limit handler of a request shares one provider, and the last one
// to decide sets what it reports, as with Set. A value set with Set still
// comes first: the replacer asks its map before any provider added later.
type placeholders struct {
	quota      *zone // the zone whose limit and remaining are reported; nil: none
	remaining  int64
	rejected   *zone // the zone that rejected the request; nil: none did
	retryAfter int64 // seconds; -1: none
	// requestJSON is the request's JSON body, once a zone that reads it
	// applied and it was one whole JSON document; nil before (see
	// readRequestJSON).
	requestJSON *requestJSON
}

// requestJSON is a request's JSON document and the values of the paths
// read from it so far: a key, a tier, a cost and a `map` may each ask for
// the same path, and each walk of a large document costs.
type requestJSON struct {
	doc  []byte
	mu   sync.Mutex // guards read: a placeholder may be read from any goroutine
	read []jsonValue
}

type jsonValue struct {
	path, val string
	ok        bool
}

// value is the value at path (see bodyscan.RequestValue).
func (j *requestJSON) value(path string) (string, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, v := range j.read {
		if v.path == path {
			return v.val, v.ok
		}
	}
	val, ok := bodyscan.ValidRequestValue(j.doc, path)
	if len(j.read) < maxJSONValues {
		j.read = append(j.read, jsonValue{path, val, ok})
	}
	return val, ok
}

// maxJSONValues bounds the values a request keeps (a config names a few
// paths; a log of every placeholder must not grow the request).
const maxJSONValues = 16

const placeholderPrefix = "http.rate_limit."

// placeholdersVar is the request variable (Caddy's vars, which every
// request has) under which a handler finds the placeholders an earlier
// handler of the same request added: a name that no `vars` directive or
// {http.vars.*} placeholder of a Caddyfile can spell. Asking the replacer
// instead walked all its providers, Caddy's largest among them, whose
// stack frame made request goroutines grow their stacks again.
const placeholdersVar = "\x00rate_limit"

// placeholdersOf returns the placeholders of r, whose replacer is repl,
// adding their provider to it if no handler has yet.
func placeholdersOf(r *http.Request, repl *caddy.Replacer) *placeholders {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if p, ok := vars[placeholdersVar].(*placeholders); ok {
		return p
	}
	p := &placeholders{retryAfter: -1}
	repl.Map(p.get)
	if vars != nil {
		vars[placeholdersVar] = p
	}
	return p
}

// setQuota reports res's zone's limit and remaining: on an allowed request
// the most restrictive zone's, on a rejected one the rejecting zone's.
func (p *placeholders) setQuota(res *result) {
	p.quota, p.remaining = res.Z, ratelimitheader.ShownRemaining(res.D.Remaining)
}

// get is the provider: it answers {http.rate_limit.limit} and
// {http.rate_limit.remaining} once a zone reported them, and
// {http.rate_limit.zone}, {http.rate_limit.exceeded.name} and
// {http.rate_limit.retry_after} (empty when no wait can be given) once a
// zone rejected the request; {http.rate_limit.request.json.<path>} once
// a zone read the request's JSON body, and {http.rate_limit.request.size},
// the size of its JSON document in bytes.
func (p *placeholders) get(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	if path, ok := strings.CutPrefix(key, zoneconf.RequestJSONPrefix); ok {
		if p.requestJSON == nil {
			return nil, false
		}
		if v, ok := p.requestJSON.value(path); ok {
			return v, true
		}
		return "", true // read, and missing: empty
	}
	switch name {
	case "request.size":
		if p.requestJSON != nil {
			return len(p.requestJSON.doc), true
		}
	case "limit":
		if p.quota != nil {
			return p.quota.limitValue, true
		}
	case "remaining":
		if p.quota != nil {
			return p.remaining, true // boxed only when read
		}
	case "zone", "exceeded.name":
		if p.rejected != nil {
			return p.rejected.name, true
		}
	case "retry_after":
		if p.rejected != nil {
			if p.retryAfter < 0 {
				return "", true
			}
			return p.retryAfter, true
		}
	}
	return nil, false
}

// String keeps the request variable empty should anything print it.
func (p *placeholders) String() string { return "" }

// readRequestJSON reads the request's JSON body (see
// bodyscan.ReadRequest) for its {http.rate_limit.request.json.*}
// placeholders, which then answer every path from it (see
// bodyscan.RequestValue), for the zones and for any handler or log after
// (a `map` from the model to its price). A body that is longer than the
// bound or not one whole JSON document answers no path: a cost is then
// default_cost, a key or tier holds the placeholder empty.
//
//go:noinline
func readRequestJSON(r *http.Request, repl *caddy.Replacer) {
	doc, ok := bodyscan.ReadRequest(r)
	if !ok || !bodyscan.Valid(doc) {
		return
	}
	placeholdersOf(r, repl).requestJSON = &requestJSON{doc: doc}
}
