package redis

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestSettleParity runs seeded random takes, settlements (give-backs of
// part or all of a reservation, excesses up to far past any capacity, of
// the last admission or one from long ago) and peeks through
// algorithms.Limit.Settle and through the scripts' undo and owe ops, with
// clocks that run forward, stand still and run back, for every kind that
// settles, through EVALSHA and FCALL, and wants identical decisions at
// every step.
func TestSettleParity(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []string{"evalsha", "fcall"} {
		s := newTestStore(srv.Client())
		if mode == "fcall" {
			withFunctions(t, s)
		}
		t.Run(mode, func(t *testing.T) { settleParity(t, s, mode) })
	}
}

func settleParity(t *testing.T, s *Store, mode string) {
	n := 3000
	if testing.Short() {
		n = 300
	}
	windows := []time.Duration{time.Millisecond, time.Second, 13 * time.Second, time.Hour}
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.LeakyBucket, algorithms.FixedWindow, algorithms.SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(kind), 29))
			for ci := 0; ci < 8; ci++ {
				window := windows[rng.IntN(len(windows))]
				events := 1 + rng.Int64N(min(20, window.Microseconds()))
				if ci == 7 {
					events = 300_000 // a fine tick (Scale > 1) for the bucket family
					window = time.Second
				}
				var burst int64
				var maxDelay time.Duration
				if kind == algorithms.TokenBucket || kind == algorithms.GCRA || kind == algorithms.LeakyBucket {
					burst = rng.Int64N(2*events + 1)
				}
				if kind == algorithms.LeakyBucket && rng.IntN(2) == 0 {
					maxDelay = time.Duration(rng.Int64N(int64(2 * window)))
				}
				l, err := algorithms.NewLimit(kind, events, window, burst, maxDelay)
				if err != nil {
					continue
				}
				name := fmt.Sprintf("%s-settle-%s-%d", mode, kind, ci)
				runSettleParity(t, zoneOf(s, name, l), &l, rng, n/8)
			}
		})
	}
	// A calendar window settles in its period (fixedperiod's owe).
	for _, zone := range []string{"UTC", "Asia/Kolkata", "America/New_York"} {
		t.Run("calendar/"+zone, func(t *testing.T) {
			loc, err := time.LoadLocation(zone)
			if err != nil {
				t.Fatal(err)
			}
			l := calendarLimit(t, 5, algorithms.Day, 1, loc)
			rng := rand.New(rand.NewPCG(uint64(len(zone)), 31))
			runSettleParity(t, zoneOf(s, fmt.Sprintf("%s-settle-calendar-%s", mode, zone), l), &l, rng, n/4)
		})
	}
}

func runSettleParity(t *testing.T, zl storage.Limiter, l *algorithms.Limit, rng *rand.Rand, n int) {
	t.Helper()
	ctx := context.Background()
	st, ok := zl.(storage.Settler)
	if !ok {
		t.Fatalf("%T is not a storage.Settler", zl)
	}
	state := algorithms.NewState(l)
	type held struct {
		d    algorithms.Decision
		cost int64
	}
	var admitted []held
	now := epoch + rng.Int64N(l.Window)
	capacity := l.Capacity()
	for i := 0; i < n; i++ {
		switch r := rng.IntN(10); {
		case r < 3:
		case r < 7:
			now += rng.Int64N(l.Window/3 + 1)
		case r < 8:
			now -= rng.Int64N(l.Window/2 + 1) // backwards
		default:
			now += rng.Int64N(3*l.Window + 1)
		}
		switch r := rng.IntN(10); {
		case r < 5:
			cost := rng.Int64N(capacity/2 + 1)
			want := l.Take(&state, now, cost)
			got, err := zl.Take(ctx, "k", now, cost)
			if err != nil {
				t.Fatalf("step %d: Take(%d, %d): %v", i, now, cost, err)
			}
			if got != want {
				t.Fatalf("step %d: Take(%d, %d) = %+v, want %+v (Go)", i, now, cost, got, want)
			}
			if got.Allowed {
				admitted = append(admitted, held{got, cost})
			}
		case r < 9 && len(admitted) > 0:
			k := len(admitted) - 1
			if rng.IntN(3) == 0 {
				k = rng.IntN(len(admitted))
			}
			h := admitted[k]
			var actual int64
			switch rng.IntN(6) {
			case 0:
				actual = 0 // a response that did not match
			case 1:
				actual = rng.Int64N(h.cost + 1)
			case 2:
				actual = h.cost + rng.Int64N(10*capacity+1)
			case 3:
				actual = math.MaxInt64 / 4 // past every cap
			default:
				actual = h.cost + rng.Int64N(2*algorithms.Milli+1)
			}
			l.Settle(&state, now, h.cost, actual, h.d)
			if err := st.Settle(ctx, "k", now, h.cost, actual, h.d); err != nil {
				t.Fatalf("step %d: Settle(%d, %d -> %d): %v", i, now, h.cost, actual, err)
			}
		default:
			c := copyState(state)
			want := l.Peek(&c, now, algorithms.Milli)
			got, ok, err := zl.Peek(ctx, "k", now)
			if err != nil {
				t.Fatalf("step %d: Peek(%d): %v", i, now, err)
			}
			if !ok {
				fresh := algorithms.NewState(l)
				got = l.Peek(&fresh, now, algorithms.Milli)
			}
			if got != want {
				t.Fatalf("step %d: Peek(%d) = %+v (held %v), want %+v (Go)", i, now, got, ok, want)
			}
		}
	}
}
