package algorithms

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"
)

// An adaptive concurrency limit is an in-flight limit that follows the
// upstream's latency: it is recomputed once per sample window from the
// round trips of the requests it admitted,
//
//	gradient = clamp(Tolerance * baseline / recent, 0.5, 1)
//	target   = limit * gradient, or limit + sqrt(limit) when gradient is 1
//	           (limit * 1.5 while recent shows no queue at all)
//	limit'   = limit + share * (target - limit)
//
// where recent is the window's Percentile round trip and baseline the
// round trip of an upstream that is not queueing: the least of the last
// epoch's candidates (the median recent of windows pooled up to 100 round
// trips) and of its probe. The share is Smoothing (0.2) for growth and a
// half for a decrease, so that the limit backs off within a few windows
// and creeps back up, within [Floor, Ceiling]. A window whose limit could
// queue less than one request at the upstream (limit * (1 - baseline /
// recent) < 1) is not cut: a small limit's round trips above the
// tolerance are the service time's noise.
//
// It starts in slow start, as TCP: from Initial (2) the limit doubles each
// window while the gradient is 1, and the first window that shows a queue
// takes the whole cut (target), which ends slow start. So a small
// upstream is not flooded before the first window has taught anything,
// and the baseline is learnt while nothing queues.
//
// See docs/design.md, "Adaptive concurrency: the controller", for the
// faults of Envoy's and Netflix's controllers that this one avoids.
//
// The controller is pure like the rest of the package: AdaptiveConfig.Admit,
// End and Read take the state (and End now, in µs); they read no clock,
// take no lock and allocate nothing. The state is one value per limit
// (about 1.3 KB, a histogram of the window's round trips), kept by its
// owner under its own lock.

// Outcome is how an admitted request ended, as the controller learns it.
type Outcome uint8

const (
	// OK is an answer from the upstream: its round trip is a sample.
	OK Outcome = iota
	// Drop is an upstream timeout or a 5xx: a sign of overload whose
	// round trip says nothing about service time.
	Drop
	// Cancelled is a request the client gave up on: it teaches nothing.
	Cancelled
)

// Defaults of AdaptiveConfig, chosen for a typical HTTP upstream (round
// trips of 1 ms to a few seconds, tens to thousands of requests a second).
const (
	// DefaultAdaptiveFloor is 1: a request keeps flowing whatever the
	// latency says, so that the controller always has samples to recover
	// from, and an upstream of one or two workers is not held above its
	// capacity by the floor (a floor of 4 kept an upstream of 2 at twice
	// its service time).
	DefaultAdaptiveFloor int64 = 1
	// DefaultAdaptiveCeiling bounds the limit at what one instance can
	// sensibly hold in flight to one upstream.
	DefaultAdaptiveCeiling int64 = 1000
	// DefaultAdaptiveInitial is where slow start begins: 2 is at or below
	// the capacity of any upstream that serves two requests at once, so
	// the first windows learn the unqueued round trip; doubling a window
	// reaches an upstream of 64 workers in 6 windows. (An initial limit
	// above the capacity learns the queue as service time, which only a
	// probe undoes.)
	DefaultAdaptiveInitial int64 = 2
	// DefaultAdaptiveWindow is one second: short enough to follow a load
	// step within a few seconds, long enough to hold a percentile.
	DefaultAdaptiveWindow = time.Second
	// DefaultAdaptiveMinSamples is the least number of samples a window
	// needs before it closes: a p90 of fewer than 20 samples is one or
	// two requests.
	DefaultAdaptiveMinSamples int64 = 20
	// DefaultAdaptivePercentile is p90: the tail the clients feel, but not
	// the p99 that one slow request moves.
	DefaultAdaptivePercentile = 0.9
	// DefaultAdaptiveTolerance is Envoy's buffer (25% of the minimum round
	// trip): latency up to 1.25x the baseline is not congestion. The limit
	// settles where the upstream's queue makes latency cross it, so it
	// bounds the latency added by queueing to about a quarter; Gradient2's
	// 1.5 lets a saturated upstream run at 1.5x its service time and more.
	DefaultAdaptiveTolerance = 1.25
	// DefaultAdaptiveSmoothing is Gradient2's 0.2: growth takes a fifth of
	// its step per window, so that one lucky window does not open the gate.
	DefaultAdaptiveSmoothing = 0.2
	// DefaultAdaptiveEpoch is the number of windows after which the
	// baseline is re-measured by a probe window (with jitter of a quarter
	// either way): 30 s, so that a probe's cost, half of one window's
	// admissions, is under 2% of a saturated upstream's throughput.
	DefaultAdaptiveEpoch int64 = 30
)

const (
	// adaptiveDropShare is the share of drops in a window above which the
	// window is overload whatever its latency: 5% keeps one stray 502 from
	// shrinking a busy upstream's limit.
	adaptiveDropShare = 0.05
	// adaptiveDecrease is the multiplicative decrease of a window of drops.
	adaptiveDecrease = 0.9
	// adaptiveMinGradient is the least gradient, as Gradient2's and
	// Envoy's: the most a window asks the limit to shrink is by half.
	adaptiveMinGradient = 0.5
	// adaptiveCut is the share of a cut taken per window: half, against
	// Smoothing's fifth for growth, so that the limit backs off within a
	// few windows when capacity falls (a halving is followed in two) but
	// one window that crossed the tolerance by a quantum of queueing does
	// not throw away a third of the throughput.
	adaptiveCut = 0.5
	// adaptiveStale is how many windows' time a window may wait for its
	// samples: past it, the few samples are too old to describe the
	// upstream and are dropped, teaching nothing.
	adaptiveStale = 10
	// adaptiveProbe is the share of the limit a probe window admits.
	adaptiveProbe = 0.5
	// adaptiveReprobe is the first epoch, and the one after a probe that
	// found a queue, in windows: time for the cuts of the lower baseline
	// to take effect before the next probe.
	adaptiveReprobe = 5
	// adaptivePoolSamples is how many samples the windows pooled for a
	// baseline candidate hold: the p90 of 20 samples of an upstream whose
	// service time varies is too noisy for the least of them to be the
	// baseline (it would sit far below the typical window's recent, and
	// the limit would be cut for noise); the median of 5 is not.
	adaptivePoolSamples = 100
	// adaptivePool is the most windows pooled for a candidate.
	adaptivePool = 5
	// maxRTT bounds a round trip in the histogram: 2^40 µs, 12 days.
	maxRTT int64 = 1 << 40
	// rttBuckets is the histogram's size: 8 buckets per power of two up
	// to maxRTT, whose bucket is the last (a bucket is at most 1/8 of its
	// round trips wide, so its midpoint is at most 1/16 off).
	rttBuckets = 37*8 + 8 + 1
)

// AdaptiveConfig is an adaptive concurrency limit's configuration. Build it
// with NewAdaptive, which fills in defaults and validates it.
type AdaptiveConfig struct {
	// Floor and Ceiling bound the limit. Defaults: 1 and 1000.
	Floor, Ceiling int64
	// Initial is the limit before the first window closes, where slow
	// start begins. Default 2 (within [Floor, Ceiling]).
	Initial int64
	// Window is a sample window's least length in µs; a window closes at
	// the first round trip after both Window and MinSamples are reached.
	// Default 1 s.
	Window int64
	// MinSamples is a window's least number of samples. Default 20.
	MinSamples int64
	// Percentile is the round trip of a window taken as recent, in (0, 1).
	// Default 0.9.
	Percentile float64
	// Tolerance is how far above the baseline recent may go before it is
	// congestion, >= 1. Default 1.25.
	Tolerance float64
	// Smoothing is the share of a growth step taken per window, in (0, 1].
	// Default 0.2.
	Smoothing float64
	// Epoch is the number of windows (jittered by a quarter) after which
	// the baseline is re-measured. Default 30.
	Epoch int64
}

// NewAdaptive fills in the zero fields of c with their defaults and
// validates it; errors name the field and the value.
func NewAdaptive(c AdaptiveConfig) (AdaptiveConfig, error) {
	if c.Floor == 0 {
		c.Floor = DefaultAdaptiveFloor
	}
	if c.Ceiling == 0 {
		c.Ceiling = max(DefaultAdaptiveCeiling, c.Floor)
	}
	if c.Initial == 0 {
		c.Initial = min(max(DefaultAdaptiveInitial, c.Floor), c.Ceiling)
	}
	if c.Window == 0 {
		c.Window = DefaultAdaptiveWindow.Microseconds()
	}
	if c.MinSamples == 0 {
		c.MinSamples = DefaultAdaptiveMinSamples
	}
	if c.Percentile == 0 {
		c.Percentile = DefaultAdaptivePercentile
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultAdaptiveTolerance
	}
	if c.Smoothing == 0 {
		c.Smoothing = DefaultAdaptiveSmoothing
	}
	if c.Epoch == 0 {
		c.Epoch = DefaultAdaptiveEpoch
	}
	switch {
	case c.Floor < 1 || c.Floor > MaxEvents:
		return c, fmt.Errorf("min: must be in [1, %d], got %d", MaxEvents, c.Floor)
	case c.Ceiling < c.Floor || c.Ceiling > MaxEvents:
		return c, fmt.Errorf("max: must be in [min (%d), %d], got %d", c.Floor, MaxEvents, c.Ceiling)
	case c.Initial < c.Floor || c.Initial > c.Ceiling:
		return c, fmt.Errorf("initial: must be in [min (%d), max (%d)], got %d", c.Floor, c.Ceiling, c.Initial)
	case c.Window < 1 || c.Window > MaxSpan/adaptiveStale:
		return c, fmt.Errorf("window: must be in [1µs, %s], got %s", time.Duration(MaxSpan/adaptiveStale)*time.Microsecond, time.Duration(c.Window)*time.Microsecond)
	case c.MinSamples < 1 || c.MinSamples > math.MaxUint32:
		return c, fmt.Errorf("min_samples: must be in [1, %d], got %d", uint32(math.MaxUint32), c.MinSamples)
	case !(c.Percentile > 0 && c.Percentile < 1):
		return c, fmt.Errorf("percentile: must be in (0, 1), got %g", c.Percentile)
	case !(c.Tolerance >= 1 && c.Tolerance <= 100):
		return c, fmt.Errorf("tolerance: must be in [1, 100], got %g", c.Tolerance)
	case !(c.Smoothing > 0 && c.Smoothing <= 1):
		return c, fmt.Errorf("smoothing: must be in (0, 1], got %g", c.Smoothing)
	case c.Epoch < 4 || c.Epoch > 1<<20:
		return c, fmt.Errorf("epoch: must be in [4, %d] windows, got %d", 1<<20, c.Epoch)
	}
	return c, nil
}

// AdaptiveState is one adaptive limit's state. Make it with
// AdaptiveConfig.NewState; the zero value is not ready.
type AdaptiveState struct {
	// Limit is the current limit, fractional so that smoothed growth
	// accumulates; requests are admitted against its floor.
	Limit float64
	// InFlight is the number of admitted requests not yet ended.
	InFlight int64
	// Baseline is the round trip of an upstream that is not queueing, in
	// µs; 0 until the first window closes.
	Baseline int64
	// Recent is the last closed window's Percentile round trip, in µs.
	Recent int64
	// Gradient is the last closed window's gradient (1 for a window of
	// drops, which is cut by adaptiveDecrease instead).
	Gradient float64
	// Windows counts the windows that closed.
	Windows int64

	start   int64               // start of the current window, µs
	samples int64               // OK and Drop ends in the window
	drops   int64               // Drop ends in the window
	peak    int64               // most requests in flight during the window
	epochLo int64               // least baseline candidate in the current epoch; 0 none
	left    int64               // windows left in the current epoch
	probe   bool                // the current window is a probe
	probeAt int64               // what a probe window admits
	slow    bool                // slow start: the limit doubles a window until a queue shows
	npool   int                 // windows in pooled
	poolN   int64               // their samples
	pooled  [adaptivePool]int64 // recents of the windows pooled for a candidate
	rng     uint64              // xorshift state of the epoch jitter
	hist    [rttBuckets]uint32
}

// NewState returns a fresh state at now; seed sets the epoch jitter (give
// each instance its own, so that instances do not re-measure in step).
func (c *AdaptiveConfig) NewState(now int64, seed uint64) AdaptiveState {
	// The first epoch is short (a window of slow start that doubled
	// counts in none): the baseline of its few windows is the least
	// trusted (an initial limit above the upstream's capacity learnt a
	// queue as service time).
	return AdaptiveState{Limit: float64(c.Initial), Gradient: 1, start: now, rng: seed | 1, left: adaptiveReprobe, slow: true}
}

// Read returns the number of requests admitted in flight now: the limit,
// or during a probe window half of it (or of what the window before used,
// if that was less than half; at least Floor), which lets an upstream's
// queue drain so that its unqueued round trip shows.
func (c *AdaptiveConfig) Read(s *AdaptiveState) int64 {
	l := int64(s.Limit)
	if s.probe {
		l = s.probeAt
	}
	return l
}

// Admit admits a request if fewer than Read(s) are in flight, and counts it.
func (c *AdaptiveConfig) Admit(s *AdaptiveState) bool {
	if s.InFlight >= c.Read(s) {
		return false
	}
	s.InFlight++
	s.peak = max(s.peak, s.InFlight)
	return true
}

// AdmitOver counts a request admitted whatever the limit: a dry run lets
// every request through and reports what it would shed, and the
// controller goes on learning from the upstream as it is loaded.
func (c *AdaptiveConfig) AdmitOver(s *AdaptiveState) {
	s.InFlight++
	s.peak = max(s.peak, s.InFlight)
}

// End records the end at now of a request Admit admitted, after rtt µs.
// A Cancelled request only frees its slot.
func (c *AdaptiveConfig) End(s *AdaptiveState, now, rtt int64, o Outcome) {
	if s.InFlight > 0 {
		s.InFlight--
	}
	if o == Cancelled {
		return
	}
	if s.probe && now-rtt < s.start {
		// A probe learns only from the requests it admitted: one sent
		// before it waited in the queue the probe is there to drain
		// (Envoy's minimum round trip was skewed this way).
		return
	}
	s.samples++
	if o == Drop {
		s.drops++
	} else {
		s.hist[rttBucket(rtt)]++
	}
	// A clock that ran backwards (now before the window opened) only
	// delays the window's close.
	elapsed := now - s.start
	if elapsed < c.Window {
		return
	}
	if s.samples < c.MinSamples {
		if elapsed >= adaptiveStale*c.Window {
			c.restart(s, now)
			if s.probe {
				// Too little traffic to probe: the probe ends
				// without teaching, and admits the limit again.
				s.probe, s.epochLo, s.left = false, 0, c.epochLength(s)
			}
		}
		return
	}
	c.close(s)
	c.restart(s, now)
}

// restart opens a new window at now.
func (c *AdaptiveConfig) restart(s *AdaptiveState, now int64) {
	s.start, s.samples, s.drops, s.peak = now, 0, 0, s.InFlight
	clear(s.hist[:])
}

// close learns from a window of enough samples.
func (c *AdaptiveConfig) close(s *AdaptiveState) {
	s.Windows++
	wasProbe := s.probe
	s.probe = false
	oks := s.samples - s.drops
	lo := s.epochLo
	if oks > 0 {
		s.Recent = c.percentile(s, oks)
		// The baseline falls at once to a lower candidate; it rises only
		// at the end of an epoch (below). In slow start a window's recent
		// is a candidate (its few windows have to learn fast); past it,
		// the median recent of windows pooled up to adaptivePoolSamples.
		// A probe of fewer samples is a candidate only if it found a
		// queue (below the epoch's by more than the tolerance), not for
		// a p90 low by chance.
		cand := s.Recent
		switch {
		case wasProbe:
			if oks < adaptivePoolSamples && s.epochLo > 0 && c.Tolerance*float64(s.Recent) >= float64(s.epochLo) {
				cand = 0
			}
		case !s.slow:
			cand = s.pool(s.Recent, oks)
		}
		if s.Baseline == 0 {
			s.Baseline = s.Recent // the first window's, whatever else
		}
		if cand > 0 {
			if cand < s.Baseline {
				s.Baseline = cand
			}
			if s.epochLo == 0 || cand < s.epochLo {
				s.epochLo = cand
			}
		}
	}
	limit := s.Limit
	doubled := false
	switch {
	case float64(s.drops) > adaptiveDropShare*float64(s.samples):
		s.Gradient = 1
		s.slow = false
		limit *= adaptiveDecrease
	case wasProbe || oks == 0:
		// A probe admitted less than the limit: its latency is the
		// baseline's, not the limit's.
	default:
		g := min(max(c.Tolerance*float64(s.Baseline)/float64(s.Recent), adaptiveMinGradient), 1)
		if g < 1 && limit*(1-float64(s.Baseline)/float64(s.Recent)) < 1 {
			g = 1
		}
		s.Gradient = g
		if s.slow {
			if g < 1 {
				s.slow = false
				limit *= g
			} else if 2*s.peak >= int64(limit) {
				limit *= 2
				doubled = true
			}
			break
		}
		if g < 1 {
			limit *= 1 - adaptiveCut*(1-g)
		} else if 2*s.peak >= int64(limit) {
			// Growth only when the window used at least half the
			// limit: an app-limited window says nothing of more. The
			// step is the queue allowance, sqrt(limit); while recent
			// stays within half the tolerance of the baseline (no
			// queue at all) it is half the limit, so that a limit far
			// below a large upstream's capacity gets there in tens of
			// windows, not hundreds.
			step := math.Sqrt(limit)
			if float64(s.Recent) <= float64(s.Baseline)*(1+(c.Tolerance-1)/2) {
				step = max(step, limit/2)
			}
			limit += c.Smoothing * step
		}
	}
	s.Limit = min(max(limit, float64(c.Floor)), float64(c.Ceiling))

	if wasProbe {
		c.newEpoch(s)
		// A probe that answered faster than the epoch by more than the
		// tolerance found a queue the baseline had learnt as service
		// time (a limit that started above the upstream's capacity, or
		// rose past it). Probe again soon: a probe at half a limit more
		// than twice the capacity still queues, and each halves it.
		if oks > 0 && c.Tolerance*float64(s.Recent) < float64(lo) {
			s.left = adaptiveReprobe
		}
		return
	}
	if doubled {
		// A window that doubled the limit counts in no epoch: slow
		// start's windows run at or under the capacity, and a probe
		// would only delay it. One that could not (the traffic used
		// less than half the limit) does: a limit set above what the
		// clients send, with all of them queued, is probed.
		return
	}
	s.left--
	if s.left > 0 {
		return
	}
	// The epoch ended: the next window is a probe at half the limit,
	// and the baseline becomes the least candidate of the epoch and the
	// probe. An upstream that was queueing all epoch drains in the probe
	// and shows its service time; one that is slower for good (a deploy)
	// stays slow, and the baseline follows it. Without the probe, a
	// limit that starts or stays above the upstream's capacity would
	// learn the queue as service time and never see it.
	s.probe = true
	// Half the limit; or, when the window used less than half of it (a
	// limit above what the clients send), half of what it used: half
	// the limit would admit them all and drain nothing.
	used := s.Limit
	if 2*s.peak < int64(s.Limit) {
		used = float64(s.peak)
	}
	s.probeAt = max(int64(used*adaptiveProbe), c.Floor)
}

// pool adds a window's recent of n samples to the pool, and returns the
// median recent of the pooled windows once they hold adaptivePoolSamples
// samples or adaptivePool windows (emptying the pool), else 0.
func (s *AdaptiveState) pool(recent, n int64) int64 {
	s.pooled[s.npool] = recent
	s.npool++
	s.poolN += n
	if s.poolN < adaptivePoolSamples && s.npool < adaptivePool {
		return 0
	}
	p := s.pooled[:s.npool]
	slices.Sort(p)
	m := p[len(p)/2]
	s.npool, s.poolN = 0, 0
	return m
}

// newEpoch sets the baseline to the epoch's least candidate and starts the
// next epoch.
func (c *AdaptiveConfig) newEpoch(s *AdaptiveState) {
	if s.epochLo > 0 {
		s.Baseline = s.epochLo
	}
	s.epochLo = 0
	s.left = c.epochLength(s)
}

// epochLength returns Epoch windows, give or take a quarter at random.
func (c *AdaptiveConfig) epochLength(s *AdaptiveState) int64 {
	s.rng ^= s.rng << 13
	s.rng ^= s.rng >> 7
	s.rng ^= s.rng << 17
	q := c.Epoch / 4
	return c.Epoch - q + int64(s.rng%uint64(2*q+1))
}

// percentile returns the window's Percentile round trip of n samples: the
// midpoint of the bucket that holds it.
func (c *AdaptiveConfig) percentile(s *AdaptiveState, n int64) int64 {
	rank := int64(math.Ceil(c.Percentile * float64(n)))
	var seen int64
	for i, k := range s.hist {
		seen += int64(k)
		if seen >= rank {
			return bucketMid(i)
		}
	}
	return bucketMid(len(s.hist) - 1)
}

// rttBucket returns the histogram bucket of a round trip: itself below 16
// µs, else 8 buckets per power of two.
func rttBucket(rtt int64) int {
	v := uint64(min(max(rtt, 1), maxRTT))
	e := bits.Len64(v) - 1
	if e < 4 {
		return int(v)
	}
	k := e - 3
	return k*8 + int(v>>k)
}

// bucketMid returns the middle of bucket i's round trips.
func bucketMid(i int) int64 {
	if i < 16 {
		return int64(i)
	}
	k := i/8 - 1
	lo := int64(i%8+8) << k
	return lo + (int64(1)<<k)/2
}
