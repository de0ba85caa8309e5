package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// leaseZones opens concurrency zones of three leases on s.
func leaseZones(t testing.TB, s *Store) []*zone {
	t.Helper()
	var zs []*zone
	for i, lease := range []time.Duration{time.Second, 2 * time.Second, 30 * time.Second} {
		l, err := algorithms.NewConcurrency(3, lease)
		if err != nil {
			t.Fatal(err)
		}
		zs = append(zs, s.Zone(storage.Zone{Name: fmt.Sprintf("lz%d", i), Limit: l}).(*zone))
	}
	return zs
}

// slotState is a concurrency key's leases (id=end, sorted by id, ids
// mapped by ids) and whether the key has a TTL.
func slotState(t *testing.T, c goredis.UniversalClient, key string, ids map[string]string) string {
	t.Helper()
	zs, err := c.ZRangeWithScores(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, z := range zs {
		id := fmt.Sprint(z.Member)
		if m, ok := ids[id]; ok {
			id = m
		}
		out = append(out, fmt.Sprintf("%s=%.0f", id, z.Score))
	}
	slices.Sort(out)
	return fmt.Sprint(out, pttl(t, c, key) > 0)
}

// TestRenewParity: renew.lua renewing many leases at once leaves every
// key as the one-key renewal (single.lua's op 'l', Zone.Renew) of each
// lease in turn does: live leases run a whole lease from now, ended ones
// stay ended, given-back ones stay gone; and it counts the live ones.
func TestRenewParity(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	stores := [2]*Store{New(c, "pa:"), New(c, "pb:")}
	var zones [2][]*zone
	for i, s := range stores {
		s.callerClock = true
		s.ttlSlack = testSlack.Milliseconds()
		zones[i] = leaseZones(t, s)
	}
	rng := rand.New(rand.NewPCG(27, 6))
	ctx := context.Background()
	now := int64(1_767_225_600_000_000)
	type lease struct {
		z, key int
		d      [2]algorithms.Decision
	}
	var leases []lease
	ids := map[string]string{} // b's lease ids to a's
	for step := range 300 {
		now += rng.Int64N(700_000)
		switch r := rng.IntN(10); {
		case r < 5: // take in both
			z, key := rng.IntN(3), rng.IntN(4)
			var l lease
			l.z, l.key = z, key
			for i := range stores {
				d, err := zones[i][z].Take(ctx, fmt.Sprint(key), now, algorithms.Milli)
				if err != nil {
					t.Fatal(err)
				}
				l.d[i] = d
			}
			if l.d[0].Allowed != l.d[1].Allowed {
				t.Fatalf("step %d: takes differ: %+v", step, l.d)
			}
			if l.d[0].Allowed {
				leases = append(leases, l)
				ids[fmt.Sprint(l.d[1].At)] = fmt.Sprint(l.d[0].At)
			}
		case r < 6 && len(leases) > 0: // give one back in both
			k := rng.IntN(len(leases))
			l := leases[k]
			for i := range stores {
				if err := zones[i][l.z].Undo(ctx, fmt.Sprint(l.key), now, algorithms.Milli, l.d[i]); err != nil {
					t.Fatal(err)
				}
			}
			if rng.IntN(2) == 0 { // or keep renewing a lease given back
				leases = append(leases[:k], leases[k+1:]...)
			}
		default: // renew a random subset: batched in a, one by one in b
			var due []renewal
			live := int64(0)
			for _, l := range leases {
				if rng.IntN(3) == 0 {
					continue
				}
				z := zones[0][l.z]
				key := fmt.Sprint(l.key)
				due = append(due, renewal{rkey: stores[0].key(key, z.tail), id: l.d[0].At, lease: z.limit.Window})
				score, err := c.ZScore(ctx, stores[1].key(key, zones[1][l.z].tail), fmt.Sprint(l.d[1].At)).Result()
				if err == nil && int64(score) > now {
					live++
				}
				if err := zones[1][l.z].Renew(ctx, key, now, l.d[1]); err != nil {
					t.Fatal(err)
				}
			}
			k := stores[0].leases
			k.at = now
			before := k.renewed.Load()
			if err := k.renew(ctx, due); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			if got := k.renewed.Load() - before; got != live {
				t.Errorf("step %d: renew.lua counted %d live leases, want %d", step, got, live)
			}
		}
		// Same states, once the lease ids (random) are mapped.
		for z := range 3 {
			for key := range 4 {
				a := slotState(t, c, stores[0].key(fmt.Sprint(key), zones[0][z].tail), nil)
				b := slotState(t, c, stores[1].key(fmt.Sprint(key), zones[1][z].tail), ids)
				if a != b {
					t.Fatalf("step %d, zone %d, key %d:\nbatched  %s\none by one %s", step, z, key, a, b)
				}
			}
		}
	}
}

// TestKeeperRenewsInOneCall: leases held on one server are renewed by one
// script call a tick, whatever their number, each only once due (a third
// of its lease after its take or last renewal); a released lease is not
// renewed; on a Cluster one script per slot, in one pipeline.
func TestKeeperRenewsInOneCall(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func(t *testing.T) (Client, *goredis.Client)
	}{
		{"server", func(t *testing.T) (Client, *goredis.Client) {
			c := redistest.Start(t).Client()
			return c, c
		}},
		{"cluster", func(t *testing.T) (Client, *goredis.Client) {
			cl := redistest.StartCluster(t, 3)
			return cl.Client(), nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, one := c.client(t)
			s := New(client, "keep:")
			s.callerClock = true
			s.ttlSlack = testSlack.Milliseconds()
			s.leases.manual = true // the test ticks, on its clock
			s.leases.clock = func() time.Duration { return 0 }
			defer s.Close()
			zs := leaseZones(t, s)
			ctx := context.Background()
			now := int64(1_767_225_600_000_000)
			k := s.leases
			type held struct {
				z    *zone
				key  string
				d    algorithms.Decision
				l    *Lease
				ends float64
			}
			var hs []held
			for i := range 300 {
				z := zs[i%2] // leases of 1s and 2s
				key := fmt.Sprint("k", i)
				d, err := z.Take(ctx, key, now, algorithms.Milli)
				if err != nil || !d.Allowed {
					t.Fatalf("take %d: %+v %v", i, d, err)
				}
				hs = append(hs, held{z: z, key: key, d: d})
			}
			for i := range hs { // held at the keeper's time 0
				hs[i].l = hs[i].z.Hold(hs[i].key, hs[i].d)
			}
			if s.Held() != 300 {
				t.Fatalf("Held() = %d, want 300", s.Held())
			}
			hs[0].l.Release()
			hs[0].l.Release() // twice: nothing more
			if s.Held() != 299 {
				t.Fatalf("Held() after a release = %d, want 299", s.Held())
			}
			score := func(h held) float64 {
				t.Helper()
				rc, ok := client.(goredis.UniversalClient)
				if !ok {
					t.Fatal("not a universal client")
				}
				v, err := rc.ZScore(ctx, s.key(h.key, h.z.tail), fmt.Sprint(h.d.At)).Result()
				if err != nil {
					t.Fatalf("ZSCORE %s: %v", h.key, err)
				}
				return v
			}
			for i := range hs {
				hs[i].ends = score(hs[i])
			}
			evals := func() int64 {
				if one == nil {
					return k.calls.Load()
				}
				return redistest.Calls(t, one, "evalsha", "eval")
			}
			start := time.Duration(0) // the leases were held then
			// Not due yet at a quarter of the 1s lease.
			before := evals()
			k.at = now + 250_000
			k.tick(start + 250*time.Millisecond)
			if n := evals() - before; n != 0 {
				t.Errorf("a tick with nothing due made %d calls, want 0", n)
			}
			// At 0.4s the 1s leases are due (every third), the 2s ones not.
			k.at = now + 400_000
			before = evals()
			k.tick(start + 400*time.Millisecond)
			n := evals() - before
			if one != nil && (n < 1 || n > 2) { // EVALSHA, NOSCRIPT, then EVAL
				t.Errorf("one server: a first tick made %d calls, want 2 (NOSCRIPT, then EVAL)", n)
			}
			if one == nil && (n < 2 || n > 150) {
				t.Errorf("cluster: a tick made %d calls, want one per slot", n)
			}
			for i, h := range hs {
				got := score(h)
				switch {
				case i == 0 && got != h.ends:
					t.Errorf("released lease renewed: ends %v, was %v", got, h.ends)
				case i > 0 && h.z == zs[0] && got != float64(now+400_000+sec):
					t.Errorf("lease %d (1s): ends %v, want %v", i, got, now+400_000+sec)
				case h.z == zs[1] && got != h.ends:
					t.Errorf("lease %d (2s): renewed before due: ends %v, was %v", i, got, h.ends)
				}
			}
			// At 0.7s the 2s leases are due: one call, the script known.
			k.at = now + 700_000
			before = evals()
			k.tick(start + 700*time.Millisecond)
			if n := evals() - before; one != nil && n != 1 {
				t.Errorf("one server: a tick made %d calls, want 1", n)
			}
			for i, h := range hs {
				if got := score(h); h.z == zs[1] && got != float64(now+700_000+2*sec) {
					t.Errorf("lease %d (2s): ends %v, want %v", i, got, now+700_000+2*sec)
				}
			}
			for _, h := range hs {
				h.l.Release()
			}
			if !k.tick(start + time.Second) {
				return // none held: the loop stops
			}
			t.Error("tick with none held reports leases held")
		})
	}
}

// TestKeeperLoopStops: the loop runs while leases are held and ends when
// the last is released, and a closed store holds none.
func TestKeeperLoopStops(t *testing.T) {
	srv := redistest.Start(t)
	s := NewPipelined(srv.Client(), "loop:")
	zs := leaseZones(t, s)
	ctx := context.Background()
	d, err := zs[0].Take(ctx, "x", 0, algorithms.Milli)
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	l := zs[0].Hold("x", d)
	if l == nil {
		t.Fatal("Hold returned nil")
	}
	before := s.leases.renewed.Load()
	deadline := time.Now().Add(10 * time.Second)
	for s.leases.renewed.Load() == before { // every 1/3 s
		if time.Now().After(deadline) {
			t.Fatal("the lease was never renewed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.Release()
	running := func() bool {
		s.leases.mu.Lock()
		defer s.leases.mu.Unlock()
		return s.leases.running
	}
	for running() || runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Fatalf("loop running %v, %d goroutines (%d before the hold): the loop did not stop", running(), runtime.NumGoroutine(), base)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Close()
	if l := zs[0].Hold("x", d); l != nil {
		t.Error("a closed store holds a lease")
	}
}

// BenchmarkLeaseHold measures what a held lease costs the keeper: heap
// bytes per lease held (its record, its Redis key, its place in the
// list), 50,000 held at once, keys as long as an IPv4 address.
func BenchmarkLeaseHold(b *testing.B) {
	const n = 50_000
	s := New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), DefaultPrefix)
	s.leases.manual = true // no loop: nothing is sent
	l, err := algorithms.NewConcurrency(4, 30*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	z := s.Zone(storage.Zone{Name: "held", Limit: l}).(*zone)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.1.%d.%d", i/256, i%256)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	held := make([]*Lease, n)
	b.ReportAllocs()
	for range b.N {
		before := heap()
		for i, k := range keys {
			held[i] = z.Hold(k, algorithms.Decision{Allowed: true, At: int64(i + 1)})
		}
		after := heap()
		for _, l := range held {
			l.Release()
		}
		b.ReportMetric(float64(after-before)/n, "B/lease")
	}
}
