package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// leaseLimits are the limits the lease parity tests run: the bucket
// family with fine and coarse ticks and a burst, fixed windows aligned to
// the epoch and to the calendar.
func leaseLimits(t *testing.T) []algorithms.Limit {
	return []algorithms.Limit{
		mustLimit(t, algorithms.TokenBucket, 100, time.Second, 0, 0),
		mustLimit(t, algorithms.TokenBucket, 7, time.Second, 40, 0),
		mustLimit(t, algorithms.TokenBucket, 300_000, time.Second, 0, 0),
		mustLimit(t, algorithms.GCRA, 100, time.Second, 0, 0),
		mustLimit(t, algorithms.GCRA, 300_000, time.Second, 1000, 0),
		mustLimit(t, algorithms.LeakyBucket, 50, time.Second, 0, 0),
		mustLimit(t, algorithms.FixedWindow, 200, time.Second, 0, 0),
		mustLimit(t, algorithms.FixedWindow, 1000, time.Minute, 0, 0),
		mustLimit(t, algorithms.SlidingWindow, 200, time.Second, 0, 0),
		mustLimit(t, algorithms.SlidingWindow, 1000, 10*time.Second, 0, 0),
		utcDay(t, 500),
	}
}

// TestLeaseParity runs random lease takes (each ending the lease before
// it, as a store's lease call does), lease ends, plain takes and peeks
// through the Go twin (algorithms.Limit.LeaseEnd and LeaseTake) and
// through single.lua's ops 'q' and 'e' on a real Redis, and wants the
// same decisions, leases and states at every step; also across a reset,
// after which a lease taken before it gives nothing back. A rejection that
// what the leases hold could admit is told no later than when they are
// back (the key's back and leased: algorithms.LeaseMark on the Go side).
func TestLeaseParity(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	for _, mode := range []string{"evalsha", "fcall"} {
		s := newTestStore(c)
		if mode == "fcall" {
			withFunctions(t, s)
		}
		for li, l := range leaseLimits(t) {
			t.Run(fmt.Sprintf("%s/%s#%d", mode, l.Kind, li), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(li), 44))
				name := fmt.Sprintf("lease-%s-%d", mode, li)
				zl := s.Zone(storage.Zone{Name: name, Limit: l, Lease: true})
				z := zl.(*zone)
				runLeaseParity(t, c, rng, z, l, false)
			})
		}
		// Two instances' leases on a key that direct decisions drain,
		// in steps short beside a lease's life, on limits slow enough
		// that leases are back before the state alone would admit:
		// rejections told when the leases are back.
		for li, l := range slowLimits(t) {
			t.Run(fmt.Sprintf("%s/%s#%d/pressure", mode, l.Kind, li), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(li), 45))
				z := s.Zone(storage.Zone{Name: fmt.Sprintf("lease-p-%s-%d", mode, li), Limit: l, Lease: true}).(*zone)
				runLeaseParity(t, c, rng, z, l, true)
			})
		}
	}
}

func runLeaseParity(t *testing.T, c goredis.UniversalClient, rng *rand.Rand, z *zone, l algorithms.Limit, pressure bool) {
	t.Helper()
	ctx := context.Background()
	key := "k"
	rkey := z.store.key(key, z.tail)
	state := algorithms.NewState(&l)
	var holders [2]ended // the leases out, as two instances' stores keep them
	held := &holders[0]
	var resetAt int64
	var mark algorithms.LeaseMark // the key's leases (see common.lua)
	marked := markedState(&l)
	capped := 0 // rejections whose Wait mark shortened
	leaseWait := func(d *algorithms.Decision, cost int64) {
		w := d.Wait
		if marked {
			mark.Wait(d, l.LeaseNeed(cost))
		}
		if d.Wait != w {
			capped++
		}
	}
	now := epoch + rng.Int64N(l.Window)
	latest := now
	leases := 0
	steps := 400
	if pressure {
		steps = 1000
	}
	for i := range steps {
		if pressure {
			held = &holders[rng.IntN(2)]
			now += rng.Int64N(max(1, min(l.Window/40, 20*ms)))
		} else {
			now += rng.Int64N(max(1, l.Window/40))
		}
		if rng.IntN(30) == 0 {
			now -= rng.Int64N(10 * ms) // a clock that runs backwards
		}
		latest = max(latest, now)
		cost := []int64{1000, 1000, 500, 3000, 0}[rng.IntN(5)]
		if cost == 0 {
			// A dear request: refused while leases are out, and told
			// when they are back.
			cost = 1 + rng.Int64N(l.Capacity()/4)
		}
		r := rng.IntN(10)
		if pressure {
			// Fewer lease calls: the other instance drains the key by
			// direct decisions while a lease is out.
			r = []int{0, 0, 6, 7, 7, 7, 7, 7, 7, 8}[r]
		}
		switch {
		case r < 6: // a lease call
			want := rng.Int64N(2 * l.Events)
			life := int64(1)<<rng.IntN(19) + rng.Int64N(100) // 1µs to about 300ms
			if pressure {
				want, life = l.Events, 250*ms
			}
			if pressure && rng.IntN(6) == 0 {
				*held = ended{} // its instance died: never returned
			}
			if held.taken != 0 && rng.IntN(4) == 0 {
				// Over with nothing to give back: the store sends
				// only its events, for leased.
				*held = ended{n: held.n}
			}
			if held.taken != 0 && held.taken > resetAt {
				l.LeaseEnd(&state, now, held.unspent, held.life, held.taken)
			}
			var sp *algorithms.Span
			wantD, wantN, wantLife := l.LeaseTake(&state, sp, now, cost, want, life)
			leaseWait(&wantD, cost)
			mark.Return(held.n)
			if wantN > 0 {
				mark.Take(wantD.At, wantN, l.LeaseBack(&wantD, wantLife, returnDelay(life)))
			}
			got, n, lived, err := z.lease(ctx, now, rkey, amount(&l, cost), want, life, *held)
			if err != nil {
				t.Fatalf("step %d: lease(now=%d, cost=%d, want=%d, life=%d): %v", i, now, cost, want, life, err)
			}
			if got != wantD || n != wantN || lived != wantLife {
				t.Fatalf("step %d: lease(now=%d, cost=%d, want=%d, life=%d, ending %+v) = %+v, %d, %d; want %+v, %d, %d (Go)",
					i, now, cost, want, life, *held, got, n, lived, wantD, wantN, wantLife)
			}
			// A lease call writes the key once, at its end (see
			// common.lua's staged): with the TTL its state needs.
			if v := pttl(t, c, rkey); v == -1 || n > 0 && v < testSlack.Milliseconds()+got.Reset/1000-1000 {
				t.Fatalf("step %d: after a lease call (Reset %dµs, leased %d), the key's PTTL is %dms, want at least %dms",
					i, got.Reset, n, v, testSlack.Milliseconds()+got.Reset/1000-1000)
			}
			*held = ended{}
			if n > 0 {
				leases++
				spent := rng.Int64N(n + 1)
				*held = ended{unspent: n - spent, taken: got.At, life: lived, n: n}
			}
		case r < 7 && held.taken != 0: // the sweeper returns it
			if held.taken > resetAt {
				l.LeaseEnd(&state, now, held.unspent, held.life, held.taken)
				mark.Return(held.n)
			}
			if err := z.endLease(ctx, now, rkey, *held); err != nil {
				t.Fatalf("step %d: endLease(now=%d, %+v): %v", i, now, *held, err)
			}
			*held = ended{}
		case r < 8:
			want := l.Take(&state, now, cost)
			leaseWait(&want, cost)
			got, err := z.Take(ctx, key, now, cost)
			if err != nil || got != want {
				t.Fatalf("step %d: Take(now=%d, cost=%d) = %+v, %v; want %+v (Go)", i, now, cost, got, err, want)
			}
		case r < 9 && rng.IntN(4) == 0: // a reset, while a lease may be out
			// At the latest time yet: a reset's mark is the time it
			// ran at, or its state's (see single.lua), and a
			// window's state keeps only its window's start.
			now = latest
			if _, err := z.Reset(ctx, key, now); err != nil {
				t.Fatal(err)
			}
			state = algorithms.NewState(&l)
			mark = algorithms.LeaseMark{}
			resetAt = now
			for _, h := range holders {
				if h.taken > resetAt {
					resetAt = h.taken
				}
			}
		}
		c := copyState(state)
		want := l.Peek(&c, now, algorithms.Milli)
		leaseWait(&want, algorithms.Milli)
		got, ok, err := z.Peek(ctx, key, now)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			fresh := algorithms.NewState(&l)
			got = l.Peek(&fresh, now, algorithms.Milli)
		}
		if got != want {
			t.Fatalf("step %d: Peek(now=%d) = %+v, want %+v (Go)", i, now, got, want)
		}
	}
	if leases < 10 {
		t.Fatalf("only %d leases taken: the trace tests little", leases)
	}
	t.Logf("%d leases, %d rejections told when leases are back", leases, capped)
	if pressure && marked && capped == 0 {
		t.Errorf("no rejection was told when the leases are back: the trace tests little")
	}
}

// instances returns n stores on c as n instances would have them
// (pipelined, with a deny cache), closed when the test ends.
func instances(t *testing.T, c goredis.UniversalClient, n int) []*Store {
	t.Helper()
	var out []*Store
	for range n {
		s := NewPipelined(c, "lease:").WithDenyCache(c)
		t.Cleanup(s.Close)
		out = append(out, s)
	}
	return out
}

// zoneOn returns zone name's limiter l on each store, leasing.
func zoneOn(stores []*Store, name string, l algorithms.Limit) []storage.Limiter {
	var zs []storage.Limiter
	for _, s := range stores {
		zs = append(zs, s.Zone(storage.Zone{Name: name, Limit: l, Lease: true}))
	}
	return zs
}

// hammerStores has clients goroutines per store decide key on zs until
// each has seen refused requests in a row, and returns the count
// admitted.
func hammerStores(t *testing.T, stores []*Store, zs []storage.Limiter, key string, clients, refused int) (admitted int64) {
	t.Helper()
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for i, s := range stores {
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for inRow := 0; inRow < refused; {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					v, err := s.Decide(ctx, time.Now().UnixMicro(), []Request{{Zone: zs[i], Key: key, Cost: algorithms.Milli}})
					cancel()
					switch {
					case err != nil:
						failed.Add(1)
						return
					case v.Rejected < 0:
						ok.Add(1)
						inRow = 0
					default:
						inRow++
					}
				}
			}()
		}
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d decisions failed", n)
	}
	return ok.Load()
}

// waitReturned waits until no store holds a lease with quota in it, and
// until the deny caches' rejections have expired (DenyCacheFor).
func waitReturned(t *testing.T, stores ...*Store) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := int64(0)
		for _, s := range stores {
			out += s.book.outstanding()
		}
		if out == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d milli-events still leased after 20s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Duration(DenyCacheFor) * time.Microsecond)
}

// exhaust hammers key on zs in rounds, each until every client is
// refused in a row, waiting between rounds for the leases to come back,
// until a round admits nothing; it returns the count admitted.
func exhaust(t *testing.T, stores []*Store, zs []storage.Limiter, key string) int64 {
	t.Helper()
	var total int64
	for round := 0; round < 10; round++ {
		n := hammerStores(t, stores, zs, key, 4, 30)
		total += n
		waitReturned(t, stores...)
		if n == 0 {
			return total
		}
	}
	t.Fatalf("still admitting after 10 rounds (%d admitted)", total)
	return total
}

// leaseDecisions is how many decisions stores made from leases.
func leaseDecisions(stores []*Store) int64 {
	var n int64
	for _, s := range stores {
		n += s.Leases().Decisions.Load()
	}
	return n
}

// TestLeasesExactAcrossInstances: three instances on one Redis hammer one
// fixed_window key, and one sliding_window key (a fresh one: its previous
// window counts nothing), decided mostly from leases: never more than N
// admitted, and once the instances have returned what they hold, N in
// all.
func TestLeasesExactAcrossInstances(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	for _, kind := range []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) { leasesExact(t, c, kind) })
	}
}

// TestLeasesExactOnClusterAndSentinel: the same on a Redis Cluster (a
// lease call's keys, the state and its reset mark, share a slot) and on a
// Sentinel-managed primary.
func TestLeasesExactOnClusterAndSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Cluster and a Sentinel")
	}
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		leasesExact(t, cl.Client(), algorithms.FixedWindow)
	})
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		c := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: sn.Name, SentinelAddrs: sn.Sentinels})
		t.Cleanup(func() { c.Close() })
		leasesExact(t, c, algorithms.FixedWindow)
	})
}

func leasesExact(t *testing.T, c goredis.UniversalClient, kind algorithms.Kind) {
	stores := instances(t, c, 3)
	const n = 20_000
	l := mustLimit(t, kind, n, time.Hour, 0, 0)
	zs := zoneOn(stores, "exact", l)
	window := func() int64 { now := time.Now().UnixMicro(); return now - now%l.Window }
	start := window()
	total := exhaust(t, stores, zs, "all")
	if window() != start {
		t.Skip("the hour ended during the test")
	}
	decisions := leaseDecisions(stores)
	t.Logf("admitted %d of %d; %d decided from leases", total, n, decisions)
	if total > n {
		t.Fatalf("admitted %d, more than the limit %d", total, n)
	}
	if total < n*99/100 {
		t.Errorf("admitted %d, less than 99%% of %d once the leases were back", total, n)
	}
	if decisions < n/2 {
		t.Errorf("%d of %d decided from leases: want most", decisions, total)
	}
}

// hammerUntil has clients goroutines per store decide key on zs until
// total admitted reaches n, and returns the count admitted.
func hammerUntil(t *testing.T, stores []*Store, zs []storage.Limiter, key string, clients int, n int64) int64 {
	t.Helper()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i, s := range stores {
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ok.Load() < n {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					v, err := s.Decide(ctx, time.Now().UnixMicro(), []Request{{Zone: zs[i], Key: key, Cost: algorithms.Milli}})
					cancel()
					if err != nil {
						t.Errorf("decide: %v", err)
						return
					}
					if v.Rejected < 0 {
						ok.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	return ok.Load()
}

// die makes s an instance that died: it forgets its leases without
// returning them, and decides nothing more.
// It returns what the instance held unspent, and the most it could hold
// by docs/redis.md's bound: an eighth of what the key had left when each
// of its leases was taken.
func die(s *Store) (lost, bound int64) {
	b := s.book
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		for _, h := range sh.m {
			h.mu.Lock()
			if h.n > 0 {
				lost += h.left / algorithms.Milli
				bound += h.room/algorithms.QuotaLeaseShare + 1
			}
			h.detach()
			h.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	return lost, bound
}

// TestLeasesDeadInstance: one of three instances dies holding leases on a
// fixed_window key: still never more than N, and what the others admit
// in all falls short of N by what the dead one held, no more; that is at
// most the bound docs/redis.md states (an eighth of what was left).
func TestLeasesDeadInstance(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	stores := instances(t, c, 3)
	const n = 20_000
	l := mustLimit(t, algorithms.FixedWindow, n, time.Hour, 0, 0)
	zs := zoneOn(stores, "dead", l)
	window := func() int64 { now := time.Now().UnixMicro(); return now - now%l.Window }
	start := window()
	first := hammerUntil(t, stores, zs, "all", 4, n/2)
	lost, bound := die(stores[2])
	rest := exhaust(t, stores[:2], zs[:2], "all")
	if window() != start {
		t.Skip("the hour ended during the test")
	}
	total := first + rest
	t.Logf("admitted %d of %d; the dead instance held %d events (%.2f%% of N)", total, n, lost, 100*float64(lost)/n)
	if total > n {
		t.Fatalf("admitted %d, more than the limit %d", total, n)
	}
	if short := n - total; short > lost {
		t.Errorf("admitted %d: %d short of N, more than the %d the dead instance held", total, short, lost)
	}
	// The bound is of what was left when each lease was taken, which may
	// be more than what is left when the instance dies: the others admit
	// meanwhile.
	if lost > bound || bound > n/algorithms.QuotaLeaseShare+1 {
		t.Errorf("the dead instance held %d; the bound, an eighth of what the key had left when its lease was taken: %d (at most an eighth of N, %d)", lost, bound, n)
	}
}

// TestLeasesReset: a reset while leases are out gives the key a fresh
// quota: what the instances admit after it is at most N plus what they
// held in leases at the reset (an instance that had not heard of the
// reset yet may spend its lease), and at least 99% of N once the leases
// are back.
func TestLeasesReset(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	stores := instances(t, c, 3)
	const n = 20_000
	l := mustLimit(t, algorithms.FixedWindow, n, time.Hour, 0, 0)
	zs := zoneOn(stores, "reset", l)
	window := func() int64 { now := time.Now().UnixMicro(); return now - now%l.Window }
	start := window()
	hammerUntil(t, stores, zs, "all", 4, n/2)
	var out int64
	for _, s := range stores {
		out += s.book.outstanding() / algorithms.Milli
	}
	if _, err := zs[0].Reset(context.Background(), "all", 0); err != nil {
		t.Fatal(err)
	}
	after := exhaust(t, stores, zs, "all")
	if window() != start {
		t.Skip("the hour ended during the test")
	}
	t.Logf("after the reset: admitted %d of %d; %d events were out in leases at the reset", after, n, out)
	if out == 0 {
		t.Error("no lease was out at the reset: the test tests nothing")
	}
	if after > n+out {
		t.Fatalf("admitted %d after the reset, more than N + the leases out (%d + %d)", after, n, out)
	}
	if after < n*99/100 {
		t.Errorf("admitted %d after the reset, less than 99%% of %d", after, n)
	}
}

// TestLeasesTokenBucket: three instances hammer one token_bucket key,
// partly from leases: never more than burst + rate x t.
func TestLeasesTokenBucket(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	stores := instances(t, c, 3)
	const rate, burst = 4000, 8000
	l := mustLimit(t, algorithms.TokenBucket, rate, time.Second, burst, 0)
	zs := zoneOn(stores, "bucket", l)
	begin := time.Now()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i, s := range stores {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(begin) < 1500*time.Millisecond {
					v, err := s.Decide(context.Background(), time.Now().UnixMicro(), []Request{{Zone: zs[i], Key: "all", Cost: algorithms.Milli}})
					if err != nil {
						t.Errorf("decide: %v", err)
						return
					}
					if v.Rejected < 0 {
						ok.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(begin)
	upper := burst + rate*elapsed.Seconds()
	decisions := leaseDecisions(stores)
	t.Logf("admitted %d in %s (B + r*t = %.0f); %d from leases", ok.Load(), elapsed, upper, decisions)
	if float64(ok.Load()) > upper {
		t.Fatalf("admitted %d, more than B + r*t = %.0f", ok.Load(), upper)
	}
	if decisions == 0 {
		t.Error("no decision from a lease: the test tests nothing")
	}
}

// TestLeasesReturnedOnClose: a zone that closes (a reload) returns its
// leases at once, and so does a store that closes (shutdown): the count
// on Redis falls to what was admitted before Close returns.
func TestLeasesReturnedOnClose(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	l := mustLimit(t, algorithms.FixedWindow, 100_000, time.Hour, 0, 0)
	for _, what := range []string{"zone", "store"} {
		t.Run(what, func(t *testing.T) {
			s := NewPipelined(c, "close:").WithDenyCache(c)
			defer s.Close()
			z := s.Zone(storage.Zone{Name: what, Limit: l, Lease: true})
			rkey := s.Key(what, l.Kind, "k")
			var admitted int64
			for s.book.outstanding() == 0 {
				if admitted > 10_000 {
					t.Fatal("no lease after 10,000 requests")
				}
				v, err := s.Decide(context.Background(), time.Now().UnixMicro(), []Request{{Zone: z, Key: "k", Cost: algorithms.Milli}})
				if err != nil {
					t.Fatal(err)
				}
				if v.Rejected < 0 {
					admitted++
				}
			}
			held := s.book.outstanding() / algorithms.Milli
			if what == "zone" {
				z.(*zone).CloseLeases()
			} else {
				s.Close()
			}
			level, err := c.HGet(context.Background(), rkey, "level").Int64()
			if err != nil {
				t.Fatal(err)
			}
			if level/algorithms.Milli != admitted {
				t.Errorf("after Close: Redis counts %d, want the %d admitted (%d were leased)", level/algorithms.Milli, admitted, held)
			}
		})
	}
}

// TestLeaseOfAReplacedZone: a reload that changes a zone's limit replaces
// its limiter; the new one's first lease call on a key returns the old
// one's lease on it as the old zone took it, and every lease comes back.
func TestLeaseOfAReplacedZone(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := NewPipelined(c, "replaced:").WithDenyCache(c)
	defer s.Close()
	old := s.Zone(storage.Zone{Name: "z", Limit: mustLimit(t, algorithms.FixedWindow, 100_000, time.Hour, 0, 0), Lease: true})
	admitted := int64(0)
	decide := func(z storage.Limiter) {
		t.Helper()
		v, err := s.Decide(context.Background(), time.Now().UnixMicro(), []Request{{Zone: z, Key: "k", Cost: algorithms.Milli}})
		if err != nil {
			t.Fatal(err)
		}
		if v.Rejected < 0 {
			admitted++
		}
	}
	for s.book.outstanding() == 0 {
		if admitted > 10_000 {
			t.Fatal("no lease after 10,000 requests")
		}
		decide(old)
	}
	replaced := s.Zone(storage.Zone{Name: "z", Limit: mustLimit(t, algorithms.FixedWindow, 200_000, time.Hour, 0, 0), Lease: true})
	for range 100 {
		decide(replaced)
	}
	s.Close()
	rkey := s.Key("z", algorithms.FixedWindow, "k")
	waitFor := time.Now().Add(5 * time.Second)
	for {
		level, err := c.HGet(context.Background(), rkey, "level").Int64()
		if err != nil {
			t.Fatal(err)
		}
		if level/algorithms.Milli == admitted {
			return
		}
		if time.Now().After(waitFor) {
			t.Fatalf("Redis counts %d, want the %d admitted: a lease was not returned", level/algorithms.Milli, admitted)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLeaseDemand: under a fake clock, a key becomes hot (a lease is
// wanted) once asked for hotAsks times in a period (half a lease's life),
// its first lease is sized from its rate so far, later ones from the last
// period's demand, each twice the demand of a lease's life, and a key that
// goes quiet is cold again.
func TestLeaseDemand(t *testing.T) {
	b := newBook(nil)
	var now time.Duration
	b.clock = func() time.Duration { return now }
	period := b.period()
	if period != 250_000 {
		t.Fatalf("period = %dµs, want 250ms (half of DefaultLeaseLife)", period)
	}
	ms := time.Millisecond
	hash := uint64(12345)
	// The sketch counts the events of a period.
	for i := range 3 {
		if n := b.often(hash, algorithms.Milli); n != int64(i+1)*algorithms.Milli {
			t.Fatalf("often after %d events = %d, want %d", i+1, n, (i+1)*algorithms.Milli)
		}
	}
	now += time.Duration(period) * time.Microsecond // a new period forgets them
	if n := b.often(hash, algorithms.Milli); n != algorithms.Milli {
		t.Fatalf("often in a new period = %d, want %d", n, algorithms.Milli)
	}

	h := &keyLease{period: now}
	steps := []struct {
		at   time.Duration // since the period began
		n    int           // events asked then
		want int64
	}{
		{0, 7, 0},                     // not hot yet
		{10 * ms, 1, 2 * 2 * 16 * 8},  // 8 events in 10ms: at most 16x a period's worth (period/16), for two periods
		{125 * ms, 8, 2 * 2 * 16 * 2}, // 16 in 125 ms: 32 a period
		{250 * ms, 2, 2 * 2 * 16},     // a new period: the last one's 16
		{600 * ms, 1, 0},              // a period without a request: cold
	}
	start := now
	for i, st := range steps {
		now = start + st.at
		for range st.n {
			h.note(now, algorithms.Milli, period)
		}
		if got := h.want(now, period); got != st.want {
			t.Errorf("step %d: %d events at %s: want() = %d, want %d", i, st.n, st.at, got, st.want)
		}
	}

	// Hot is counted in requests, not cost: one request of 60 events
	// (an LLM prompt) is cold, as is a key of seven; an eighth makes it hot.
	h = &keyLease{period: now}
	for i := range hotAsks {
		h.note(now, 60*algorithms.Milli, period)
		if got := h.want(now, period); (got > 0) != (i == hotAsks-1) {
			t.Errorf("after %d requests of 60 events: want() = %d, want a lease only from the %dth", i+1, got, hotAsks)
		}
	}
}

// TestSweepRenewsABusyKeysLease: under a fake clock, a lease that is over
// while its key is still asked for is not returned by the sweep on its
// own: the sweep renews it, in one lease call that returns it and takes
// the next (one script, not two), and the key's next request is decided
// from the new lease; a lease whose key is quiet is returned by the
// sweep, and Redis then counts exactly what was admitted. (It was
// TestSweepLeavesABusyKeysLeaseToItsCall, when the key's next request
// made that call: the sweep now makes it, issue 44.)
func TestSweepRenewsABusyKeysLease(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	l := mustLimit(t, algorithms.FixedWindow, 1_000_000, time.Hour, 0, 0)
	s, now, zl, z := fakeClockBook(t, c, "sweep", l)
	ctx := context.Background()
	at := func() time.Duration { return time.Duration(now.Load()) }
	take := func() {
		t.Helper()
		v, err := s.Decide(ctx, epoch+at().Microseconds(), []Request{{Zone: zl, Key: "k", Cost: algorithms.Milli}})
		if err != nil || v.Rejected >= 0 {
			t.Fatalf("Decide at %s = %+v, %v", at(), v, err)
		}
	}
	scripts := func() int64 { return redistest.Calls(t, c, "evalsha", "fcall", "eval") }
	admitted := int64(0)
	for s.Leases().Taken.Load() == 0 {
		if admitted == 100 {
			t.Fatal("no lease taken in 100 requests, 1 ms apart")
		}
		now.Add(int64(time.Millisecond))
		take()
		admitted++
	}
	// Busy until just before the lease's end (the leases that demand
	// runs out of before theirs are renewed on the way), then a sweep
	// just after it.
	var end time.Duration
	for {
		_, left, ok := z.LeaseOf("k")
		if !ok {
			t.Fatalf("no lease at %s, a busy key's", at())
		}
		if left <= 1000 {
			end = at() + time.Duration(left)*time.Microsecond
			break
		}
		now.Add(int64(time.Millisecond))
		take()
		admitted++
	}
	taken := s.Leases().Taken.Load()
	now.Store(int64(end + 2*time.Millisecond))
	calls := scripts()
	s.book.sweep(at(), nil)
	if got := scripts() - calls; got != 1 {
		t.Fatalf("the sweep just after the lease of a busy key ended ran %d scripts, want 1 (a lease call: it ends the lease and takes the next)", got)
	}
	if got := s.Leases().Taken.Load(); got != taken+1 {
		t.Fatalf("%d leases taken, want %d", got, taken+1)
	}
	now.Add(int64(time.Millisecond))
	take() // decided from the new lease
	admitted++
	if got := scripts() - calls; got != 1 {
		t.Fatalf("the sweep and the request after it ran %d scripts, want 1", got)
	}
	// Quiet: the sweep returns the lease.
	now.Add(int64(time.Duration(s.book.period()) * time.Microsecond / 4))
	s.book.sweep(at(), nil)
	if _, _, ok := z.LeaseOf("k"); ok {
		t.Fatal("a quiet key's lease is still held after a sweep")
	}
	d, _, err := z.Peek(ctx, "k", epoch+at().Microseconds())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Remaining, l.Events-admitted; got != want {
		t.Fatalf("Redis has %d left after %d admitted and every lease returned, want %d", got, admitted, want)
	}
}

// fakeClockBook returns a store on c whose book runs on a fake clock (now,
// in ns from epoch, Redis's too) with no sweeper of its own (the test
// sweeps), and its leasing zone name of l.
func fakeClockBook(t *testing.T, c Client, name string, l algorithms.Limit) (*Store, *atomic.Int64, storage.Limiter, *zone) {
	t.Helper()
	s := newTestStore(c)
	now := new(atomic.Int64)
	s.book.clock = func() time.Duration { return time.Duration(now.Load()) }
	s.book.wall = func() int64 { return epoch + time.Duration(now.Load()).Microseconds() }
	s.book.mu.Lock()
	s.book.started = true
	s.book.mu.Unlock()
	t.Cleanup(s.book.close)
	zl := s.Zone(storage.Zone{Name: name, Limit: l, Lease: true})
	return s, now, zl, zl.(*zone)
}

// busyLimits runs f in a subtest for each of two limits whose keys
// lease (a fixed_window of 1,000,000 an hour, a token_bucket of
// 1,000,000 a second), with a fake-clock book of a zone of it, named
// name and the algorithm.
func busyLimits(t *testing.T, name string, f func(t *testing.T, l algorithms.Limit, s *Store, now *atomic.Int64, zl storage.Limiter, z *zone)) {
	srv := redistest.Start(t)
	c := srv.Client()
	for _, l := range []algorithms.Limit{
		mustLimit(t, algorithms.FixedWindow, 1_000_000, time.Hour, 0, 0),
		mustLimit(t, algorithms.TokenBucket, 1_000_000, time.Second, 0, 0),
	} {
		t.Run(l.Kind.String(), func(t *testing.T) {
			s, now, zl, z := fakeClockBook(t, c, name+"-"+l.Kind.String(), l)
			f(t, l, s, now, zl, z)
		})
	}
}

// TestBusyKeyLeaseCalls: under a fake clock, a key asked for once a
// millisecond for 3 s costs Redis one lease call a lease's life (500 ms),
// whatever its rate: its lease lives DefaultLeaseLife less 1/32 (a
// bucket's, whose burst is a second of its rate, a µs or so less: half
// of what it has left refills in that time), holds enough for its life
// and is renewed at the last sweep before it ends, not sooner.
func TestBusyKeyLeaseCalls(t *testing.T) {
	busyLimits(t, "busy", func(t *testing.T, l algorithms.Limit, s *Store, now *atomic.Int64, zl storage.Limiter, z *zone) {
		ctx := context.Background()
		var first time.Duration
		for ms := range 3000 {
			now.Store(int64(time.Duration(ms+1) * time.Millisecond))
			at := time.Duration(now.Load())
			v, err := s.Decide(ctx, epoch+at.Microseconds(), []Request{{Zone: zl, Key: "k", Cost: algorithms.Milli}})
			if err != nil || v.Rejected >= 0 {
				t.Fatalf("Decide at %s = %+v, %v", at, v, err)
			}
			if ms%62 == 0 {
				s.book.sweep(at, nil)
			}
			if first == 0 && s.Leases().Taken.Load() == 1 {
				first = at
				_, left, ok := z.LeaseOf("k")
				life := DefaultLeaseLife.Microseconds()
				if !ok || left > life-life/32 || left < life-life/32-10 {
					t.Fatalf("first lease: ends in %dµs (held %t), want %dµs", left, ok, life-life/32)
				}
			}
		}
		if first == 0 || first > 20*time.Millisecond {
			t.Fatalf("first lease at %s, want one within 20 ms of requests 1 ms apart", first)
		}
		// 3 s less the first lease's time, in lives of 484 ms: 6
		// renewals, and the first lease.
		taken, returned := s.Leases().Taken.Load(), s.Leases().Returned.Load()
		if taken != 7 {
			t.Errorf("%d leases taken in 3 s (%d returned), want 7: one a life of %s", taken, returned, DefaultLeaseLife)
		}
	})
}

// TestSweepRenewsBusyKeys: under a fake clock, with a sweep every quarter
// of a period as the sweeper runs them, a key asked for once a
// millisecond has its lease renewed by the sweep before it ends, one
// lease call a lease's life: after its first lease, none of its requests
// makes a lease call (issue 44). A lease a reset ended (heard) is not
// renewed: the key's next request takes the next one. Once the key goes
// quiet, no sweep renews its lease: the next returns it, and Redis
// counts exactly what was admitted.
func TestSweepRenewsBusyKeys(t *testing.T) {
	busyLimits(t, "renew", func(t *testing.T, l algorithms.Limit, s *Store, now *atomic.Int64, zl storage.Limiter, z *zone) {
		ctx := context.Background()
		at := func() time.Duration { return time.Duration(now.Load()) }
		tick := time.Duration(s.book.period()) * time.Microsecond / 4
		next := tick
		sweep := func() {
			for at() >= next {
				s.book.sweep(next, nil)
				next += tick
			}
		}
		var admitted int64
		take := func() (called bool) {
			t.Helper()
			taken := s.Leases().Taken.Load()
			v, err := s.Decide(ctx, epoch+at().Microseconds(), []Request{{Zone: zl, Key: "k", Cost: algorithms.Milli}})
			if err != nil || v.Rejected >= 0 {
				t.Fatalf("Decide at %s = %+v, %v", at(), v, err)
			}
			admitted++
			return s.Leases().Taken.Load() != taken
		}
		var first time.Duration
		var requestCalls int
		for ms := 1; ms <= 3000; ms++ {
			now.Store(int64(time.Duration(ms) * time.Millisecond))
			sweep()
			if take() {
				requestCalls++
			}
			if first == 0 && s.Leases().Taken.Load() > 0 {
				first = at()
			}
		}
		if first == 0 || requestCalls != 1 {
			t.Fatalf("the key's requests made %d lease calls in 3 s (the first at %s), want 1: the sweep renews a busy key's lease", requestCalls, first)
		}
		if taken := s.Leases().Taken.Load(); taken != 7 {
			t.Errorf("%d leases taken in 3 s, want 7: one a life of %s", taken, DefaultLeaseLife)
		}
		if renewed := s.Leases().Renewed.Load(); renewed != 6 {
			t.Errorf("%d leases renewed in 3 s, want 6: every lease after the first", renewed)
		}
		if _, left, ok := z.LeaseOf("k"); !ok || left < tick.Microseconds() {
			t.Fatalf("the busy key's lease ends in %dµs (held %t), want at least a sweep's tick away", left, ok)
		}

		// A reset ends the lease here: the sweeps leave it to the
		// key's next request.
		s.book.heard(s.key("k", z.tail), 0)
		taken := s.Leases().Taken.Load()
		now.Add(int64(10 * time.Millisecond)) // busy still
		s.book.sweep(at(), nil)
		renewed := s.Leases().Renewed.Load()
		if got := s.Leases().Taken.Load(); got != taken {
			t.Fatalf("a sweep renewed a lease a reset ended (%d leases taken, want %d)", got, taken)
		}
		if !take() {
			t.Fatal("the request after a reset ended the key's lease made no lease call")
		}
		if got := s.Leases().Renewed.Load(); got != renewed {
			t.Fatalf("the request's lease call after a reset counted as a renewal (%d, want %d)", got, renewed)
		}

		// Busy until the lease would end before a sweep a tick on
		// renews it (renewAhead), then quiet from then: that sweep
		// does not renew it but returns it, and none after takes one.
		ahead := renewAhead(tick).Microseconds()
		for i := 0; ; i++ {
			if _, left, ok := z.LeaseOf("k"); !ok || left < ahead+tick.Microseconds() {
				break
			}
			if i == 1000 {
				t.Fatal("the busy key's lease did not near its end in 1 s")
			}
			now.Add(int64(time.Millisecond))
			sweep()
			take()
		}
		taken = s.Leases().Taken.Load()
		now.Add(int64(tick))
		s.book.sweep(at(), nil)
		if _, _, ok := z.LeaseOf("k"); ok {
			t.Fatal("a key quiet for a sweep's tick still holds a lease after the sweep")
		}
		for range 16 { // two lease lives
			now.Add(int64(tick))
			sweep()
		}
		if got := s.Leases().Taken.Load(); got != taken {
			t.Fatalf("%d leases taken while the key was quiet, want none", got-taken)
		}
		if _, _, ok := z.LeaseOf("k"); ok {
			t.Fatal("a quiet key's lease is still held")
		}
		if l.Kind != algorithms.FixedWindow {
			return
		}
		d, _, err := z.Peek(ctx, "k", epoch+at().Microseconds())
		if err != nil {
			t.Fatal(err)
		}
		if got, want := d.Remaining, l.Events-admitted; got != want {
			t.Fatalf("Redis has %d left after %d admitted and every lease returned, want %d", got, admitted, want)
		}
	})
}

// TestLeaseCallReadsAndWritesOnce: a lease call that ends the key's lease,
// decides a request and takes the next lease reads the key's state from
// Redis once and writes it once (common.lua's staged), for each state's
// shape: a hash (token_bucket, fixed_window epoch and calendar,
// sliding_window) and a string (gcra).
func TestLeaseCallReadsAndWritesOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	limits := []algorithms.Limit{
		mustLimit(t, algorithms.TokenBucket, 1_000_000, time.Second, 0, 0),
		mustLimit(t, algorithms.FixedWindow, 1_000_000, time.Hour, 0, 0),
		utcDay(t, 500_000),
		mustLimit(t, algorithms.SlidingWindow, 1_000_000, time.Hour, 0, 0),
		mustLimit(t, algorithms.GCRA, 1_000_000, time.Second, 0, 0),
	}
	for _, mode := range []string{"evalsha", "fcall"} {
		s := newTestStore(c)
		if mode == "fcall" {
			withFunctions(t, s)
		}
		for i, l := range limits {
			t.Run(fmt.Sprintf("%s/%s#%d", mode, l.Kind, i), func(t *testing.T) {
				z := s.Zone(storage.Zone{Name: fmt.Sprintf("once-%s-%d", mode, i), Limit: l, Lease: true}).(*zone)
				rkey := z.store.key("k", z.tail)
				ctx := context.Background()
				now := epoch + 10*ms
				d, n, life, err := z.lease(ctx, now, rkey, amount(&l, algorithms.Milli), 100, 250*ms, ended{})
				if err != nil || n == 0 {
					t.Fatalf("first lease: %+v, %d, %v", d, n, err)
				}
				reads, writes := []string{"hmget", "get"}, []string{"hset", "set", "pexpire", "del"}
				r0, w0 := redistest.Calls(t, c, reads...), redistest.Calls(t, c, writes...)
				old := ended{unspent: n / 2, taken: d.At, life: life}
				d, n, _, err = z.lease(ctx, now+ms, rkey, amount(&l, algorithms.Milli), 100, 250*ms, old)
				if err != nil || n == 0 {
					t.Fatalf("renewal: %+v, %d, %v", d, n, err)
				}
				// One read of the state, one of the reset mark (a GET).
				r, w := redistest.Calls(t, c, reads...)-r0, redistest.Calls(t, c, writes...)-w0
				wantW := int64(2) // HSET and PEXPIRE
				if l.Kind == algorithms.GCRA {
					wantW = 1 // SET ... PX
				}
				if r != 2 || w != wantW {
					t.Fatalf("a renewing lease call ran %d reads and %d writes, want 2 (the state, the reset mark) and %d", r, w, wantW)
				}
			})
		}
	}
}

// TestFromLease: the hot path (FromLease, which the shared store tries
// before Decide) decides from a key's lease as Decide's would, spending
// the same lease; where the lease cannot (none, another zone's, spent,
// ended) it reports false having changed nothing, so that Decide, which
// follows, counts the request once; and it finds keys of any length
// (beyond its stack buffer too).
func TestFromLease(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	l := mustLimit(t, algorithms.TokenBucket, 1_000_000, time.Second, 0, 0)
	s, now, zl, z := fakeClockBook(t, c, "fromlease", l)
	other := s.Zone(storage.Zone{Name: "fromlease-other", Limit: l, Lease: true})
	ctx := context.Background()
	for _, key := range []string{"k", strings.Repeat("long key ", 40)} {
		if _, ok := s.FromLease(zl, key, algorithms.Milli); ok {
			t.Fatalf("%.10q: decided from a lease before any", key)
		}
		// Hot: Decide takes its lease.
		for i := 0; ; i++ {
			now.Add(int64(time.Millisecond))
			if _, err := s.Decide(ctx, epoch+time.Duration(now.Load()).Microseconds(), []Request{{Zone: zl, Key: key, Cost: algorithms.Milli}}); err != nil {
				t.Fatal(err)
			}
			if _, _, ok := z.LeaseOf(key); ok {
				break
			}
			if i == 100 {
				t.Fatalf("%.10q: no lease after 100 requests", key)
			}
		}
		events, _, _ := z.LeaseOf(key)
		d, ok := s.FromLease(zl, key, 2*algorithms.Milli)
		if !ok || !d.Allowed || d.Remaining != events-2 {
			t.Fatalf("%.10q: FromLease = %+v, %t; want allowed from the lease's %d, %d left", key, d, ok, events, events-2)
		}
		if got, _, _ := z.LeaseOf(key); got != events-2 {
			t.Fatalf("%.10q: the lease holds %d after FromLease, want %d", key, got, events-2)
		}
		h := s.book.find(s.key(key, z.tail))
		h.mu.Lock()
		asked := h.asked
		h.mu.Unlock()
		for _, c := range []struct {
			name string
			l    storage.Limiter
			cost int64
		}{
			{"another zone's request", other, algorithms.Milli},
			{"a cost above what the lease holds", zl, (events - 1) * algorithms.Milli},
			{"a cost of 0", zl, 0},
			{"a cost above the capacity", zl, l.Capacity() + 1},
		} {
			if d, ok := s.FromLease(c.l, key, c.cost); ok {
				t.Errorf("%.10q: %s: decided from the lease: %+v", key, c.name, d)
			}
		}
		now.Add(int64(DefaultLeaseLife)) // the lease ended
		if d, ok := s.FromLease(zl, key, algorithms.Milli); ok {
			t.Errorf("%.10q: decided from a lease that ended: %+v", key, d)
		}
		h.mu.Lock()
		if h.asked != asked {
			t.Errorf("%.10q: FromLease that could not decide counted the request (asked %d, was %d)", key, h.asked, asked)
		}
		h.mu.Unlock()
	}
}

// utcDay is a calendar limit of n events a day in UTC.
func utcDay(t *testing.T, n int64) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewCalendarLimit(n, algorithms.Calendar{Unit: algorithms.Day, Count: 1, Loc: time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
