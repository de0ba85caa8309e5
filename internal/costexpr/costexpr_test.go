package costexpr

import (
	"strings"
	"testing"
)

// vars answers placeholders from a map, as caddy.Replacer's Get.
func vars(m map[string]any) func(string) (any, bool) {
	return func(name string) (any, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func TestEval(t *testing.T) {
	get := vars(map[string]any{
		"in": "1200", "out": "300", "cached": "200", "price_in": "3", "price_out": "15",
		"size": int64(4096), "f": 0.5, "empty": "", "text": "abc", "neg": "-3", "hex": "0x10", "inf": "Inf",
		"zero": "0",
	})
	cases := []struct {
		src  string
		want float64
		ok   bool
	}{
		{"{in}", 1200, true},
		{"{in} * {price_in} + {out} * {price_out}", 1200*3 + 300*15, true},
		{"({in} - {cached}) * 3 + {cached} * 0.3 + {out} * 15", 1000*3 + 200*0.3 + 300*15, true},
		{"{size} / 4", 1024, true},
		{"{f} * 10", 5, true},
		{"2 + 3 * 4", 14, true},
		{"(2 + 3) * 4", 20, true},
		{"10 - 4 - 3", 3, true},   // left to right
		{"24 / 4 / 3", 2, true},   // left to right
		{"1e-6 * 2e6", 2, true},   // exponents
		{" \t{in}\n", 1200, true}, // white space
		{"{missing}", 0, false},
		{"{missing:0} + {in}", 1200, true},
		{"{empty:7}", 7, true},
		{"{text}", 0, false},
		{"{neg}", 0, false},
		{"{hex}", 0, false},
		{"{inf}", 0, false},
		{"{in} / {zero}", 0, false},
		{"{out} - {in}", 0, false}, // negative
		{"0", 0, true},
		{"{missing} * 0", 0, false}, // no value, whatever it is multiplied by
		{"max({in}, {out})", 1200, true},
		{"min({in}, {out}, 500)", 300, true},
		{"max({missing}, {out})", 300, true}, // of the values that have one
		{"max({missing}, {text})", 0, false},
		{"max({missing}, {text}) + 1", 0, false},
		{"max({in} / {zero}, 7)", 7, true},
		{"max({in}) * 2", 2400, true},
		{"max(1, 2) + max(3, min(4, 5, 6))", 6, true},
	}
	for _, c := range cases {
		e, err := Compile(c.src)
		if err != nil {
			t.Errorf("Compile(%q): %v", c.src, err)
			continue
		}
		got, ok := e.Eval(get)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("Eval(%q) = %v, %v; want %v, %v", c.src, got, ok, c.want, c.ok)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	cases := []struct{ src, want string }{
		{"", "at position 1: want a number, a placeholder, max(, min( or '(', got the end"},
		{"{a} *", "at position 6: want a number, a placeholder, max(, min( or '(', got the end"},
		{"{a} {b}", "at position 5: want an operator (+ - * /) or the end, got \"{\""},
		{"({a} + 1", "at position 9: want ')', got the end"},
		{"{a} + 1)", "at position 8: want an operator"},
		{"{a", "at position 1: placeholder not closed with '}'"},
		{"{} + 1", "at position 1: want a placeholder name, got \"{}\""},
		{"{a:x}", "the default of {a} must be a number >= 0, got \"x\""},
		{"-{a}", "at position 1: want a number, a placeholder, max(, min( or '(', got \"-\""},
		{"{a} ^ 2", "at position 5: want an operator"},
		{"2e", "at position 1: want a number, got \"2e\""},
		{"max({a} {b})", "at position 9: want ',' or ')', got \"{\""},
		{"max()", "at position 5: want a number"},
		{"maximum(1)", "at position 1: want a number"},
		{"{a} * abc", "at position 7: want a number, a placeholder, max(, min( or '(', got \"a\""},
		{strings.Repeat("(1+", 17) + "1" + strings.Repeat(")", 17), "needs 18 values at once, at most 16"},
	}
	for _, c := range cases {
		_, err := Compile(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%q) = %v, want an error with %q", c.src, err, c.want)
		}
	}
}

// TestEvalAllocates: a settlement's evaluation allocates nothing.
func TestEvalAllocates(t *testing.T) {
	e, err := Compile("{in} * {price_in} + {out} * {price_out}")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{"in": "1200", "out": "300", "price_in": "3", "price_out": "15"}
	get := func(name string) (any, bool) { v, ok := m[name]; return v, ok }
	if n := testing.AllocsPerRun(100, func() { e.Eval(get) }); n != 0 {
		t.Errorf("Eval allocates %v times, want 0", n)
	}
}

// FuzzCompile: any text compiles or is refused with an error, and a
// compiled expression evaluates without panicking.
func FuzzCompile(f *testing.F) {
	for _, s := range []string{"{a} * {b:0} + (3 - {c}) / 2", "((1))", "1e5", "{a", "()", "1 +"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		e, err := Compile(src)
		if err != nil {
			return
		}
		e.Eval(func(string) (any, bool) { return "2", true })
		e.Eval(func(string) (any, bool) { return nil, false })
	})
}
