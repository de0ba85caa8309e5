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
)

// leaseLimits are the limits the lease parity tests run: the bucket
// family with fine and coarse ticks and a burst, fixed windows aligned to
// the epoch and to the calendar.
func leaseLimits(t *testing.T) []algorithms.Limit {
	day, err := algorithms.NewCalendarLimit(500, algorithms.Calendar{Unit: algorithms.Day, Count: 1, Loc: time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	return []algorithms.Limit{
		mustLimit(t, algorithms.TokenBucket, 100, time.Second, 0, 0),
		mustLimit(t, algorithms.TokenBucket, 7, time.Second, 40, 0),
		mustLimit(t, algorithms.TokenBucket, 300_000, time.Second, 0, 0),
		mustLimit(t, algorithms.GCRA, 100, time.Second, 0, 0),
		mustLimit(t, algorithms.GCRA, 300_000, time.Second, 1000, 0),
		mustLimit(t, algorithms.LeakyBucket, 50, time.Second, 0, 0),
		mustLimit(t, algorithms.FixedWindow, 200, time.Second, 0, 0),
		mustLimit(t, algorithms.FixedWindow, 1000, time.Minute, 0, 0),
		day,
	}
}

// TestLeaseParity runs random lease takes (each ending the lease before
// it, as a store's lease call does), lease ends, plain takes and peeks
// through the Go twin (algorithms.Limit.LeaseEnd and LeaseTake) and
// through single.lua's ops 'q' and 'e' on a real Redis, and wants the
// same decisions, leases and states at every step; also across a reset,
// after which a lease taken before it gives nothing back.
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
				runLeaseParity(t, rng, z, l)
			})
		}
	}
}

func runLeaseParity(t *testing.T, rng *rand.Rand, z *zone, l algorithms.Limit) {
	t.Helper()
	ctx := context.Background()
	key := "k"
	rkey := z.store.key(key, z.tail)
	state := algorithms.NewState(&l)
	var held ended // the lease out, as the store keeps it
	var resetAt int64
	now := epoch + rng.Int64N(l.Window)
	latest := now
	leases := 0
	for i := range 400 {
		now += rng.Int64N(max(1, l.Window/40))
		if rng.IntN(30) == 0 {
			now -= rng.Int64N(10 * ms) // a clock that runs backwards
		}
		latest = max(latest, now)
		cost := []int64{1000, 1000, 500, 3000}[rng.IntN(4)]
		switch r := rng.IntN(10); {
		case r < 6: // a lease call
			want := rng.Int64N(2 * l.Events)
			life := int64(1)<<rng.IntN(19) + rng.Int64N(100) // 1µs to about 300ms
			if held.taken != 0 && held.taken > resetAt {
				l.LeaseEnd(&state, now, held.unspent, held.life, held.taken)
			}
			var sp *algorithms.Span
			wantD, wantN, wantLife := l.LeaseTake(&state, sp, now, cost, want, life)
			got, n, lived, err := z.lease(ctx, now, rkey, amount(&l, cost), want, life, held)
			if err != nil {
				t.Fatalf("step %d: lease(now=%d, cost=%d, want=%d, life=%d): %v", i, now, cost, want, life, err)
			}
			if got != wantD || n != wantN || lived != wantLife {
				t.Fatalf("step %d: lease(now=%d, cost=%d, want=%d, life=%d, ending %+v) = %+v, %d, %d; want %+v, %d, %d (Go)",
					i, now, cost, want, life, held, got, n, lived, wantD, wantN, wantLife)
			}
			held = ended{}
			if n > 0 {
				leases++
				spent := rng.Int64N(n + 1)
				held = ended{unspent: n - spent, taken: got.At, life: lived}
			}
		case r < 7 && held.taken != 0: // the sweeper returns it
			if held.taken > resetAt {
				l.LeaseEnd(&state, now, held.unspent, held.life, held.taken)
			}
			if err := z.endLease(ctx, now, rkey, held); err != nil {
				t.Fatalf("step %d: endLease(now=%d, %+v): %v", i, now, held, err)
			}
			held = ended{}
		case r < 8:
			want := l.Take(&state, now, cost)
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
			resetAt = now
			if held.taken > now {
				resetAt = held.taken
			}
		}
		c := copyState(state)
		want := l.Peek(&c, now, algorithms.Milli)
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
}
