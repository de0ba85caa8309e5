package algorithms

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustAdaptive(t testing.TB, c AdaptiveConfig) AdaptiveConfig {
	t.Helper()
	c, err := NewAdaptive(c)
	if err != nil {
		t.Fatalf("NewAdaptive: %v", err)
	}
	return c
}

// window drives one sample window from start: n requests end at even
// steps over c.Window, each after rtt with outcome o, while up to peak are
// kept in flight (as many as the limit admits). It returns the window's end.
func window(c *AdaptiveConfig, s *AdaptiveState, start int64, peak, n int, rtt int64, o Outcome) int64 {
	for i := range n {
		for s.InFlight < int64(peak) && c.Admit(s) {
		}
		if s.InFlight == 0 {
			c.Admit(s)
		}
		c.End(s, start+c.Window*int64(i+1)/int64(n), rtt, o)
	}
	return start + c.Window
}

// pastSlowStart returns s as if its slow start had ended, for the tests of
// what follows it (slow start counts no epoch, so it has no probe).
func pastSlowStart(s AdaptiveState) AdaptiveState {
	s.slow = false
	return s
}

// upstream is the round trip of an upstream of workers serving each
// request in service µs, with inflight requests sent to it: queueing adds
// to the service time once inflight passes workers.
func upstream(service int64, workers, inflight int64) int64 {
	return service * max(workers, inflight) / workers
}

// steady drives n windows against an upstream of workers and service time,
// with the clients always wanting more than the limit. It returns the time.
func steady(c *AdaptiveConfig, s *AdaptiveState, now int64, windows int, service, workers int64) int64 {
	for range windows {
		l := c.Read(s)
		now = window(c, s, now, int(l), 200, upstream(service, workers, l), OK)
	}
	return now
}

func TestNewAdaptiveDefaults(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{})
	want := AdaptiveConfig{Floor: 1, Ceiling: 1000, Initial: 2, Window: 1_000_000, MinSamples: 20, Percentile: 0.9, Tolerance: 1.25, Smoothing: 0.2, Epoch: 30}
	if c != want {
		t.Errorf("NewAdaptive(zero) = %+v, want %+v", c, want)
	}
	// A floor above the default initial starts there.
	if c := mustAdaptive(t, AdaptiveConfig{Floor: 50}); c.Initial != 50 || c.Ceiling != 1000 {
		t.Errorf("NewAdaptive(Floor 50): Initial %d, Ceiling %d, want 50, 1000", c.Initial, c.Ceiling)
	}
}

func TestNewAdaptiveErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    AdaptiveConfig
		want string
	}{
		{"negative floor", AdaptiveConfig{Floor: -1}, "min: must be in [1, 1099511627776], got -1"},
		{"ceiling under floor", AdaptiveConfig{Floor: 10, Ceiling: 5}, "max: must be in [min (10), 1099511627776], got 5"},
		{"initial above ceiling", AdaptiveConfig{Ceiling: 10, Initial: 11}, "initial: must be in [min (1), max (10)], got 11"},
		{"initial under floor", AdaptiveConfig{Floor: 8, Initial: 2}, "initial: must be in [min (8), max (1000)], got 2"},
		{"negative window", AdaptiveConfig{Window: -5}, "window: must be in [1µs, "},
		{"negative min samples", AdaptiveConfig{MinSamples: -1}, "min_samples: must be in [1, 4294967295], got -1"},
		{"percentile 1", AdaptiveConfig{Percentile: 1}, "percentile: must be in (0, 1), got 1"},
		{"percentile negative", AdaptiveConfig{Percentile: -0.5}, "percentile: must be in (0, 1), got -0.5"},
		{"tolerance under 1", AdaptiveConfig{Tolerance: 0.9}, "tolerance: must be in [1, 100], got 0.9"},
		{"smoothing above 1", AdaptiveConfig{Smoothing: 1.5}, "smoothing: must be in (0, 1], got 1.5"},
		{"short epoch", AdaptiveConfig{Epoch: 2}, "epoch: must be in [4, 1048576] windows, got 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewAdaptive(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewAdaptive(%+v) = %v, want an error containing %q", tc.c, err, tc.want)
			}
		})
	}
}

// TestNewAdaptiveEdges: each bound of NewAdaptive at its edge is
// accepted, and just past it refused with the whole error.
func TestNewAdaptiveEdges(t *testing.T) {
	for _, c := range []AdaptiveConfig{
		{Floor: MaxEvents, Ceiling: MaxEvents},
		{Floor: 5, Ceiling: 5},
		{Floor: 3, Initial: 3},
		{Ceiling: 10, Initial: 10},
		{Window: 1},
		{Window: MaxSpan / adaptiveStale},
		{MinSamples: 1},
		{MinSamples: math.MaxUint32},
		{Percentile: 1e-9},
		{Percentile: 0.999},
		{Tolerance: 1},
		{Tolerance: 100},
		{Smoothing: 1e-9},
		{Smoothing: 1},
		{Epoch: 4},
		{Epoch: 1 << 20},
	} {
		if _, err := NewAdaptive(c); err != nil {
			t.Errorf("NewAdaptive(%+v): %v, want accepted", c, err)
		}
	}
	for _, tc := range []struct {
		c    AdaptiveConfig
		want string
	}{
		{AdaptiveConfig{Floor: MaxEvents + 1}, "min: must be in [1, 1099511627776], got 1099511627777"},
		{AdaptiveConfig{Ceiling: MaxEvents + 1}, "max: must be in [min (1), 1099511627776], got 1099511627777"},
		{AdaptiveConfig{Floor: 5, Ceiling: 4}, "max: must be in [min (5), 1099511627776], got 4"},
		{AdaptiveConfig{Floor: 3, Initial: 2}, "initial: must be in [min (3), max (1000)], got 2"},
		{AdaptiveConfig{Window: MaxSpan/adaptiveStale + 1}, "window: must be in [1µs, 31274h59m50.684262s], got 31274h59m50.684263s"},
		{AdaptiveConfig{MinSamples: math.MaxUint32 + 1}, "min_samples: must be in [1, 4294967295], got 4294967296"},
		{AdaptiveConfig{Percentile: -1e-9}, "percentile: must be in (0, 1), got -1e-09"},
		{AdaptiveConfig{Tolerance: 100.5}, "tolerance: must be in [1, 100], got 100.5"},
		{AdaptiveConfig{Smoothing: -0.1}, "smoothing: must be in (0, 1], got -0.1"},
		{AdaptiveConfig{Epoch: 3}, "epoch: must be in [4, 1048576] windows, got 3"},
		{AdaptiveConfig{Epoch: 1<<20 + 1}, "epoch: must be in [4, 1048576] windows, got 1048577"},
	} {
		if _, err := NewAdaptive(tc.c); err == nil || err.Error() != tc.want {
			t.Errorf("NewAdaptive(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
}

// TestAdaptiveAppLimited: a window that kept fewer than half the limit in
// flight does not grow the limit, however good its latency; one that used
// the limit does.
func TestAdaptiveAppLimited(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{})
	s := c.NewState(t0, 1)
	now := window(&c, &s, t0, 20, 100, 10*ms, OK) // sets the baseline at full use
	// The requests in flight when a window opens count in its peak: one
	// window brings them down to 9.
	now = window(&c, &s, now, 9, 100, 10*ms, OK)
	before := s.Limit
	for i := range 50 {
		now = window(&c, &s, now, int(c.Read(&s))/2-1, 100, 10*ms, OK)
		if s.Limit != before {
			t.Fatalf("window %d: an app-limited window moved the limit from %v to %v", i, before, s.Limit)
		}
	}
	window(&c, &s, now, int(c.Read(&s)), 100, 10*ms, OK)
	if s.Limit <= before {
		t.Errorf("a window at full use of good latency left the limit at %v, want growth past %v", s.Limit, before)
	}
}

// TestAdaptiveBounds: whatever the round trips, outcomes and use, the limit
// stays within [Floor, Ceiling], and Read never admits more than Ceiling
// nor fewer than Floor.
func TestAdaptiveBounds(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Floor: 3, Ceiling: 40, Initial: 10, MinSamples: 5, Epoch: 4})
	rng := rand.New(rand.NewPCG(7, 7))
	for seed := range uint64(20) {
		s := c.NewState(t0, seed)
		now := t0
		for i := range 300 {
			rtt := 1 + rng.Int64N(int64(1+rng.IntN(4))*50*ms)
			o := Outcome(rng.IntN(3))
			if rng.IntN(4) != 0 {
				o = OK
			}
			now = window(&c, &s, now, 1+rng.IntN(60), 5+rng.IntN(50), rtt, o)
			if r := c.Read(&s); s.Limit < 3 || s.Limit > 40 || r < 3 || r > 40 {
				t.Fatalf("seed %d window %d: limit %v, read %d, want within [3, 40]", seed, i, s.Limit, r)
			}
			if s.InFlight > 40 {
				t.Fatalf("seed %d window %d: %d in flight, above the ceiling 40", seed, i, s.InFlight)
			}
		}
	}
	// Pushed hard both ways, the bounds are reached and hold.
	s := c.NewState(t0, 1)
	now := steady(&c, &s, t0, 100, 10*ms, 1000)
	if s.Limit != 40 {
		t.Errorf("an upstream that never queues: limit %v, want the ceiling 40", s.Limit)
	}
	for range 100 {
		now = window(&c, &s, now, int(c.Read(&s)), 50, 10*ms, Drop)
	}
	if s.Limit != 3 {
		t.Errorf("windows of drops only: limit %v, want the floor 3", s.Limit)
	}
}

// TestAdaptiveStepChange: an upstream of 32 workers becomes twice as slow
// (a deploy) and then fast again. The limit shrinks, is not left at the
// floor (the baseline follows the slower upstream within two epochs), and
// grows back when the upstream is fast again.
func TestAdaptiveStepChange(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{})
	s := c.NewState(t0, 1)
	now := steady(&c, &s, t0, 60, 10*ms, 32)
	settled := c.Read(&s)
	if settled < 22 || settled > 52 {
		t.Fatalf("at 10 ms and 32 workers the limit settled at %d, want within [22, 52]", settled)
	}
	now = steady(&c, &s, now, 1, 20*ms, 32)
	if c.Read(&s) >= settled {
		t.Errorf("a window twice as slow left the limit at %d, want below %d", c.Read(&s), settled)
	}
	// Two epochs (of at most 1.25 x 30 windows and a probe each) later,
	// the slower service time is the baseline and the limit uses the
	// workers again.
	now = steady(&c, &s, now, 2*(38+1)+40, 20*ms, 32)
	if got := c.Read(&s); got < 22 {
		t.Errorf("long after the upstream became twice as slow the limit is %d (baseline %d µs), want at least 22", got, s.Baseline)
	}
	if s.Baseline < 15*ms {
		t.Errorf("baseline %d µs after the slowdown, want it to follow the 20 ms service time", s.Baseline)
	}
	// Fast again: the baseline falls at once and the limit stays up.
	now = steady(&c, &s, now, 60, 10*ms, 32)
	if got := c.Read(&s); got < 22 || s.Baseline > 11*ms {
		t.Errorf("after the upstream is fast again: limit %d, baseline %d µs, want at least 22 and about 10 ms", got, s.Baseline)
	}
	_ = now
}

// TestAdaptiveDrops: a window with more than 5% drops cuts the limit by
// 10%, whatever its latency; a stray drop does not.
func TestAdaptiveDrops(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 100})
	s := c.NewState(t0, 1)
	now := t0
	mixed := func(drops int) {
		for i := range 100 {
			for s.InFlight < 100 && c.Admit(&s) {
			}
			o := OK
			if i < drops {
				o = Drop
			}
			c.End(&s, now+c.Window*int64(i+1)/100, 10*ms, o)
		}
		now += c.Window
	}
	mixed(0)
	before := s.Limit
	mixed(10)
	if want := before * 0.9; s.Limit != want {
		t.Errorf("a window of 10%% drops: limit %v, want %v", s.Limit, want)
	}
	before = s.Limit
	mixed(2)
	if s.Limit < before {
		t.Errorf("a window of 2%% drops cut the limit from %v to %v", before, s.Limit)
	}
}

// TestAdaptiveTeachesNothing: cancelled requests, and windows with too few
// samples (however long they last), leave everything but the in-flight
// count as it was.
func TestAdaptiveTeachesNothing(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{})
	s := c.NewState(t0, 1)
	now := window(&c, &s, t0, 20, 100, 10*ms, OK)
	before := s
	for range 20 {
		now = window(&c, &s, now, 20, 500, 900*ms, Cancelled)
	}
	before.peak, before.InFlight = s.peak, s.InFlight // the in flight is the one thing they move
	if s != before {
		t.Errorf("cancelled requests changed the state:\n got %+v\nwant %+v", s, before)
	}
	// One sample a window's time for 30 windows: a window waits for its
	// samples for 10 windows' time, and then drops the few it has.
	for i := range 30 {
		now = window(&c, &s, now, 20, 1, 900*ms, OK)
		if i%10 == 0 && s.samples != 0 {
			t.Errorf("after %d windows' time of one sample each, %d samples kept, want them dropped", i+1, s.samples)
		}
	}
	if s.Limit != before.Limit || s.Windows != before.Windows || s.Baseline != before.Baseline || s.Recent != before.Recent {
		t.Errorf("windows of too few samples changed the limit: got limit %v windows %d baseline %d recent %d, want %v %d %d %d",
			s.Limit, s.Windows, s.Baseline, s.Recent, before.Limit, before.Windows, before.Baseline, before.Recent)
	}
}

// TestAdaptiveProbe: when an epoch ends, one window admits half the
// limit, and a queue that drains in it keeps the baseline where it was.
func TestAdaptiveProbe(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 40, Epoch: 4})
	s := pastSlowStart(c.NewState(t0, 1))
	now := window(&c, &s, t0, 40, 100, 10*ms, OK)
	probed := false
	for range 14 {
		if s.probe {
			probed = true
			if r := c.Read(&s); r != int64(s.Limit/2) {
				t.Fatalf("probe window reads %d, want half the limit %v", r, s.Limit)
			}
			now = window(&c, &s, now, int(c.Read(&s)), 100, 10*ms, OK)
			continue
		}
		// Queueing all along: latency up by 20%, under the tolerance.
		now = window(&c, &s, now, int(c.Read(&s)), 100, 12*ms, OK)
	}
	if !probed {
		t.Fatal("no probe window in 14 windows of epochs of 3 to 5 windows")
	}
	if s.Baseline > 10*ms {
		t.Errorf("baseline %d µs after a probe that saw 10 ms, want it kept at 10 ms", s.Baseline)
	}
}

// untilProbe returns a controller of epochs of 4 windows and its state
// after windows at the limit of rtt, up to the first probe.
func untilProbe(t *testing.T, limit int64, rtt int64) (AdaptiveConfig, AdaptiveState, int64) {
	t.Helper()
	c := mustAdaptive(t, AdaptiveConfig{Initial: limit, Epoch: 4})
	s := pastSlowStart(c.NewState(t0, 1))
	now := t0
	for !s.probe {
		now = window(&c, &s, now, int(limit), 200, rtt, OK)
	}
	return c, s, now
}

// TestAdaptiveProbeOwnRequests: requests sent before a probe window that
// end in it, after queueing, are not its samples.
func TestAdaptiveProbeOwnRequests(t *testing.T) {
	c, s, now := untilProbe(t, 100, 12*ms)
	s.InFlight = 99 // admitted before the probe
	// The probe: 99 requests sent before it end after 40 ms of queueing,
	// then 100 of its own answer in 10 ms.
	for i := range 99 {
		c.End(&s, now+int64(i)*ms/10, 40*ms, OK)
	}
	window(&c, &s, now, 50, 100, 10*ms, OK)
	if s.probe || s.Baseline > 10*ms {
		t.Errorf("after a probe whose own requests took 10 ms: probe %v, baseline %d µs, want the probe over and 10 ms", s.probe, s.Baseline)
	}
}

// TestAdaptiveProbeStarved: a probe that gets too few samples within 10
// windows' time ends, and the limit is admitted again.
func TestAdaptiveProbeStarved(t *testing.T) {
	c, s, now := untilProbe(t, 40, 10*ms)
	before := s.Baseline
	for range 11 {
		now = window(&c, &s, now, 1, 1, 10*ms, OK)
	}
	if s.probe || c.Read(&s) != int64(s.Limit) || s.Baseline != before {
		t.Errorf("after a starved probe: probe %v, read %d of limit %v, baseline %d (was %d); want the probe over, the limit read, the baseline kept",
			s.probe, c.Read(&s), s.Limit, s.Baseline, before)
	}
}

// TestAdaptivePercentile: the histogram's percentile is within 1/16 of the
// true one.
func TestAdaptivePercentile(t *testing.T) {
	for _, v := range []int64{1, 7, 15, 16, 17, 100, 999, 10 * ms, 123_456, int64(time.Hour / time.Microsecond), maxRTT} {
		got := bucketMid(rttBucket(v))
		if d := got - v; d*16 > v || -d*16 > v {
			t.Errorf("bucketMid(rttBucket(%d)) = %d, want within 1/16", v, got)
		}
	}
	if b := rttBucket(maxRTT * 4); b != rttBuckets-1 {
		t.Errorf("rttBucket(4 maxRTT) = %d, want the last bucket %d", b, rttBuckets-1)
	}
	c := mustAdaptive(t, AdaptiveConfig{Initial: 100})
	s := c.NewState(t0, 1)
	for i := range 100 {
		c.Admit(&s)
		c.End(&s, t0+c.Window*int64(i+1)/100, int64(i+1)*ms, OK)
	}
	if s.Recent < 85*ms || s.Recent > 95*ms {
		t.Errorf("p90 of 1..100 ms = %d µs, want about 90 ms", s.Recent)
	}
}

func TestAdaptiveAllocs(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{})
	s := c.NewState(t0, 1)
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now = window(&c, &s, now, 30, 50, 10*ms, OK)
	})
	if allocs != 0 {
		t.Errorf("a window of 50 requests allocates %v times, want 0", allocs)
	}
}

// BenchmarkAdaptive is one request's cost: Admit and End, with a window
// closing every 1000 requests.
func BenchmarkAdaptive(b *testing.B) {
	c := mustAdaptive(b, AdaptiveConfig{Initial: 100})
	s := c.NewState(t0, 1)
	now := t0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now += ms
		c.Admit(&s)
		c.End(&s, now, 10*ms+int64(i%7)*ms, OK)
	}
}

// TestAdaptiveSlowStart: from the initial limit, the limit doubles each
// window while the upstream shows no queue; the first window that queues
// cuts it by the gradient (to about the tolerance times the capacity) and
// ends slow start, after which growth is the smoothed step.
func TestAdaptiveSlowStart(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{})
	s := c.NewState(t0, 1)
	now := t0
	for i, want := range []int64{2, 4, 8, 16, 32, 64} {
		if got := c.Read(&s); got != want {
			t.Fatalf("window %d: limit %d, want %d (doubling from the initial 2)", i, got, want)
		}
		now = steady(&c, &s, now, 1, 10*ms, 100)
	}
	if !s.slow || c.Read(&s) != 128 {
		t.Fatalf("after 64 under 100 workers: limit %d, slow start %v; want 128 and still in slow start", c.Read(&s), s.slow)
	}
	// 128 in flight against 100 workers: round trips of 1.28 service
	// times, past the tolerance.
	now = steady(&c, &s, now, 1, 10*ms, 100)
	if got := c.Read(&s); s.slow || got < 100 || got >= 128 {
		t.Fatalf("after the first queueing window: limit %d, slow start %v; want within [100, 128) (the gradient's cut) and slow start over", got, s.slow)
	}
	for i := range 5 {
		before := s.Limit
		now = steady(&c, &s, now, 1, 10*ms, 1000) // no queue: growth
		if s.Limit > before*1.1+1e-9 {
			t.Fatalf("window %d after slow start: limit %v from %v, want at most a tenth of growth", i, s.Limit, before)
		}
	}
}

// TestAdaptiveQueueOfOne: a window whose round trips are above the
// tolerance but whose limit could queue less than one request at the
// upstream (limit x (1 - baseline/recent) < 1) is noise in the service
// time, not queueing: it does not cut the limit. The same round trips
// at a limit that could queue several do.
func TestAdaptiveQueueOfOne(t *testing.T) {
	for _, tc := range []struct {
		limit int64
		cut   bool
	}{{2, false}, {3, true}, {8, true}} {
		c := mustAdaptive(t, AdaptiveConfig{Floor: 1, Initial: tc.limit})
		s := pastSlowStart(c.NewState(t0, 1))
		now := window(&c, &s, t0, int(tc.limit), 100, 10*ms, OK) // the baseline
		before := s.Limit
		window(&c, &s, now, int(tc.limit), 100, 16*ms, OK) // 1.6 x: a queue of 0.375 x limit
		if cut := s.Limit < before; cut != tc.cut {
			t.Errorf("limit %d: round trips 1.6 x the baseline took the limit from %v to %v; want a cut: %v", tc.limit, before, s.Limit, tc.cut)
		}
	}
}

// TestAdaptiveBaselineOfPooledWindows: past slow start, a window of few
// samples whose p90 is low by chance does not lower the baseline; the
// median of windows pooled up to 100 samples does.
func TestAdaptiveBaselineOfPooledWindows(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 4})
	s := pastSlowStart(c.NewState(t0, 1))
	now := window(&c, &s, t0, 4, 20, 10*ms, OK)
	base := s.Baseline
	// Windows of 20 samples: one low among higher ones.
	for i, rtt := range []int64{10 * ms, 6 * ms, 10 * ms, 10 * ms, 10 * ms} {
		now = window(&c, &s, now, 4, 20, rtt, OK)
		if s.Baseline != base {
			t.Fatalf("window %d of 20 samples at %d µs: baseline %d, want it kept at %d", i, rtt, s.Baseline, base)
		}
	}
	// Five windows lower, pooled: the baseline follows.
	for range 5 {
		now = window(&c, &s, now, 4, 20, 6*ms, OK)
	}
	if s.Baseline > 7*ms {
		t.Errorf("after 100 samples pooled at 6 ms: baseline %d µs, want it lowered to about 6 ms", s.Baseline)
	}
}

// TestAdaptiveBuckets: the histogram's buckets, walked one round trip at
// a time up to 2^16 µs and around every power of two above: each round
// trip below 16 µs is its own bucket; above, a bucket follows the one
// before without a gap, is at most 1/8 of its least round trip wide, and
// its middle (bucketMid) is its least round trip plus half its width.
func TestAdaptiveBuckets(t *testing.T) {
	var rtts []int64
	for v := int64(1); v <= 1<<16; v++ {
		rtts = append(rtts, v)
	}
	for e := 17; e <= 40; e++ {
		for d := int64(-300); d <= 300; d++ {
			rtts = append(rtts, int64(1)<<e+d)
		}
	}
	lo := map[int]int64{} // each bucket's least round trip seen
	hi := map[int]int64{} // and its most
	prev := 0
	for i, v := range rtts {
		b := rttBucket(v)
		if v < 16 && b != int(v) {
			t.Fatalf("rttBucket(%d) = %d, want %d", v, b, v)
		}
		if i > 0 && rtts[i-1] == v-1 && b != prev && b != prev+1 {
			t.Fatalf("rttBucket(%d) = %d after %d for %d: want the same bucket or the next", v, b, prev, v-1)
		}
		if _, ok := lo[b]; !ok {
			lo[b] = v
		}
		hi[b] = v
		prev = b
	}
	for b, l := range lo {
		h := hi[b]
		if l < 16 {
			if bucketMid(b) != l {
				t.Errorf("bucketMid(%d) = %d, want %d", b, bucketMid(b), l)
			}
			continue
		}
		// Buckets seen whole: those whose neighbours were seen too.
		if _, ok := lo[b-1]; !ok || hi[b-1] != l-1 {
			continue
		}
		if _, ok := lo[b+1]; !ok || lo[b+1] != h+1 {
			continue
		}
		width := h - l + 1
		if width*8 > l {
			t.Errorf("bucket %d holds [%d, %d]: wider than 1/8 of %d", b, l, h, l)
		}
		if got, want := bucketMid(b), l+width/2; got != want {
			t.Errorf("bucketMid(%d) = %d, want %d, the middle of [%d, %d]", b, got, want, l, h)
		}
	}
	if b := rttBucket(0); b != 1 {
		t.Errorf("rttBucket(0) = %d, want 1 (a round trip is at least 1 µs)", b)
	}
}

// TestAdaptivePercentileModel: a window's recent is the bucket middle of
// the sample of rank ceil(p * n) in the sorted samples (a plain model),
// for random samples, percentiles and counts.
func TestAdaptivePercentileModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 2))
	for range 2000 {
		c := mustAdaptive(t, AdaptiveConfig{Percentile: []float64{0.5, 0.9, 0.99, rng.Float64()*0.98 + 0.01}[rng.IntN(4)]})
		s := c.NewState(t0, 1)
		n := 1 + rng.IntN(60)
		samples := make([]int64, n)
		for i := range samples {
			samples[i] = 1 + rng.Int64N([]int64{20, 1000, 1 << 30}[rng.IntN(3)])
			s.hist[rttBucket(samples[i])]++
		}
		slices.Sort(samples)
		rank := int(math.Ceil(c.Percentile * float64(n)))
		if got, want := c.percentile(&s, int64(n)), bucketMid(rttBucket(samples[rank-1])); got != want {
			t.Fatalf("percentile %g of %v = %d, want %d", c.Percentile, samples, got, want)
		}
	}
	// More asked than the histogram holds: its last bucket.
	c := mustAdaptive(t, AdaptiveConfig{})
	s := c.NewState(t0, 1)
	if got, want := c.percentile(&s, 5), bucketMid(rttBuckets-1); got != want {
		t.Errorf("percentile of an empty histogram = %d, want the last bucket's %d", got, want)
	}
}

// TestAdaptiveEpochLength: an epoch is Epoch windows give or take a
// quarter (Epoch/4 rounded down), every length of that range drawn.
func TestAdaptiveEpochLength(t *testing.T) {
	for _, epoch := range []int64{4, 5, 7, 30, 101} {
		c := mustAdaptive(t, AdaptiveConfig{Epoch: epoch})
		s := c.NewState(t0, 12345)
		seen := map[int64]bool{}
		for range 5000 {
			n := c.epochLength(&s)
			if n < epoch-epoch/4 || n > epoch+epoch/4 {
				t.Fatalf("epoch %d: a length of %d, want within [%d, %d]", epoch, n, epoch-epoch/4, epoch+epoch/4)
			}
			seen[n] = true
		}
		if want := 2*(epoch/4) + 1; int64(len(seen)) != want {
			t.Errorf("epoch %d: %d lengths drawn, want all %d", epoch, len(seen), want)
		}
	}
}

// TestAdaptivePool: the pool returns 0 until its windows hold
// adaptivePoolSamples samples or adaptivePool windows, then their median
// recent, and starts empty again.
func TestAdaptivePool(t *testing.T) {
	var s AdaptiveState
	steps := []struct{ recent, n, want int64 }{
		{50, 40, 0},
		{30, 59, 0},
		{40, 1, 40}, // 100 samples: the median of 50, 30, 40
		{70, 99, 0}, // empty again
		{10, 1, 70}, // 100 samples: of 70 and 10, the upper middle
		{5, 1, 0}, {6, 1, 0}, {7, 1, 0}, {8, 1, 0},
		{9, 1, 7}, // 5 windows
	}
	for i, st := range steps {
		if got := s.pool(st.recent, st.n); got != st.want {
			t.Fatalf("step %d: pool(%d, %d) = %d, want %d", i, st.recent, st.n, got, st.want)
		}
	}
}

// TestAdaptiveNewEpoch: an epoch's end sets the baseline to its least
// candidate, and keeps the baseline when the epoch had none.
func TestAdaptiveNewEpoch(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{})
	s := c.NewState(t0, 1)
	s.Baseline, s.epochLo = 100, 80
	c.newEpoch(&s)
	if s.Baseline != 80 || s.epochLo != 0 {
		t.Fatalf("after an epoch of least candidate 80: baseline %d, epoch's least %d; want 80 and 0", s.Baseline, s.epochLo)
	}
	c.newEpoch(&s)
	if s.Baseline != 80 {
		t.Fatalf("after an epoch without candidates: baseline %d, want 80 kept", s.Baseline)
	}
}

// TestAdaptiveWindowCounts: Windows counts the windows closed; a window's
// recent is the percentile of its OK round trips alone (its drops count
// in its samples, not its round trips); a window of drops alone leaves
// recent as it was; an end with nothing in flight leaves none in flight.
func TestAdaptiveWindowCounts(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 100, Ceiling: 100})
	s := c.NewState(t0, 1)
	now := window(&c, &s, t0, 50, 100, 10*ms, OK)
	now = window(&c, &s, now, 50, 100, 10*ms, OK)
	if s.Windows != 2 {
		t.Fatalf("after 2 windows: Windows %d", s.Windows)
	}
	// 100 OK round trips of 20 ms and 3 drops (under the drop share),
	// the drops ending first.
	for i := range 103 {
		c.Admit(&s)
		o := OK
		if i < 3 {
			o = Drop
		}
		c.End(&s, now+c.Window*int64(i+1)/103, 20*ms, o)
	}
	now += c.Window
	if want := bucketMid(rttBucket(20 * ms)); s.Windows != 3 || s.Recent != want {
		t.Fatalf("a window of 100 OK and 3 drops: Windows %d, recent %d; want 3 and %d", s.Windows, s.Recent, want)
	}
	before := s.Recent
	window(&c, &s, now, 50, 100, 10*ms, Drop)
	if s.Windows != 4 || s.Recent != before {
		t.Fatalf("a window of drops alone: Windows %d, recent %d; want 4 and %d kept", s.Windows, s.Recent, before)
	}
	for s.InFlight > 0 {
		c.End(&s, now, 10*ms, Cancelled)
	}
	c.End(&s, now, 10*ms, Cancelled)
	if s.InFlight != 0 {
		t.Fatalf("an end with nothing in flight: %d in flight, want 0", s.InFlight)
	}
}

// TestAdaptiveHalfUsed: a window that used exactly half the limit is
// not app-limited: in slow start it doubles the limit, past it the limit
// grows (by a fifth of half the limit, recent being the baseline).
func TestAdaptiveHalfUsed(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 20})
	s := c.NewState(t0, 1)
	window(&c, &s, t0, 10, 100, 10*ms, OK)
	if s.Limit != 40 {
		t.Errorf("slow start, half the limit used: limit %v, want 40", s.Limit)
	}
	p := pastSlowStart(c.NewState(t0, 1))
	window(&c, &p, t0, 10, 100, 10*ms, OK)
	if p.Limit != 22 {
		t.Errorf("past slow start, half the limit used: limit %v, want 22", p.Limit)
	}
}

// TestAdaptiveNoQueueStep: recent within half the tolerance of the
// baseline, at its edge exactly (10 µs against 8 µs with a tolerance of
// 1.5), still grows the limit by the larger step, half the limit.
func TestAdaptiveNoQueueStep(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 20, Tolerance: 1.5})
	s := pastSlowStart(c.NewState(t0, 1))
	now := window(&c, &s, t0, 20, 100, 8, OK)
	if s.Baseline != 8 || s.Limit != 22 {
		t.Fatalf("first window: baseline %d, limit %v; want 8 and 22", s.Baseline, s.Limit)
	}
	window(&c, &s, now, 22, 100, 10, OK)
	if want := 22 + 0.2*11; s.Recent != 10 || s.Limit != want {
		t.Fatalf("recent 10 µs on a baseline of 8: recent %d, limit %v; want 10 and %v", s.Recent, s.Limit, want)
	}
}

// TestAdaptiveEpochEnd: the first epoch past slow start is 5 windows:
// the 6th is a probe, at half the limit when the windows used half of
// it exactly (not app-limited). A round trip past maxRTT counts in the
// histogram's last bucket.
func TestAdaptiveEpochEnd(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 20, Ceiling: 20})
	s := pastSlowStart(c.NewState(t0, 1))
	now := t0
	for i := 1; i <= 5; i++ {
		if s.probe {
			t.Fatalf("a probe after %d windows, want after 5", i-1)
		}
		now = window(&c, &s, now, 10, 100, 10*ms, OK)
	}
	if !s.probe || c.Read(&s) != 10 {
		t.Fatalf("after 5 windows: probe %v, reads %d; want a probe at 10", s.probe, c.Read(&s))
	}
	f := c.NewState(t0, 1)
	c.Admit(&f)
	c.End(&f, t0+1, maxRTT*4, OK)
	if f.hist[rttBuckets-1] != 1 {
		t.Fatalf("a round trip of 4 maxRTT: not in the last bucket")
	}
}

// TestAdaptiveQueueOfExactlyOne: a queue of exactly one request (limit
// 4, recent 8 µs on a baseline of 6: 4 * (1 - 6/8) = 1) is a queue: the
// gradient (1.25 * 6/8) cuts the limit. Below one request it would not.
func TestAdaptiveQueueOfExactlyOne(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 4, Ceiling: 4})
	s := pastSlowStart(c.NewState(t0, 1))
	now := window(&c, &s, t0, 4, 100, 6, OK)
	window(&c, &s, now, 4, 100, 8, OK)
	if s.Baseline != 6 || s.Recent != 8 || s.Gradient != 0.9375 || s.Limit >= 4 {
		t.Fatalf("baseline %d, recent %d, gradient %v, limit %v; want 6, 8, 0.9375 and a limit cut below 4", s.Baseline, s.Recent, s.Gradient, s.Limit)
	}
}

// TestAdaptiveProbeAtTheTolerance: a probe of fewer than
// adaptivePoolSamples whose recent is exactly the epoch's least
// candidate over the tolerance (12 µs against 15, 1.25 * 12 = 15) did
// not find a queue: it is no candidate (the baseline stays 15) and the
// next epoch is a whole one, not a quick reprobe.
func TestAdaptiveProbeAtTheTolerance(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 100, Epoch: 40})
	s := pastSlowStart(c.NewState(t0, 1))
	now := t0
	for !s.probe {
		now = window(&c, &s, now, 100, 200, 15, OK)
	}
	window(&c, &s, now, int(c.Read(&s)), 50, 12, OK)
	if s.probe || s.Recent != 12 || s.Baseline != 15 || s.left < 30 {
		t.Fatalf("after the probe: probe %v, recent %d, baseline %d, epoch %d windows; want over, 12, 15 and at least 30", s.probe, s.Recent, s.Baseline, s.left)
	}
}

// TestAdaptiveAdmitOver: a request admitted over the limit (a dry run)
// counts in flight and in the window's peak.
func TestAdaptiveAdmitOver(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 1, Ceiling: 1})
	s := c.NewState(t0, 1)
	c.Admit(&s)
	c.AdmitOver(&s)
	if s.InFlight != 2 || s.peak != 2 {
		t.Fatalf("one admitted and one over the limit of 1: %d in flight, peak %d; want 2 and 2", s.InFlight, s.peak)
	}
}

// TestAdaptiveDropShareEdge: a window whose drops are exactly the drop
// share (5 of 100) is not overloaded: the limit is not cut.
func TestAdaptiveDropShareEdge(t *testing.T) {
	c := mustAdaptive(t, AdaptiveConfig{Initial: 20, Ceiling: 20})
	s := pastSlowStart(c.NewState(t0, 1))
	now := window(&c, &s, t0, 20, 100, 10*ms, OK)
	for i := range 100 {
		for s.InFlight < 20 && c.Admit(&s) {
		}
		o := OK
		if i < 5 {
			o = Drop
		}
		c.End(&s, now+c.Window*int64(i+1)/100, 10*ms, o)
	}
	if s.Windows != 2 || s.Limit != 20 {
		t.Fatalf("a window of 5 drops in 100: %d windows, limit %v; want 2 and 20 kept", s.Windows, s.Limit)
	}
}

// TestAdaptiveProbeEdges: a short probe after an epoch without
// candidates is a candidate (there is no epoch's least to compare it
// with); a probe of drops alone teaches no queue, whatever recent the
// window before left (no quick reprobe).
func TestAdaptiveProbeEdges(t *testing.T) {
	untilProbe := func() (AdaptiveConfig, AdaptiveState, int64) {
		c := mustAdaptive(t, AdaptiveConfig{Initial: 100, Epoch: 40})
		s := pastSlowStart(c.NewState(t0, 1))
		now := t0
		for !s.probe {
			now = window(&c, &s, now, 100, 200, 15, OK)
		}
		return c, s, now
	}
	c, s, now := untilProbe()
	s.epochLo = 0 // an epoch without candidates
	window(&c, &s, now, int(c.Read(&s)), 50, 12, OK)
	if s.Baseline != 12 {
		t.Fatalf("a short probe of 12 µs after an epoch without candidates: baseline %d, want 12", s.Baseline)
	}
	c, s, now = untilProbe()
	s.Recent = 5 // as if the window before had been fast
	window(&c, &s, now, int(c.Read(&s)), 50, 12, Drop)
	if s.left < 30 {
		t.Fatalf("after a probe of drops alone: an epoch of %d windows, want a whole one (at least 30)", s.left)
	}
}
