package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// element is an SVG element as the test reads it.
type element struct {
	name     string
	attr     map[string]string
	text     string
	children []*element
}

// parseSVG parses an SVG file as XML into a tree.
func parseSVG(t *testing.T, data []byte) *element {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	root := &element{}
	stack := []*element{root}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v", err)
		}
		top := stack[len(stack)-1]
		switch tok := tok.(type) {
		case xml.StartElement:
			e := &element{name: tok.Name.Local, attr: map[string]string{}}
			for _, a := range tok.Attr {
				e.attr[a.Name.Local] = a.Value
			}
			top.children = append(top.children, e)
			stack = append(stack, e)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			top.text += string(tok)
		}
	}
	if len(root.children) != 1 || root.children[0].name != "svg" {
		t.Fatalf("root is not one <svg>")
	}
	return root.children[0]
}

// walk calls f on e and everything below it.
func (e *element) walk(f func(*element)) {
	f(e)
	for _, c := range e.children {
		c.walk(f)
	}
}

// direct decides the client's requests with the algorithms package, apart
// from the generator's code: how many are admitted, how many of those
// pass within the plotted span, and the largest delay.
func direct(t *testing.T, kind algorithms.Kind, maxDelay time.Duration) (admitted, passed int, maxD int64) {
	t.Helper()
	l, err := algorithms.NewLimit(kind, 10, time.Second, 0, maxDelay)
	if err != nil {
		t.Fatal(err)
	}
	s := algorithms.NewState(&l)
	for _, at := range arrivals() {
		d := l.Take(&s, epoch+at, 1000)
		if d.Allowed {
			admitted++
			if at+d.Delay <= span {
				passed++
			}
			maxD = max(maxD, d.Delay)
		}
	}
	return admitted, passed, maxD
}

var pictured = map[string]struct {
	kind     algorithms.Kind
	maxDelay time.Duration
}{
	"token_bucket":             {algorithms.TokenBucket, 0},
	"gcra":                     {algorithms.GCRA, 0},
	"leaky_bucket":             {algorithms.LeakyBucket, 0},
	"leaky_bucket + max_delay": {algorithms.LeakyBucket, 500 * time.Millisecond},
	"sliding_window":           {algorithms.SlidingWindow, 0},
	"sliding_log":              {algorithms.SlidingLog, 0},
	"fixed_window":             {algorithms.FixedWindow, 0},
}

// checkPanel checks that a panel shows what the algorithm decides: a
// mark per request, admitted ones as admitted, the totals in the title
// and the running total, and for the shaper its delays.
func checkPanel(t *testing.T, file string, p *element) string {
	t.Helper()
	name := p.attr["data-algorithm"]
	spec, ok := pictured[name]
	if !ok {
		t.Errorf("%s: panel of unknown algorithm %q", file, name)
		return name
	}
	admitted, passed, maxD := direct(t, spec.kind, spec.maxDelay)
	offered := len(arrivals())

	marks := map[string]int{}
	var texts []string
	var runningTotal = -1
	var delays []int64
	p.walk(func(e *element) {
		switch {
		case e.name == "rect" && (e.attr["class"] == "admitted" || e.attr["class"] == "rejected"):
			marks[e.attr["class"]]++
		case e.name == "text":
			texts = append(texts, e.text)
		case e.name == "polyline" && e.attr["class"] == "admitted":
			runningTotal, _ = strconv.Atoi(e.attr["data-total"])
		case e.name == "circle" && e.attr["class"] == "delay":
			d, err := strconv.ParseInt(e.attr["data-delay-us"], 10, 64)
			if err != nil {
				t.Errorf("%s %s: delay %q: %v", file, name, e.attr["data-delay-us"], err)
			}
			delays = append(delays, d)
		}
	})
	if marks["admitted"] != admitted || marks["rejected"] != offered-admitted {
		t.Errorf("%s %s: %d admitted and %d rejected marks, want %d and %d",
			file, name, marks["admitted"], marks["rejected"], admitted, offered-admitted)
	}
	if got := p.attr["data-admitted"]; got != strconv.Itoa(admitted) {
		t.Errorf("%s %s: data-admitted %s, want %d", file, name, got, admitted)
	}
	title := fmt.Sprintf("admitted %d of %d", admitted, offered)
	if !strings.Contains(strings.Join(texts, "\n"), title) {
		t.Errorf("%s %s: no text %q in %q", file, name, title, texts)
	}
	if runningTotal != passed {
		t.Errorf("%s %s: running total ends at %d, want %d", file, name, runningTotal, passed)
	}
	if spec.maxDelay > 0 {
		if len(delays) != admitted {
			t.Errorf("%s %s: %d delays plotted, want one per admitted request, %d", file, name, len(delays), admitted)
		}
		for _, d := range delays {
			if d < 0 || d > spec.maxDelay.Microseconds() {
				t.Errorf("%s %s: delay %dµs, want within [0, %s]", file, name, d, spec.maxDelay)
			}
		}
		if maxD != spec.maxDelay.Microseconds() {
			t.Errorf("%s %s: the client never waits max_delay (longest delay %dµs): the picture shows no shaping", file, name, maxD)
		}
	} else if len(delays) != 0 {
		t.Errorf("%s %s: %d delays plotted for an algorithm that does not delay", file, name, len(delays))
	}
	return name
}

// TestGenerate runs the generator into a temporary directory and checks
// that every picture is well-formed SVG showing what the algorithms
// decide, and that the committed pictures in docs/img are up to date.
func TestGenerate(t *testing.T) {
	dir := t.TempDir()
	if err := generate(dir); err != nil {
		t.Fatalf("generate: %v", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(pictured)+2 {
		t.Errorf("generated %d SVGs, want one per algorithm (%d), algorithms.svg and adaptive.svg", len(files), len(pictured))
	}
	for _, f := range files {
		file := filepath.Base(f)
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		svg := parseSVG(t, data)
		var names []string
		svg.walk(func(e *element) {
			if e.name == "g" && e.attr["class"] == "panel" {
				names = append(names, checkPanel(t, file, e))
			}
		})
		want := 1
		switch file {
		case "algorithms.svg":
			want = len(pictured)
		case "adaptive.svg":
			want = 0
			checkAdaptive(t, svg)
		}
		if len(names) != want {
			t.Errorf("%s: %d panels %q, want %d", file, len(names), names, want)
		}

		committed, err := os.ReadFile(filepath.Join("..", "img", file))
		if err != nil {
			t.Errorf("docs/img/%s: %v (run go run ./docs/gen)", file, err)
		} else if !bytes.Equal(committed, data) {
			t.Errorf("docs/img/%s is out of date: run go run ./docs/gen", file)
		}
	}
}
