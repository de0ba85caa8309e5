package zoneconf

import (
	"fmt"
	"strings"

	"github.com/caddy-tollgate/tollgate/internal/costexpr"
)

// Response is a zone's count_response and cost_response, checked: what a
// response settles a request's charge to.
type Response struct {
	// Cost is the cost_response expression, or nil.
	Cost *costexpr.Expr
	// JSON are the dotted paths of the {http.rate_limit.response.json.*}
	// placeholders in Cost: the numbers the body scanner looks for.
	JSON []string
	// Headers: count_response or cost_response reads the response's
	// headers, which must then be kept as the upstream wrote them.
	Headers bool
}

// ResponseHeaderPrefix starts Caddy's placeholders of a response header.
const ResponseHeaderPrefix = "http.response.header."

// ResponseJSONPrefix starts the placeholders of a number in the response
// body.
const ResponseJSONPrefix = "http.rate_limit.response.json."

// RequestSize is the placeholder of the size in bytes of the request's
// JSON document, once read.
const RequestSize = "http.rate_limit.request.size"

// RequestJSONPrefix starts the placeholders of a number in the request's
// JSON body.
const RequestJSONPrefix = "http.rate_limit.request.json."

// response checks count_response and cost_response and parses them into
// s.Response.
func (zc *Zone) response(s *Settings) error {
	if !zc.CountResponse && zc.CostResponse == "" {
		return nil
	}
	field := "count_response"
	if !zc.CountResponse {
		field = "cost_response"
	}
	if !s.Rate {
		return fmt.Errorf("%s: needs a rate (events and window); a zone with only concurrency counts requests in flight, not responses", field)
	}
	rule := &Response{}
	if zc.CountResponse {
		if zc.CountStatus == nil && !zc.CountHeaders {
			return fmt.Errorf("count_response: give a status or a header to match; an empty matcher matches every response")
		}
		for _, code := range zc.CountStatus {
			if (code < 1 || code > 5) && (code < 100 || code > 599) {
				return fmt.Errorf("count_response: status %d is neither a class (1 to 5, or 1xx to 5xx) nor a status code (100 to 599)", code)
			}
		}
	}
	if c := strings.TrimSpace(zc.CostResponse); c != "" {
		if !strings.Contains(c, "{") {
			return fmt.Errorf("cost_response: must be a placeholder template such as {http.response.header.X-Usage}, got %q", zc.CostResponse)
		}
		e, err := costexpr.Compile(c)
		if err != nil {
			return fmt.Errorf("cost_response: %w", err)
		}
		if err := s.Limit.CanSettle(); err != nil {
			return fmt.Errorf("cost_response: %w", err)
		}
		paths, err := JSONPaths(c, ResponseJSONPrefix)
		if err != nil {
			return fmt.Errorf("cost_response: %w", err)
		}
		rule.Cost, rule.JSON = e, paths
	}
	rule.Headers = (zc.CountResponse && zc.CountHeaders) || strings.Contains(zc.CostResponse, "{"+ResponseHeaderPrefix)
	s.Response = rule
	return nil
}

// JSONPaths returns the dotted paths of the placeholders starting with
// prefix (a body-number placeholder's) in a template, checking each.
func JSONPaths(tmpl, prefix string) ([]string, error) {
	var paths []string
	for rest := tmpl; ; {
		i := strings.Index(rest, "{"+prefix)
		if i < 0 {
			return paths, nil
		}
		rest = rest[i+1+len(prefix):]
		end := strings.IndexAny(rest, "}:")
		if end < 0 {
			return nil, fmt.Errorf("unclosed placeholder {%s%s", prefix, rest)
		}
		path := rest[:end]
		for _, seg := range strings.Split(path, ".") {
			if seg == "" {
				return nil, fmt.Errorf("{%s%s}: a dotted path of names, such as usage.total_tokens, has no empty segment", prefix, path)
			}
		}
		paths = append(paths, path)
		rest = rest[end:]
	}
}
