package bodyscan

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// The body scanner is checked against references on generated bodies:
// a Server-Sent Events stream against modelSSE, the SSE specification's
// parsing written plainly over the whole body (encoding/json reading
// each event); a JSON body against encoding/json; and a compressed body
// (encoded by compress/gzip, compress/zlib, compress/flate, zstd and
// brotli's own encoders) against the same body sent uncompressed. Each
// body is fed in writes of random sizes.

// scanPaths are the paths the generated bodies are scanned for: a key
// most documents have, its other case, and first keys that only an
// escape spells ("/" as `\/`), or that bytes which are not UTF-8 decode
// to (U+FFFD).
var scanPaths = []string{"a", "a.a", "b.0", "A", "/", "\ufffd"}

// modelSSE reads stream as the SSE specification parses it, over the
// whole stream at once: lines ended by CRLF, LF or CR; a line's field
// name before its first colon, its value after it and one space; each
// data field's value followed by LF in the event's data; an event
// dispatched by an empty line. It returns, per path, the number
// encoding/json reads at it in the last event whose data is a JSON
// object (white space before it or not), as written. An event is
// skipped, as the scanner's bounds have it, when its data is longer than
// maxEventScan or one of its lines is longer than maxLineScan.
func modelSSE(stream []byte) map[string]string {
	found := map[string]string{}
	var data []byte
	long := false
	for {
		i := bytes.IndexAny(stream, "\r\n")
		if i < 0 {
			return found // an unfinished line is not read, nor its event
		}
		line := string(stream[:i])
		if stream[i] == '\r' && i+1 < len(stream) && stream[i+1] == '\n' {
			i++
		}
		stream = stream[i+1:]
		if len(line) > maxLineScan {
			long = true
			continue
		}
		if line != "" {
			if field, value, _ := strings.Cut(line, ":"); field == "data" {
				data = append(append(data, strings.TrimPrefix(value, " ")...), '\n')
			}
			continue
		}
		if doc := bytes.TrimLeft(data, " \t\r\n"); !long && len(data) <= maxEventScan && len(doc) > 0 && doc[0] == '{' {
			for _, p := range scanPaths {
				if n, ok := decodedNumberAt(data, strings.Split(p, ".")); ok {
					found[p] = n
				}
			}
		}
		data, long = nil, false
	}
}

// modelJSON reads body as encoding/json does, at each path.
func modelJSON(body []byte) map[string]string {
	found := map[string]string{}
	for _, p := range scanPaths {
		if n, ok := decodedNumberAt(body, strings.Split(p, ".")); ok {
			found[p] = n
		}
	}
	return found
}

// lineDoc is a document from g for a data line: most without the line
// ends its white space may hold (which split it into lines that are not
// data, as a server would not).
func lineDoc(g *docGen) []byte {
	doc := g.doc()
	if g.r.IntN(8) > 0 {
		doc = bytes.ReplaceAll(bytes.ReplaceAll(doc, []byte("\r"), []byte(" ")), []byte("\n"), []byte(" "))
	}
	return doc
}

// sseBody generates an event stream of the lines a server sends, with
// every line end, data over several lines, and documents from g.
func sseBody(g *docGen) []byte {
	var b []byte
	for range 1 + g.r.IntN(6) {
		for range g.r.IntN(4) {
			var line []byte
			switch g.r.IntN(8) {
			case 0:
				line = []byte("event: delta")
			case 1:
				line = []byte(": a comment")
			case 2:
				line = []byte("id: 7")
			case 3:
				line = append([]byte("data:"), lineDoc(g)...) // no space after the colon
			case 4:
				// White space before the document: after the space a
				// colon may have, or on data lines of its own.
				line = []byte([...]string{"data:  ", "data:\t", "data: \t ", "data:\ndata: ", "data\ndata:", "data: \ndata:\t", "data: \v", "data:\f"}[g.r.IntN(8)] + `{"a":3}`)
			case 5:
				// A document over two data lines.
				doc := lineDoc(g)
				cut := g.r.IntN(len(doc) + 1)
				line = append(append(append([]byte("data: "), doc[:cut]...), "\ndata: "...), doc[cut:]...)
			default:
				line = append([]byte("data: "), lineDoc(g)...)
			}
			b = append(b, line...)
			b = append(b, [...]string{"\n", "\r\n", "\r"}[g.r.IntN(3)]...)
		}
		if g.r.IntN(10) > 0 {
			b = append(b, [...]string{"\n", "\r\n", "\r"}[g.r.IntN(3)]...)
		}
	}
	return b
}

// feedSplit feeds body to s in writes of random sizes (some empty).
func feedSplit(r *rand.Rand, s *Scanner, h http.Header, body []byte) {
	for len(body) > 0 {
		n := min(len(body), r.IntN(24))
		s.Feed(h, body[:n])
		body = body[n:]
	}
}

// TestScannerAgainstModel: the scanner reads generated event streams as
// modelSSE does, and JSON bodies as encoding/json does, however they are
// split into writes.
func TestScannerAgainstModel(t *testing.T) {
	g := &docGen{r: rand.New(rand.NewPCG(7, 8))}
	sse := http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}}
	found := 0
	for range genCases / 10 {
		body := sseBody(g)
		s := New(scanPaths)
		feedSplit(g.r, s, sse, body)
		got, want := finish(s), modelSSE(body)
		if !equalFound(got, want) {
			t.Fatalf("stream %q: the scanner found %v; the model %v", body, got, want)
		}
		found += len(want)

		doc := g.doc()
		s = New(scanPaths)
		feedSplit(g.r, s, http.Header{"Content-Type": {"application/json"}}, doc)
		if got, want := finish(s), modelJSON(doc); !equalFound(got, want) {
			t.Fatalf("JSON body %q: the scanner found %v; encoding/json reads %v", doc, got, want)
		}
	}
	t.Logf("%d streams and %d JSON bodies, %d numbers found in the streams", genCases/10, genCases/10, found)
	if found < genCases/100 {
		t.Errorf("only %d numbers found in the streams: the generator no longer reaches them", found)
	}
}

func equalFound(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestDecompressorsAgainstPlain: a body compressed by each coding's own
// encoder (the standard library's gzip, zlib and flate at a random
// level; zstd's and brotli's) reads as the same body uncompressed,
// through every Content-Encoding name the scanner reads, in writes of
// random sizes.
func TestDecompressorsAgainstPlain(t *testing.T) {
	g := &docGen{r: rand.New(rand.NewPCG(9, 10))}
	encoders := map[string]func(w io.Writer, level int) io.WriteCloser{
		"gzip": func(w io.Writer, level int) io.WriteCloser {
			z, _ := gzip.NewWriterLevel(w, level)
			return z
		},
		"x-gzip": func(w io.Writer, level int) io.WriteCloser {
			z, _ := gzip.NewWriterLevel(w, level)
			return z
		},
		"deflate": func(w io.Writer, level int) io.WriteCloser {
			z, _ := zlib.NewWriterLevel(w, level)
			return z
		},
		"deflate raw": func(w io.Writer, level int) io.WriteCloser {
			z, _ := flate.NewWriter(w, level)
			return z
		},
		"zstd": func(w io.Writer, level int) io.WriteCloser {
			z, _ := zstd.NewWriter(w)
			return z
		},
		"br": func(w io.Writer, level int) io.WriteCloser { return brotli.NewWriter(w) },
	}
	for range 50 {
		ct := "application/json"
		body := g.doc()
		if g.r.IntN(2) == 0 {
			ct = "text/event-stream"
			body = sseBody(g)
		}
		plain := New(scanPaths)
		feedSplit(g.r, plain, http.Header{"Content-Type": {ct}}, body)
		want := finish(plain)
		ident := New(scanPaths)
		feedSplit(g.r, ident, http.Header{"Content-Type": {ct}, "Content-Encoding": {"Identity"}}, body)
		if got := finish(ident); !equalFound(got, want) {
			t.Fatalf("%s body %q as Content-Encoding identity: found %v; without %v", ct, body, got, want)
		}
		for name, enc := range encoders {
			var buf bytes.Buffer
			w := enc(&buf, flate.HuffmanOnly+g.r.IntN(flate.BestCompression+2))
			w.Write(body)
			w.Close()
			coding, _, _ := strings.Cut(name, " ")
			for _, spelled := range []string{coding, strings.ToUpper(coding), " " + coding + " "} {
				s := New(scanPaths)
				feedSplit(g.r, s, http.Header{"Content-Type": {ct}, "Content-Encoding": {spelled}}, buf.Bytes())
				if got := finish(s); !equalFound(got, want) {
					t.Fatalf("%s body %q as Content-Encoding %q (%s): found %v; uncompressed %v", ct, body, spelled, name, got, want)
				}
			}
		}
	}
}
