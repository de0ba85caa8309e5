package bodyscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// The reader is checked here against a reference on generated documents,
// in the default run (seeded, so a failure repeats): encoding/json for
// what a document is and what it holds, and for RequestValue a plain
// model of its rule over encoding/json's tokens. The documents are made
// of the parts the reader's branches turn on (escapes, surrogates, bytes
// that are not UTF-8, every number form, keys that fold, duplicates,
// white space, nesting), and a share of them is broken by an edit or cut
// off, so that refusals are checked as much as readings.

// docGen generates JSON documents, valid and nearly so.
type docGen struct {
	r *rand.Rand
	b []byte
}

// keys are the member names generated, written as the document holds
// them: escaped, folded (the Kelvin sign folds to k, ſ to s), or not
// UTF-8.
var genKeys = []string{
	`a`, `b`, `A`, `B`, `ab`, `aB`, `k`, `K`, `s`, `\u212a`, "\u212a", `\u017f`, "\u017f",
	`\u0061`, `\u0041`, `a\u0062`, `\"`, `\\`, `\/`, `/`, `\ud83d\ude00`, "\U0001F600", `\ud83d`,
	`\ude00`, `\ud83d\u0061`, `\ud83dx`, "\xff", "\xc3", `\ufffd`, "\ufffd", ``, `\n`, `\t`, `\b\f\r`,
	`0`, `1`, `usage`, `max_tokens`, `µ`, `\u039c`, `\u03bc`, `é`, `\u00C9`, "\x80", `z`, `Z`, `\u007a`,
	`\u0039`, `\u005f`, `\u005F`, `\u00af`, `_`, "\u0080", `\u0080`, `€`,
}

// genPaths are the path segments asked for: the keys decoded, their other
// cases, indexes, and segments no key is.
var genSegs = []string{
	"a", "b", "A", "B", "ab", "AB", "k", "K", "s", "S", "\u212a", "\u017f", `"`, `\`, "/",
	"\U0001F600", "\ufffd", "", "\n", "\t", "\b\f\r", "0", "1", "2", "-1", "+1", "01", "x",
	"usage", "USAGE", "max_tokens", "µ", "Μ", "μ", "é", "É", "\x80", "z", "Z", "9", "_", "\u0080", "€",
}

var genStrings = []string{
	``, `x`, `a`, `A`, `1`, `true`, `\u0061`, `\"`, `\\`, `\/`, `\b\f\n\r\t`, `\u00e9`, `\u00E9`, `é`,
	`\ud83d\ude00`, "\U0001F600", `\ud83d`, `\ude00x`, `\ud83d\ud83d`, "\xff", "\xe2\x82", `}]`, `{[`,
	`\\\"`, `,:`,
}

var genNumbers = []string{
	"0", "-0", "1", "7", "42", "-3", "10", "1.5", "-2.5e3", "1E+2", "1e-2", "0.0", "1e400", "-1e400",
	"123456789012345678901234567890", "2e3", "1999", "0e0", "-0.0", "9", "-9.9", "90e-1",
}

// genBadNumbers are not numbers: a document that holds one is not JSON.
var genBadNumbers = []string{
	"1.", "01", "-", "1e", "1e+", ".5", "+1", "1.e3", "-01", "9a", "0x1", "1ee2", "--1", "1.2.3",
}

// Bytes that break a document where an edit puts them.
const genNoise = "{}[]\",:\\ \t\n\r0123456789-+.eEtrufalsn\x00\x01\x1f\x7f\xff"

// key returns a member name: half of them of the few that paths ask
// for most (a, b, and a's other spellings), so that paths find values.
func (g *docGen) key() string {
	if g.r.IntN(2) == 0 {
		return [...]string{"a", "b", "A", `\u0061`}[g.r.IntN(4)]
	}
	return genKeys[g.r.IntN(len(genKeys))]
}

func (g *docGen) ws() {
	for g.r.IntN(3) == 0 {
		g.b = append(g.b, " \t\n\r"[g.r.IntN(4)])
	}
}

func (g *docGen) value(depth int) {
	g.ws()
	k := g.r.IntN(10)
	if depth >= 4 {
		k = 4 + g.r.IntN(6)
	}
	switch k {
	case 0, 1, 2:
		g.b = append(g.b, '{')
		g.ws()
		for i, n := 0, g.r.IntN(5); i < n; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.ws()
			g.b = append(g.b, '"')
			g.b = append(g.b, g.key()...)
			g.b = append(g.b, '"')
			g.ws()
			g.b = append(g.b, ':')
			g.value(depth + 1)
		}
		g.b = append(g.b, '}')
	case 3:
		g.b = append(g.b, '[')
		g.ws()
		for i, n := 0, g.r.IntN(4); i < n; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.value(depth + 1)
		}
		g.b = append(g.b, ']')
	case 4, 5, 6:
		if g.r.IntN(20) == 0 {
			g.b = append(g.b, genBadNumbers[g.r.IntN(len(genBadNumbers))]...)
		} else {
			g.b = append(g.b, genNumbers[g.r.IntN(len(genNumbers))]...)
		}
	case 7, 8:
		g.b = append(g.b, '"')
		g.b = append(g.b, genStrings[g.r.IntN(len(genStrings))]...)
		g.b = append(g.b, '"')
	default:
		g.b = append(g.b, [...]string{"true", "false", "null"}[g.r.IntN(3)]...)
	}
	g.ws()
}

// doc returns a document: valid, or (one in three) broken by an edit, a
// cut or bytes after it.
func (g *docGen) doc() []byte {
	g.b = g.b[:0]
	if g.r.IntN(8) > 0 {
		// Most documents the reader meets are objects: one whose member
		// "a" every path may ask for, and maybe more.
		g.b = append(g.b, `{"a":`...)
		g.value(1)
		for g.r.IntN(2) == 0 {
			g.b = append(g.b, `,"`+g.key()+`":`...)
			g.value(1)
		}
		g.b = append(g.b, '}')
	} else {
		g.value(0)
	}
	switch g.r.IntN(9) {
	case 0:
		i := g.r.IntN(len(g.b) + 1)
		g.b = append(g.b[:i], append([]byte{genNoise[g.r.IntN(len(genNoise))]}, g.b[i:]...)...)
	case 1:
		if len(g.b) > 0 {
			i := g.r.IntN(len(g.b))
			g.b = append(g.b[:i], g.b[i+1:]...)
		}
	case 2:
		g.b = g.b[:g.r.IntN(len(g.b)+1)]
	case 3:
		if len(g.b) > 0 {
			g.b[g.r.IntN(len(g.b))] = genNoise[g.r.IntN(len(genNoise))]
		}
	}
	return bytes.Clone(g.b)
}

// path returns one to three segments.
func (g *docGen) path() []string {
	segs := make([]string, 1+g.r.IntN(3))
	for i := range segs {
		segs[i] = genSegs[g.r.IntN(len(genSegs))]
		if g.r.IntN(2) == 0 {
			segs[i] = "a" // the member every object document has
		}
	}
	return segs
}

// genCases is how many documents each reference test reads.
const genCases = 20000

// TestNumberAtAgainstEncodingJSON: on generated documents, jsonValid is
// json.Valid, and NumberAt reads what encoding/json reads into a map (the
// last of duplicate keys, escapes decoded): the same number as written,
// or none.
func TestNumberAtAgainstEncodingJSON(t *testing.T) {
	g := &docGen{r: rand.New(rand.NewPCG(1, 2))}
	valid, found := 0, 0
	for range genCases {
		doc := g.doc()
		v := jsonValid(doc)
		if want := json.Valid(doc); v != want {
			t.Fatalf("jsonValid(%q) = %v, json.Valid says %v", doc, v, want)
		}
		if v != Valid(doc) {
			t.Fatalf("Valid(%q) = %v, jsonValid says %v", doc, Valid(doc), v)
		}
		if v {
			valid++
		}
		for range 3 {
			segs := g.path()
			got, ok := NumberAt(doc, segs)
			want, wantOK := decodedNumberAt(doc, segs)
			if ok != wantOK || string(got) != want {
				t.Fatalf("NumberAt(%q, %q) = %q, %v; encoding/json reads %q, %v", doc, segs, got, ok, want, wantOK)
			}
			if ok {
				found++
			}
		}
	}
	t.Logf("%d documents, %d valid; %d numbers found", genCases, valid, found)
	// The generator is worth its cases only if both answers are common.
	if valid < genCases/3 || valid > genCases*9/10 || found < genCases/20 {
		t.Errorf("of %d documents %d valid, %d numbers found: the generator no longer covers both sides", genCases, valid, found)
	}
}

// node is a JSON value as encoding/json's tokens give it, members in
// document order (duplicates kept).
type node struct {
	tok   json.Token // a string, json.Number, bool or nil; a json.Delim for a container
	keys  []string   // an object's member names, decoded
	elems []*node    // an object's member values, or an array's elements
}

// parseOrdered reads doc through encoding/json's tokenizer.
func parseOrdered(d *json.Decoder) (*node, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	n := &node{tok: tok}
	switch tok {
	case json.Delim('{'):
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			v, err := parseOrdered(d)
			if err != nil {
				return nil, err
			}
			n.keys = append(n.keys, k.(string))
			n.elems = append(n.elems, v)
		}
		_, err = d.Token()
	case json.Delim('['):
		for d.More() {
			v, err := parseOrdered(d)
			if err != nil {
				return nil, err
			}
			n.elems = append(n.elems, v)
		}
		_, err = d.Token()
	}
	return n, err
}

// modelRequestValue is RequestValue's rule written plainly over
// encoding/json's reading: every value whose keys fold to the path's
// segments (strings.EqualFold: Unicode simple folding, as encoding/json
// matches a struct field) is a candidate, in document order; the largest
// number wins (the first of equal ones, as written); else strings and
// booleans that all agree; null, objects and arrays are no candidates.
func modelRequestValue(doc []byte, path string) (string, bool) {
	if path == "" || !json.Valid(doc) {
		return "", false
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	root, err := parseOrdered(d)
	if err != nil {
		panic(err) // json.Valid accepted it
	}
	var cands []*node
	var walk func(n *node, segs []string)
	walk = func(n *node, segs []string) {
		if len(segs) == 0 {
			cands = append(cands, n)
			return
		}
		switch n.tok {
		case json.Delim('{'):
			for i, k := range n.keys {
				if strings.EqualFold(k, segs[0]) {
					walk(n.elems[i], segs[1:])
				}
			}
		case json.Delim('['):
			if i, err := strconv.Atoi(segs[0]); err == nil && i >= 0 && i < len(n.elems) {
				walk(n.elems[i], segs[1:])
			}
		}
	}
	walk(root, strings.Split(path, "."))
	var num json.Number
	var numV float64
	for _, c := range cands {
		if x, ok := c.tok.(json.Number); ok {
			f, err := strconv.ParseFloat(string(x), 64)
			if err != nil && !errors.Is(err, strconv.ErrRange) {
				panic(err)
			}
			if num == "" || f > numV {
				num, numV = x, f
			}
		}
	}
	if num != "" {
		return string(num), true
	}
	var first any
	for _, c := range cands {
		switch x := c.tok.(type) {
		case string, bool:
			if first == nil {
				first = x
			} else if first != x {
				return "", false
			}
		}
	}
	switch x := first.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

// TestRequestValueAgainstModel: on generated documents and paths,
// RequestValue reads what modelRequestValue does, and ValidRequestValue
// does too on the valid ones.
func TestRequestValueAgainstModel(t *testing.T) {
	g := &docGen{r: rand.New(rand.NewPCG(3, 4))}
	found := 0
	for range genCases {
		doc := g.doc()
		for range 3 {
			path := strings.Join(g.path(), ".")
			if g.r.IntN(50) == 0 {
				path = ""
			}
			got, ok := RequestValue(doc, path)
			want, wantOK := modelRequestValue(doc, path)
			if ok != wantOK || got != want {
				t.Fatalf("RequestValue(%q, %q) = %q, %v; the model reads %q, %v", doc, path, got, ok, want, wantOK)
			}
			if json.Valid(doc) {
				if got, ok := ValidRequestValue(doc, path); ok != wantOK || got != want {
					t.Fatalf("ValidRequestValue(%q, %q) = %q, %v; the model reads %q, %v", doc, path, got, ok, want, wantOK)
				}
			}
			if ok {
				found++
			}
		}
	}
	t.Logf("%d documents, %d values found", genCases, found)
	if found < genCases/10 {
		t.Errorf("of %d documents, %d values found: the generator no longer reaches the values", genCases, found)
	}
}

// TestReadDocumentAgainstEncodingJSON: of a valid document that is an
// object or array followed by anything, readDocument reads up to where
// encoding/json's decoder ends the document, however the body is split
// into reads.
func TestReadDocumentAgainstEncodingJSON(t *testing.T) {
	g := &docGen{r: rand.New(rand.NewPCG(5, 6))}
	checked := 0
	for range genCases / 4 {
		doc := g.doc()
		if !json.Valid(doc) {
			continue
		}
		trimmed := bytes.TrimLeft(doc, " \t\n\r")
		if trimmed[0] != '{' && trimmed[0] != '[' {
			continue
		}
		d := json.NewDecoder(bytes.NewReader(doc))
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatalf("decoding %q: %v", doc, err)
		}
		end := int(d.InputOffset())
		body := append(bytes.Clone(doc[:end]), ` {"then":"more"}`...)
		buf, got := readDocument(&splitReader{r: g.r, data: body})
		if got != end || !bytes.Equal(buf[:got], doc[:end]) {
			t.Fatalf("readDocument(%q) ends at %d, read %q; encoding/json ends the document at %d", body, got, buf, end)
		}
		checked++
	}
	if checked < genCases/20 {
		t.Errorf("only %d documents checked", checked)
	}
}

// splitReader reads data in pieces of random sizes.
type splitReader struct {
	r    *rand.Rand
	data []byte
}

func (s *splitReader) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 1+s.r.IntN(16))], s.data)
	s.data = s.data[n:]
	return n, nil
}

// TestKeyMatchAgainstEncodingJSON: for every key the generator writes
// and every segment it asks for, keyIs says whether encoding/json decodes
// the key to the segment, and keyFolds whether it decodes to one equal
// under simple folding (strings.EqualFold, as encoding/json matches a
// struct field): each pair once, so that rare pairs (an escaped
// backslash, a lone continuation byte, z against Z) are not left to
// chance; and each key against itself decoded.
func TestKeyMatchAgainstEncodingJSON(t *testing.T) {
	for _, raw := range genKeys {
		var key string
		if err := json.Unmarshal([]byte(`"`+raw+`"`), &key); err != nil {
			t.Fatalf("key %q: %v", raw, err)
		}
		for _, seg := range append([]string{key}, genSegs...) { // the key itself, decoded, first
			if got, want := keyIs([]byte(raw), seg), key == seg; got != want {
				t.Errorf("keyIs(%q, %q) = %v; encoding/json decodes the key to %q", raw, seg, got, key)
			}
			if got, want := keyFolds([]byte(raw), seg), strings.EqualFold(key, seg); got != want {
				t.Errorf("keyFolds(%q, %q) = %v; encoding/json decodes the key to %q, EqualFold says %v", raw, seg, got, key, want)
			}
		}
	}
}
