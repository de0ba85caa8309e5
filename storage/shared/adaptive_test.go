package shared

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// pinned is a controller whose limit is n whatever it learns.
func pinned(t *testing.T, n int64) algorithms.AdaptiveConfig {
	t.Helper()
	cfg, err := algorithms.NewAdaptive(algorithms.AdaptiveConfig{Floor: n, Ceiling: n, Initial: n, Window: 1000, MinSamples: 1})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

const t0 = int64(1_700_000_000_000_000)

// TestAdaptiveNeverAboveItsLimit: callers racing on one key never have
// more than the limit admitted at once, and every place comes back.
func TestAdaptiveNeverAboveItsLimit(t *testing.T) {
	a := NewAdaptive(pinned(t, 3), 10)
	var now, in, most atomic.Int64
	now.Store(t0)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				h, d := a.Admit("k", now.Add(1), false)
				if !d.Allowed {
					if h.k != nil {
						t.Error("a shed request holds a place")
					}
					continue
				}
				n := in.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				in.Add(-1)
				o := algorithms.OK
				if i%7 == 0 {
					o = algorithms.Drop
				}
				h.End(now.Add(1), now.Load(), o)
				h.End(now.Load(), now.Load(), o) // a second End does nothing
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > 3 {
		t.Errorf("%d admitted at once, limit 3", m)
	}
	if st, _ := a.State("k"); st.InFlight != 0 || st.Windows == 0 {
		t.Errorf("after: %+v, want nothing in flight and windows closed", st)
	}
}

// TestAdaptiveKeysBeyondMaxKeysShareOne: keys beyond max_keys share one
// controller, and a sweep makes room for them again.
func TestAdaptiveKeysBeyondMaxKeysShareOne(t *testing.T) {
	a := NewAdaptive(pinned(t, 1), 2)
	ha, _ := a.Admit("a", t0, false)
	hb, _ := a.Admit("b", t0, false)
	hc, dc := a.Admit("c", t0, false)
	if _, dd := a.Admit("d", t0, false); !dc.Allowed || dd.Allowed {
		t.Errorf("c %v, d %v: want c admitted and d shed (one shared place)", dc.Allowed, dd.Allowed)
	}
	if a.Len() != 2 {
		t.Errorf("Len %d, want 2", a.Len())
	}
	if _, ok := a.State("c"); ok {
		t.Error("c has a controller of its own beyond max_keys")
	}
	hc.End(t0+1, t0+1, algorithms.OK)
	if _, dd := a.Admit("d", t0+2, false); !dd.Allowed {
		t.Error("d shed after c ended")
	}
	ha.End(t0+3, t0+3, algorithms.OK)
	idle := t0 + 3 + adaptiveIdleWindows*1000
	if n := a.Sweep(idle); n != 1 || a.Len() != 1 {
		t.Errorf("sweep forgot %d keys, %d left; want a forgotten and b (in flight) kept", n, a.Len())
	}
	if _, ok := a.State("b"); !ok {
		t.Error("b forgotten with a request in flight")
	}
	if _, de := a.Admit("e", idle, false); !de.Allowed {
		t.Error("e shed: the sweep made room for a key of its own")
	}
	if _, ok := a.State("e"); !ok {
		t.Error("e has no controller of its own after the sweep")
	}
	hb.End(idle, idle, algorithms.OK)
	if a.Shed() != 1 {
		t.Errorf("shed %d, want 1", a.Shed())
	}
}

// TestAdaptiveDryRunAndReset: a dry run admits above the limit and counts
// what it would shed; a reset learns afresh and keeps what is in flight.
func TestAdaptiveDryRunAndReset(t *testing.T) {
	cfg, _ := algorithms.NewAdaptive(algorithms.AdaptiveConfig{Floor: 1, Initial: 1, Window: 1000, MinSamples: 1})
	a := NewAdaptive(cfg, 10)
	h1, _ := a.Admit("k", t0, true)
	h2, d2 := a.Admit("k", t0, true)
	if h2.k == nil {
		t.Fatal("a dry run's request above the limit holds no place")
	}
	if d2.Allowed || a.Shed() != 1 {
		t.Errorf("dry run above the limit: allowed %v, shed %d; want reported as shed once", d2.Allowed, a.Shed())
	}
	if st, _ := a.State("k"); st.InFlight != 2 {
		t.Errorf("in flight %d, want 2 (a dry run counts what it lets through)", st.InFlight)
	}
	for i := int64(0); i < 50; i++ { // the limit grows: 1 -> more
		h, _ := a.Admit("k", t0+i*2000, true)
		h.End(t0+i*2000+1000, t0+i*2000+500, algorithms.OK)
	}
	if ok, _ := a.Reset(context.Background(), "k", t0+200_000); !ok {
		t.Fatal("reset found no key")
	}
	if st, _ := a.State("k"); st.InFlight != 2 || st.Limit != 1 || st.Windows != 0 {
		t.Errorf("after reset: %+v, want 2 in flight, limit 1, nothing learnt", st)
	}
	h1.End(t0+200_001, t0+200_001, algorithms.Cancelled)
	h2.End(t0+200_001, t0+200_001, algorithms.Cancelled)
	if st, _ := a.State("k"); st.InFlight != 0 {
		t.Errorf("in flight %d after both ended", st.InFlight)
	}
}

// TestAdmitAdaptiveShedGivesBack: a request the second part sheds holds
// nothing in the first; Take and Undo hold and free a place.
func TestAdmitAdaptiveShedGivesBack(t *testing.T) {
	one, none := NewAdaptive(pinned(t, 2), 10), NewAdaptive(pinned(t, 1), 10)
	busy, _ := none.Admit("k", t0, false)
	parts := []Part[int]{
		{Zone: &Zone{Adaptive: one}, Key: "k"},
		{Zone: &Zone{Adaptive: none}, Key: "k"},
	}
	if shed := AdmitAdaptive(t0, parts); shed != 1 {
		t.Fatalf("shed by %d, want 1", shed)
	}
	if st, _ := one.State("k"); st.InFlight != 0 {
		t.Errorf("the first part holds %d after the second shed the request", st.InFlight)
	}
	busy.End(t0, t0, algorithms.OK)
	if shed := AdmitAdaptive(t0, parts); shed != -1 {
		t.Fatalf("shed by %d with room in both", shed)
	}
	EndAdaptive(t0+5, parts, t0+4, algorithms.OK)
	if st, _ := none.State("k"); st.InFlight != 0 {
		t.Errorf("in flight %d after EndAdaptive", st.InFlight)
	}
	d, _ := none.Take(context.Background(), "k", t0, 1000)
	if d2, _ := none.Take(context.Background(), "k", t0, 1000); !d.Allowed || d2.Allowed {
		t.Errorf("Take: %v then %v, want admitted then shed", d.Allowed, d2.Allowed)
	}
	_ = none.Undo(context.Background(), "k", t0, 1000, d)
	if st, _ := none.State("k"); st.InFlight != 0 {
		t.Errorf("in flight %d after Undo", st.InFlight)
	}
}
