package tollgate

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/caddyserver/caddy/v2"
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
			s := newBodyScanner([]string{"usage.total_tokens"})
			for _, c := range chunks {
				s.feed(sse, []byte(c))
			}
			repl := caddy.NewReplacer()
			s.finish(repl)
			v, _ := repl.GetString(jsonPlaceholder + "usage.total_tokens")
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
// sends it: what scanning costs a stream, apart from the network.
func BenchmarkBodyScanner(b *testing.B) {
	for _, c := range []struct{ name, end, enc string }{
		{"end=lf", "\n", ""}, {"end=crlf", "\r\n", ""}, {"end=cr", "\r", ""}, {"end=lf,enc=gzip", "\n", "gzip"},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := http.Header{"Content-Type": {"text/event-stream"}}
			chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 900) + "\"}}],\"usage\":null}" + c.end + c.end
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
				s := newBodyScanner([]string{"usage.total_tokens"})
				for i := 0; i < len(src); i += 32 << 10 {
					s.feed(h, src[i:min(len(src), i+32<<10)])
				}
				repl := caddy.NewReplacer()
				s.finish(repl)
				if v, _ := repl.GetString(jsonPlaceholder + "usage.total_tokens"); v != "12345" {
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
		buf, end := readJSONDocument(iotest.OneByteReader(body))
		switch {
		case c.doc[0] == '"':
			if end != 0 {
				t.Errorf("%s: end %d, want 0 (not an object or array: no path in it)", c.doc, end)
			}
		case end != len(c.doc) || string(buf) != c.doc:
			t.Errorf("%s: read %q, end %d; want the document, end %d", c.doc, buf, end, len(c.doc))
		}
	}
	buf, end := readJSONDocument(strings.NewReader(`{"max_tokens":5`))
	if end != -1 || string(buf) != `{"max_tokens":5` {
		t.Errorf("a body cut off: read %q, end %d; want all of it, end -1", buf, end)
	}
	big := `{"a":"` + strings.Repeat("x", maxJSONScan) + `"}`
	if buf, end := readJSONDocument(strings.NewReader(big)); end != -1 || len(buf) > maxJSONScan+1 {
		t.Errorf("a body over the bound: read %d bytes, end %d; want at most %d, end -1", len(buf), end, maxJSONScan+1)
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
