package bodyscan

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// TestBodyScannerLineEnds: a Server-Sent Events stream's lines may end
// with LF, CRLF or a bare CR (the SSE specification allows all three);
// the scanner finds the last event's number whichever it is, however the
// stream is split into writes (every split point, and a byte at a time),
// and a CRLF split between two writes is one line end, not two (two
// would end the event before its data line).
func TestBodyScannerLineEnds(t *testing.T) {
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	events := []string{
		"event: delta",
		`data: {"usage": {"total_tokens": 7}}`,
		"",
		": a comment",
		"data: {\"choices\": []}",
		"",
		"event: message_delta",
		`data: {"usage":`,
		`data:  {"total_tokens": 42}}`,
		"",
		"data: [DONE]",
		"",
	}
	for _, end := range []string{"\n", "\r\n", "\r"} {
		body := strings.Join(events, end)
		name := strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(end)
		scan := func(chunks ...string) string {
			s := New([]string{"usage.total_tokens"})
			for _, c := range chunks {
				s.Feed(sse, []byte(c))
			}
			found := finish(s)
			v, _ := found["usage.total_tokens"]
			return v
		}
		if got := scan(body); got != "42" {
			t.Errorf("%s: one write: %q, want 42", name, got)
		}
		for i := 1; i < len(body); i++ {
			if got := scan(body[:i], body[i:]); got != "42" {
				t.Fatalf("%s: split at %d (%q | %q): %q, want 42", name, i, body[max(0, i-8):i], body[i:min(len(body), i+8)], got)
			}
		}
		bytes := make([]string, len(body))
		for i := range body {
			bytes[i] = body[i : i+1]
		}
		if got := scan(bytes...); got != "42" {
			t.Errorf("%s: a byte a write: %q, want 42", name, got)
		}
	}
}

// BenchmarkBodyScanner is the scanner alone on 10 MB of OpenAI-style
// chunks in 32 KiB writes, with each line end the SSE specification
// allows, and (enc=gzip) the LF stream gzip-compressed, as `encode gzip`
// sends it; and (no_usage) of Anthropic-style chunks, which do not name
// the path: what scanning costs a stream, apart from the network.
func BenchmarkBodyScanner(b *testing.B) {
	openai := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 900) + "\"}}],\"usage\":null}"
	// Anthropic's content_block_delta names no usage, and its text has
	// escapes (none of them \u).
	anthropic := `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + strings.Repeat(`a \"b\"\n`, 100) + `"}}`
	for _, c := range []struct{ name, chunk, end, enc string }{
		{"end=lf", openai, "\n", ""}, {"end=crlf", openai, "\r\n", ""}, {"end=cr", openai, "\r", ""}, {"end=lf,enc=gzip", openai, "\n", "gzip"},
		{"end=lf,no_usage", anthropic, "\n", ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := http.Header{"Content-Type": {"text/event-stream"}}
			chunk := c.chunk + c.end + c.end
			var body strings.Builder
			for body.Len() < streamSize {
				body.WriteString(chunk)
			}
			body.WriteString("data: {\"usage\":{\"total_tokens\":12345}}" + c.end + c.end)
			src := []byte(body.String())
			b.SetBytes(int64(len(src)))
			if c.enc != "" {
				h.Set("Content-Encoding", c.enc)
				src = compress(b, c.enc, body.String())
			}
			b.ReportAllocs()
			for b.Loop() {
				s := New([]string{"usage.total_tokens"})
				for i := 0; i < len(src); i += 32 << 10 {
					s.Feed(h, src[i:min(len(src), i+32<<10)])
				}
				found := finish(s)
				if v, _ := found["usage.total_tokens"]; v != "12345" {
					b.Fatalf("usage.total_tokens = %q, want 12345", v)
				}
			}
		})
	}
}

// TestReadJSONDocument: the request's JSON is read until its document
// ends and no further, however the body arrives (a byte a read here):
// what follows the document is not asked for, strings and escapes that
// hold brackets do not end it, and a body that is not one document is
// read to its end (or the bound) and ends nothing.
func TestReadJSONDocument(t *testing.T) {
	for _, c := range []struct{ doc, rest string }{
		{`{"max_tokens":5}`, `then the client waits`},
		{` [1,{"a":"]}\"}"},2]`, `{"more":1}`},
		{`{"s":"\\","t":{"u":[]}}`, ``},
		{`"a string"`, ``},
	} {
		body := &stopAt{t: t, data: []byte(c.doc + c.rest), stop: len(c.doc)}
		buf, end := readDocument(iotest.OneByteReader(body))
		switch {
		case c.doc[0] == '"':
			if end != 0 {
				t.Errorf("%s: end %d, want 0 (not an object or array: no path in it)", c.doc, end)
			}
		case end != len(c.doc) || string(buf) != c.doc:
			t.Errorf("%s: read %q, end %d; want the document, end %d", c.doc, buf, end, len(c.doc))
		}
	}
	buf, end := readDocument(strings.NewReader(`{"max_tokens":5`))
	if end != -1 || string(buf) != `{"max_tokens":5` {
		t.Errorf("a body cut off: read %q, end %d; want all of it, end -1", buf, end)
	}
	big := `{"a":"` + strings.Repeat("x", maxJSONScan) + `"}`
	if buf, end := readDocument(strings.NewReader(big)); end != -1 || len(buf) > maxJSONScan {
		t.Errorf("a body over the bound: read %d bytes, end %d; want at most %d, end -1", len(buf), end, maxJSONScan)
	}
}

// stopAt is a body whose bytes from stop on are read only by a reader
// that did not stop at the document's end: reading them fails the test.
type stopAt struct {
	t    *testing.T
	data []byte
	stop int
	off  int
}

func (s *stopAt) Read(p []byte) (int, error) {
	if s.off >= len(s.data) {
		return 0, io.EOF
	}
	if s.off >= s.stop {
		s.t.Errorf("read past the document's end, at byte %d of %q", s.off, s.data)
	}
	n := copy(p, s.data[s.off:])
	s.off += n
	return n, nil
}

// TestBodyScannerHoldsBounded feeds the scanner a 10 MB event stream in
// writes of every size, one event far over the bound, and a JSON body
// over its bound (plain, and gzip), and checks what it keeps: at most one
// event's bound of line and data, nothing of a JSON body past its bound,
// and the usage of the last event that holds it; and that a body in an
// encoding it does not read keeps the estimate.
func TestBodyScannerHoldsBounded(t *testing.T) {
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	var body strings.Builder
	for body.Len() < streamSize {
		fmt.Fprintf(&body, "data: {\"choices\":[{\"delta\":{\"content\":%q}}],\"usage\":null}\r\n\r\n", strings.Repeat("y", body.Len()%3000))
	}
	body.WriteString("data: {\"usage\":{\"total_tokens\":7}}\n\n")
	body.WriteString("data: \"" + strings.Repeat("z", 2*maxEventScan) + "\"\n\n") // skipped
	body.WriteString("data: {\"usage\":\n")                                       // an event over two data lines
	body.WriteString("data: {\"total_tokens\":42}}\n\n")
	body.WriteString("data: [DONE]\n\n")
	s := New([]string{"usage.total_tokens"})
	src := body.String()
	held := 0
	for i, step := 0, 1; i < len(src); step = step%7919 + 13 {
		end := min(len(src), i+step)
		s.Feed(sse, []byte(src[i:end]))
		held = max(held, cap(s.buf)+cap(s.data))
		i = end
	}
	found := finish(s)
	if held > 4*maxEventScan {
		t.Errorf("the scanner held %d bytes at once, want at most %d (bounded per event)", held, 4*maxEventScan)
	}
	if got, _ := found["usage.total_tokens"]; got != "42" {
		t.Errorf("usage.total_tokens = %q, want 42 (the last event holding it, two data lines)", got)
	}

	j := New([]string{"usage.total_tokens"})
	big := []byte(strings.Repeat(" ", 64<<10))
	for i := 0; i < 2*maxJSONScan/len(big); i++ {
		j.Feed(http.Header{}, big)
	}
	if j.mode != scanOff || cap(j.buf) != 0 {
		t.Errorf("a JSON body over %d bytes: mode %d, %d bytes held; want the scan off and nothing held", maxJSONScan, j.mode, cap(j.buf))
	}
	// A compressed body is read as it decompresses, within the same
	// bound: 2 MiB of spaces compressed to a few KiB is over it.
	read := func(h http.Header, body []byte) (string, bool) {
		s := New([]string{"usage.total_tokens"})
		for i := 0; i < len(body); i += 1000 {
			s.Feed(h, body[i:min(len(body), i+1000)])
		}
		found := finish(s)
		v, ok := found["usage.total_tokens"]
		return v, ok
	}
	gzipJSON := http.Header{"Content-Encoding": {"gzip"}, "Content-Type": {"application/json"}}
	if got, _ := read(gzipJSON, compress(t, "gzip", `{"usage":{"total_tokens":3}}`)); got != "3" {
		t.Errorf("a gzip body: usage.total_tokens = %q, want 3", got)
	}
	bomb := compress(t, "gzip", `{"usage":{"total_tokens":3}}`+strings.Repeat(" ", 2*maxJSONScan))
	if got, ok := read(gzipJSON, bomb); ok {
		t.Errorf("a gzip body of %d bytes decompressing past the bound: usage.total_tokens = %q, want unset", len(bomb), got)
	}
	for _, enc := range []string{"compress", "gzip, br"} {
		h := http.Header{"Content-Encoding": {enc}, "Content-Type": {"application/json"}}
		if got, ok := read(h, []byte(`{"usage":{"total_tokens":3}}`)); ok {
			t.Errorf("Content-Encoding %s: usage.total_tokens = %q, want unset (the estimate kept)", enc, got)
		}
	}
}

// TestBodyScannerDeflate: a body of Content-Encoding deflate is read
// whether zlib-wrapped (RFC 9110) or raw (as some servers send it), as
// JSON and as a stream, at every compression level, and within the same
// bound as the other codings.
func TestBodyScannerDeflate(t *testing.T) {
	read := func(h http.Header, body []byte) (string, bool) {
		s := New([]string{"usage.total_tokens"})
		for i := 0; i < len(body); i += 7 {
			s.Feed(h, body[i:min(len(body), i+7)])
		}
		v, ok := finish(s)["usage.total_tokens"]
		return v, ok
	}
	bodies := map[string]string{
		"application/json":  `{"choices":[{"text":"` + strings.Repeat("lorem ipsum ", 50) + `"}],"usage":{"total_tokens":42}}`,
		"text/event-stream": "data: {\"usage\":null}\n\ndata: {\"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n",
	}
	for ct, body := range bodies {
		for level := flate.HuffmanOnly; level <= flate.BestCompression; level++ {
			var zbuf, rbuf bytes.Buffer
			zw, _ := zlib.NewWriterLevel(&zbuf, level)
			rw, _ := flate.NewWriter(&rbuf, level)
			for _, w := range []io.WriteCloser{zw, rw} {
				io.WriteString(w, body)
				w.Close()
			}
			for name, b := range map[string][]byte{"zlib": zbuf.Bytes(), "raw": rbuf.Bytes()} {
				h := http.Header{"Content-Encoding": {"Deflate"}, "Content-Type": {ct}}
				if got, _ := read(h, b); got != "42" {
					t.Errorf("%s, deflate (%s, level %d): usage.total_tokens = %q, want 42", ct, name, level, got)
				}
			}
		}
	}
	bomb := compress(t, "deflate-raw", `{"usage":{"total_tokens":3}}`+strings.Repeat(" ", 2*maxJSONScan))
	if got, ok := read(http.Header{"Content-Encoding": {"deflate"}}, bomb); ok {
		t.Errorf("a raw deflate body decompressing past the bound: usage.total_tokens = %q, want unset", got)
	}
}

// TestNarrowAcceptEncoding: a request's Accept-Encoding keeps only the
// codings the scanner reads, q-values and all; with none left it asks for
// identity; a header that lists only readable codings, or no header, is
// left alone.
func TestNarrowAcceptEncoding(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      []string // the header's values; nil: no header
		want    string   // "" with changed false: as it was
		changed bool
	}{
		{"absent", nil, "", false},
		{"all readable", []string{"gzip, deflate, br, zstd"}, "gzip, deflate, br, zstd", false},
		{"q-values kept", []string{"br;q=1.0, gzip;q=0.8, *;q=0.1"}, "br;q=1.0, gzip;q=0.8", true},
		{"unknown dropped", []string{"x-snappy, deflate"}, "deflate", true},
		{"only unknown", []string{"compress"}, "identity", true},
		{"only a wildcard", []string{"*"}, "identity", true},
		{"case and spaces", []string{" GZip ;q=0.5 ,Compress"}, "GZip ;q=0.5", true},
		{"identity kept", []string{"identity, x-lz4"}, "identity", true},
		{"two lines", []string{"gzip", "br"}, "gzip, br", true},
		{"empty items", []string{", ,gzip,"}, "gzip", false},
	} {
		h := http.Header{}
		for _, v := range c.in {
			h.Add("Accept-Encoding", v)
		}
		changed := NarrowAcceptEncoding(h)
		want := c.want
		if !c.changed {
			want = strings.Join(c.in, ", ")
			if len(c.in) > 0 {
				want = c.in[0]
			}
		}
		if got := strings.Join(h.Values("Accept-Encoding"), ", "); changed != c.changed || got != want {
			t.Errorf("%s: NarrowAcceptEncoding(%q) = %q, changed %v; want %q, changed %v", c.name, c.in, got, changed, want, c.changed)
		}
	}
}

// finish finishes s and returns the numbers it found, by path.
func finish(s *Scanner) map[string]string {
	found := map[string]string{}
	s.Finish(func(path, num string) { found[path] = num })
	return found
}

// streamSize is the body of the scanner's benchmark: 10 MB of events.
const streamSize = 10 << 20

// compress encodes body in enc (gzip, zstd, br, deflate, or
// deflate-raw: deflate without its zlib wrapping).
func compress(t testing.TB, enc, body string) []byte {
	var buf bytes.Buffer
	var w io.WriteCloser
	switch enc {
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "zstd":
		w, _ = zstd.NewWriter(&buf)
	case "br":
		w = brotli.NewWriter(&buf)
	case "deflate": // zlib-wrapped, as RFC 9110 has it
		w = zlib.NewWriter(&buf)
	case "deflate-raw": // raw, as some servers send deflate
		w, _ = flate.NewWriter(&buf, flate.DefaultCompression)
	default:
		t.Errorf("no encoder for %q", enc)
		return nil
	}
	io.WriteString(w, body)
	w.Close()
	return buf.Bytes()
}
