package bodyscan

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// TestJSONNumberAt checks the allocation-free path walk against documents
// of the shapes LLM APIs send, and what it must refuse.
func TestJSONNumberAt(t *testing.T) {
	cases := []struct {
		doc, path, want string // want "" means not found
	}{
		{`{"usage":{"total_tokens":42}}`, "usage.total_tokens", "42"},
		{`{"id":"a\"}b","choices":[{"delta":{"content":"x{[\\"}}],"usage":{"prompt_tokens":1,"total_tokens":7}}`, "usage.total_tokens", "7"},
		{`{"usage":null}`, "usage.total_tokens", ""},
		{`{"usage":{"total_tokens":"12"}}`, "usage.total_tokens", ""},
		{`{"usage":{"total_tokens":1.5e3}}`, "usage.total_tokens", "1.5e3"},
		{`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`, "usage.output_tokens", "15"},
		{` { "a" : [ 1 , {"b": 2} ] } `, "a.1.b", "2"},
		{`{"a":[1,2]}`, "a.2", ""},
		{`{"a":[1,2]}`, "a.x", ""},
		{`{"a":true,"b":3}`, "b", "3"},
		{`{"usage":{"total_tokens":42`, "usage.total_tokens", ""},
		{`{"usage":{"total_tokens":42}`, "usage.total_tokens", ""},
		{`{"usage":{"total_tokens":42}}}`, "usage.total_tokens", ""},
		{`{"usage":{"total_tokens":4 2}}`, "usage.total_tokens", ""},
		// Read as parsers read: the last of duplicate keys, escapes decoded.
		{`{"max_tokens":1,"max_tokens":5000}`, "max_tokens", "5000"},
		{`{"max_tokens":1,"model":"m","max_tokens":"x"}`, "max_tokens", ""},
		{`{"usage":{"total_tokens":1},"usage":{"prompt_tokens":2}}`, "usage.total_tokens", ""},
		{`{"max\u005ftokens":5000}`, "max_tokens", "5000"},
		{`{"max_tokens":1,"max\u005Ftokens":5000}`, "max_tokens", "5000"},
		{`{"a\"b":7}`, `a"b`, "7"},
		{`{"\ud83d\ude00":8}`, "\U0001F600", "8"},
		{`{"\ud83d":9}`, "\uFFFD", "9"},
		{"{\"\xff\":10}", "\uFFFD", "10"},
		{`{"usage":{"total_tok`, "usage.total_tokens", ""},
		{`[DONE]`, "usage.total_tokens", ""},
		{`{"x":{"usage":{"total_tokens":5}}}`, "usage.total_tokens", ""},
		{`{"usage":-3}`, "usage", "-3"},
	}
	for _, c := range cases {
		got, ok := NumberAt([]byte(c.doc), strings.Split(c.path, "."))
		if c.want == "" && ok {
			t.Errorf("NumberAt(%s, %s) = %q, want not found", c.doc, c.path, got)
		}
		if c.want != "" && (!ok || string(got) != c.want) {
			t.Errorf("NumberAt(%s, %s) = %q, %v; want %q", c.doc, c.path, got, ok, c.want)
		}
	}
	doc := []byte(`{"choices":[{"delta":{"content":"` + strings.Repeat("y", 900) + `"}}],"usage":{"total_tokens":9}}`)
	segs := []string{"usage", "total_tokens"}
	if n := testing.AllocsPerRun(100, func() { NumberAt(doc, segs) }); n != 0 {
		t.Errorf("NumberAt allocates %v times, want 0", n)
	}
}

// FuzzJSONNumberAt: the walk reads what encoding/json reads (into a map,
// keeping the last of duplicate keys, escapes decoded), for any bytes
// and path: the same number, or none where the value at the path is
// missing, not a number, or the document is not JSON (jsonValid agrees
// with json.Valid on every input).
func FuzzJSONNumberAt(f *testing.F) {
	for _, seed := range []struct{ doc, path string }{
		{`{"usage":{"total_tokens":42}}`, "usage.total_tokens"},
		{`{"max_tokens":1,"max_tokens":5000}`, "max_tokens"},
		{`{"max\u005ftokens":5000}`, "max_tokens"},
		{`{"a":[1,{"b":-2.5e3}]}`, "a.1.b"},
		{`{"\ud83d\ude00":8,"x":"\\\"}"}`, "\U0001F600"},
		{"{\"\xff\":10}", "\uFFFD"},
		{`{"usage":{"total_tokens":42`, "usage.total_tokens"},
		{`[{"a":1},{"a":2,"a":3}]`, "1.a"},
	} {
		f.Add([]byte(seed.doc), seed.path)
	}
	f.Add([]byte(`[1,-0.5e+7,"\u00e9\n",true,false,null,{}]`), "0")
	f.Add([]byte(`{"a":01}`), "a")
	f.Add([]byte("{\"a\":\"\t\"}"), "a")
	f.Fuzz(func(t *testing.T, doc []byte, path string) {
		if got, want := jsonValid(doc), json.Valid(doc); got != want {
			t.Fatalf("jsonValid(%q) = %v, json.Valid says %v", doc, got, want)
		}
		segs := strings.Split(path, ".")
		for _, s := range segs {
			if s == "" {
				return // refused at load
			}
		}
		got, ok := NumberAt(doc, segs)
		want, wantOK := decodedNumberAt(doc, segs)
		if ok != wantOK || string(got) != want {
			t.Fatalf("NumberAt(%q, %q) = %q, %v; encoding/json reads %q, %v", doc, path, got, ok, want, wantOK)
		}
	})
}

// decodedNumberAt is the number at segs in doc as encoding/json decodes
// it.
func decodedNumberAt(doc []byte, segs []string) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil || !json.Valid(doc) {
		return "", false
	}
	for _, seg := range segs {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[seg]; !ok {
				return "", false
			}
		case []any:
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || n >= len(x) {
				return "", false
			}
			v = x[n]
		default:
			return "", false
		}
	}
	n, ok := v.(json.Number)
	return string(n), ok
}
