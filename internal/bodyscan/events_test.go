package bodyscan

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// readStream feeds stream to a scanner for paths in writes cut at cuts
// (positions in stream, increasing) and returns what it found.
func readStream(paths []string, stream string, cuts ...int) map[string]string {
	s := New(paths)
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	at := 0
	for _, c := range append(cuts, len(stream)) {
		s.Feed(sse, []byte(stream[at:c]))
		at = c
	}
	return finish(s)
}

// TestEventDataWhiteSpace: an event's data is read as a JSON parser
// reads it, so white space before the object (a second space after the
// colon, a tab, data lines that are empty or white space before the
// object's) does not hide it; what JSON does not count as white space
// does.
func TestEventDataWhiteSpace(t *testing.T) {
	usage := `{"usage":{"total_tokens":7}}`
	for _, c := range []struct {
		name, stream, want string
	}{
		{"two spaces", "data:  " + usage + "\n\n", "7"},
		{"a tab", "data:\t" + usage + "\n\n", "7"},
		{"CR LF inside", "data: \t \n" + "data:" + usage + "\n\n", "7"},
		{"an empty data line first", "data:\ndata: " + usage + "\n\n", "7"},
		{"a field without a colon first", "data\ndata: " + usage + "\n\n", "7"},
		{"a blank data line first", "data:  \ndata: " + usage + "\n\n", "7"},
		{"a tab line first", "data: \t\ndata: " + usage + "\n\n", "7"},
		{"the object opened on its own line", "data: \ndata:  {\ndata: \"usage\":{\"total_tokens\":7}}\n\n", "7"},
		{"a vertical tab", "data: \v" + usage + "\n\n", ""},
		{"a no-break space", "data: \u00a0" + usage + "\n\n", ""},
		{"a form feed", "data: \f" + usage + "\n\n", ""},
		{"a field named data1", "data1: " + usage + "\n\n", ""},
		{"only white space", "data: \ndata: \t\n\n", ""},
	} {
		if got := readStream([]string{"usage.total_tokens"}, c.stream)["usage.total_tokens"]; got != c.want {
			t.Errorf("%s: %q: usage.total_tokens = %q, want %q", c.name, c.stream, got, c.want)
		}
	}
}

// TestEventEscapedFirstKey: an event whose data names the path's first
// key only with an escape (`"\u0075sage"`) is read, as encoding/json
// reads it, and a JSON body too.
func TestEventEscapedFirstKey(t *testing.T) {
	for _, c := range []struct {
		path, doc, want string
	}{
		{"usage.total_tokens", `{"\u0075sage":{"total_tokens":7}}`, "7"},
		{"usage.total_tokens", `{"us\u0061ge":{"total_tokens":7}}`, "7"},
		{"usage.total_tokens", `{"USAGE":{"total_tokens":7}}`, ""},
		{"usage.total_tokens", `{"us\\age":{"total_tokens":7}}`, ""},
		{"a/b", `{"a\/b":7}`, "7"},
		{"a\"b", `{"a\"b":7}`, "7"},
		{"a\tb", `{"a\tb":7}`, "7"},
		{"\ufffd", "{\"\xff\":7}", "7"},
		{"\ufffd", `{"\ud800":7}`, "7"},
		{"é", `{"\u00e9":7}`, "7"},
		{"é", `{"\u00E9":7}`, "7"},
	} {
		if got := readStream([]string{c.path}, "data: "+c.doc+"\n\n")[c.path]; got != c.want {
			t.Errorf("an event %s: %q = %q, want %q", c.doc, c.path, got, c.want)
		}
		// After paths that the event does not name, which looked for
		// the escapes first.
		paths := []string{"x.y", "x/y.z", c.path}
		if got := readStream(paths, "data: "+c.doc+"\n\n")[c.path]; got != c.want {
			t.Errorf("an event %s, after paths it does not name: %q = %q, want %q", c.doc, c.path, got, c.want)
		}
		s := New([]string{c.path})
		s.Feed(http.Header{"Content-Type": {"application/json"}}, []byte(c.doc))
		if got := finish(s)[c.path]; got != c.want {
			t.Errorf("a JSON body %s: %q = %q, want %q", c.doc, c.path, got, c.want)
		}
	}
}

// TestLongLineSkipsItsEvent: a line longer than maxLineScan skips the
// event it is in, and only that one (its data lines after it are not
// read as an event of their own), wherever the writes are cut: before
// its line end (a write that then starts with the LF), at each of a
// CRLF's bytes, or not at all (the whole line in one write).
func TestLongLineSkipsItsEvent(t *testing.T) {
	for _, end := range []string{"\n", "\r\n", "\r"} {
		long := ": " + strings.Repeat("c", maxLineScan-1) // one byte over
		stream := `data: {"a":1}` + end + end + long + end + `data: {"a":2}` + end + end +
			`data: {"b":3}` + end + end
		at := strings.Index(stream, long) + len(long)
		for _, cuts := range [][]int{nil, {at}, {at + 1}, {at - 1}, {at - 1, at, at + 1}, {3, at}} {
			got := readStream([]string{"a", "b"}, stream, cuts...)
			if got["a"] != "1" || got["b"] != "3" {
				t.Errorf("line end %q, writes cut at %v: found %v, want a 1, b 3 (the second event skipped)", end, cuts, got)
			}
		}
		ok := ": " + strings.Repeat("c", maxLineScan-2) // at the bound
		stream = strings.Replace(stream, long, ok, 1)
		at--
		for _, cuts := range [][]int{nil, {at}, {at + 1}, {at - 1}} {
			if got := readStream([]string{"a", "b"}, stream, cuts...); got["a"] != "2" || got["b"] != "3" {
				t.Errorf("line end %q, a line at the bound, writes cut at %v: found %v, want a 2, b 3", end, cuts, got)
			}
		}
	}
}

// TestCRLFAcrossAnEmptyWrite: a CRLF whose CR ends a write and whose LF
// starts the next write that is not empty is one line end, whatever
// empty writes come between (two would end the event before its second
// data line).
func TestCRLFAcrossAnEmptyWrite(t *testing.T) {
	stream := "data: {\"a\":\r\ndata: 7}\r\n\r\n"
	at := strings.Index(stream, "\r") + 1
	for _, cuts := range [][]int{{at}, {at, at}, {at, at, at}, {at - 1, at - 1, at, at}} {
		if got := readStream([]string{"a"}, stream, cuts...)["a"]; got != "7" {
			t.Errorf("writes cut at %v: a = %q, want 7", cuts, got)
		}
	}
}

// padDoc returns a JSON object of n bytes (n at least 20) whose member
// "a" is num.
func padDoc(n, num int) string {
	head := fmt.Sprintf(`{"a":%d,"p":"`, num)
	return head + strings.Repeat("x", n-len(head)-2) + `"}`
}

// longLines is a stream for TestLongLinesAgainstModel: events of lines
// from sseBody mixed with lines and data near the bounds (a comment or
// id line of maxLineScan bytes, a byte less or more; a data line whose
// data, with its LF, is maxEventScan bytes, a byte less or more; an
// event whose two data lines together are), every line end.
func longLines(g *docGen) []byte {
	var b []byte
	end := func() []byte { return []byte([...]string{"\n", "\r\n", "\r"}[g.r.IntN(3)]) }
	num := 100
	for range 1 + g.r.IntN(4) {
		num++
		off := g.r.IntN(3) - 1 // the edge, a byte below or a byte above
		switch g.r.IntN(5) {
		case 0:
			b = append(b, ": "+strings.Repeat("c", maxLineScan-2+off)...)
		case 1:
			b = append(b, "id: "+strings.Repeat("7", maxLineScan-4+off)...)
		case 2:
			b = append(b, "data: "+padDoc(maxEventScan-1+off, num)...)
		case 3:
			b = append(b, "data:"+padDoc(maxEventScan-1+off, num)...)
		default:
			doc := padDoc(maxEventScan-2+off, num)
			cut := 1 + g.r.IntN(len(doc)-1)
			b = append(append(append(b, "data: "+doc[:cut]...), end()...), "data: "+doc[cut:]...)
		}
		b = append(b, end()...)
		if g.r.IntN(2) == 0 {
			b = append(b, fmt.Sprintf(`data: {"a":%d}`, -num)...) // after the long line, in its event
			b = append(b, end()...)
		}
		b = append(b, end()...)
		b = append(b, sseBody(g)...)
	}
	return b
}

// TestLongLinesAgainstModel: streams with lines and events at their
// bounds, in writes cut at random points (some at a long line's end or a
// byte either side of it, some empty), are read as modelSSE reads the
// whole stream at once: an event over a bound is skipped, exactly that
// one, and the next read.
func TestLongLinesAgainstModel(t *testing.T) {
	g := &docGen{r: rand.New(rand.NewPCG(11, 12))}
	n := 150
	if testing.Short() {
		n = 30
	}
	skipped := 0
	for range n {
		stream := longLines(g)
		var cuts []int
		for range g.r.IntN(12) {
			at := g.r.IntN(len(stream) + 1)
			if g.r.IntN(2) == 0 {
				// Near a long line's end: the first line end after
				// maxLineScan-2 bytes from a random point, or a byte
				// either side.
				if i := bytes.IndexAny(stream[min(len(stream), at+maxLineScan-2):], "\r\n"); i >= 0 {
					at = min(len(stream), max(0, at+maxLineScan-2+i+g.r.IntN(3)-1))
				}
			}
			cuts = append(cuts, at)
		}
		slices.Sort(cuts)
		got, want := readStream(scanPaths, string(stream), cuts...), modelSSE(stream)
		if !equalFound(got, want) {
			t.Fatalf("a stream of %d bytes cut at %v: the scanner found %v; the model, reading it whole, %v\n%.3000q", len(stream), cuts, got, want, stream)
		}
		if a, _ := strconv.Atoi(want["a"]); a < 100 {
			skipped++ // the last event with an "a" was not a long one
		}
	}
	if skipped == 0 || skipped == n {
		t.Errorf("in %d of %d streams the last long event read was not the last: the generator no longer reaches both sides of the bounds", skipped, n)
	}
}

// TestLongLineNotKept: of a line longer than maxLineScan, split over
// writes, the scanner keeps no more than the bound, and none of it once
// it is over.
func TestLongLineNotKept(t *testing.T) {
	s := New([]string{"a"})
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	chunk := []byte(strings.Repeat("c", 1000))
	s.Feed(sse, []byte(": "))
	held := 0
	for range 4 * maxLineScan / len(chunk) {
		s.Feed(sse, chunk)
		held = max(held, len(s.buf))
	}
	if held > maxLineScan || len(s.buf) != 0 {
		t.Errorf("a line of %d bytes in writes of %d: held up to %d bytes, %d at its end; want at most %d, then none", 4*maxLineScan, len(chunk), held, len(s.buf), maxLineScan)
	}
	s.Feed(sse, []byte("\ndata: {\"a\":1}\n\ndata: {\"a\":2}\n\n"))
	if got := finish(s)["a"]; got != "2" {
		t.Errorf("after the long line: a = %q, want 2 (its event skipped, the next read)", got)
	}
}
