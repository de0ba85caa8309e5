package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// The TakeAll tests run requests through TakeAll on a real Redis and
// through refTakeAll, the contract's rule written with the Go algorithms:
// check every zone on a copy of its state; if every zone that is not a dry
// run admits, take in every admitting zone; otherwise charge nothing.

// refZone is one zone in both stores: the Go states per key, and the Redis
// zone.
type refZone struct {
	name   string
	l      algorithms.Limit
	states map[string]*algorithms.State
	zl     storage.Limiter
}

func newRefZone(s *Store, name string, l algorithms.Limit) *refZone {
	return &refZone{name: name, l: l, states: map[string]*algorithms.State{}, zl: zoneOf(s, name, l)}
}

func (z *refZone) state(key string) *algorithms.State {
	st, ok := z.states[key]
	if !ok {
		s := algorithms.NewState(&z.l)
		st = &s
		z.states[key] = st
	}
	return st
}

// refReq is one zone's part of a request.
type refReq struct {
	z    *refZone
	key  string
	cost int64
	dry  bool
}

func (r refReq) String() string {
	dry := ""
	if r.dry {
		dry = " dry"
	}
	return fmt.Sprintf("%s/%s cost=%d%s", r.z.name, r.key, r.cost, dry)
}

func requests(rs []refReq) []Request {
	out := make([]Request, len(rs))
	for i, r := range rs {
		out[i] = Request{Zone: r.z.zl, Key: r.key, Cost: r.cost, DryRun: r.dry}
	}
	return out
}

// refTakeAll decides rs at now with the Go algorithms. One request is
// decided by Take, as TakeAll promises; a rejecting Take brings the state
// up to date with now (which matters only to a clock that later runs
// backwards), where a rejected request of several zones writes nothing.
func refTakeAll(rs []refReq, now int64) ([]algorithms.Decision, int) {
	if len(rs) == 1 {
		r := rs[0]
		d := r.z.l.Take(r.z.state(r.key), now, r.cost)
		if !d.Allowed && !r.dry {
			return []algorithms.Decision{d}, 0
		}
		return []algorithms.Decision{d}, -1
	}
	ds := make([]algorithms.Decision, len(rs))
	rejected := -1
	for i, r := range rs {
		c := copyState(*r.z.state(r.key))
		ds[i] = r.z.l.Peek(&c, now, r.cost)
		if !ds[i].Allowed && !r.dry && rejected < 0 {
			rejected = i
		}
	}
	if rejected >= 0 {
		return ds, rejected
	}
	for i, r := range rs {
		if ds[i].Allowed {
			ds[i] = r.z.l.Take(r.z.state(r.key), now, r.cost)
		}
	}
	return ds, -1
}

// checkTakeAll runs rs through TakeAll and refTakeAll and reports where
// they differ.
func checkTakeAll(t *testing.T, s *Store, label string, rs []refReq, now int64) ([]algorithms.Decision, int) {
	t.Helper()
	want, wantRej := refTakeAll(rs, now)
	got, gotRej, err := s.TakeAll(context.Background(), now, requests(rs))
	if err != nil {
		t.Fatalf("%s: TakeAll(now=%d, %v): %v", label, now, rs, err)
	}
	if gotRej != wantRej || len(got) != len(want) {
		t.Fatalf("%s: TakeAll(now=%d, %v) = %+v, rejected %d; want %+v, rejected %d (Go)", label, now, rs, got, gotRej, want, wantRej)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: TakeAll(now=%d, %v): zone %d (%v) = %+v, want %+v (Go)", label, now, rs, i, rs[i], got[i], want[i])
		}
	}
	return got, gotRej
}

// TestTakeAllTable steps through a fixed time grid: a tight and a loose
// zone on one key, a zone on another key, a dry run, costs above the
// capacity, and a request that a zone rejects, which must charge nothing
// anywhere.
func TestTakeAllTable(t *testing.T) {
	srv := redistest.Start(t)
	for _, g := range []grouping{oneServer, byTag} {
		t.Run(fmt.Sprintf("grouping=%d", g), func(t *testing.T) {
			s := newTestStore(srv.Client())
			s.group = g
			p := fmt.Sprintf("table%d-", g)
			tight := newRefZone(s, p+"tight", mustLimit(t, algorithms.TokenBucket, 2, time.Second, 0, 0))
			loose := newRefZone(s, p+"loose", mustLimit(t, algorithms.FixedWindow, 5, time.Second, 0, 0))
			log := newRefZone(s, p+"log", mustLimit(t, algorithms.SlidingLog, 3, time.Second, 0, 0))
			dry := newRefZone(s, p+"dry", mustLimit(t, algorithms.GCRA, 1, time.Second, 0, 0))
			shape := newRefZone(s, p+"shape", mustLimit(t, algorithms.LeakyBucket, 2, time.Second, 0, time.Second))
			both := func(cost int64) []refReq {
				return []refReq{{loose, "ip", cost, false}, {tight, "ip", cost, false}}
			}
			steps := []struct {
				now      int64
				reqs     []refReq
				rejected int // -1: admitted
			}{
				{epoch, both(1000), -1},
				{epoch, both(1000), -1},
				{epoch, both(1000), 1}, // tight is empty; loose must not be charged
				{epoch + 100*ms, both(1000), 1},
				{epoch + 500*ms, both(1000), -1}, // one event refilled
				{epoch + 500*ms, []refReq{{loose, "ip", 2000, false}}, -1},
				{epoch + 500*ms, both(0), -1},
				{epoch + 500*ms, both(1), 0}, // loose is full now, tight too
				{epoch + 500*ms, []refReq{{tight, "ip", 2001, false}, {loose, "other", 1000, false}}, 0}, // above capacity: Never
				{epoch + sec, []refReq{{log, "a", 1000, false}, {dry, "a", 1000, true}, {loose, "ip", 1000, false}}, -1},
				{epoch + sec, []refReq{{log, "a", 1000, false}, {dry, "a", 1000, true}, {loose, "ip", 1000, false}}, -1}, // dry rejects: not charged, no block
				{epoch + sec, []refReq{{dry, "b", 5000, true}, {log, "b", 3000, false}}, -1},                             // dry above capacity
				{epoch + sec, []refReq{{log, "b", 1000, false}, {log, "a", 1000, false}}, 0},
				{epoch + sec, []refReq{{log, "a", 1000, false}, {tight, "x", 1000, false}, {loose, "y", 1000, false}}, -1},
				{epoch + sec, []refReq{{shape, "s", 2000, false}, {tight, "s", 1000, false}}, -1},
				{epoch + sec, []refReq{{shape, "s", 1000, false}, {tight, "s", 1000, false}}, -1}, // delayed
				{epoch + sec, []refReq{{shape, "s", 2000, false}, {tight, "s", 1000, false}}, 0},  // over max_delay
				{epoch + sec, []refReq{{log, "s", 1000, false}, {tight, "s", 1000, false}, {shape, "s", 1000, false}}, 1},
				{epoch + 3*sec, []refReq{{tight, "s", 1000, false}, {shape, "s", 1000, false}, {log, "s", 1000, false}}, -1},
			}
			delayed := 0
			for i, st := range steps {
				ds, rej := checkTakeAll(t, s, fmt.Sprintf("step %d", i), st.reqs, st.now)
				if rej != st.rejected {
					t.Fatalf("step %d: TakeAll(now=%d, %v) rejected %d, want %d", i, st.now, st.reqs, rej, st.rejected)
				}
				for _, d := range ds {
					if d.Delay > 0 {
						delayed++
					}
				}
			}
			if delayed == 0 {
				t.Errorf("no step was delayed")
			}
		})
	}
}

// randomRequests returns 1 to 4 zones' parts of a request, with costs as
// randomSteps draws them, in random order.
func randomRequests(rng *rand.Rand, zones []*refZone, keys []string) []refReq {
	n := 1 + rng.IntN(min(4, len(zones)))
	var rs []refReq
	for _, i := range rng.Perm(len(zones))[:n] {
		z := zones[i]
		capacity := z.l.Capacity()
		cost := randomCost(rng, capacity)
		rs = append(rs, refReq{z, keys[rng.IntN(len(keys))], cost, rng.IntN(5) == 0})
	}
	return rs
}

// randomZones returns a zone of each algorithm, twice, with random limits.
func randomZones(t *testing.T, rng *rand.Rand, s *Store, prefix string) []*refZone {
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 13 * time.Second}
	var zones []*refZone
	for i := 0; i < 2; i++ {
		for _, kind := range allKinds {
			window := windows[rng.IntN(len(windows))]
			events := 1 + rng.Int64N(min(8, window.Microseconds()))
			var burst int64
			var maxDelay time.Duration
			if (kind == algorithms.TokenBucket || kind == algorithms.GCRA || kind == algorithms.LeakyBucket) && rng.IntN(2) == 0 {
				burst = 1 + rng.Int64N(2*events)
			}
			if kind == algorithms.LeakyBucket && rng.IntN(2) == 0 {
				maxDelay = time.Duration(rng.Int64N(int64(2 * window)))
			}
			name := fmt.Sprintf("%s%s-%d", prefix, kind, i)
			zones = append(zones, newRefZone(s, name, mustLimit(t, kind, events, window, burst, maxDelay)))
		}
	}
	return zones
}

// runRandomTakeAll runs n random requests over zones, with now walking
// forward (and, if backwards, sometimes back), an Undo or a Take of a
// single zone now and then, and wants TakeAll to decide as refTakeAll.
func runRandomTakeAll(t *testing.T, s *Store, rng *rand.Rand, zones []*refZone, keys []string, n int, backwards bool) (admitted, rejected int) {
	t.Helper()
	ctx := context.Background()
	now := epoch + rng.Int64N(sec)
	for i := 0; i < n; i++ {
		switch r := rng.IntN(100); {
		case r < 30:
		case r < 70:
			now += rng.Int64N(2 * ms)
		case r < 85:
			now += rng.Int64N(200 * ms)
		case r < 90 && backwards:
			now -= rng.Int64N(5 * ms)
		default:
			now += rng.Int64N(15 * sec)
		}
		label := fmt.Sprintf("step %d", i)
		switch r := rng.IntN(100); {
		case r < 4: // a zone's own Undo
			z := zones[rng.IntN(len(zones))]
			key, cost := keys[rng.IntN(len(keys))], rng.Int64N(2*algorithms.Milli)
			// A charge from some time ago (or not yet, on a clock that ran
			// backwards): what each twin gives back must agree.
			taken := algorithms.Decision{Allowed: true, At: now - rng.Int64N(3*sec), Reset: rng.Int64N(2 * sec)}
			z.l.Undo(z.state(key), now, cost, taken)
			if err := z.zl.Undo(ctx, key, now, cost, taken); err != nil {
				t.Fatalf("%s: Undo: %v", label, err)
			}
		case r < 8: // a zone's own Take
			z := zones[rng.IntN(len(zones))]
			key := keys[rng.IntN(len(keys))]
			want := z.l.Take(z.state(key), now, algorithms.Milli)
			got, err := z.zl.Take(ctx, key, now, algorithms.Milli)
			if err != nil || got != want {
				t.Fatalf("%s: %s Take(%s) = %+v, %v; want %+v", label, z.name, key, got, err, want)
			}
		default:
			if _, rej := checkTakeAll(t, s, label, randomRequests(rng, zones, keys), now); rej < 0 {
				admitted++
			} else {
				rejected++
			}
		}
	}
	return admitted, rejected
}

// TestTakeAllRandom mixes every algorithm in random requests: on one
// server, where one script decides each request, with a clock that also
// runs backwards; and split by hash tag, where each key is a group of its
// own and TakeAll gives back what earlier groups took.
func TestTakeAllRandom(t *testing.T) {
	n := 3000
	if testing.Short() {
		n = 500
	}
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name      string
		group     grouping
		backwards bool
		fcall     bool
	}{
		{"one_script", oneServer, true, false},
		{"by_tag", byTag, false, false},
		{"one_script_fcall", oneServer, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(srv.Client())
			if tc.fcall {
				withFunctions(t, s)
			}
			s.group = tc.group
			rng := rand.New(rand.NewPCG(7, uint64(tc.group)))
			zones := randomZones(t, rng, s, tc.name+"-")
			a, r := runRandomTakeAll(t, s, rng, zones, []string{"a", "b", "c"}, n, tc.backwards)
			t.Logf("%d requests admitted, %d rejected", a, r)
			if a < n/10 || r < n/10 {
				t.Errorf("admitted %d, rejected %d of %d: want plenty of both", a, r, n)
			}
		})
	}
}

// TestTakeAllSingle checks that TakeAll of one request decides as Take,
// dry run or not.
func TestTakeAllSingle(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(srv.Client())
	ctx := context.Background()
	for _, kind := range allKinds {
		t.Run(kind.String(), func(t *testing.T) {
			var maxDelay time.Duration
			if kind == algorithms.LeakyBucket {
				maxDelay = 300 * time.Millisecond
			}
			l := mustLimit(t, kind, 3, time.Second, 0, maxDelay)
			viaAll := zoneOf(s, "single-all-"+kind.String(), l)
			viaTake := zoneOf(s, "single-take-"+kind.String(), l)
			rng := rand.New(rand.NewPCG(uint64(kind), 3))
			for i, st := range randomSteps(rng, &l, 300, true) {
				if st.op != take {
					continue
				}
				dry := rng.IntN(3) == 0
				want, err := viaTake.Take(ctx, "k", st.now, st.cost)
				if err != nil {
					t.Fatalf("step %d: Take: %v", i, err)
				}
				ds, rej, err := s.TakeAll(ctx, st.now, []Request{{Zone: viaAll, Key: "k", Cost: st.cost, DryRun: dry}})
				if err != nil {
					t.Fatalf("step %d: TakeAll: %v", i, err)
				}
				wantRej := -1
				if !want.Allowed && !dry {
					wantRej = 0
				}
				if len(ds) != 1 || ds[0] != want || rej != wantRej {
					t.Fatalf("step %d: TakeAll(%v, dry=%v) = %+v, %d; want [%+v], %d (Take)", i, st, dry, ds, rej, want, wantRej)
				}
			}
		})
	}
}

func TestTakeAllErrors(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	other := New(srv.Client(), DefaultPrefix)
	ctx := context.Background()
	l := mustLimit(t, algorithms.TokenBucket, 2, time.Hour, 0, 0)
	a, b := zoneOf(s, "err-a", l), zoneOf(s, "err-b", l)
	if ds, rej, err := s.TakeAll(ctx, 0, nil); ds != nil || rej != -1 || err != nil {
		t.Errorf("TakeAll(no requests) = %v, %d, %v; want nil, -1, nil", ds, rej, err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		reqs []Request
		want error
	}{
		{"another store's zone", ctx, []Request{{Zone: a, Key: "k"}, {Zone: zoneOf(other, "err-c", l), Key: "k"}}, errForeignZone},
		{"another store's zone alone", ctx, []Request{{Zone: zoneOf(other, "err-c", l), Key: "k"}}, errForeignZone},
		{"a zone of another kind", ctx, []Request{{Zone: a, Key: "k"}, {Zone: fakeLimiter{}, Key: "k"}}, errForeignZone},
		{"a zone and key twice", ctx, []Request{{Zone: a, Key: "k"}, {Zone: b, Key: "k"}, {Zone: a, Key: "k"}}, errSameKey},
		{"canceled", canceled, []Request{{Zone: a, Key: "k"}, {Zone: b, Key: "k"}}, context.Canceled},
		{"canceled alone", canceled, []Request{{Zone: a, Key: "k"}}, context.Canceled},
	}
	for _, tt := range tests {
		ds, rej, err := s.TakeAll(tt.ctx, 0, tt.reqs)
		if !errors.Is(err, tt.want) || ds != nil || rej != -1 {
			t.Errorf("%s: TakeAll = %v, %d, %v; want nil, -1 and an error that is %v", tt.name, ds, rej, err, tt.want)
		}
	}
	// Nothing was charged.
	for _, z := range []storage.Limiter{a, b} {
		if _, ok, err := z.Peek(ctx, "k", 0); ok || err != nil {
			t.Errorf("Peek after failed TakeAlls: ok = %v, %v; want no key", ok, err)
		}
	}
}

// fakeLimiter is a storage.Limiter of no store.
type fakeLimiter struct{ storage.Limiter }

// TestTakeAllAtomic runs TakeAll from 32 goroutines on a loose zone and a
// tight one that key the same identity (one script per request; on a
// Cluster too, see TestTakeAllCluster).
func TestTakeAllAtomic(t *testing.T) {
	srv := redistest.Start(t)
	runAtomic(t, newTestStore(srv.Client()))
}

// runAtomic checks that the loose zone, one event larger than the tight
// one and checked first, never rejects, as it would if it were charged
// before the tight zone rejected and given back after, and that it ends
// up charged exactly as often as the tight zone admitted.
func runAtomic(t *testing.T, s *Store) {
	t.Helper()
	const tightN, goroutines, each = 60, 32, 8
	loose := zoneOf(s, "atomic-loose", mustLimit(t, algorithms.FixedWindow, tightN+1, time.Hour, 0, 0))
	tight := zoneOf(s, "atomic-tight", mustLimit(t, algorithms.TokenBucket, tightN, time.Hour, 0, 0))
	if a, b := slot(s.Key("atomic-loose", algorithms.FixedWindow, "203.0.113.7")), slot(s.Key("atomic-tight", algorithms.TokenBucket, "203.0.113.7")); a != b {
		t.Fatalf("the zones' keys are in slots %d and %d, want one", a, b)
	}
	now := epoch + 10*sec
	reqs := []Request{
		{Zone: loose, Key: "203.0.113.7", Cost: algorithms.Milli},
		{Zone: tight, Key: "203.0.113.7", Cost: algorithms.Milli},
	}
	var admitted, byLoose atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				ds, rej, err := s.TakeAll(context.Background(), now, reqs)
				if err != nil {
					failed.Store(err)
					return
				}
				switch {
				case rej < 0:
					admitted.Add(1)
				case rej == 0:
					byLoose.Add(1)
				case !ds[0].Allowed:
					failed.Store(fmt.Errorf("rejected by tight, but loose decided %+v", ds[0]))
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(err)
	}
	if got := admitted.Load(); got != tightN {
		t.Errorf("admitted %d of %d, want exactly %d", got, goroutines*each, tightN)
	}
	if got := byLoose.Load(); got != 0 {
		t.Errorf("the loose zone rejected %d requests, want 0 (it saw a charge a rejection took)", got)
	}
	d, ok, err := loose.Peek(context.Background(), "203.0.113.7", now)
	if err != nil || !ok || d.Remaining != 1 || !d.Allowed {
		t.Errorf("loose Peek = %+v, %v, %v; want 1 event left (charged %d times)", d, ok, err, tightN)
	}
}

// TestTakeAllCluster runs TakeAll on a 3-master Cluster: slot agrees with
// CLUSTER KEYSLOT, zones of one key share a slot and decide atomically,
// random requests over keys in different slots decide as refTakeAll,
// concurrent requests over two slots never over-admit and leave no charge
// when rejected, and a group that fails gives back what the groups before
// it took.
func TestTakeAllCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client()
	ctx := context.Background()

	t.Run("slots", func(t *testing.T) {
		s := New(cc, DefaultPrefix)
		keys := []string{"203.0.113.7", "", "{", "}", "}{", "{x}", "a:b", "#abc", "2001:db8::1", strconv.Itoa(1 << 40)}
		for _, key := range keys {
			var slots []int64
			for _, zone := range []string{"per_ip", "login", "a:b", "{z}", ""} {
				k := s.Key(zone, algorithms.TokenBucket, key)
				want, err := cc.ClusterKeySlot(ctx, k).Result()
				if err != nil {
					t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
				}
				if got := slot(k); int64(got) != want {
					t.Errorf("slot(%q) = %d, want %d (CLUSTER KEYSLOT)", k, got, want)
				}
				slots = append(slots, want)
			}
			for _, sl := range slots[1:] {
				if sl != slots[0] {
					t.Errorf("key %q: the zones' keys are in slots %v, want one", key, slots)
					break
				}
			}
		}
	})

	t.Run("atomic", func(t *testing.T) {
		s := newTestStore(cc)
		if s.group != bySlot {
			t.Fatalf("a store on a ClusterClient groups by %d, want by slot", s.group)
		}
		runAtomic(t, s)
	})

	// The library loads on every primary, and FCALL goes to each key's.
	for _, mode := range []string{"evalsha", "fcall"} {
		t.Run("random-"+mode, func(t *testing.T) {
			s := newTestStore(cc)
			if mode == "fcall" {
				withFunctions(t, s)
			}
			rng := rand.New(rand.NewPCG(11, 12))
			zones := randomZones(t, rng, s, "cl-random-"+mode+"-")
			keys := []string{"a", "b", "c", "d"}
			n := 1500
			if testing.Short() {
				n = 300
			}
			a, r := runRandomTakeAll(t, s, rng, zones, keys, n, false)
			t.Logf("%d requests admitted, %d rejected", a, r)
			if mode == "fcall" {
				if !s.Functions() {
					t.Error("functions off after the run")
				}
				err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
					info, err := c.Info(ctx, "commandstats").Result()
					if err == nil && !strings.Contains(info, "cmdstat_fcall:") {
						err = fmt.Errorf("primary %s ran no FCALL", c.Options().Addr)
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	t.Run("concurrent", func(t *testing.T) {
		s := newTestStore(cc)
		const nA, nB, goroutines, each = 40, 25, 32, 6
		za := zoneOf(s, "cross-a", mustLimit(t, algorithms.SlidingLog, nA, time.Hour, 0, 0))
		zb := zoneOf(s, "cross-b", mustLimit(t, algorithms.GCRA, nB, time.Hour, 0, 0))
		ka, kb := "user-7", "10.0.0.1"
		if slot(s.Key("cross-a", algorithms.SlidingLog, ka)) == slot(s.Key("cross-b", algorithms.GCRA, kb)) {
			t.Fatalf("the keys share a slot; want two")
		}
		now := epoch + 20*sec
		var admitted, rejected atomic.Int64
		var failed atomic.Value
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				reqs := []Request{{Zone: za, Key: ka, Cost: algorithms.Milli}, {Zone: zb, Key: kb, Cost: algorithms.Milli}}
				if g%2 == 1 {
					reqs[0], reqs[1] = reqs[1], reqs[0] // either group first
				}
				for i := 0; i < each; i++ {
					_, rej, err := s.TakeAll(ctx, now, reqs)
					if err != nil {
						failed.Store(err)
						return
					}
					if rej < 0 {
						admitted.Add(1)
					} else {
						rejected.Add(1)
					}
				}
			}(g)
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			t.Fatal(err)
		}
		got := admitted.Load()
		if got > nB || got < nB-goroutines {
			t.Errorf("admitted %d, want at most %d (and not far below)", got, nB)
		}
		// After every TakeAll has returned, the zones hold the admitted
		// requests' charges and nothing of the rejected ones'.
		for _, c := range []struct {
			z   storage.Limiter
			key string
			n   int64
		}{{za, ka, nA}, {zb, kb, nB}} {
			d, ok, err := c.z.Peek(ctx, c.key, now)
			if err != nil || !ok || d.Remaining != c.n-got {
				t.Errorf("Peek(%s) = %+v, %v, %v; want %d remaining after %d admitted", c.key, d, ok, err, c.n-got, got)
			}
		}
		// The rest of zone b's quota, then a rejection by b: zone a keeps
		// nothing of it.
		for i := got; i < nB; i++ {
			if _, rej, err := s.TakeAll(ctx, now, []Request{{Zone: za, Key: ka, Cost: algorithms.Milli}, {Zone: zb, Key: kb, Cost: algorithms.Milli}}); err != nil || rej >= 0 {
				t.Fatalf("TakeAll %d: rejected %d, %v; want admitted", i, rej, err)
			}
		}
		ds, rej, err := s.TakeAll(ctx, now, []Request{{Zone: za, Key: ka, Cost: algorithms.Milli}, {Zone: zb, Key: kb, Cost: algorithms.Milli}})
		if err != nil || rej != 1 || !ds[0].Allowed || ds[0].Remaining != nA-nB {
			t.Fatalf("TakeAll with b empty = %+v, rejected %d, %v; want rejected by b, a's check with %d left", ds, rej, err, nA-nB)
		}
		if d, _, _ := za.Peek(ctx, ka, now); d.Remaining != nA-nB {
			t.Errorf("after a rejection by b, a has %d left, want %d", d.Remaining, nA-nB)
		}
	})

	t.Run("failed_group", func(t *testing.T) {
		s := New(cc, "fail:")
		za := zoneOf(s, "fa", mustLimit(t, algorithms.TokenBucket, 5, time.Hour, 0, 0))
		zb := zoneOf(s, "fb", mustLimit(t, algorithms.TokenBucket, 5, time.Hour, 0, 0))
		owner := masterOf(t, cl, cc)
		ka := "a"
		var kb string
		for i := 0; kb == ""; i++ {
			k := "b" + strconv.Itoa(i)
			if owner(slot(s.Key("fb", algorithms.TokenBucket, k))) != owner(slot(s.Key("fa", algorithms.TokenBucket, ka))) {
				kb = k
			}
		}
		reqs := []Request{{Zone: za, Key: ka, Cost: algorithms.Milli}, {Zone: zb, Key: kb, Cost: algorithms.Milli}}
		// Load the script on both masters first.
		if _, _, err := s.TakeAll(ctx, 0, reqs); err != nil {
			t.Fatalf("TakeAll: %v", err)
		}
		b := owner(slot(s.Key("fb", algorithms.TokenBucket, kb)))
		b.Pause()
		tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, _, err := s.TakeAll(tctx, 0, reqs)
		cancel()
		b.Resume()
		if err == nil {
			t.Fatalf("TakeAll with b's master hung: no error")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Logf("TakeAll with b's master hung: %v", err)
		}
		// The request's deadline passed before a's give-back could start:
		// it goes on in the background, the request not waiting for it.
		var (
			d    algorithms.Decision
			err2 error
		)
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if d, _, err2 = za.Peek(ctx, ka, 0); err2 == nil && d.Remaining == 4 {
				break
			}
		}
		if err2 != nil || d.Remaining != 4 {
			t.Errorf("zone a after the failed TakeAll: %+v, %v; want 4 left (1 admitted, 1 given back)", d, err2)
		}
	})
}

// masterOf returns a function that finds the master that serves a slot.
func masterOf(t *testing.T, cl *redistest.Cluster, cc *goredis.ClusterClient) func(int) *redistest.Server {
	t.Helper()
	ranges, err := cc.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	return func(sl int) *redistest.Server {
		for _, r := range ranges {
			if sl < r.Start || sl > r.End || len(r.Nodes) == 0 {
				continue
			}
			for _, srv := range cl.Servers {
				if srv.Addr == r.Nodes[0].Addr {
					return srv
				}
			}
		}
		t.Fatalf("no master serves slot %d", sl)
		return nil
	}
}

// TestDecideClockIsRedisTime: a Verdict's Clock is the time Redis decided
// at, taken only from a decision that carries it: a concurrency slot's
// carries its lease id in At, and a request whose first zone was one had
// its lease id read as Redis's clock (issue 27, item 2). A request of
// slots alone, or answered by the deny cache, carries no time.
func TestDecideClockIsRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(srv.Client()).WithDenyCache(srv.Client())
	defer s.Close()
	slotsLimit, err := algorithms.NewConcurrency(5, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	slots := zoneOf(s, "clock-slots", slotsLimit)
	rate := zoneOf(s, "clock-rate", mustLimit(t, algorithms.TokenBucket, 1, time.Hour, 0, 0))
	now := epoch + 7*sec
	for i, c := range []struct {
		reqs    []Request
		decided bool
		clock   int64
	}{
		{[]Request{{Zone: slots, Key: "k", Cost: algorithms.Milli}, {Zone: rate, Key: "k", Cost: algorithms.Milli}}, true, now},
		{[]Request{{Zone: slots, Key: "k", Cost: algorithms.Milli}}, true, 0},
		{[]Request{{Zone: rate, Key: "r", Cost: algorithms.Milli}}, true, now},
		{[]Request{{Zone: rate, Key: "r", Cost: algorithms.Milli}}, true, now}, // rejected by Redis: cached
		{[]Request{{Zone: rate, Key: "r", Cost: algorithms.Milli}}, false, 0},  // answered by the cache
	} {
		v, err := s.Decide(context.Background(), now, c.reqs)
		if err != nil {
			t.Fatalf("step %d: Decide: %v", i, err)
		}
		if v.Decided != c.decided || v.Clock != c.clock {
			t.Errorf("step %d: Decide = decided %v, clock %d; want %v, %d (decisions %+v)", i, v.Decided, v.Clock, c.decided, c.clock, v.Decisions)
		}
	}
}
