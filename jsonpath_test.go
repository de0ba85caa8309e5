package tollgate

import (
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
		{`{"usage":{"total_tokens":42`, "usage.total_tokens", "42"},
		{`{"usage":{"total_tok`, "usage.total_tokens", ""},
		{`[DONE]`, "usage.total_tokens", ""},
		{`{"x":{"usage":{"total_tokens":5}}}`, "usage.total_tokens", ""},
		{`{"usage":-3}`, "usage", "-3"},
	}
	for _, c := range cases {
		got, ok := jsonNumberAt([]byte(c.doc), strings.Split(c.path, "."))
		if c.want == "" && ok {
			t.Errorf("jsonNumberAt(%s, %s) = %q, want not found", c.doc, c.path, got)
		}
		if c.want != "" && (!ok || string(got) != c.want) {
			t.Errorf("jsonNumberAt(%s, %s) = %q, %v; want %q", c.doc, c.path, got, ok, c.want)
		}
	}
	doc := []byte(`{"choices":[{"delta":{"content":"` + strings.Repeat("y", 900) + `"}}],"usage":{"total_tokens":9}}`)
	segs := []string{"usage", "total_tokens"}
	if n := testing.AllocsPerRun(100, func() { jsonNumberAt(doc, segs) }); n != 0 {
		t.Errorf("jsonNumberAt allocates %v times, want 0", n)
	}
}
