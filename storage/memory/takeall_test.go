package memory

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

func mustLimit(t testing.TB, kind algorithms.Kind, events int64, window time.Duration) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewLimit(kind, events, window, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestTakeAllMatchesModel: TakeAll over three zones decides as a model
// that checks every zone (Peek on a copy) and takes in all only if every
// blocking zone admits; a rejected request changes no zone's state.
func TestTakeAllMatchesModel(t *testing.T) {
	kinds := []algorithms.Kind{algorithms.TokenBucket, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.GCRA, algorithms.SlidingLog, algorithms.LeakyBucket}
	rng := rand.New(rand.NewSource(7))
	for round := 0; round < 30; round++ {
		var stores []*Store
		var models []*algorithms.Limit
		modelStates := make([]map[string]*algorithms.State, 3)
		for z := 0; z < 3; z++ {
			l := mustLimit(t, kinds[rng.Intn(len(kinds))], int64(1+rng.Intn(5)), time.Duration(1+rng.Intn(10))*time.Second)
			stores = append(stores, New(storage.Zone{Name: "z" + strconv.Itoa(z), Limit: l}))
			models = append(models, &l)
			modelStates[z] = map[string]*algorithms.State{}
		}
		now := int64(1_700_000_000) * sec
		for step := 0; step < 300; step++ {
			now += int64(rng.Intn(400_000))
			key := strconv.Itoa(rng.Intn(3))
			n := 1 + rng.Intn(3)
			reqs := make([]Request, n)
			for i := range reqs {
				reqs[i] = Request{Store: stores[i], Key: key, Cost: int64(rng.Intn(2500)), DryRun: rng.Intn(6) == 0}
			}
			ds := make([]algorithms.Decision, n)
			got := TakeAll(now, reqs, ds)

			// The model.
			want := -1
			checks := make([]algorithms.Decision, n)
			for i := range reqs {
				st := modelStates[i][key]
				if st == nil {
					s := algorithms.NewState(models[i])
					st = &s
					modelStates[i][key] = st
				}
				cp := *st
				cp.Log = append([]int64(nil), st.Log...)
				checks[i] = models[i].Peek(&cp, now, reqs[i].Cost)
				if !checks[i].Allowed && !reqs[i].DryRun && want < 0 {
					want = i
				}
			}
			if want < 0 {
				for i := range reqs {
					if checks[i].Allowed {
						checks[i] = models[i].Take(modelStates[i][key], now, reqs[i].Cost)
					}
				}
			}
			if got != want {
				t.Fatalf("round %d step %d: TakeAll = %d, want %d", round, step, got, want)
			}
			for i := range ds {
				ds[i].Entry = 0 // the store's, which the model does not know
				if ds[i] != checks[i] {
					t.Fatalf("round %d step %d zone %d: decision %+v, want %+v", round, step, i, ds[i], checks[i])
				}
			}
		}
	}
}

// TestTakeAllRejectedChargesNothing: a request that the second zone
// rejects leaves the first zone's state as it was, and inserts no key.
func TestTakeAllRejectedChargesNothing(t *testing.T) {
	wide := New(storage.Zone{Name: "wide", Limit: mustLimit(t, algorithms.TokenBucket, 5, time.Hour)})
	narrow := New(storage.Zone{Name: "narrow", Limit: mustLimit(t, algorithms.TokenBucket, 1, time.Hour)})
	now := 100 * sec
	ds := make([]algorithms.Decision, 2)
	if r := TakeAll(now, []Request{{Store: wide, Key: "k", Cost: 1000}, {Store: narrow, Key: "k", Cost: 1000}}, ds); r != -1 {
		t.Fatalf("first: rejected %d, want -1", r)
	}
	for i := 0; i < 3; i++ {
		if r := TakeAll(now, []Request{{Store: wide, Key: "k", Cost: 1000}, {Store: narrow, Key: "k", Cost: 1000}}, ds); r != 1 {
			t.Fatalf("rejected %d, want 1 (narrow)", r)
		}
		if !ds[0].Allowed || ds[0].Remaining != 4 {
			t.Fatalf("wide's check: %+v, want allowed, reporting the 4 it really has", ds[0])
		}
	}
	if d, _, _ := wide.Peek(context.Background(), "k", now); d.Remaining != 4 {
		t.Fatalf("wide after rejections: %+v, want 4 left, as after the first request", d)
	}
	// A key only the rejected request named is not inserted.
	narrowFull := New(storage.Zone{Name: "nf", Limit: mustLimit(t, algorithms.TokenBucket, 1, time.Hour)})
	narrowFull.Take(context.Background(), "x", now, 1000)
	TakeAll(now, []Request{{Store: wide, Key: "x", Cost: 1000}, {Store: narrowFull, Key: "x", Cost: 1000}}, ds)
	if _, ok, _ := wide.Peek(context.Background(), "x", now); ok {
		t.Fatal("a rejected request inserted its key in wide")
	}
	// A dry-run zone's rejection does not block, and it is not charged.
	if r := TakeAll(now, []Request{{Store: wide, Key: "k", Cost: 1000}, {Store: narrow, Key: "k", Cost: 1000, DryRun: true}}, ds); r != -1 || ds[1].Allowed {
		t.Fatalf("dry run: rejected %d, narrow %+v; want -1 and narrow rejecting", r, ds[1])
	}
}

// TestTakeAllConcurrent: goroutines decide overlapping zones and keys
// with TakeAll, Take and Sweep at once; no deadlock, and no zone admits
// more than its limit for any key.
func TestTakeAllConcurrent(t *testing.T) {
	const events = 50
	stores := []*Store{
		New(storage.Zone{Name: "a", Limit: mustLimit(t, algorithms.FixedWindow, events, time.Hour), MaxKeys: 8}),
		New(storage.Zone{Name: "b", Limit: mustLimit(t, algorithms.TokenBucket, events, time.Hour), MaxKeys: 8}),
		New(storage.Zone{Name: "c", Limit: mustLimit(t, algorithms.SlidingLog, events, time.Hour), MaxKeys: 8}),
	}
	now := 100 * sec
	var admitted [3][4]atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			ds := make([]algorithms.Decision, 3)
			for i := 0; i < 2000; i++ {
				k := rng.Intn(4)
				key := strconv.Itoa(k)
				perm := rng.Perm(3)[:1+rng.Intn(3)]
				reqs := make([]Request, len(perm))
				for j, z := range perm {
					reqs[j] = Request{Store: stores[z], Key: key, Cost: 1000}
				}
				if TakeAll(now, reqs, ds) < 0 {
					for j, z := range perm {
						if ds[j].Allowed {
							admitted[z][k].Add(1)
						}
					}
				}
				if i%200 == 0 {
					stores[rng.Intn(3)].Sweep(now)
				}
			}
		}(g)
	}
	wg.Wait()
	for z := range admitted {
		for k := range admitted[z] {
			if n := admitted[z][k].Load(); n > events {
				t.Errorf("zone %d key %d: %d admitted, want at most %d", z, k, n, events)
			}
		}
		checkConsistent(t, stores[z])
	}
}

// TestConcurrentEvictionKeepsCount: a flood of distinct keys from many
// goroutines never holds more than max_keys, and the count, list and maps
// agree afterwards.
func TestConcurrentEvictionKeepsCount(t *testing.T) {
	s := New(storage.Zone{Name: "flood", Limit: mustLimit(t, algorithms.TokenBucket, 5, time.Hour), MaxKeys: 100})
	var wg sync.WaitGroup
	var over atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				s.Take(context.Background(), strconv.Itoa(g)+"-"+strconv.Itoa(i%700), 100*sec+int64(i), 1000)
				if s.Len() > 100 {
					over.Add(1)
				}
				if i%1000 == 0 {
					s.Sweep(100 * sec)
				}
			}
		}(g)
	}
	wg.Wait()
	if over.Load() > 0 {
		t.Fatalf("Len passed max_keys %d times", over.Load())
	}
	checkConsistent(t, s)
}

func TestTakeAllAllocations(t *testing.T) {
	var reqs []Request
	for z := 0; z < 4; z++ {
		s := New(storage.Zone{Name: "z" + strconv.Itoa(z), Limit: mustLimit(t, algorithms.TokenBucket, 1<<30, time.Hour)})
		s.Take(context.Background(), "k", 100*sec, 1000)
		reqs = append(reqs, Request{Store: s, Key: "k", Cost: 1000})
	}
	ds := make([]algorithms.Decision, 4)
	now := int64(100 * sec)
	if n := testing.AllocsPerRun(1000, func() { now++; TakeAll(now, reqs, ds) }); n != 0 {
		t.Fatalf("TakeAll of 4 zones on existing keys: %v allocations, want 0", n)
	}
}

func BenchmarkTakeAll(b *testing.B) {
	for _, zones := range []int{1, 2, 4} {
		b.Run("zones="+strconv.Itoa(zones), func(b *testing.B) {
			var reqs []Request
			for z := 0; z < zones; z++ {
				s := New(storage.Zone{Name: "z" + strconv.Itoa(z), Limit: mustLimit(b, algorithms.TokenBucket, 1<<30, time.Hour)})
				reqs = append(reqs, Request{Store: s, Key: "k", Cost: 1000})
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ds := make([]algorithms.Decision, zones)
				r := append([]Request(nil), reqs...)
				now := int64(100 * sec)
				for pb.Next() {
					now++
					TakeAll(now, r, ds)
				}
			})
		})
	}
}

// TestConcurrentLateUndo: goroutines take one key and give back random
// earlier admissions of theirs, windows later, across window boundaries on
// a shared clock; each aligned window of a fixed_window never holds more
// than N live admissions, and a sliding_log's (t - W, t] never more than N.
// The clock is read under the test's lock, so that requests reach the
// store in time order (a request that reaches it after a later one is
// decided at the later time; a sliding_log that gives back its newest
// entries forgets that hold, see the README).
func TestConcurrentLateUndo(t *testing.T) {
	for _, kind := range []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingLog, algorithms.SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			const n, w = 5, 1000 // 5 per ms
			s := New(storage.Zone{Name: "late", Limit: mustLimit(t, kind, n, time.Millisecond)})
			var clock atomic.Int64
			clock.Store(100 * sec)
			type adm struct{ d algorithms.Decision }
			var mu sync.Mutex
			var live []adm // admitted, not given back
			var wg sync.WaitGroup
			var bad atomic.Value
			for g := 0; g < 6; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					rng := rand.New(rand.NewSource(int64(g)))
					var mine []algorithms.Decision
					for i := 0; i < 3000; i++ {
						if len(mine) > 0 && rng.Intn(4) == 0 {
							j := rng.Intn(len(mine))
							d := mine[j]
							mine = append(mine[:j], mine[j+1:]...)
							mu.Lock()
							now := clock.Add(int64(rng.Intn(120)))
							s.Undo(context.Background(), "k", now, 1000, d)
							for k := range live {
								if live[k].d == d {
									live = append(live[:k], live[k+1:]...)
									break
								}
							}
							mu.Unlock()
							continue
						}
						mu.Lock() // the take and its record as one step, for the check
						now := clock.Add(int64(rng.Intn(120)))
						d, _ := s.Take(context.Background(), "k", now, 1000)
						if d.Allowed {
							live = append(live, adm{d})
							mine = append(mine, d)
							var inWindow, inSpan int
							for _, a := range live {
								if a.d.At-a.d.At%w == d.At-d.At%w {
									inWindow++
								}
								if a.d.At > d.At-w {
									inSpan++
								}
							}
							if kind == algorithms.FixedWindow && inWindow > n || kind == algorithms.SlidingLog && inSpan > n || inWindow > n {
								bad.Store(fmt.Sprintf("at %d: %d live in its window, %d in (t-W, t]", d.At, inWindow, inSpan))
							}
						}
						mu.Unlock()
					}
				}(g)
			}
			wg.Wait()
			if v := bad.Load(); v != nil {
				t.Fatal(v)
			}
		})
	}
}

// TestTakeAllIgnoresBadBanLinks: a Strike that names no earlier request
// with a ban (itself, a later one, out of range, a rate) links nothing:
// the request is decided as without one, and nothing panics.
func TestTakeAllIgnoresBadBanLinks(t *testing.T) {
	rate := New(storage.Zone{Name: "r", Limit: mustLimit(t, algorithms.TokenBucket, 1, time.Hour), MaxKeys: 10})
	other := New(storage.Zone{Name: "o", Limit: mustLimit(t, algorithms.TokenBucket, 1, time.Hour), MaxKeys: 10})
	for _, strike := range []int{2, 3, 99, -5, 1} {
		key := fmt.Sprint("k", strike)
		reqs := []Request{{Store: other, Key: key, Cost: 1000}, {Store: rate, Key: key, Cost: 1000, Strike: strike}}
		ds := make([]algorithms.Decision, 2)
		if got := TakeAll(0, reqs, ds); got != -1 || !ds[1].Allowed || storage.Skipped(ds[1]) {
			t.Errorf("strike %d: first request rejected %d, %+v", strike, got, ds)
		}
		if got := TakeAll(0, reqs, ds); got != 0 {
			t.Errorf("strike %d: second request: rejected %d, want 0", strike, got)
		}
	}
}
