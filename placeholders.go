package tollgate

import (
	"strings"

	"github.com/caddyserver/caddy/v2"
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
}

const (
	placeholderPrefix = "http.rate_limit."
	// placeholdersSelf is where a handler finds the provider an earlier
	// handler of the same request added: a name no placeholder of a
	// Caddyfile can spell.
	placeholdersSelf = placeholderPrefix + "\x00"
)

// placeholdersOf returns the placeholders of the request whose replacer is
// repl, adding their provider to it if no handler has yet.
func placeholdersOf(repl *caddy.Replacer) *placeholders {
	if v, ok := repl.Get(placeholdersSelf); ok {
		if p, ok := v.(*placeholders); ok {
			return p
		}
	}
	p := &placeholders{retryAfter: -1}
	repl.Map(p.get)
	return p
}

// setQuota reports res's zone's limit and remaining: on an allowed request
// the most restrictive zone's, on a rejected one the rejecting zone's.
func (p *placeholders) setQuota(res *result) {
	p.quota, p.remaining = res.z, res.d.Remaining
}

// get is the provider: it answers {http.rate_limit.limit} and
// {http.rate_limit.remaining} once a zone reported them, and
// {http.rate_limit.zone}, {http.rate_limit.exceeded.name} and
// {http.rate_limit.retry_after} (empty when no wait can be given) once a
// zone rejected the request.
func (p *placeholders) get(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	switch name {
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
	case placeholdersSelf[len(placeholderPrefix):]:
		return p, true
	}
	return nil, false
}

// String keeps the provider's own entry empty should a config name it.
func (p *placeholders) String() string { return "" }
