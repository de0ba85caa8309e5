package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
)

// The guard tests run bans and concurrency slots, beside rates, through
// TakeAll on a real Redis and through memory.TakeAll (the Go twin of
// multi.lua: the same rule over the Go algorithms), and want the same
// decisions at every step.

// guardZone is one zone's limit in both stores.
type guardZone struct {
	name string
	mem  *memory.Store
	rds  storage.Limiter
}

func newGuardZone(s *Store, name string, l algorithms.Limit) guardZone {
	z := storage.Zone{Name: name, Limit: l, MaxKeys: 1000}
	return guardZone{name: name, mem: memory.New(z), rds: s.Zone(z)}
}

// held is a concurrency slot a request holds in both stores.
type held struct {
	key      string
	mem, rds algorithms.Decision
}

func mustGuard(t testing.TB) (ban, slots algorithms.Limit) {
	t.Helper()
	ban, err := algorithms.NewBan(2, time.Second, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	slots, err = algorithms.NewConcurrency(2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ban, slots
}

// runGuardParity sends n random requests, each to a zone with a ban, a
// rate and concurrency slots on one of two keys and to a second zone (ban
// and rate) on a shared key, sometimes as a dry run, and ends random
// requests in flight; both stores must decide alike.
func runGuardParity(t *testing.T, s *Store, label string, n int) {
	ban, slots := mustGuard(t)
	// The rate's window is longer than the ban, so that a banned key's
	// rate often still refuses it when the ban ends: its Wait covers both.
	rate := mustLimit(t, algorithms.FixedWindow, 3, 5*time.Second, 0, 0)
	global := mustLimit(t, algorithms.TokenBucket, 5, time.Second, 0, 0)
	zs := []guardZone{
		newGuardZone(s, label+"ban", ban),
		newGuardZone(s, label+"rate", rate),
		newGuardZone(s, label+"slots", slots),
		newGuardZone(s, label+"gban", ban),
		newGuardZone(s, label+"global", global),
	}
	rng := rand.New(rand.NewPCG(3, uint64(len(label))))
	ctx := context.Background()
	now := int64(1_767_225_600_000_000)
	var inFlight []held
	var counts [4]int // admitted, rejected, banned, released
	for i := range n {
		now += rng.Int64N(150_000)
		if len(inFlight) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(inFlight))
			h := inFlight[k]
			inFlight = append(inFlight[:k], inFlight[k+1:]...)
			if err := zs[2].mem.Undo(ctx, h.key, now, algorithms.Milli, h.mem); err != nil {
				t.Fatal(err)
			}
			if err := zs[2].rds.Undo(ctx, h.key, now, algorithms.Milli, h.rds); err != nil {
				t.Fatal(err)
			}
			counts[3]++
			continue
		}
		key := []string{"a", "b"}[rng.IntN(2)]
		dry := rng.IntN(8) == 0
		cost := int64(1+rng.IntN(2)) * algorithms.Milli
		if rng.IntN(16) == 0 {
			cost = 4 * algorithms.Milli // above the rate's capacity: never
		}
		type part struct {
			z      guardZone
			key    string
			cost   int64
			strike int
		}
		parts := []part{
			{zs[0], key, algorithms.Milli, 0},
			{zs[1], key, cost, 1},
			{zs[2], key, algorithms.Milli, 1},
			{zs[3], "g", algorithms.Milli, 0},
			{zs[4], "g", cost, 4},
		}
		mreqs := make([]memory.Request, len(parts))
		rreqs := make([]Request, len(parts))
		for j, p := range parts {
			mreqs[j] = memory.Request{Store: p.z.mem, Key: p.key, Cost: p.cost, DryRun: dry && j < 3, Strike: p.strike}
			rreqs[j] = Request{Zone: p.z.rds, Key: p.key, Cost: p.cost, DryRun: dry && j < 3, Strike: p.strike}
		}
		want := make([]algorithms.Decision, len(parts))
		wantRej := memory.TakeAll(now, mreqs, want)
		got, gotRej, err := s.TakeAll(ctx, now, rreqs)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		same := gotRej == wantRej
		for j := range parts {
			g, w := got[j], want[j]
			w.Entry = 0 // the memory store's entry: Redis keeps none
			if j == 2 { // a slot's At is its lease id in Redis
				g.At, w.At = 0, 0
			}
			same = same && g == w
		}
		if !same {
			t.Fatalf("step %d at %d, key %s, cost %d, dry %v:\nRedis %+v rejected %d\nGo    %+v rejected %d", i, now, key, cost, dry, got, gotRej, want, wantRej)
		}
		switch {
		case wantRej == 0 || wantRej == 3:
			counts[2]++
		case wantRej >= 0:
			counts[1]++
		default:
			counts[0]++
		}
		if wantRej < 0 && want[2].Allowed && !storage.Skipped(want[2]) && rng.IntN(4) > 0 {
			inFlight = append(inFlight, held{key, want[2], got[2]})
		} else if wantRej < 0 && want[2].Allowed && !storage.Skipped(want[2]) {
			// ends at once
			_ = zs[2].mem.Undo(ctx, key, now, algorithms.Milli, want[2])
			if err := zs[2].rds.Undo(ctx, key, now, algorithms.Milli, got[2]); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%s: admitted %d, rejected %d, banned %d, released %d", label, counts[0], counts[1], counts[2], counts[3])
	for k, c := range counts {
		if c < n/50 {
			t.Errorf("outcome %d happened %d times in %d steps: the test does not cover it", k, c, n)
		}
	}
}

func TestGuardParity(t *testing.T) {
	n := 4000
	if testing.Short() {
		n = 800
	}
	srv := redistest.Start(t)
	for _, g := range []grouping{oneServer, byTag} {
		s := newTestStore(srv.Client())
		s.group = g
		runGuardParity(t, s, fmt.Sprintf("g%d-", g), n)
	}
}

func TestGuardParityCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := newTestStore(cl.Client())
	runGuardParity(t, s, "cl-", 800)
}

// TestLeases: a slot is a lease that ends unless renewed; renewing an
// expired lease does not take its slot back.
func TestLeases(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(srv.Client())
	l, err := algorithms.NewConcurrency(2, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	z := s.Zone(storage.Zone{Name: "lease", Limit: l}).(*zone)
	ctx := context.Background()
	take := func(at int64, want bool) algorithms.Decision {
		t.Helper()
		d, err := z.Take(ctx, "k", at, algorithms.Milli)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != want {
			t.Fatalf("take at %d: %+v, want allowed %v", at, d, want)
		}
		return d
	}
	const t0 = int64(1_767_225_600_000_000)
	a := take(t0, true)
	b := take(t0+sec/2, true)
	take(t0+sec, false)
	if err := z.Renew(ctx, "k", t0+1500*ms, b); err != nil { // b now ends at t0 + 3.5s
		t.Fatal(err)
	}
	c := take(t0+2*sec, true) // a's lease ended at t0 + 2s
	take(t0+2*sec, false)
	if err := z.Renew(ctx, "k", t0+2100*ms, a); err != nil { // too late: a stays gone
		t.Fatal(err)
	}
	take(t0+3*sec, false) // b (renewed) and c hold both slots
	if err := z.Undo(ctx, "k", t0+3*sec, algorithms.Milli, c); err != nil {
		t.Fatal(err)
	}
	take(t0+3*sec, true)
	take(t0+3600*ms, true) // b ended at t0 + 3.5s
	if ttl := pttl(t, srv.Client(), s.key("k", z.tail)); ttl <= 0 {
		t.Fatalf("slot key PTTL %d: want it to expire", ttl)
	}
}
