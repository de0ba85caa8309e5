package main

import (
	"bytes"
	"container/heap"
	"fmt"
	"slices"
	"strings"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// The picture of concurrency adaptive (adaptive.svg): a load step against
// the real controller (algorithms.AdaptiveConfig at its defaults), in a
// discrete-event model with no clock and no goroutines. An upstream of
// adaptiveC workers, each serving one request at a time for adaptiveS,
// with a FIFO queue in front (a request waits for a free worker); its
// capacity is halved at 30 s and restored at 60 s. 8 clients per worker
// each send a request, send the next as soon as it is answered, and come
// back one service time after a refusal (a 503).
const (
	adaptiveC    = 32
	adaptiveS    = 20_000 // µs
	adaptiveSpan = 90_000_000
	// adaptiveTick is how often the limit and the upstream's in flight
	// are read; each plotted point is the mean of adaptivePlot ticks.
	adaptiveTick = 10_000
	adaptivePlot = 25
	// adaptiveSkip is how long a phase is left to settle before its
	// medians are taken.
	adaptiveSkip = 10_000_000
)

// adaptivePhase is a stretch of the run at one capacity.
type adaptivePhase struct {
	from, until int64 // µs
	workers     int
}

var adaptivePhases = []adaptivePhase{
	{0, 30_000_000, adaptiveC},
	{30_000_000, 60_000_000, adaptiveC / 2},
	{60_000_000, adaptiveSpan, adaptiveC},
}

// capacityAt is the upstream's workers at t.
func capacityAt(t int64) int {
	for _, p := range adaptivePhases {
		if t < p.until {
			return p.workers
		}
	}
	return adaptivePhases[len(adaptivePhases)-1].workers
}

type simEvent struct {
	at     int64
	done   bool  // a worker finished; else a client sends
	client int   // the client sending, or whose request finished
	sent   int64 // when the finished request was admitted
}

type simQueue []simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	if q[i].done != q[j].done {
		return q[i].done // a worker frees before a client sends
	}
	return q[i].client < q[j].client
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// adaptiveRun is what one run measured.
type adaptiveRun struct {
	limit    []int64 // the controller's limit at every tick (-1: no controller)
	inFlight []int   // the upstream's in flight (queued and served) at every tick
	rtts     []int64 // the round trip of every answered request ...
	ends     []int64 // ... and when it was answered, in order
}

// simulateAdaptive runs the load step with the controller c admitting, or
// with every request admitted when c is nil.
func simulateAdaptive(c *algorithms.AdaptiveConfig) adaptiveRun {
	var s algorithms.AdaptiveState
	if c != nil {
		s = c.NewState(0, 1)
	}
	q := &simQueue{}
	clients := 8 * adaptiveC
	for i := range clients {
		// The clients start spread over the first service time.
		heap.Push(q, simEvent{at: int64(i) * adaptiveS / int64(clients), client: i})
	}
	var waiting []simEvent // requests queued at the upstream
	busy := 0
	var run adaptiveRun
	start := func(now int64) {
		for busy < capacityAt(now) && len(waiting) > 0 {
			r := waiting[0]
			waiting = waiting[1:]
			busy++
			heap.Push(q, simEvent{at: now + adaptiveS, done: true, client: r.client, sent: r.sent})
		}
	}
	next := int64(0) // the next tick
	for q.Len() > 0 {
		e := heap.Pop(q).(simEvent)
		for ; next <= e.at && next < adaptiveSpan; next += adaptiveTick {
			start(next) // capacity restored: the queue moves at once
			l := int64(-1)
			if c != nil {
				l = c.Read(&s)
			}
			run.limit = append(run.limit, l)
			run.inFlight = append(run.inFlight, busy+len(waiting))
		}
		if e.at >= adaptiveSpan {
			break
		}
		if e.done {
			busy--
			if c != nil {
				c.End(&s, e.at, e.at-e.sent, algorithms.OK)
			}
			run.rtts = append(run.rtts, e.at-e.sent)
			run.ends = append(run.ends, e.at)
			start(e.at)
			heap.Push(q, simEvent{at: e.at, client: e.client})
			continue
		}
		if c != nil && !c.Admit(&s) {
			heap.Push(q, simEvent{at: e.at + adaptiveS, client: e.client})
			continue
		}
		waiting = append(waiting, simEvent{client: e.client, sent: e.at})
		start(e.at)
	}
	return run
}

// phaseStats are a phase's medians after adaptiveSkip, and its goodput:
// answers per second over the judged part, as a share of capacity.
type phaseStats struct {
	inFlight, limit int
	latency         int64 // µs
	goodput         float64
}

func median[T int | int64](xs []T) T {
	ys := slices.Clone(xs)
	slices.Sort(ys)
	return ys[len(ys)/2]
}

// stats returns the judged part of each phase's medians.
func (r *adaptiveRun) stats() []phaseStats {
	var out []phaseStats
	for _, p := range adaptivePhases {
		from, to := (p.from+adaptiveSkip)/adaptiveTick, p.until/adaptiveTick
		var ps phaseStats
		ps.inFlight = median(r.inFlight[from:to])
		ps.limit = int(median(r.limit[from:to]))
		lo, _ := slices.BinarySearch(r.ends, p.from+adaptiveSkip)
		hi, _ := slices.BinarySearch(r.ends, p.until)
		ps.latency = median(r.rtts[lo:hi])
		secs := float64(p.until-p.from-adaptiveSkip) / 1e6
		ps.goodput = float64(hi-lo) / secs / (float64(p.workers) * 1e6 / adaptiveS)
		out = append(out, ps)
	}
	return out
}

// followed returns how long after the halving the limit first was at
// most 1.6 times the halved capacity, in µs, or -1.
func (r *adaptiveRun) followed() int64 {
	p := adaptivePhases[1]
	for i := p.from / adaptiveTick; i < p.until/adaptiveTick; i++ {
		if 10*r.limit[i] <= 16*int64(p.workers) {
			return i*adaptiveTick - p.from
		}
	}
	return -1
}

// regrown returns how long after the capacity returned the limit first
// reached it again, in µs, or -1.
func (r *adaptiveRun) regrown() int64 {
	p := adaptivePhases[2]
	for i := p.from / adaptiveTick; i < int64(len(r.limit)); i++ {
		if r.limit[i] >= int64(p.workers) {
			return i*adaptiveTick - p.from
		}
	}
	return -1
}

// Colours of the adaptive picture's lines.
const (
	colLimit    = colAdmitted
	colInFlight = colDelay
	colCapacity = colOffered
	colLatency  = colRejected
)

// adaptiveSVG draws the run: the controller's limit, the upstream's in
// flight and its capacity over time, and below, each second's median
// round trip of the answered requests; unlimited is the same load with
// every request admitted, for the caption.
func adaptiveSVG(r, unlimited adaptiveRun) []byte {
	const (
		w, h        = 720, 400
		left, right = 40, 14
		chartY      = 78
		chartH      = 200
		gap         = 26
		latH        = 56
		yMax        = 48 // requests in flight at the top of the chart
		latMax      = 3  // service times at the top of the latency strip
	)
	plotW := float64(w - left - right)
	px := func(t int64) float64 { return left + plotW*float64(t)/adaptiveSpan }
	py := func(v float64) float64 { return chartY + chartH - chartH*min(v, yMax)/yMax }
	latY := float64(chartY + chartH + gap)
	pl := func(rtt float64) float64 { return latY + latH - latH*min(rtt/adaptiveS, latMax)/latMax }
	st := r.stats()
	un := unlimited.stats()[0]

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif"`, w, h, w, h)
	fmt.Fprintf(&b, ` data-capacity="%d" data-service-us="%d" data-clients="%d" data-followed-us="%d" data-regrown-us="%d">`+"\n",
		adaptiveC, adaptiveS, 8*adaptiveC, r.followed(), r.regrown())
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w, h)
	text(&b, 10, 18, 13, "start", "bold", "concurrency adaptive at its defaults: the upstream's capacity halves at 30s, returns at 60s")
	text(&b, 10, 34, 11, "start", "", fmt.Sprintf("An upstream of %d workers of %d ms (%d from 30s to 60s); %d clients, each back one service time after a 503",
		adaptiveC, adaptiveS/1000, adaptiveC/2, 8*adaptiveC))

	// Legend.
	fmt.Fprintf(&b, `<g font-size="11" fill="%s">`+"\n", colText)
	x := 10.0
	for _, l := range []struct {
		col, dash, label string
		width            float64
	}{
		{colLimit, "", "the zone's limit", 124},
		{colInFlight, "", "upstream's in flight (queued + served)", 240},
		{colCapacity, `stroke-dasharray="4 3"`, "upstream's capacity", 144},
		{colLatency, "", "median round trip", 0},
	} {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="50" x2="%.1f" y2="50" stroke="%s" stroke-width="2" %s/>`+"\n", x, x+18, l.col, l.dash)
		text(&b, x+22, 54, 11, "start", "", l.label)
		x += l.width
	}
	b.WriteString("</g>\n")

	// Grid: every 10 s, and every 8 requests in flight.
	for s := int64(0); s <= adaptiveSpan/1_000_000; s += 10 {
		x := px(s * 1_000_000)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x, chartY, x, latY+latH, colGrid)
		text(&b, x, latY+latH+13, 10, "middle", "", fmt.Sprintf("%ds", s))
	}
	for n := 0; n <= yMax; n += 8 {
		y := py(float64(n))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(0), y, px(adaptiveSpan), y, colGrid)
		text(&b, px(0)-4, y+3.5, 10, "end", "", fmt.Sprint(n))
	}
	text(&b, px(0)+4, chartY+12, 10, "start", "", fmt.Sprintf("requests in flight (without the zone: %d, every client)", un.inFlight))

	// Capacity: a step line.
	var steps []string
	for _, p := range adaptivePhases {
		y := py(float64(p.workers))
		steps = append(steps, fmt.Sprintf("%.2f,%.2f %.2f,%.2f", px(p.from), y, px(p.until), y))
	}
	fmt.Fprintf(&b, `<polyline class="capacity" points="%s" fill="none" stroke="%s" stroke-width="2" stroke-dasharray="4 3"/>`+"\n", strings.Join(steps, " "), colCapacity)

	// The upstream's in flight and the limit: the mean of each
	// adaptivePlot ticks, the values (×10, whole) in data-values.
	series := func(class, col string, area bool, at func(i int) float64) {
		var pts, vals []string
		for i := 0; i+adaptivePlot <= len(r.limit); i += adaptivePlot {
			sum := 0.0
			for j := i; j < i+adaptivePlot; j++ {
				sum += at(j)
			}
			v := sum / adaptivePlot
			t := int64(i+adaptivePlot/2) * adaptiveTick
			pts = append(pts, fmt.Sprintf("%.2f,%.2f", px(t), py(v)))
			vals = append(vals, fmt.Sprint(int64(v*10+0.5)))
		}
		if area {
			first, last := pts[0], pts[len(pts)-1]
			fmt.Fprintf(&b, `<polygon points="%s,%.2f %s %s,%.2f" fill="%s" fill-opacity="0.25" stroke="none"/>`+"\n",
				first[:strings.IndexByte(first, ',')], py(0), strings.Join(pts, " "), last[:strings.IndexByte(last, ',')], py(0), col)
		}
		fmt.Fprintf(&b, `<polyline class="%s" data-every-us="%d" data-values="%s" points="%s" fill="none" stroke="%s" stroke-width="1.4"/>`+"\n",
			class, adaptivePlot*adaptiveTick, strings.Join(vals, " "), strings.Join(pts, " "), col)
	}
	series("in-flight", colInFlight, true, func(i int) float64 { return float64(r.inFlight[i]) })
	series("limit", colLimit, false, func(i int) float64 { return float64(r.limit[i]) })

	// Each phase's medians, once settled.
	for i, p := range adaptivePhases {
		s := st[i]
		fmt.Fprintf(&b, `<g class="phase" data-workers="%d" data-in-flight="%d" data-limit="%d" data-latency-us="%d" data-goodput-pct="%d">`+"\n",
			p.workers, s.inFlight, s.limit, s.latency, int(100*s.goodput+0.5))
		mid := (px(p.from) + px(p.until)) / 2
		text(&b, mid, py(42), 10, "middle", "", fmt.Sprintf("settled: in flight %d, limit %d", s.inFlight, s.limit))
		text(&b, mid, py(42)+12, 10, "middle", "", fmt.Sprintf("round trip %s, goodput %d%%", ms(s.latency), int(100*s.goodput+0.5)))
		b.WriteString("</g>\n")
	}

	// Latency strip: each second's median round trip, in service times.
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(0), latY, px(adaptiveSpan), latY, colGrid)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(0), pl(adaptiveS), px(adaptiveSpan), pl(adaptiveS), colGrid)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(0), latY+latH, px(adaptiveSpan), latY+latH, colGrid)
	text(&b, px(0)-4, latY+3.5, 10, "end", "", ms(latMax*adaptiveS))
	text(&b, px(0)-4, pl(adaptiveS)+3.5, 10, "end", "", ms(adaptiveS))
	text(&b, px(0)-4, latY+latH+3.5, 10, "end", "", "0")
	text(&b, px(adaptiveSpan)-2, latY-4, 10, "end", "", fmt.Sprintf("median round trip per second (without the zone: %s)", ms(un.latency)))
	var pts, vals []string
	lo := 0
	for s := int64(0); s < adaptiveSpan/1_000_000; s++ {
		hi, _ := slices.BinarySearch(r.ends, (s+1)*1_000_000)
		if hi > lo {
			m := median(r.rtts[lo:hi])
			pts = append(pts, fmt.Sprintf("%.2f,%.2f", px(s*1_000_000+500_000), pl(float64(m))))
			vals = append(vals, fmt.Sprint(m))
		}
		lo = hi
	}
	fmt.Fprintf(&b, `<polyline class="latency" data-values="%s" points="%s" fill="none" stroke="%s" stroke-width="1.6"/>`+"\n",
		strings.Join(vals, " "), strings.Join(pts, " "), colLatency)

	text(&b, 10, h-8, 11, "start", "", fmt.Sprintf("The limit followed the halving in %.1fs and grew back to %d in %.1fs; its dips are probes of the baseline.",
		float64(r.followed())/1e6, adaptiveC, float64(r.regrown())/1e6))
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// ms formats µs as milliseconds.
func ms(us int64) string { return fmt.Sprintf("%dms", (us+500)/1000) }

// adaptivePicture runs the load step with the controller at its defaults,
// and without it, and draws adaptive.svg.
func adaptivePicture() ([]byte, error) {
	c, err := algorithms.NewAdaptive(algorithms.AdaptiveConfig{})
	if err != nil {
		return nil, err
	}
	return adaptiveSVG(simulateAdaptive(&c), simulateAdaptive(nil)), nil
}
