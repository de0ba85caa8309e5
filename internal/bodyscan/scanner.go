// Package bodyscan reads numbers from HTTP bodies as they pass, for
// Tollgate's {http.rate_limit.response.json.*} and
// {http.rate_limit.request.json.*} placeholders: without holding the body
// back, within fixed bounds, through gzip, zstd, br and deflate, and from
// Server-Sent Events streams event by event. It knows nothing of Caddy.
package bodyscan

import (
	"bytes"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"
)

// Scanner reads the numbers at its paths from a response body as it
// passes to the client: the body is never held back or delayed, and only
// a bounded amount of it is kept.
//
//   - A body with a Content-Encoding of gzip, zstd, br or deflate (as `encode`
//     sends it, or an upstream that compressed it itself) is decompressed
//     as it passes, and what it decompresses to is read as below; any
//     other encoding (or several) is not read: it keeps the estimate.
//   - A Server-Sent Events stream (Content-Type text/event-stream) is
//     read event by event; each event whose data (its data lines joined,
//     as the SSE specification has it) is a JSON object, white space
//     before it or not, is read as encoding/json reads it, and the last
//     event that holds a number at the path wins (an OpenAI-compatible
//     stream's final chunk with stream_options.include_usage,
//     Anthropic's message_delta). Only an event ended by its empty line
//     is read, as the SSE specification dispatches events: a stream cut
//     off mid-event keeps what earlier events said. An event is skipped
//     when its data (each line's followed by its LF) is longer than
//     maxEventScan bytes, or when one of its lines is longer than
//     maxLineScan, wherever the writes cut the stream.
//   - Any other body is read as one JSON document, of which at most
//     maxJSONScan bytes are kept; a longer body, or one that is not a
//     whole JSON document (cut off mid-write), keeps the estimate.
type Scanner struct {
	paths []string
	segs  [][]string // each path's segments
	names []firstKey // each path's first key: see mayHold
	found []string   // per path: the number last found, or ""
	mode  scanMode
	buf   []byte // JSON: the body so far; SSE: the line being read
	data  []byte // SSE: the current event's data, each line's ended by LF
	skip  bool   // SSE: the current event is too long to read
	long  bool   // SSE: the line being read is too long (not kept)
	cr    bool   // SSE: the last write ended with a CR
	// dec, for a compressed body, decompresses the bytes fed and scans
	// what they decompress to, on a goroutine of its own, which owns the
	// fields above until Finish has waited for it.
	dec *decompressor
}

type scanMode uint8

const (
	scanUnknown scanMode = iota // before the first bytes
	scanJSON
	scanSSE
	scanOff // compressed, or past the bound
)

// Bounds on what the scanner keeps per request.
const (
	maxJSONScan  = 1 << 20  // a JSON body longer than this keeps the estimate
	maxEventScan = 64 << 10 // an event longer than this is skipped
	// maxLineScan bounds a line: an event with a longer line is skipped.
	// Its "data: " on top of the event's bound lets every data line
	// within that bound be read, whole in a write or not.
	maxLineScan = maxEventScan + len("data: ")
)

func New(paths []string) *Scanner {
	s := &Scanner{paths: paths, found: make([]string, len(paths))}
	for _, p := range paths {
		segs := strings.Split(p, ".")
		s.segs = append(s.segs, segs)
		k := firstKey{quoted: []byte(`"` + segs[0] + `"`)}
		switch {
		case strings.ContainsRune(segs[0], utf8.RuneError):
			k.any = true // a key that is not UTF-8 decodes to U+FFFD: no bytes tell
		case strings.ContainsAny(segs[0], "\"/\b\f\n\r\t"):
			k.esc = 1 // a short escape may spell it: any backslash
		}
		s.names = append(s.names, k)
	}
	return s
}

// firstKey is what a document that has a member named a path's first
// key holds (see mayHold).
type firstKey struct {
	quoted []byte // the key as written, quoted
	esc    int    // the escape any other spelling of it has: an index of escapes
	any    bool   // no bytes tell
}

// escapes are what a key spelled with an escape holds: `\u`, or for a
// key with a character that has a short escape (such as "/"), a
// backslash.
var escapes = [2][]byte{[]byte(`\u`), []byte(`\`)}

// mayHold reports whether doc may have a member named path i's first
// key, cheaply, before NumberAt walks it: doc holds the key as written,
// or an escape that a spelling of it needs (escapes), or the key has
// U+FFFD, which any byte that is not UTF-8 decodes to. held notes, per
// escape, whether doc was looked into for it (1) and holds it (2): each
// is looked for once a document, whatever the paths.
func (s *Scanner) mayHold(doc []byte, i int, held *[len(escapes)]int8) bool {
	k := &s.names[i]
	if k.any || bytes.Contains(doc, k.quoted) {
		return true
	}
	if held[k.esc] == 0 {
		held[k.esc] = 1
		if bytes.Contains(doc, escapes[k.esc]) {
			held[k.esc] = 2
		}
	}
	return held[k.esc] == 2
}

// Feed scans p, the next bytes of the body whose headers are h.
func (s *Scanner) Feed(h http.Header, p []byte) {
	if s.dec != nil {
		s.dec.write(p)
		return
	}
	if s.mode == scanUnknown {
		s.mode = scanModeOf(h)
		if enc := contentEncoding(h); enc != "" && s.mode != scanOff {
			s.decompress(enc)
			s.dec.write(p)
			return
		}
	}
	s.scan(p)
}

// scan scans p, the next bytes of the body as the upstream wrote it
// (decompressed).
func (s *Scanner) scan(p []byte) {
	switch s.mode {
	case scanJSON:
		if len(s.buf)+len(p) > maxJSONScan {
			s.mode, s.buf = scanOff, nil
			return
		}
		s.buf = append(s.buf, p...)
	case scanSSE:
		s.feedSSE(p)
	}
}

// scanModeOf chooses how to read a body from its headers.
func scanModeOf(h http.Header) scanMode {
	if enc := contentEncoding(h); enc != "" && decoderOf(enc) == nil {
		return scanOff // an encoding not read
	}
	if mt, _, err := mime.ParseMediaType(h.Get("Content-Type")); err == nil && mt == "text/event-stream" {
		return scanSSE
	}
	return scanJSON
}

// feedSSE splits p into lines (ended by LF, CRLF or a bare CR, as the SSE
// specification has it) and events (ended by an empty line), keeping only
// the unfinished line and event. A line whole within p is read in place.
// A CR that ends p may be the first half of a CRLF: an LF that starts the
// next write that is not empty then ends nothing.
func (s *Scanner) feedSSE(p []byte) {
	if len(p) == 0 {
		return // an empty write: a CR before it still waits for its LF
	}
	if s.cr && p[0] == '\n' {
		p = p[1:]
	}
	s.cr = false
	// The next LF and CR, each looked for again only once passed: a
	// stream with one kind of line end scans for the other once a write.
	lf, cr := bytes.IndexByte(p, '\n'), bytes.IndexByte(p, '\r')
	for len(p) > 0 {
		i := lf
		if cr >= 0 && (i < 0 || cr < i) {
			i = cr
		}
		if i < 0 {
			s.appendLine(p)
			return
		}
		l := p[:i]
		if len(s.buf) != 0 {
			s.appendLine(l)
			l = s.buf
		}
		if s.long || len(l) > maxLineScan {
			s.skip = true // a line too long: its event is skipped
		} else {
			s.line(l)
		}
		s.buf, s.long = s.buf[:0], false
		next := i + 1
		if p[i] == '\r' {
			switch {
			case next == len(p):
				s.cr = true
			case p[next] == '\n':
				next++
			}
		}
		p = p[next:]
		lf, cr = after(p, lf, next, '\n'), after(p, cr, next, '\r')
	}
}

// after is where the next c is in p, now that next bytes before p were
// consumed: at, moved, or looked for again if it was consumed (-1 stays:
// there is none).
func after(p []byte, at, next int, c byte) int {
	if at < 0 {
		return at
	}
	if at -= next; at < 0 {
		return bytes.IndexByte(p, c)
	}
	return at
}

// appendLine adds b to the line being read, which is kept only up to
// maxLineScan bytes: past that, the line is long, and none of it is
// kept.
func (s *Scanner) appendLine(b []byte) {
	if s.long || len(s.buf)+len(b) > maxLineScan {
		s.buf, s.long = s.buf[:0], true
		return
	}
	s.buf = append(s.buf, b...)
}

// line handles one complete line of the stream, without its line end.
func (s *Scanner) line(l []byte) {
	if len(l) == 0 {
		s.event()
		return
	}
	// A data field: "data:" and its value, or "data" alone (an empty
	// value), as the SSE specification has it.
	rest, ok := bytes.CutPrefix(l, []byte("data:"))
	switch {
	case s.skip:
		return
	case ok:
		rest = bytes.TrimPrefix(rest, []byte(" "))
	case string(l) == "data":
		rest = nil
	default:
		return // another field, or a comment
	}
	if len(s.data)+len(rest)+1 > maxEventScan {
		s.skip = true
		return
	}
	s.data = append(append(s.data, rest...), '\n')
}

// event handles a complete event: its data is looked into if it is an
// object (JSON white space before it, such as the LF of an empty data
// line, is a parser's white space too) that may hold a path.
func (s *Scanner) event() {
	data, skip := s.data, s.skip
	s.data, s.skip = s.data[:0], false
	if i := skipSpace(data, 0); skip || i == len(data) || data[i] != '{' {
		return
	}
	s.lookup(data, true)
}

// lookup notes the number at each path of the JSON document that holds
// one; with quick, only for a document that may name the path's first
// key (mayHold).
func (s *Scanner) lookup(doc []byte, quick bool) {
	var held [len(escapes)]int8
	for i, segs := range s.segs {
		if quick && !s.mayHold(doc, i, &held) {
			continue
		}
		if n, ok := NumberAt(doc, segs); ok {
			s.found[i] = string(n)
		}
	}
}

// Finish reads what is left (a JSON body) and calls set with each path
// whose number was found and the number as written. An SSE stream's
// unfinished line and event are not read: a number is read only from an
// event that ended.
func (s *Scanner) Finish(set func(path, num string)) {
	if s.dec != nil {
		s.dec.close()
	}
	if s.mode == scanJSON {
		s.lookup(s.buf, false)
	}
	for i, p := range s.paths {
		if s.found[i] != "" {
			set(p, s.found[i])
		}
	}
}

// ReadRequest reads the JSON document that r's body starts with, for a
// cost estimate (an LLM request's max_tokens): only as far as the
// document goes (a client that keeps the body open after it is not
// waited for), and at most maxJSONScan bytes. What it read is put back
// for the handlers after, read or not. ok is false when the body is
// longer, not one whole JSON document, or absent.
func ReadRequest(r *http.Request) (doc []byte, ok bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false
	}
	buf, end := readDocument(r.Body)
	r.Body = replayBody{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
	if end < 0 {
		return nil, false
	}
	return buf[:end], true
}

// readDocument reads body until the JSON document it starts with
// ends, the body ends or fails, or maxJSONScan bytes were read, whichever
// is first. It returns what it read and where in it the document ends,
// -1 if it did not.
func readDocument(body io.Reader) (buf []byte, end int) {
	var d docEnd
	buf = make([]byte, 0, 4<<10)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		room := min(cap(buf), maxJSONScan) - len(buf)
		n, err := body.Read(buf[len(buf) : len(buf)+room])
		if i := d.scan(buf[len(buf) : len(buf)+n]); i >= 0 {
			return buf[:len(buf)+n], len(buf) + i
		}
		buf = buf[:len(buf)+n]
		if err != nil || len(buf) == maxJSONScan {
			return buf, -1 // a document that did not end within the bound
		}
	}
}

// docEnd finds where a JSON document ends in the bytes given it one part
// after another: after its top-level object or array closes (a document
// that is neither holds no path, and ends where it starts). It only
// follows strings and nesting; NumberAt checks the document.
type docEnd struct {
	depth int
	begun bool // the first byte of the value was seen
	str   bool // in a string
	esc   bool // in a string, after a backslash
}

// scan returns the position in p just after the document's end, or -1.
func (d *docEnd) scan(p []byte) int {
	for i, c := range p {
		switch {
		case d.str:
			switch {
			case d.esc:
				d.esc = false
			case c == '\\':
				d.esc = true
			case c == '"':
				d.str = false
			}
		case !d.begun:
			switch c {
			case ' ', '\t', '\n', '\r':
				continue
			case '{', '[':
				d.begun, d.depth = true, 1
			default:
				return i
			}
		case c == '"':
			d.str = true
		case c == '{' || c == '[':
			d.depth++
		case c == '}' || c == ']':
			if d.depth--; d.depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// replayBody is a request body whose first bytes were read and are read
// again, closed as the original.
type replayBody struct {
	io.Reader
	io.Closer
}
