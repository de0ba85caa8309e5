// Command gen draws the pictures of docs/algorithms.md: one bursty client
// (a burst, a pause, then a steady stream over the limit) against each of
// Tollgate's algorithms, decided by the real algorithms package, and what
// each admits over time. It writes one SVG per algorithm and algorithms.svg
// with all of them side by side; and adaptive.svg, concurrency adaptive's
// controller in front of a simulated upstream whose capacity halves and
// returns (adaptive.go):
//
//	go run ./docs/gen            # writes docs/img/*.svg
//	go run ./docs/gen -out dir   # elsewhere
//
// The SVGs are written by hand, with no dependency beyond the standard
// library, and are the same bytes on every run: the test in this package
// fails when the committed pictures no longer match the algorithms.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// The limit every picture uses: rate 10/s (events 10, window 1s, burst 10),
// and for the shaper a max_delay of 500ms.
const (
	events   = 10
	window   = time.Second
	maxDelay = 500 * time.Millisecond
)

// The client, in µs from the start of the picture.
const (
	span        = 10_000_000 // the time axis: 10s
	burstStart  = 500_000    // 40 requests in one second from 0.5s ...
	burstCount  = 40
	burstLength = 1_000_000
	steadyStart = 4_000_000 // ... a pause, then 20 per second from 4s to 10s
	steadyRate  = 20
)

// epoch is the wall-clock time the picture starts at: a whole second, so
// that the window algorithms' aligned windows start on the axis's seconds.
const epoch = 1_700_000_000 * 1_000_000

// arrivals returns the client's request times, in µs from the start.
func arrivals() []int64 {
	var ts []int64
	for i := range int64(burstCount) {
		ts = append(ts, burstStart+i*burstLength/burstCount)
	}
	for t := int64(steadyStart); t < span; t += 1_000_000 / steadyRate {
		ts = append(ts, t)
	}
	return ts
}

// outcome is one request's fate.
type outcome struct {
	at      int64 // arrival, µs from the start
	allowed bool
	delay   int64 // µs a shaper holds the admitted request
}

// run is one algorithm's picture.
type run struct {
	name  string // as configured: "token_bucket", "leaky_bucket + max_delay"
	file  string // SVG file name
	note  string // one line under the title
	shape bool   // a shaper: plot the delay
	out   []outcome
}

// admitted counts the admitted requests.
func (r *run) admitted() int {
	n := 0
	for _, o := range r.out {
		if o.allowed {
			n++
		}
	}
	return n
}

// simulate sends the client's requests, each of cost 1, through l.
func simulate(l algorithms.Limit) []outcome {
	s := algorithms.NewState(&l)
	var out []outcome
	for _, t := range arrivals() {
		d := l.Take(&s, epoch+t, algorithms.Milli)
		out = append(out, outcome{at: t, allowed: d.Allowed, delay: d.Delay})
	}
	return out
}

// runs decides the client against every algorithm.
func runs() ([]run, error) {
	specs := []struct {
		kind      algorithms.Kind
		maxDelay  time.Duration
		name      string
		note      string
		shapesOut bool
	}{
		{algorithms.TokenBucket, 0, "token_bucket", "the burst takes the full bucket, then the refill: 10/s", false},
		{algorithms.GCRA, 0, "gcra", "the same decisions as token_bucket, one timestamp of state", false},
		{algorithms.LeakyBucket, 0, "leaky_bucket", "as a policer: the same meter as token_bucket", false},
		{algorithms.LeakyBucket, maxDelay, "leaky_bucket + max_delay", "shapes: holds requests up to 500ms, sends them at 10/s", true},
		{algorithms.SlidingWindow, 0, "sliding_window", "the previous window weighs in as the window slides", false},
		{algorithms.SlidingLog, 0, "sliding_log", "exactly 10 in any 1s: admissions echo the burst", false},
		{algorithms.FixedWindow, 0, "fixed_window", "10 per aligned second: 20 across the edge at 1s", false},
	}
	var rs []run
	for _, s := range specs {
		l, err := algorithms.NewLimit(s.kind, events, window, 0, s.maxDelay)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		file := s.kind.String() + ".svg"
		if s.shapesOut {
			file = "leaky_bucket_shaping.svg"
		}
		rs = append(rs, run{name: s.name, file: file, note: s.note, shape: s.shapesOut, out: simulate(l)})
	}
	return rs, nil
}

// Colours.
const (
	colAdmitted = "#2b6cb0"
	colRejected = "#e53e3e"
	colOffered  = "#a0aec0"
	colDelay    = "#dd6b20"
	colGrid     = "#e2e8f0"
	colText     = "#2d3748"
)

// The size of a panel in the side-by-side picture and on its own, and
// the grid of the side-by-side picture.
const (
	panelW, panelH = 440, 236
	aloneW, aloneH = 720, 280
	columns        = 2
	headerH        = 56
)

// generate writes every picture into dir.
func generate(dir string) error {
	rs, err := runs()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range rs {
		var b bytes.Buffer
		svgOpen(&b, aloneW, aloneH+24, len(r.out), r.admitted())
		legend(&b, 10, 16, r.shape)
		panel(&b, r, 0, 24, aloneW, aloneH)
		b.WriteString("</svg>\n")
		if err := os.WriteFile(filepath.Join(dir, r.file), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	var b bytes.Buffer
	rows := (len(rs) + columns - 1) / columns
	svgOpen(&b, columns*panelW, headerH+rows*panelH, len(rs[0].out), -1)
	text(&b, 10, 18, 13, "start", "bold", "One client against rate 10/s (events 10, window 1s, burst 10)")
	text(&b, 10, 34, 11, "start", "", "40 requests in one second from 0.5s, a pause, then 20 per second from 4s: 160 requests in all")
	legend(&b, 10, 50, true)
	for i, r := range rs {
		panel(&b, r, float64(i%columns*panelW), float64(headerH+i/columns*panelH), panelW, panelH)
	}
	b.WriteString("</svg>\n")
	if err := os.WriteFile(filepath.Join(dir, "algorithms.svg"), b.Bytes(), 0o644); err != nil {
		return err
	}
	svg, err := adaptivePicture()
	if err != nil {
		return fmt.Errorf("adaptive: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "adaptive.svg"), svg, 0o644)
}

func svgOpen(b *bytes.Buffer, w, h, offered, admitted int) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" data-offered="%d"`, w, h, w, h, offered)
	if admitted >= 0 {
		fmt.Fprintf(b, ` data-admitted="%d"`, admitted)
	}
	b.WriteString(">\n")
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w, h)
}

// legend draws the key to the marks, starting at x, y; the shaper's delay
// only if shape.
func legend(b *bytes.Buffer, x, y float64, shape bool) {
	fmt.Fprintf(b, `<g font-size="11" fill="%s">`+"\n", colText)
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="2" height="10" fill="%s"/>`+"\n", x, y-9, colAdmitted)
	text(b, x+6, y, 11, "start", "", "admitted")
	x += 66
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="2" height="10" fill="%s"/>`+"\n", x, y-9, colRejected)
	text(b, x+6, y, 11, "start", "", "rejected (one mark per request)")
	x += 200
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="4 3"/>`+"\n", x, y-4, x+18, y-4, colOffered)
	text(b, x+22, y, 11, "start", "", "sent, in all")
	x += 104
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", x, y-4, x+18, y-4, colAdmitted)
	text(b, x+22, y, 11, "start", "", "admitted, in all")
	if shape {
		x += 120
		for i := range 4 {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="1.4" fill="%s"/>`+"\n", x+2+float64(i)*5, y-4, colDelay)
		}
		text(b, x+22, y, 11, "start", "", "shaper's delay")
	}
	b.WriteString("</g>\n")
}

// panel draws one run in the w x h box at x0, y0: the title, a
// strip with one mark per request (admitted or rejected), and the
// running totals of requests sent and admitted; for a shaper, admitted
// requests count when they are sent on, and a strip below shows each
// one's delay.
func panel(b *bytes.Buffer, r run, x0, y0 float64, w, h int) {
	const (
		left, right = 36, 12
		titleH      = 34
		stripH      = 16
		bottom      = 20
		delayH      = 38
		delayGap    = 16
	)
	plotW := float64(w - left - right)
	px := func(t int64) float64 { return x0 + left + plotW*float64(t)/span }
	stripY := y0 + titleH
	chartY := stripY + stripH + 6
	chartH := float64(h-titleH-stripH-6-bottom) - 8
	if r.shape {
		chartH -= delayH + delayGap
	}
	total := len(r.out)
	py := func(n int) float64 { return chartY + chartH - chartH*float64(n)/float64(total) }

	fmt.Fprintf(b, `<g class="panel" data-algorithm="%s" data-offered="%d" data-admitted="%d">`+"\n", r.name, total, r.admitted())
	text(b, x0+left, y0+14, 13, "start", "bold", r.name)
	text(b, x0+float64(w)-right, y0+14, 12, "end", "", fmt.Sprintf("admitted %d of %d", r.admitted(), total))
	text(b, x0+left, y0+28, 11, "start", "", r.note)

	// Seconds: grid lines and labels, which are also the window
	// algorithms' window edges.
	bottomY := chartY + chartH
	if r.shape {
		bottomY += delayH + delayGap
	}
	for s := int64(0); s <= span/1_000_000; s++ {
		x := px(s * 1_000_000)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x, stripY, x, bottomY, colGrid)
		text(b, x, bottomY+13, 10, "middle", "", fmt.Sprintf("%ds", s))
	}

	// One mark per request, at its arrival.
	for _, o := range r.out {
		class, col := "admitted", colAdmitted
		if !o.allowed {
			class, col = "rejected", colRejected
		}
		fmt.Fprintf(b, `<rect class="%s" x="%.2f" y="%.1f" width="1.2" height="%d" fill="%s"/>`+"\n", class, px(o.at)-0.6, stripY, stripH, col)
	}

	// Running totals.
	for _, n := range []int{0, total / 4, total / 2, 3 * total / 4, total} {
		y := py(n)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(0), y, px(span), y, colGrid)
		text(b, px(0)-4, y+3.5, 10, "end", "", fmt.Sprint(n))
	}
	sent := make([]int64, len(r.out))
	passed := []int64{}
	for i, o := range r.out {
		sent[i] = o.at
		if o.allowed {
			passed = append(passed, o.at+o.delay) // a shaper's request passes when its delay ends
		}
	}
	step(b, "sent", sent, px, py, colOffered, `stroke-dasharray="4 3"`)
	step(b, "admitted", passed, px, py, colAdmitted, "")

	if r.shape {
		top := chartY + chartH + delayGap
		maxD := float64(maxDelay.Microseconds())
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(0), top, px(span), top, colGrid)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(0), top+delayH, px(span), top+delayH, colGrid)
		text(b, px(0)-4, top+3.5, 10, "end", "", fmt.Sprintf("%gs", maxDelay.Seconds()))
		text(b, px(0)-4, top+delayH+3.5, 10, "end", "", "0")
		text(b, px(span)-2, top+delayH-4, 10, "end", "", "delay of each admitted request, by arrival")
		for _, o := range r.out {
			if o.allowed {
				y := top + delayH - delayH*float64(o.delay)/maxD
				fmt.Fprintf(b, `<circle class="delay" data-delay-us="%d" cx="%.2f" cy="%.2f" r="1.4" fill="%s"/>`+"\n", o.delay, px(o.at), y, colDelay)
			}
		}
	}
	b.WriteString("</g>\n")
}

// step draws the running count of the times ts, in any order, as a step
// line over the whole axis; its data-total is the count it ends at.
func step(b *bytes.Buffer, class string, ts []int64, px func(int64) float64, py func(int) float64, col, extra string) {
	sorted := slices.Sorted(slices.Values(ts))
	pts := []string{fmt.Sprintf("%.2f,%.2f", px(0), py(0))}
	n := 0
	for _, t := range sorted {
		if t > span {
			break // a shaper's last requests pass after the axis ends
		}
		pts = append(pts, fmt.Sprintf("%.2f,%.2f", px(t), py(n)))
		n++
		pts = append(pts, fmt.Sprintf("%.2f,%.2f", px(t), py(n)))
	}
	pts = append(pts, fmt.Sprintf("%.2f,%.2f", px(span), py(n)))
	fmt.Fprintf(b, `<polyline class="%s" data-total="%d" points="%s" fill="none" stroke="%s" stroke-width="2" %s/>`+"\n", class, n, strings.Join(pts, " "), col, extra)
}

func text(b *bytes.Buffer, x, y float64, size int, anchor, weight, s string) {
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" fill="%s"`, x, y, size, anchor, colText)
	if weight != "" {
		fmt.Fprintf(b, ` font-weight="%s"`, weight)
	}
	b.WriteString(">")
	s = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
	b.WriteString(s)
	b.WriteString("</text>\n")
}

func main() {
	out := flag.String("out", filepath.Join("docs", "img"), "directory to write the SVGs to")
	flag.Parse()
	if err := generate(*out); err != nil {
		log.Fatalf("gen: %v", err)
	}
}
