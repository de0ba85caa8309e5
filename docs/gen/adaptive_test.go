package main

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// values parses a series' data-values: whole numbers separated by spaces.
func values(t *testing.T, e *element) []int64 {
	t.Helper()
	var out []int64
	for _, f := range strings.Fields(e.attr["data-values"]) {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("adaptive.svg %s: data-values: %v", e.attr["class"], err)
		}
		out = append(out, v)
	}
	return out
}

func attrInt(t *testing.T, e *element, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(e.attr[name], 10, 64)
	if err != nil {
		t.Fatalf("adaptive.svg <%s>: %s: %v", e.name, name, err)
	}
	return v
}

// checkAdaptive checks that adaptive.svg shows what the issue asks of the
// controller, read back from the picture itself: in each phase, once
// settled, the upstream's in flight near its capacity, round trips near
// the service time and goodput at least 80%; the limit following the
// halving within 10 s and growing back; and the curves and captions
// telling the same story.
func checkAdaptive(t *testing.T, svg *element) {
	t.Helper()
	C := attrInt(t, svg, "data-capacity")
	S := attrInt(t, svg, "data-service-us")
	if C != adaptiveC || S != adaptiveS {
		t.Errorf("adaptive.svg: capacity %d and service time %dµs, want %d and %d", C, S, adaptiveC, adaptiveS)
	}
	followed, regrown := attrInt(t, svg, "data-followed-us"), attrInt(t, svg, "data-regrown-us")
	if followed < 0 || followed > 10_000_000 {
		t.Errorf("adaptive.svg: the limit followed the halving in %dµs, want within 10s", followed)
	}
	if regrown < 0 {
		t.Errorf("adaptive.svg: the limit did not grow back to %d", C)
	}

	series := map[string][]int64{}
	var phases []*element
	var texts []string
	every := int64(0)
	svg.walk(func(e *element) {
		switch {
		case e.name == "polyline" && e.attr["data-values"] != "":
			series[e.attr["class"]] = values(t, e)
			if e.attr["class"] == "limit" {
				every = attrInt(t, e, "data-every-us")
			}
			if n := len(strings.Fields(e.attr["points"])); n != len(series[e.attr["class"]]) {
				t.Errorf("adaptive.svg %s: %d points, %d values", e.attr["class"], n, len(series[e.attr["class"]]))
			}
		case e.name == "g" && e.attr["class"] == "phase":
			phases = append(phases, e)
		case e.name == "text":
			texts = append(texts, e.text)
		}
	})
	limit, inFlight, latency := series["limit"], series["in-flight"], series["latency"]
	if every <= 0 || int64(len(limit)) != adaptiveSpan/every || len(inFlight) != len(limit) {
		t.Fatalf("adaptive.svg: %d limit and %d in-flight points every %dµs, want %d of each", len(limit), len(inFlight), every, adaptiveSpan/max(every, 1))
	}
	if len(latency) != adaptiveSpan/1_000_000 {
		t.Errorf("adaptive.svg: %d latency points, want one per second, %d", len(latency), adaptiveSpan/1_000_000)
	}
	if len(phases) != len(adaptivePhases) {
		t.Fatalf("adaptive.svg: %d phases, want %d", len(phases), len(adaptivePhases))
	}
	all := strings.Join(texts, "\n")
	for i, p := range adaptivePhases {
		g := phases[i]
		w := int64(p.workers)
		if got := attrInt(t, g, "data-workers"); got != w {
			t.Errorf("adaptive.svg phase %d: %d workers, want %d", i, got, w)
		}
		in, lat, good := attrInt(t, g, "data-in-flight"), attrInt(t, g, "data-latency-us"), attrInt(t, g, "data-goodput-pct")
		if 10*in < 7*w || 10*in > 16*w {
			t.Errorf("adaptive.svg phase %d: in-flight median %d, want within [0.7, 1.6] x %d", i, in, w)
		}
		if 10*lat > 16*S {
			t.Errorf("adaptive.svg phase %d: round trip median %dµs, want at most 1.6 x %d", i, lat, S)
		}
		if good < 80 {
			t.Errorf("adaptive.svg phase %d: goodput %d%%, want at least 80%%", i, good)
		}
		caption := "in flight " + g.attr["data-in-flight"] + ", limit " + g.attr["data-limit"]
		if !strings.Contains(all, caption) {
			t.Errorf("adaptive.svg phase %d: no caption %q", i, caption)
		}
		// The plotted curves agree with the phase's medians: over the
		// settled part, the median of the plotted means is within 10%.
		from, to := (p.from+adaptiveSkip)/every, p.until/every
		for _, s := range []struct {
			name string
			vs   []int64
			attr string
		}{{"in-flight", inFlight, "data-in-flight"}, {"limit", limit, "data-limit"}} {
			m := median(slices.Clone(s.vs[from:to]))
			want := 10 * attrInt(t, g, s.attr)
			if 10*m < 9*want || 10*m > 11*want {
				t.Errorf("adaptive.svg phase %d: %s plotted median %.1f, the caption's %d", i, s.name, float64(m)/10, want/10)
			}
		}
	}
	// Without the zone every client queues at the upstream.
	if !strings.Contains(all, "(without the zone: "+strconv.Itoa(8*adaptiveC)+", every client)") {
		t.Errorf("adaptive.svg: no caption of the run without the zone, with all %d clients in flight", 8*adaptiveC)
	}
}

// TestAdaptivePictureRepeats: the picture is the same bytes on every run
// (no clock, no goroutines, no randomness beyond the controller's seed).
func TestAdaptivePictureRepeats(t *testing.T) {
	a, err := adaptivePicture()
	if err != nil {
		t.Fatal(err)
	}
	b, err := adaptivePicture()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("two runs of the adaptive picture differ")
	}
}
