package bodyscan

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// The bounds are checked at their edge: the largest input kept is read
// whole, and one byte more is not.

// padded returns a JSON document of exactly n bytes holding
// usage.total_tokens 7 (n at least 60).
func padded(n int) string {
	head, tail := `{"usage":{"total_tokens":7},"pad":"`, `"}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// TestJSONBodyBound: a JSON response body of maxJSONScan bytes is read,
// one of a byte more keeps the estimate, however it is split.
func TestJSONBodyBound(t *testing.T) {
	for _, c := range []struct {
		size int
		want string
	}{{maxJSONScan, "7"}, {maxJSONScan + 1, ""}} {
		body := []byte(padded(c.size))
		for _, step := range []int{len(body), 1000, 1 << 16} {
			s := New([]string{"usage.total_tokens"})
			for i := 0; i < len(body); i += step {
				s.Feed(http.Header{}, body[i:min(len(body), i+step)])
			}
			if got := finish(s)["usage.total_tokens"]; got != c.want {
				t.Errorf("a JSON body of %d bytes in writes of %d: usage.total_tokens = %q, want %q", c.size, step, got, c.want)
			}
		}
	}
}

// twoLines returns a JSON document holding usage.total_tokens 7 as two
// data lines, of n bytes when each is followed by its LF (as the SSE
// specification's data buffer holds them).
func twoLines(n int) (string, string) {
	first := `{"usage":{"total_tokens":7},`
	return first, `"pad":"` + strings.Repeat("x", n-len(first)-2-len(`"pad":""}`)) + `"}`
}

// TestEventBound: an event's data is kept up to maxEventScan bytes,
// counting the LF after each data line (so a single data line of
// maxEventScan-1 bytes), whether its lines come whole in a write or
// split; an event over it is skipped, and the next one read.
func TestEventBound(t *testing.T) {
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	atBound1, atBound2 := twoLines(maxEventScan)
	overBound1, overBound2 := twoLines(maxEventScan + 1)
	for _, c := range []struct {
		name   string
		stream string
		want   string
	}{
		{"one line at the bound", "data: " + padded(maxEventScan-1) + "\n\n", "7"},
		{"one line over the bound", "data: " + padded(maxEventScan) + "\n\n", ""},
		{"one line at the bound, no space", "data:" + padded(maxEventScan-1) + "\n\n", "7"},
		{"a field data without a colon first, at the bound", "data\ndata: " + padded(maxEventScan-2) + "\n\n", "7"},
		{"a field data without a colon first, over the bound", "data\ndata: " + padded(maxEventScan-1) + "\n\n", ""},
		{"a comment and an id first, at the bound", ": c\nid: 1\ndata: " + padded(maxEventScan-1) + "\n\n", "7"},
		{"two lines at the bound", "data: " + atBound1 + "\ndata: " + atBound2 + "\n\n", "7"},
		{"two lines over the bound", "data: " + overBound1 + "\ndata: " + overBound2 + "\n\n", ""},
		{"after a skipped event", "data: " + overBound1 + "\ndata: " + overBound2 + "\n\n" + `data: {"usage":{"total_tokens":8}}` + "\n\n", "8"},
	} {
		for _, step := range []int{len(c.stream), 1 << 10, 7919} {
			s := New([]string{"usage.total_tokens"})
			for i := 0; i < len(c.stream); i += step {
				s.Feed(sse, []byte(c.stream[i:min(len(c.stream), i+step)]))
			}
			if got := finish(s)["usage.total_tokens"]; got != c.want {
				t.Errorf("%s, writes of %d: usage.total_tokens = %q, want %q", c.name, step, got, c.want)
			}
		}
	}
}

// TestLineBound: a line is kept up to maxLineScan bytes, whole in a
// write or split over writes; a longer line skips its event.
func TestLineBound(t *testing.T) {
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	data := `data: {"usage":{"total_tokens":7}}` + "\n"
	for _, c := range []struct {
		name   string
		stream string
		want   string
	}{
		{"a comment at the bound", ": " + strings.Repeat("c", maxLineScan-2) + "\n" + data + "\n", "7"},
		{"a comment over the bound", ": " + strings.Repeat("c", maxLineScan-1) + "\n" + data + "\n", ""},
		{"an id at the bound", "id: " + strings.Repeat("1", maxLineScan-4) + "\n" + data + "\n", "7"},
		{"an id over the bound", "id: " + strings.Repeat("1", maxLineScan-3) + "\n" + data + "\n", ""},
	} {
		for _, step := range []int{len(c.stream), 1000} {
			s := New([]string{"usage.total_tokens"})
			for i := 0; i < len(c.stream); i += step {
				s.Feed(sse, []byte(c.stream[i:min(len(c.stream), i+step)]))
			}
			if got := finish(s)["usage.total_tokens"]; got != c.want {
				t.Errorf("%s, writes of %d: usage.total_tokens = %q, want %q", c.name, step, got, c.want)
			}
		}
	}
}

// TestJSONDepthBound: nesting as deep as encoding/json allows is valid,
// a level deeper is not, as json.Valid says.
func TestJSONDepthBound(t *testing.T) {
	for _, depth := range []int{maxJSONDepth, maxJSONDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			close := map[string]string{"[": "]", `{"a":`: "}"}[open]
			doc := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(close, depth))
			if got, want := jsonValid(doc), json.Valid(doc); got != want {
				t.Errorf("%d levels of %s: jsonValid %v, json.Valid %v", depth, open, got, want)
			}
		}
	}
}
