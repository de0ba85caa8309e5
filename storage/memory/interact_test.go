package memory

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestInteract runs seeded random sequences of operations against the
// memory stores of one handler's zones, one of every rate algorithm, a
// concurrency limit and a ban guarding one of the rates, on a fake clock:
// requests through TakeAll over random sets of zones with random costs
// (some of them dry runs), requests ending (a concurrency slot given back,
// and sometimes the rates' charges too, as a client leaving or a response
// that does not count), replies seeded into the stores as into a local
// copy (late, out of order, twice), resets of a key (an admin API reset or
// unban) and sweeps. After every step it checks each key's admitted cost
// against the definitions: B + r*T over any span for the bucket family, N
// per aligned window (and the weighted count) for the windows, N events
// in any W for sliding_log, at most n in flight, nothing admitted while a
// ban holds. What a reset forgets starts afresh; what is given back no
// longer counts.
//
// A failure prints the seed, the limits and the shortest sequence found
// that still fails. It runs a few seconds by default;
// TOLLGATE_INTERACT_SECONDS sets the budget and TOLLGATE_INTERACT_SEED
// replays one seed.
func TestInteract(t *testing.T) {
	budget := 3 * time.Second
	if testing.Short() {
		budget = time.Second
	}
	if v := os.Getenv("TOLLGATE_INTERACT_SECONDS"); v != "" {
		s, err := strconv.ParseFloat(v, 64)
		if err != nil || s <= 0 {
			t.Fatalf("TOLLGATE_INTERACT_SECONDS=%q: want a number of seconds", v)
		}
		budget = time.Duration(s * float64(time.Second))
	}
	first, last := uint64(1), uint64(1<<62)
	if v := os.Getenv("TOLLGATE_INTERACT_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TOLLGATE_INTERACT_SEED=%q: want a number", v)
		}
		first, last = s, s
	}
	start := time.Now()
	runs, steps := 0, 0
	for seed := first; seed <= last; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x7011))
		cfg := randConfig(t, rng)
		ops := randOps(rng, cfg, 50+rng.IntN(250))
		if f := replayOps(cfg, ops); f != nil {
			ops, f = shrinkOps(cfg, ops, f)
			t.Fatalf("seed %d (replay with TOLLGATE_INTERACT_SEED=%d): %s\n%s\nshortest failing sequence (%d steps):\n%s",
				seed, seed, f.msg, cfg, len(ops), formatOps(cfg, ops, f.step))
		}
		runs++
		steps += len(ops)
		if time.Since(start) > budget {
			break
		}
	}
	t.Logf("%d sequences, %d steps, in %s", runs, steps, time.Since(start).Round(time.Millisecond))
}

// The zones of a configuration: one store per rate algorithm, then the
// concurrency limit, then the ban, which guards rates[banned].
const (
	numRates = 6
	concPart = numRates
	banPart  = numRates + 1
	numZones = numRates + 2
)

type interactConfig struct {
	limits [numZones]algorithms.Limit
	banned int // the rate zone the ban guards
	keys   int
}

func (c interactConfig) String() string {
	var b strings.Builder
	for i, l := range c.limits {
		fmt.Fprintf(&b, "zone %d: %s", i, l.Kind)
		switch {
		case i == concPart:
			fmt.Fprintf(&b, " %d in flight\n", l.Events)
		case i == banPart:
			fmt.Fprintf(&b, " after %d in %dµs for %dµs, guarding zone %d\n", l.Events, l.Window, l.Hold, c.banned)
		default:
			fmt.Fprintf(&b, " %d per %dµs, burst %d, max_delay %dµs\n", l.Events, l.Window, l.Burst, l.MaxDelay)
		}
	}
	fmt.Fprintf(&b, "%d keys", c.keys)
	return b.String()
}

func randConfig(t *testing.T, rng *rand.Rand) interactConfig {
	t.Helper()
	windows := []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second, 7 * time.Second}
	kinds := [numRates]algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.SlidingLog, algorithms.FixedWindow, algorithms.LeakyBucket}
	var c interactConfig
	for i, k := range kinds {
		n := 1 + rng.Int64N(4)
		w := windows[rng.IntN(len(windows))]
		var burst int64
		var delay time.Duration
		if k == algorithms.TokenBucket || k == algorithms.GCRA || k == algorithms.LeakyBucket {
			if rng.IntN(2) == 0 {
				burst = 1 + rng.Int64N(2*n)
			}
		}
		if k == algorithms.LeakyBucket && rng.IntN(2) == 0 {
			delay = time.Duration(1+rng.Int64N(int64(w))) / 2
		}
		l, err := algorithms.NewLimit(k, n, w, burst, delay)
		if err != nil {
			t.Fatal(err)
		}
		c.limits[i] = l
	}
	var err error
	if c.limits[concPart], err = algorithms.NewConcurrency(1+rng.Int64N(3), time.Second); err != nil {
		t.Fatal(err)
	}
	if c.limits[banPart], err = algorithms.NewBan(1+rng.Int64N(3), windows[rng.IntN(len(windows))], windows[rng.IntN(len(windows))]); err != nil {
		t.Fatal(err)
	}
	c.banned = rng.IntN(numRates)
	c.keys = 1 + rng.IntN(3)
	return c
}

type opKind uint8

const (
	opRequest opKind = iota // a request through TakeAll
	opEnd                   // a request ends: its slot, and maybe its charges, given back
	opSeed                  // a decision made before is seeded again (a late reply)
	opReset                 // a key is reset in a rate zone or the ban
	opSweep                 // every store sweeps
)

// interactOp is one step. Everything it needs is drawn when it is made;
// picks count back from the latest request or decision, modulo what the
// world holds when the step runs, so that a sequence with steps removed
// still runs, and mostly does what it did.
type interactOp struct {
	kind     opKind
	dt       int64 // µs the clock moves before the step
	key      int
	rates    uint8 // the rate zones a request applies to
	conc     bool  // the request takes a concurrency slot
	ban      bool  // the request goes through the ban (always with the guarded zone)
	dry      uint8 // rate zones that are dry runs
	cost     [numRates]int64
	giveBack bool // opEnd: give back the rates' charges too
	pick     int  // opEnd, opSeed: which one, from the latest; opReset: which zone (banPart: the ban)
}

func randOps(rng *rand.Rand, c interactConfig, n int) []interactOp {
	ops := make([]interactOp, n)
	for i := range ops {
		op := &ops[i]
		switch r := rng.IntN(10); {
		case r < 3:
		case r < 7:
			op.dt = rng.Int64N(20_000)
		case r < 9:
			op.dt = rng.Int64N(1_000_000)
		default:
			op.dt = rng.Int64N(10_000_000)
		}
		op.key = rng.IntN(c.keys)
		op.pick = rng.IntN(16) // counted from the latest: removing older steps keeps it
		switch r := rng.IntN(20); {
		case r < 12:
			op.kind = opRequest
			op.rates = uint8(rng.IntN(1 << numRates))
			op.conc = rng.IntN(3) == 0
			op.ban = op.rates&(1<<c.banned) != 0 || rng.IntN(6) == 0
			if rng.IntN(6) == 0 {
				op.dry = uint8(rng.IntN(1 << numRates))
			}
			for z := range op.cost {
				capacity := c.limits[z].Capacity()
				switch r := rng.IntN(10); {
				case r < 5:
					op.cost[z] = algorithms.Milli
				case r < 9:
					op.cost[z] = rng.Int64N(capacity + 1)
				default:
					op.cost[z] = capacity + 1 + rng.Int64N(algorithms.Milli)
				}
			}
		case r < 16:
			op.kind = opEnd
			op.giveBack = rng.IntN(2) == 0
		case r < 18:
			op.kind = opSeed
		case r < 19:
			op.kind = opReset
			op.pick = rng.IntN(numRates + 1)
			if op.pick == numRates {
				op.pick = banPart
			}
		default:
			op.kind = opSweep
		}
	}
	return ops
}

// charge is an admitted request's charge in one zone.
type charge struct {
	id        int
	at, cost  int64
	release   int64 // at + the request's delay (leaky_bucket shaping)
	delayed   bool
	givenBack bool
}

// pendingReq is an admitted request that has not ended.
type pendingReq struct {
	id      int
	key     string
	zones   []int
	costs   []int64
	ds      []algorithms.Decision
	charged []bool
	resets  []int // each zone's reset count for the key when charged
}

// seedRec is a decision a store made, to seed again.
type seedRec struct {
	zone    int
	key     string
	d       algorithms.Decision
	cost    int64
	charged bool
}

// world is the stores and what the test knows was admitted.
type world struct {
	cfg      interactConfig
	stores   [numZones]*Store
	now      int64
	nextID   int
	ledger   [numRates]map[string][]charge
	inFlight map[string]map[int]bool
	bans     map[string][][2]int64 // [start, end) of every ban seen
	pending  []pendingReq
	seeds    []seedRec
	resets   [numZones]map[string]int // resets of each zone's keys
	log      []string                 // what each step did, when logging
	logging  bool
}

func (w *world) logf(format string, args ...any) {
	if w.logging {
		w.log[len(w.log)-1] += fmt.Sprintf(format, args...)
	}
}

type failure struct {
	step int
	msg  string
}

func newWorld(c interactConfig) *world {
	w := &world{cfg: c, now: 1_700_000_000 * sec, inFlight: map[string]map[int]bool{}, bans: map[string][][2]int64{}}
	for i := range w.stores {
		w.stores[i] = New(storage.Zone{Name: "z" + strconv.Itoa(i), Limit: c.limits[i]})
	}
	for i := range w.ledger {
		w.ledger[i] = map[string][]charge{}
	}
	for i := range w.resets {
		w.resets[i] = map[string]int{}
	}
	return w
}

// replayOps runs ops on a fresh world and returns the first failure.
func replayOps(c interactConfig, ops []interactOp) *failure {
	_, f := replayLogged(c, ops, false)
	return f
}

// replayLogged runs ops on a fresh world, and with logging returns what
// each step did.
func replayLogged(c interactConfig, ops []interactOp, logging bool) ([]string, *failure) {
	w := newWorld(c)
	w.logging = logging
	for i, op := range ops {
		if logging {
			w.log = append(w.log, "")
		}
		if msg := w.step(op); msg != "" {
			return w.log, &failure{i, msg}
		}
	}
	return w.log, nil
}

func (w *world) step(op interactOp) string {
	w.now += op.dt
	key := "k" + strconv.Itoa(op.key)
	ctx := context.Background()
	switch op.kind {
	case opRequest:
		return w.request(op, key)
	case opEnd:
		if len(w.pending) == 0 {
			return ""
		}
		i := len(w.pending) - 1 - op.pick%len(w.pending)
		p := w.pending[i]
		w.pending = append(w.pending[:i], w.pending[i+1:]...)
		w.logf("end request #%d (%s, zones %v)", p.id, p.key, p.zones)
		for j, z := range p.zones {
			switch {
			case z == concPart:
				w.stores[z].Undo(ctx, p.key, w.now, algorithms.Milli, p.ds[j])
				delete(w.inFlight[p.key], p.id)
			case z < numRates && op.giveBack && p.charged[j] && p.resets[j] != w.resets[z][p.key]:
				// A charge made before the key was reset: the reset
				// forgot it (and the ledger with it), so its give-back
				// must take nothing from what the key was charged since.
				w.stores[z].Undo(ctx, p.key, w.now, p.costs[j], p.ds[j])
				w.logf("; zone %d reset since: nothing to give back", z)
			case z < numRates && op.giveBack && p.charged[j]:
				w.stores[z].Undo(ctx, p.key, w.now, p.costs[j], p.ds[j])
				ch := w.ledger[z][p.key]
				for k := range ch {
					if ch[k].id == p.id {
						ch[k].givenBack = true
					}
				}
			}
		}
	case opSeed:
		if len(w.seeds) == 0 {
			return ""
		}
		s := w.seeds[len(w.seeds)-1-op.pick%len(w.seeds)]
		w.stores[s.zone].Seed(s.key, s.d, s.cost, s.charged)
		w.logf("seed zone %d, %s from %+v, cost %d, charged %v", s.zone, s.key, s.d, s.cost, s.charged)
	case opReset:
		w.stores[op.pick].Reset(ctx, key, w.now)
		w.resets[op.pick][key]++
		if op.pick == banPart {
			delete(w.bans, key)
		} else {
			delete(w.ledger[op.pick], key)
		}
	case opSweep:
		for _, s := range w.stores {
			s.Sweep(w.now)
		}
	}
	return ""
}

func (w *world) request(op interactOp, key string) string {
	var reqs []Request
	var zones []int
	if op.ban {
		reqs = append(reqs, Request{Store: w.stores[banPart], Key: key})
		zones = append(zones, banPart)
	}
	for z := range numRates {
		if op.rates&(1<<z) == 0 {
			continue
		}
		r := Request{Store: w.stores[z], Key: key, Cost: op.cost[z], DryRun: op.dry&(1<<z) != 0}
		if op.ban && z == w.cfg.banned {
			r.Strike = 1

		}
		reqs = append(reqs, r)
		zones = append(zones, z)
	}
	if op.conc {
		reqs = append(reqs, Request{Store: w.stores[concPart], Key: key, Cost: algorithms.Milli})
		zones = append(zones, concPart)
	}
	if len(reqs) == 0 {
		return ""
	}
	ds := make([]algorithms.Decision, len(reqs))
	rejected := TakeAll(w.now, reqs, ds)
	admitted := rejected < 0
	id := w.nextID
	w.nextID++
	w.logf("request #%d (%s): admitted %v;", id, key, admitted)
	for i, z := range zones {
		w.logf(" zone %d cost %d dry %v: %+v;", z, reqs[i].Cost, reqs[i].DryRun, ds[i])
	}
	p := pendingReq{id: id, key: key, zones: zones, ds: ds, costs: make([]int64, len(reqs)), charged: make([]bool, len(reqs)), resets: make([]int, len(reqs))}
	for i, z := range zones {
		p.costs[i] = reqs[i].Cost
		p.resets[i] = w.resets[z][key]
		d := ds[i]
		if storage.Skipped(d) {
			continue
		}
		switch {
		case z == banPart:
			if !d.Allowed {
				w.bans[key] = append(w.bans[key], [2]int64{d.At, d.At + d.Reset})
			}
			w.seeds = append(w.seeds, seedRec{z, key, d, 0, false})
		case z == concPart:
			if admitted && d.Allowed {
				if w.inFlight[key] == nil {
					w.inFlight[key] = map[int]bool{}
				}
				w.inFlight[key][id] = true
				if n := int64(len(w.inFlight[key])); n > w.cfg.limits[z].Events {
					return fmt.Sprintf("key %s: %d requests in flight, concurrency %d", key, n, w.cfg.limits[z].Events)
				}
			}
		default:
			charged := admitted && d.Allowed
			p.charged[i] = charged
			w.seeds = append(w.seeds, seedRec{z, key, d, reqs[i].Cost, charged})
			if charged {
				w.ledger[z][key] = append(w.ledger[z][key], charge{id: id, at: d.At, cost: reqs[i].Cost, release: d.At + d.Delay, delayed: d.Delay > 0})
				if msg := w.check(z, key, d.At); msg != "" {
					return msg
				}
			}
		}
	}
	if admitted && op.ban {
		for _, b := range w.bans[key] {
			if b[0] <= w.now && w.now < b[1] {
				return fmt.Sprintf("key %s admitted at %d through the ban, which holds from %d to %d", key, w.now, b[0], b[1])
			}
		}
	}
	if admitted {
		w.pending = append(w.pending, p)
	}
	return ""
}

// check checks zone z's admissions of key against its definition, after
// one at now.
func (w *world) check(z int, key string, now int64) string {
	l := w.cfg.limits[z]
	var cs []charge
	for _, c := range w.ledger[z][key] {
		if !c.givenBack {
			cs = append(cs, c)
		}
	}
	limit := l.Events * algorithms.Milli
	switch l.Kind {
	case algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket:
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].release < cs[j].release })
		sum := make([]int64, len(cs)+1)
		for i, c := range cs {
			sum[i+1] = sum[i] + c.cost
		}
		for i := range cs {
			for j := i; j < len(cs); j++ {
				span := cs[j].release - cs[i].release
				if l.Scale > 1 && cs[i].delayed {
					span++
				}
				cost := sum[j+1] - sum[i]
				// cost*W <= (B*W + N*span)*Milli, in 128 bits.
				h1, l1 := bits.Mul64(uint64(cost), uint64(l.Window))
				h2, l2 := bits.Mul64(uint64(l.Burst*l.Window+l.Events*span), algorithms.Milli)
				if h1 > h2 || h1 == h2 && l1 > l2 {
					return fmt.Sprintf("zone %d (%s), key %s: %d milli admitted from %d to %d (%dµs), more than B + r*T", z, l.Kind, key, cost, cs[i].release, cs[j].release, span)
				}
			}
		}
	case algorithms.FixedWindow, algorithms.SlidingWindow:
		start := now - now%l.Window
		var cur, prev int64
		for _, c := range cs {
			switch c.at - c.at%l.Window {
			case start:
				cur += c.cost
			case start - l.Window:
				prev += c.cost
			}
		}
		if cur > limit {
			return fmt.Sprintf("zone %d (%s), key %s: %d milli admitted in the window from %d, limit %d", z, l.Kind, key, cur, start, limit)
		}
		e := now - start
		if l.Kind == algorithms.SlidingWindow {
			h1, l1 := bits.Mul64(uint64(prev), uint64(l.Window-e))
			h2, l2 := bits.Mul64(uint64(limit-cur), uint64(l.Window))
			if h1 > h2 || h1 == h2 && l1 > l2 {
				return fmt.Sprintf("zone %d (%s), key %s: at %d, the previous window's %d milli * %d/%d + %d is over %d", z, l.Kind, key, now, prev, l.Window-e, l.Window, cur, limit)
			}
		}
	case algorithms.SlidingLog:
		var n int64
		for _, c := range cs {
			if c.at > now-l.Window && c.at <= now {
				n += (c.cost + algorithms.Milli - 1) / algorithms.Milli
			}
		}
		if n > l.Events {
			return fmt.Sprintf("zone %d (%s), key %s: %d events admitted in (%d, %d], limit %d", z, l.Kind, key, n, now-l.Window, now, l.Events)
		}
	}
	return ""
}

// shrinkOps returns a shorter sequence that still fails, and its
// failure: chunks of steps are removed while the rest still fails.
func shrinkOps(c interactConfig, ops []interactOp, f *failure) ([]interactOp, *failure) {
	ops = ops[:f.step+1]
	for chunk := len(ops) / 2; chunk >= 1; {
		removed := false
		for i := 0; i+chunk <= len(ops); {
			try := append(append([]interactOp(nil), ops[:i]...), ops[i+chunk:]...)
			if g := replayOps(c, try); g != nil {
				ops, f = try[:g.step+1], g
				removed = true
				continue
			}
			i += chunk
		}
		if !removed {
			chunk /= 2
		}
	}
	// Then each request's parts: fewer zones, no slot, no dry runs.
	for i := range ops {
		if ops[i].kind != opRequest {
			continue
		}
		for _, simpler := range []func(op *interactOp) bool{
			func(op *interactOp) bool { r := op.dry != 0; op.dry = 0; return r },
			func(op *interactOp) bool { r := op.conc; op.conc = false; return r },
			func(op *interactOp) bool { r := op.ban && op.rates&(1<<c.banned) == 0; op.ban = op.ban && !r; return r },
		} {
			try := append([]interactOp(nil), ops...)
			if simpler(&try[i]) {
				if g := replayOps(c, try); g != nil {
					ops, f = try[:g.step+1], g
				}
			}
		}
		for z := range numRates {
			if i >= len(ops) || ops[i].rates&(1<<z) == 0 {
				continue
			}
			try := append([]interactOp(nil), ops...)
			try[i].rates &^= 1 << z
			if z == c.banned {
				try[i].ban = false
			}
			if g := replayOps(c, try); g != nil {
				ops, f = try[:g.step+1], g
			}
		}
	}
	return ops, f
}

func formatOps(c interactConfig, ops []interactOp, failed int) string {
	log, _ := replayLogged(c, ops, true)
	var b strings.Builder
	var t int64
	for i, op := range ops {
		t += op.dt
		fmt.Fprintf(&b, "%3d +%dµs (t=%dµs) ", i, op.dt, t)
		switch op.kind {
		case opEnd:
			fmt.Fprintf(&b, "giveBack=%v ", op.giveBack)
		case opReset:
			fmt.Fprintf(&b, "reset zone %d, k%d", op.pick, op.key)
		case opSweep:
			b.WriteString("sweep")
		}
		if i < len(log) {
			b.WriteString(log[i])
		}
		if i == failed {
			b.WriteString("   <- fails")
		}
		b.WriteByte('\n')
	}
	return b.String()
}
