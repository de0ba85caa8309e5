// Package costexpr compiles and evaluates Tollgate's cost expressions:
// `+ - * /`, parentheses, max(...) and min(...) over numbers and Caddy
// placeholders, such as
//
//	{http.rate_limit.response.json.usage.input_tokens} * {price_in} + {http.rate_limit.response.json.usage.output_tokens} * {price_out}
//
// An expression is compiled once, at config load, into a short program
// for a stack machine, and evaluated per request without allocating
// (CEL, which Caddy links for its `expression` matcher, allocates an
// activation and boxes every value per evaluation, and would need
// conversions to read a placeholder's text as a number: four operators
// over numbers need no more than this). It knows nothing of Caddy: a
// placeholder's value comes from a lookup function.
package costexpr

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// Expr is a compiled expression. Its zero value is not usable; Compile
// makes one. It is safe for concurrent use.
type Expr struct {
	src   string
	code  []op
	names []string // placeholders, in order of appearance
	depth int      // the stack the program needs
}

type opKind uint8

const (
	opNum opKind = iota // push num
	opVar               // push placeholder names[arg], or def when it has none
	opAdd
	opSub
	opMul
	opDiv
	opMax // of the top arg values that have one
	opMin
)

type op struct {
	kind   opKind
	arg    int     // opVar: index into names; opMax, opMin: how many values
	num    float64 // opNum: the number; opVar: the default
	hasDef bool    // opVar: a default was given
}

// maxDepth bounds the stack an expression may need, so that Eval keeps it
// in a fixed array.
const maxDepth = 16

// maxLen bounds an expression's text.
const maxLen = 4096

// Compile parses src: a sum of products of numbers (plain decimals such
// as 3, 0.25, 1e-6), placeholders ({name}, or {name:default} whose
// default number stands in when the placeholder has no number),
// parenthesised expressions, and max(a, b, ...) and min(a, b, ...). Its
// errors name the position (1-based, in bytes) and what was wanted there.
func Compile(src string) (*Expr, error) {
	if len(src) > maxLen {
		return nil, fmt.Errorf("expression is %d bytes long, at most %d", len(src), maxLen)
	}
	p := parser{src: src, e: &Expr{src: src}}
	if err := p.sum(); err != nil {
		return nil, err
	}
	p.space()
	if p.i < len(src) {
		return nil, p.errorf("want an operator (+ - * /) or the end, got %q", src[p.i:p.i+1])
	}
	if p.e.depth > maxDepth {
		return nil, fmt.Errorf("expression needs %d values at once, at most %d: write it with fewer nested parentheses", p.e.depth, maxDepth)
	}
	return p.e, nil
}

// String is the expression as written.
func (e *Expr) String() string { return e.src }

// Names are the placeholders the expression reads.
func (e *Expr) Names() []string { return e.names }

// Constant reports the expression's value when it reads no placeholder.
func (e *Expr) Constant() (float64, bool) {
	if len(e.names) > 0 {
		return 0, false
	}
	return e.Eval(nil)
}

// Eval returns the expression's value, get answering each placeholder
// (as caddy.Replacer's Get). A placeholder whose value is not a finite
// number >= 0 (missing, empty, text, negative) takes its default; one
// without a default has no value, and neither has a sum, difference,
// product or quotient of it, nor a division by zero. max and min are of
// their arguments that have a value, and have none only when none has.
// ok is false when the expression has no value or it is not a finite
// number >= 0.
func (e *Expr) Eval(get func(string) (any, bool)) (v float64, ok bool) {
	// No value is NaN, which arithmetic carries through.
	var stack [maxDepth]float64
	n := 0
	for i := range e.code {
		o := &e.code[i]
		switch o.kind {
		case opNum:
			stack[n] = o.num
			n++
			continue
		case opVar:
			x, found := number(get, e.names[o.arg])
			if !found {
				x = math.NaN()
				if o.hasDef {
					x = o.num
				}
			}
			stack[n] = x
			n++
			continue
		case opMax, opMin:
			m := math.NaN()
			for _, x := range stack[n-o.arg : n] {
				if !math.IsNaN(x) && (math.IsNaN(m) || (o.kind == opMax) == (x > m)) {
					m = x
				}
			}
			n -= o.arg - 1
			stack[n-1] = m
			continue
		}
		a, b := stack[n-2], stack[n-1]
		n--
		switch o.kind {
		case opAdd:
			a += b
		case opSub:
			a -= b
		case opMul:
			a *= b
		case opDiv:
			if b == 0 {
				a = math.NaN()
			} else {
				a /= b
			}
		}
		stack[n-1] = a
	}
	v = stack[0]
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

// number is the placeholder's value as a number.
func number(get func(string) (any, bool), name string) (float64, bool) {
	if get == nil {
		return 0, false
	}
	val, ok := get(name)
	if !ok {
		return 0, false
	}
	var f float64
	switch x := val.(type) {
	case string:
		return ParseNumber(x)
	case int:
		f = float64(x)
	case int64:
		f = float64(x)
	case int32:
		f = float64(x)
	case uint64:
		f = float64(x)
	case uint:
		f = float64(x)
	case float64:
		f = x
	case float32:
		f = float64(x)
	case fmt.Stringer:
		return ParseNumber(x.String())
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	return f, true
}

// ParseNumber reads a placeholder's text as a number, as a cost is read
// (see algorithms.ParseNumber).
func ParseNumber(s string) (float64, bool) { return algorithms.ParseNumber(s) }

// parser is a recursive-descent parser that emits the program in
// postfix order, tracking the stack depth it needs.
type parser struct {
	src string
	i   int
	e   *Expr
	n   int // values on the stack at this point of the program
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("expression %q at position %d: %s", p.src, p.i+1, fmt.Sprintf(format, args...))
}

func (p *parser) space() {
	for p.i < len(p.src) && strings.IndexByte(" \t\r\n", p.src[p.i]) >= 0 {
		p.i++
	}
}

func (p *parser) emit(o op) {
	switch o.kind {
	case opNum, opVar:
		p.n++
		p.e.depth = max(p.e.depth, p.n)
	case opMax, opMin:
		p.n -= o.arg - 1
	default:
		p.n--
	}
	p.e.code = append(p.e.code, o)
}

// sum := product (('+' | '-') product)*
func (p *parser) sum() error {
	if err := p.product(); err != nil {
		return err
	}
	for {
		p.space()
		if p.i >= len(p.src) || (p.src[p.i] != '+' && p.src[p.i] != '-') {
			return nil
		}
		k := opAdd
		if p.src[p.i] == '-' {
			k = opSub
		}
		p.i++
		if err := p.product(); err != nil {
			return err
		}
		p.emit(op{kind: k})
	}
}

// product := operand (('*' | '/') operand)*
func (p *parser) product() error {
	if err := p.operand(); err != nil {
		return err
	}
	for {
		p.space()
		if p.i >= len(p.src) || (p.src[p.i] != '*' && p.src[p.i] != '/') {
			return nil
		}
		k := opMul
		if p.src[p.i] == '/' {
			k = opDiv
		}
		p.i++
		if err := p.operand(); err != nil {
			return err
		}
		p.emit(op{kind: k})
	}
}

// operand := number | '{' name (':' number)? '}' | '(' sum ')' |
// ('max' | 'min') '(' sum (',' sum)* ')'
func (p *parser) operand() error {
	p.space()
	if p.i >= len(p.src) {
		return p.errorf("want a number, a placeholder, max(, min( or '(', got the end")
	}
	for _, f := range [...]struct {
		name string
		kind opKind
	}{{"max(", opMax}, {"min(", opMin}} {
		if strings.HasPrefix(p.src[p.i:], f.name) {
			p.i += len(f.name)
			args := 0
			for {
				if err := p.sum(); err != nil {
					return err
				}
				args++
				p.space()
				if p.i < len(p.src) && p.src[p.i] == ',' {
					p.i++
					continue
				}
				if p.i >= len(p.src) || p.src[p.i] != ')' {
					return p.errorf("want ',' or ')', got %s", p.next())
				}
				p.i++
				p.emit(op{kind: f.kind, arg: args})
				return nil
			}
		}
	}
	switch c := p.src[p.i]; {
	case c == '(':
		p.i++
		if err := p.sum(); err != nil {
			return err
		}
		p.space()
		if p.i >= len(p.src) || p.src[p.i] != ')' {
			return p.errorf("want ')', got %s", p.next())
		}
		p.i++
		return nil
	case c == '{':
		end := strings.IndexByte(p.src[p.i:], '}')
		if end < 0 {
			return p.errorf("placeholder not closed with '}'")
		}
		body := p.src[p.i+1 : p.i+end]
		name, def, hasDef := strings.Cut(body, ":")
		if name == "" || strings.ContainsAny(name, "{ \t") {
			return p.errorf("want a placeholder name, got %q", "{"+body+"}")
		}
		o := op{kind: opVar, arg: len(p.e.names), hasDef: hasDef}
		if hasDef {
			f, ok := ParseNumber(def)
			if !ok {
				return p.errorf("the default of {%s} must be a number >= 0, got %q", name, def)
			}
			o.num = f
		}
		p.e.names = append(p.e.names, name)
		p.i += end + 1
		p.emit(o)
		return nil
	case c >= '0' && c <= '9' || c == '.':
		j := p.i
		for j < len(p.src) {
			d := p.src[j]
			if d >= '0' && d <= '9' || d == '.' || d == 'e' || d == 'E' ||
				(d == '-' || d == '+') && (p.src[j-1] == 'e' || p.src[j-1] == 'E') {
				j++
				continue
			}
			break
		}
		f, ok := ParseNumber(p.src[p.i:j])
		if !ok {
			return p.errorf("want a number, got %q", p.src[p.i:j])
		}
		p.i = j
		p.emit(op{kind: opNum, num: f})
		return nil
	}
	return p.errorf("want a number, a placeholder, max(, min( or '(', got %q", p.src[p.i:p.i+1])
}

// next is the byte at the parser's position, quoted, for an error.
func (p *parser) next() string {
	if p.i >= len(p.src) {
		return "the end"
	}
	return strconv.Quote(p.src[p.i : p.i+1])
}
