package bodyscan

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// NumberAt returns the number at the dotted path segs in the JSON
// document doc (a segment that is a whole number indexes an array),
// without decoding the document or allocating: it walks the document,
// skipping every value off the path. It reads the document as JSON
// parsers (JSON.parse, Python's json, Go's encoding/json, and so the
// upstream) do: a key is compared with its escapes decoded, and of a key
// given twice the last counts. ok is false when the path is missing,
// holds something other than a number (null, say), or the document is
// not one whole JSON value (malformed, or cut off): a parser would
// refuse it, so no number of it is read.
func NumberAt(doc []byte, segs []string) (num []byte, ok bool) {
	i := skipSpace(doc, 0)
	for _, seg := range segs {
		if i >= len(doc) {
			return nil, false
		}
		switch doc[i] {
		case '{':
			i, ok = findKey(doc, i+1, seg)
		case '[':
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 {
				return nil, false
			}
			i, ok = findIndex(doc, i+1, n)
		default:
			return nil, false
		}
		if !ok {
			return nil, false
		}
	}
	if i >= len(doc) {
		return nil, false
	}
	end := i
	for end < len(doc) && bytes.IndexByte([]byte("+-.0123456789eE"), doc[end]) >= 0 {
		end++
	}
	if end == i || (doc[i] != '-' && (doc[i] < '0' || doc[i] > '9')) {
		return nil, false
	}
	// The walk is bounded on any bytes; what it found counts only in a
	// document a parser reads, checked last: most documents looked into
	// (a stream's events) hold no number at the path.
	if !jsonValid(doc) {
		return nil, false
	}
	return doc[i:end], true
}

// findKey scans the object whose members start at i for key and returns
// the position of its value: of the last member named key, as parsers
// keep the last of duplicate keys, so the whole object is scanned.
func findKey(doc []byte, i int, key string) (int, bool) {
	at := -1
	for {
		i = skipSpace(doc, i)
		if i >= len(doc) || doc[i] != '"' {
			return at, at >= 0 // '}': the object ended
		}
		end, ok := skipString(doc, i)
		if !ok {
			return 0, false
		}
		name := doc[i+1 : end-1]
		i = skipSpace(doc, end)
		if i >= len(doc) || doc[i] != ':' {
			return 0, false
		}
		i = skipSpace(doc, i+1)
		if keyIs(name, key) {
			at = i
		}
		if i, ok = nextItem(doc, i); !ok {
			return at, at >= 0 // the object's last member
		}
	}
}

// keyIs reports whether the JSON string content raw (between its quotes,
// escapes undecoded) decodes to key, decoding as encoding/json does: an
// escape is decoded (a surrogate pair to its rune), and a byte that is not
// UTF-8 or a lone surrogate reads as U+FFFD. Without allocating.
func keyIs(raw []byte, key string) bool {
	for _, c := range raw {
		if c == '\\' || c >= utf8.RuneSelf {
			return decodesTo(raw, key)
		}
	}
	return string(raw) == key // plain ASCII: itself
}

// decodesTo is keyIs for a key with escapes or bytes beyond ASCII.
func decodesTo(raw []byte, key string) bool {
	var enc [utf8.UTFMax]byte
	for len(raw) > 0 {
		var r rune
		r, raw = nextRune(raw)
		n := utf8.EncodeRune(enc[:], r)
		if len(key) < n || key[:n] != string(enc[:n]) {
			return false
		}
		key = key[n:]
	}
	return key == ""
}

// nextRune decodes the first rune of the JSON string content raw and
// returns it and the rest. Content that is not valid JSON reads as
// anything but panics not (its document is refused after the walk).
func nextRune(raw []byte) (rune, []byte) {
	if raw[0] != '\\' {
		r, n := utf8.DecodeRune(raw) // utf8.RuneError for a byte that is not UTF-8
		return r, raw[n:]
	}
	if len(raw) < 2 || (raw[1] == 'u' && len(raw) < 6) {
		return utf8.RuneError, nil
	}
	switch raw[1] {
	case 'b':
		return '\b', raw[2:]
	case 'f':
		return '\f', raw[2:]
	case 'n':
		return '\n', raw[2:]
	case 'r':
		return '\r', raw[2:]
	case 't':
		return '\t', raw[2:]
	case 'u':
		r := hex4(raw[2:6])
		if utf16.IsSurrogate(r) {
			if len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
				if d := utf16.DecodeRune(r, hex4(raw[8:12])); d != utf8.RuneError {
					return d, raw[12:]
				}
			}
			return utf8.RuneError, raw[6:]
		}
		return r, raw[6:]
	}
	return rune(raw[1]), raw[2:] // \" \\ \/
}

// hex4 is the value of four hex digits.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// findIndex scans the array whose elements start at i for element n.
func findIndex(doc []byte, i, n int) (int, bool) {
	for k := 0; ; k++ {
		i = skipSpace(doc, i)
		if i >= len(doc) || doc[i] == ']' {
			return 0, false
		}
		if k == n {
			return i, true
		}
		var ok bool
		if i, ok = nextItem(doc, i); !ok {
			return 0, false
		}
	}
}

// nextItem skips the value at i of an object or array and the comma
// after it, and returns where the next member or element starts; false
// at the container's end or on anything else.
func nextItem(doc []byte, i int) (int, bool) {
	i, ok := skipValue(doc, i)
	if !ok {
		return 0, false
	}
	i = skipSpace(doc, i)
	if i >= len(doc) || doc[i] != ',' {
		return 0, false
	}
	return i + 1, true
}

// skipValue returns the position after the value at i.
func skipValue(doc []byte, i int) (int, bool) {
	if i >= len(doc) {
		return 0, false
	}
	switch doc[i] {
	case '"':
		return skipString(doc, i)
	case '{', '[':
		depth := 0
		for i < len(doc) {
			switch doc[i] {
			case '"':
				end, ok := skipString(doc, i)
				if !ok {
					return 0, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	}
	for i < len(doc) && doc[i] != ',' && doc[i] != '}' && doc[i] != ']' && doc[i] != ' ' && doc[i] != '\n' && doc[i] != '\r' && doc[i] != '\t' {
		i++
	}
	return i, true
}

// skipString returns the position after the string starting at i (a '"').
func skipString(doc []byte, i int) (int, bool) {
	for j := i + 1; ; {
		k := bytes.IndexByte(doc[j:], '"')
		if k < 0 {
			return 0, false
		}
		j += k
		// A quote preceded by an odd number of backslashes is escaped.
		bs := 0
		for b := j - 1; b > i && doc[b] == '\\'; b-- {
			bs++
		}
		if bs%2 == 0 {
			return j + 1, true
		}
		j++
	}
}

func skipSpace(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\n' || doc[i] == '\r' || doc[i] == '\t') {
		i++
	}
	return i
}

// jsonValid reports whether doc is one JSON value and nothing else but
// white space, as json.Valid does, without allocating (json.Valid takes
// its scanner from a sync.Pool, which a garbage collection empties).
func jsonValid(doc []byte) bool {
	i, ok := validValue(doc, skipSpace(doc, 0), 0)
	return ok && skipSpace(doc, i) == len(doc)
}

// maxJSONDepth is encoding/json's limit on nesting.
const maxJSONDepth = 10000

// validValue returns the position after the valid value at i, nested in
// depth containers.
func validValue(doc []byte, i, depth int) (int, bool) {
	if i >= len(doc) {
		return 0, false
	}
	switch c := doc[i]; {
	case c == '{' || c == '[':
		if depth == maxJSONDepth {
			return 0, false
		}
		end := byte(']')
		if c == '{' {
			end = '}'
		}
		i = skipSpace(doc, i+1)
		if i < len(doc) && doc[i] == end {
			return i + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if i >= len(doc) || doc[i] != '"' {
					return 0, false
				}
				if i, ok = validString(doc, i); !ok {
					return 0, false
				}
				if i = skipSpace(doc, i); i >= len(doc) || doc[i] != ':' {
					return 0, false
				}
				i = skipSpace(doc, i+1)
			}
			if i, ok = validValue(doc, i, depth+1); !ok {
				return 0, false
			}
			if i = skipSpace(doc, i); i >= len(doc) {
				return 0, false
			}
			switch doc[i] {
			case end:
				return i + 1, true
			case ',':
				i = skipSpace(doc, i+1)
			default:
				return 0, false
			}
		}
	case c == '"':
		return validString(doc, i)
	case c == '-' || (c >= '0' && c <= '9'):
		return validNumber(doc, i)
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(doc[i:], []byte(lit)) {
			return i + len(lit), true
		}
	}
	return 0, false
}

// validString returns the position after the valid string at i (a '"'):
// no control character, only JSON's escapes. Bytes that are not UTF-8
// are let through, as encoding/json does.
func validString(doc []byte, i int) (int, bool) {
	for j := i + 1; j < len(doc); j++ {
		switch c := doc[j]; {
		case c == '"':
			return j + 1, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			j++
			if j >= len(doc) {
				return 0, false
			}
			switch doc[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(doc) {
					return 0, false
				}
				for _, h := range doc[j+1 : j+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return 0, false
					}
				}
				j += 4
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

// validNumber returns the position after the valid number at i:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(doc []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(doc) && doc[i] >= '0' && doc[i] <= '9' {
			i++
		}
		return i
	}
	if doc[i] == '-' {
		i++
	}
	switch {
	case i < len(doc) && doc[i] == '0':
		i++
	case i < len(doc) && doc[i] >= '1' && doc[i] <= '9':
		i = digits(i)
	default:
		return 0, false
	}
	if i < len(doc) && doc[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(doc) && (doc[i] == 'e' || doc[i] == 'E') {
		i++
		if i < len(doc) && (doc[i] == '+' || doc[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

// RequestValue returns the value at the dotted path (a segment that is a
// whole number indexes an array) in doc, a request's JSON body, read so
// that no upstream's parser takes a value the limiter did not count:
// parsers disagree on which key is the path (JSON.parse and Python's
// json keep the last of duplicate keys, some the first; Go's
// encoding/json, decoding into a struct as Ollama's API does, matches a
// key without regard to case, folding Unicode so that "ſ" is "s" and the
// Kelvin sign is "k", and keeps the last match), so every member whose
// key folds to the segment (see keyFolds) is a candidate, and:
//
//   - if any candidate is a number, the value is the largest number
//     (an estimate from it errs high), as written;
//   - else if every candidate is a string, or true or false, and all
//     are the same (strings compared decoded), the value is that string
//     decoded, or true or false;
//   - else (candidates that disagree, null, an object or array, or none)
//     the path is missing: ok is false.
//
// ok is false too when doc is not one whole JSON value: a parser would
// refuse it.
func RequestValue(doc []byte, path string) (val string, ok bool) {
	if val, ok = ValidRequestValue(doc, path); !ok || !jsonValid(doc) {
		return "", false
	}
	return val, true
}

// Valid reports whether doc is one whole JSON value, as json.Valid does,
// without allocating.
func Valid(doc []byte) bool { return jsonValid(doc) }

// ValidRequestValue is RequestValue for a document that Valid has
// accepted: it walks only the path, not the whole document.
func ValidRequestValue(doc []byte, path string) (val string, ok bool) {
	if path == "" {
		return "", false
	}
	var p pick
	p.walk(doc, skipSpace(doc, 0), path)
	switch {
	case p.num != nil:
		val = string(p.num)
	case p.str != nil && !p.differ:
		if p.str[0] != '"' {
			val = string(p.str) // true or false
		} else {
			val = decodeString(p.str[1 : len(p.str)-1])
		}
	default:
		return "", false
	}
	return val, true
}

// pick gathers RequestValue's candidates.
type pick struct {
	num    []byte  // the largest number so far, or nil
	numV   float64 // its value
	str    []byte  // the first string (quoted) or true or false, or nil
	differ bool    // a later string or literal is not str
}

// walk finds the values at path in the value at i, each given to note.
// Members whose keys fold alike are disjoint values, so the walk reads
// each byte of doc at most once per segment.
func (p *pick) walk(doc []byte, i int, path string) {
	if i >= len(doc) {
		return
	}
	seg, rest, more := strings.Cut(path, ".")
	switch doc[i] {
	case '{':
		for i++; ; {
			i = skipSpace(doc, i)
			if i >= len(doc) || doc[i] != '"' {
				return
			}
			end, ok := skipString(doc, i)
			if !ok {
				return
			}
			name := doc[i+1 : end-1]
			if i = skipSpace(doc, end); i >= len(doc) || doc[i] != ':' {
				return
			}
			i = skipSpace(doc, i+1)
			if keyFolds(name, seg) {
				if more {
					p.walk(doc, i, rest)
				} else {
					p.note(doc, i)
				}
			}
			if i, ok = nextItem(doc, i); !ok {
				return
			}
		}
	case '[':
		n, err := strconv.Atoi(seg)
		if err != nil || n < 0 {
			return
		}
		at, ok := findIndex(doc, i+1, n)
		if !ok {
			return
		}
		if more {
			p.walk(doc, skipSpace(doc, at), rest)
		} else {
			p.note(doc, at)
		}
	}
}

// note takes the value at i as a candidate.
func (p *pick) note(doc []byte, i int) {
	if i >= len(doc) {
		return // cut off: the document is refused
	}
	switch c := doc[i]; {
	case c == '-' || (c >= '0' && c <= '9'):
		end, ok := validNumber(doc, i)
		if !ok {
			return
		}
		f, err := strconv.ParseFloat(string(doc[i:end]), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return
		}
		if p.num == nil || f > p.numV {
			p.num, p.numV = doc[i:end], f
		}
	case c == '"':
		end, ok := skipString(doc, i)
		if !ok {
			return
		}
		p.same(doc[i:end])
	case bytes.HasPrefix(doc[i:], []byte("true")):
		p.same(doc[i : i+4])
	case bytes.HasPrefix(doc[i:], []byte("false")):
		p.same(doc[i : i+5])
	}
}

// same notes a string or literal candidate v.
func (p *pick) same(v []byte) {
	switch {
	case p.str == nil:
		p.str = v
	case (p.str[0] == '"') != (v[0] == '"'):
		p.differ = true
	case v[0] == '"':
		p.differ = p.differ || !sameDecoded(p.str[1:len(p.str)-1], v[1:len(v)-1])
	default:
		p.differ = p.differ || !bytes.Equal(p.str, v)
	}
}

// sameDecoded reports whether the JSON string contents a and b (escapes
// undecoded) decode to the same string.
func sameDecoded(a, b []byte) bool {
	for len(a) > 0 && len(b) > 0 {
		var ra, rb rune
		ra, a = nextRune(a)
		rb, b = nextRune(b)
		if ra != rb {
			return false
		}
	}
	return len(a) == 0 && len(b) == 0
}

// decodeString decodes JSON string content (between its quotes), as
// encoding/json does.
func decodeString(raw []byte) string {
	out := make([]byte, 0, len(raw))
	for len(raw) > 0 {
		var r rune
		r, raw = nextRune(raw)
		out = utf8.AppendRune(out, r)
	}
	return string(out)
}

// keyFolds reports whether the JSON string content raw (escapes
// undecoded) decodes to a key that Go's encoding/json takes for a struct
// field named seg: equal under Unicode simple folding, rune by rune, as
// its foldName compares (so also when equal outright). Without
// allocating.
func keyFolds(raw []byte, seg string) bool {
	for len(raw) > 0 {
		var r rune
		r, raw = nextRune(raw)
		if seg == "" {
			return false
		}
		s, n := utf8.DecodeRuneInString(seg)
		seg = seg[n:]
		if r != s && foldRune(r) != foldRune(s) {
			return false
		}
	}
	return seg == ""
}

// foldRune is the smallest rune of r's simple folding orbit, as
// encoding/json's.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}
