package bodyscan

import (
	"bytes"
	"encoding/json"
	"reflect"
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

// TestRequestValue: of the keys that some parser takes for the path
// (duplicates, and Go's case-insensitive, Unicode-folding match), a
// number is the largest; strings count only when they agree.
func TestRequestValue(t *testing.T) {
	cases := []struct {
		name, doc, path string
		want            string // "" means missing
	}{
		{"plain", `{"max_tokens":300}`, "max_tokens", "300"},
		{"duplicate, larger last", `{"max_tokens":1,"max_tokens":5000}`, "max_tokens", "5000"},
		{"duplicate, larger first", `{"max_tokens":5000,"max_tokens":1}`, "max_tokens", "5000"},
		{"upper case, Go keeps the last", `{"max_tokens":1,"MAX_TOKENS":50000}`, "max_tokens", "50000"},
		{"upper case first", `{"MAX_TOKENS":50000,"max_tokens":1}`, "max_tokens", "50000"},
		{"Kelvin sign, escaped", `{"max_tokens":1,"max_to\u212Aens":50000}`, "max_tokens", "50000"},
		{"Kelvin sign, UTF-8", "{\"max_tokens\":1,\"max_to\u212Aens\":50000}", "max_tokens", "50000"},
		{"long s", "{\"max_tokens\":1,\"max_token\u017F\":50000}", "max_tokens", "50000"},
		{"long s escaped", `{"max_tokens":1,"max_token\u017f":50000}`, "max_tokens", "50000"},
		{"not a fold", `{"max_tokens":1,"max_tokenz":50000}`, "max_tokens", "1"},
		{"number beside a string", `{"max_tokens":"x","Max_Tokens":7}`, "max_tokens", "7"},
		{"exponent compared by value", `{"max_tokens":2e3,"MAX_TOKENS":1999}`, "max_tokens", "2e3"},
		{"nested, folded at each level", `{"generationConfig":{"maxOutputTokens":5},"GENERATIONCONFIG":{"MAXOUTPUTTOKENS":800}}`, "generationConfig.maxOutputTokens", "800"},
		{"array index", `{"a":[{"b":1},{"b":2,"B":9}]}`, "a.1.b", "9"},
		{"string", `{"model":"gpt-4o"}`, "model", "gpt-4o"},
		{"string decoded", `{"model":"gpt\u002d4o"}`, "model", "gpt-4o"},
		{"same string twice", `{"model":"a","MODEL":"\u0061"}`, "model", "a"},
		{"strings that disagree", `{"model":"cheap","MODEL":"dear"}`, "model", ""},
		{"string and true", `{"stream":"true","Stream":true}`, "stream", ""},
		{"literal", `{"stream":true}`, "stream", "true"},
		{"null is no value", `{"model":"a","Model":null}`, "model", "a"},
		{"object is no value", `{"model":{"x":1}}`, "model", ""},
		{"missing", `{"messages":[]}`, "model", ""},
		{"not JSON", `{"model":"a"`, "model", ""},
		{"cut off after the colon", `{"model":`, "model", ""},
		{"trailing bytes", `{"max_tokens":5}x`, "max_tokens", ""},
		{"empty path", `{"":5}`, "", ""},
	}
	for _, c := range cases {
		got, ok := RequestValue([]byte(c.doc), c.path)
		if c.want == "" && ok {
			t.Errorf("%s: RequestValue(%s, %s) = %q, want missing", c.name, c.doc, c.path, got)
		}
		if c.want != "" && (!ok || got != c.want) {
			t.Errorf("%s: RequestValue(%s, %s) = %q, %v; want %q", c.name, c.doc, c.path, got, ok, c.want)
		}
	}
}

// FuzzRequestValue: the number RequestValue reads is never below what
// encoding/json reads, into a map (the last key spelled exactly, as
// JSON.parse and Python read) or into a struct (the last key that folds
// to the field's name), and a string it reads is what both read.
func FuzzRequestValue(f *testing.F) {
	for _, seed := range []struct{ doc, path string }{
		{`{"max_tokens":1,"MAX_TOKENS":50000}`, "max_tokens"},
		{`{"max_tokens":1,"max_to\u212Aens":50000}`, "max_tokens"},
		{"{\"max_tokens\":1,\"max_token\u017F\":50000}", "max_tokens"},
		{`{"model":"a","MODEL":"b"}`, "model"},
		{`{"model":"a","Model":"\u0061"}`, "model"},
		{`{"stream":true}`, "stream"},
	} {
		f.Add([]byte(seed.doc), seed.path)
	}
	f.Fuzz(func(t *testing.T, doc []byte, path string) {
		if path == "" || len(path) > 32 || strings.Trim(path, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_") != "" {
			return // a name that is a valid struct tag
		}
		got, ok := RequestValue(doc, path)
		var inMap map[string]any
		mapErr := json.Unmarshal(doc, &inMap)
		st := reflect.New(reflect.StructOf([]reflect.StructField{{
			Name: "F", Type: reflect.TypeFor[any](), Tag: reflect.StructTag(`json:"` + path + `"`),
		}}))
		structErr := json.Unmarshal(doc, st.Interface())
		for _, read := range []struct {
			how string
			v   any
			err error
		}{
			{"into a map", inMap[path], mapErr},
			{"into a struct", st.Elem().Field(0).Interface(), structErr},
		} {
			if read.err != nil {
				continue
			}
			switch v := read.v.(type) {
			case float64:
				n, err := strconv.ParseFloat(got, 64)
				if !ok || err != nil || n < v {
					t.Fatalf("RequestValue(%q, %q) = %q, %v; encoding/json %s reads %v, more", doc, path, got, ok, read.how, v)
				}
			case string:
				if ok && got != v {
					if _, err := strconv.ParseFloat(got, 64); err != nil {
						t.Fatalf("RequestValue(%q, %q) = %q; encoding/json %s reads %q", doc, path, got, read.how, v)
					}
				}
			}
		}
	})
}

// BenchmarkRequestValue reads max_tokens after a 100 KB prompt: with the
// document's validation (RequestValue) and without (ValidRequestValue, a
// document validated once on reading), as the handler does per path.
func BenchmarkRequestValue(b *testing.B) {
	doc := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("tell me more ", 100<<10/13) + `"}],"max_tokens":300}`)
	for _, c := range []struct {
		name string
		f    func([]byte, string) (string, bool)
	}{{"validated", RequestValue}, {"walk", ValidRequestValue}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				if v, ok := c.f(doc, "max_tokens"); !ok || v != "300" {
					b.Fatalf("got %q, %v", v, ok)
				}
			}
		})
	}
}
