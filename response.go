package tollgate

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/bodyscan"
	"github.com/caddy-tollgate/tollgate/internal/costexpr"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

// Limits on what the response says (count_response, cost_response): the
// zone reserves the request's cost when it arrives, as any zone charges
// it, and settles the charge when the rest of the handler chain returns,
// in whatever way: given back when the response does not match, settled
// to the actual cost the response tells. Only a request that a zone with
// these options admitted goes through serveSettled; every other request's
// path is untouched.

// responseRule is a zone's count_response and cost_response, parsed.
type responseRule struct {
	match *caddyhttp.ResponseMatcher // nil: every response counts
	cost  *costexpr.Expr             // cost_response, or nil
	// json are the dotted paths of the {http.rate_limit.response.json.*}
	// placeholders in cost: the numbers the body scanner looks for.
	json []string
	// headers: match or cost reads the response's headers, which the tap
	// then keeps as the upstream wrote them.
	headers bool
}

// unmarshalCountResponse parses `count_response <response matcher>`: the
// one-line form (`count_response status 401 403`) or a block (`status`,
// `header` lines), as reverse_proxy's named response matchers.
func unmarshalCountResponse(d *caddyfile.Dispenser) (*caddyhttp.ResponseMatcher, error) {
	m := map[string]caddyhttp.ResponseMatcher{}
	seg := d.NewFromNextSegment()
	if err := caddyhttp.ParseNamedResponseMatcher(seg, m); err != nil {
		return nil, err
	}
	rm, ok := m["count_response"]
	if !ok {
		return nil, d.ArgErr()
	}
	return &rm, nil
}

// checkSettlers refuses a zone with cost_response whose store cannot
// settle an excess (a storage module of another package); count_response
// alone gives back with Undo, which every store has.
func (h *Handler) checkSettlers(z *zone) error {
	if z.response == nil || z.response.cost == nil {
		return nil
	}
	if _, ok := z.Limiter.(storage.Settler); !ok {
		return fmt.Errorf("cost_response: storage %T cannot settle a cost found after the response; use storage memory or redis", h.backend)
	}
	return nil
}

// settle settles each charge of results to what the response tells: its
// status and headers as the upstream wrote them (see responseTap), and
// its body's size and numbers.
func (h *Handler) settle(r *http.Request, results []result, tap *responseTap, status int) {
	repl := replacerOf(r)
	repl.Set("http.response.status", status)
	repl.Set("http.response.size", tap.size)
	if tap.scan != nil {
		tap.scan.Finish(func(path, num string) { repl.Set(zoneconf.ResponseJSONPrefix+path, num) })
	}
	header, costRepl := tap.header, repl
	if header == nil {
		header = tap.Header() // nothing written: what net/http sends
	} else if tap.keep {
		costRepl = writtenHeaders(repl, header)
	}
	shared.Settle(context.WithoutCancel(r.Context()), h.now(), results, func(z *zone, reserved int64) int64 {
		return z.base.response.actual(reserved, status, header, costRepl)
	}, h.logStoreError)
}

// actual is the settled cost of a request that reserved cost and ended with
// status and header: 0 for a response that does not match, the
// cost_response value if it reads as a cost, else the reservation.
func (rule *responseRule) actual(cost int64, status int, header http.Header, repl *caddy.Replacer) int64 {
	if rule.match != nil && !rule.match.Match(status, header) {
		return 0
	}
	if rule.cost != nil {
		if f, ok := rule.cost.Eval(repl.Get); ok {
			if m, ok := algorithms.CostMilli(f); ok {
				return m
			}
		}
	}
	return cost
}

// writtenHeaders is a replacer for cost_response templates that answers
// {http.response.header.*} from header, the headers the upstream wrote
// (Caddy's own placeholder reads the response's headers now, after a
// `header` directive may have removed one), and every other placeholder
// from repl. The request's replacer is not changed: the handlers and logs
// after see the response as sent.
func writtenHeaders(repl *caddy.Replacer, header http.Header) *caddy.Replacer {
	r := caddy.NewEmptyReplacer()
	r.Map(func(key string) (any, bool) {
		if name, ok := strings.CutPrefix(key, zoneconf.ResponseHeaderPrefix); ok {
			return strings.Join(header[textproto.CanonicalMIMEHeaderKey(name)], ","), true
		}
		return repl.Get(key)
	})
	return r
}

// responseTap passes a response through unchanged, noting its status and
// headers as they are written, its body's size, and (for a body-number
// placeholder) scanning the body as it passes.
//
// The status and headers are taken when the handlers inside write them
// (reverse_proxy, as the upstream answered; `encode` adds its
// Content-Encoding first): a handler outside, such as a `header`
// directive that removes X-Usage from what clients see, changes them only
// after, on its way out.
type responseTap struct {
	caddyhttp.ResponseWriterWrapper
	status int
	wrote  bool        // the final status was written
	keep   bool        // a zone reads the headers: header keeps them
	header http.Header // the headers as written with the final status; nil before
	size   int64       // body bytes written
	clock  func() int64
	at     int64 // when the final status was written, by clock (µs); with a clock only
	scan   *bodyscan.Scanner
}

func newResponseTap(w http.ResponseWriter, results []result) *responseTap {
	t := &responseTap{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
	var paths []string
	for i := range results {
		if results[i].Settles() {
			rule := results[i].Z.base.response
			paths = append(paths, rule.json...)
			t.keep = t.keep || rule.headers
		}
	}
	if len(paths) > 0 {
		t.scan = bodyscan.New(paths)
	}
	return t
}

// wroteHeader notes the final status and the headers written with it: a
// copy when a zone reads them (the handlers outside may change the map),
// else the map, whose Content-Type and Content-Encoding the scanner reads
// before the body passes on.
func (t *responseTap) wroteHeader(code int) {
	t.status, t.wrote = code, true
	if t.clock != nil {
		t.at = t.clock()
	}
	if t.keep {
		t.header = t.Header().Clone()
	} else {
		t.header = t.Header()
	}
}

// WriteHeader notes the final status (not an informational 1xx) and its
// headers.
func (t *responseTap) WriteHeader(code int) {
	if !t.wrote && (code >= 200 || code == http.StatusSwitchingProtocols) {
		t.wroteHeader(code)
	}
	t.ResponseWriterWrapper.WriteHeader(code)
}

// Write counts the body's bytes as written to the client and scans them.
func (t *responseTap) Write(p []byte) (int, error) {
	if !t.wrote {
		t.wroteHeader(http.StatusOK)
	}
	n, err := t.ResponseWriterWrapper.Write(p)
	t.size += int64(n)
	if t.scan != nil && n > 0 {
		t.scan.Feed(t.header, p[:n])
	}
	return n, err
}

// ReadFrom keeps the underlying writer's ReadFrom (sendfile) when the
// body is only counted; a scanned body goes through Write.
func (t *responseTap) ReadFrom(r io.Reader) (int64, error) {
	if !t.wrote {
		t.wroteHeader(http.StatusOK)
	}
	if t.scan != nil {
		return io.Copy(writerOnly{t}, r)
	}
	n, err := t.ResponseWriterWrapper.ReadFrom(r)
	t.size += n
	return n, err
}

// writerOnly hides every method of a writer but Write (so that io.Copy
// does not call ReadFrom again).
type writerOnly struct{ io.Writer }

// Interface guards.
var (
	_ http.ResponseWriter = (*responseTap)(nil)
	_ io.ReaderFrom       = (*responseTap)(nil)
)
