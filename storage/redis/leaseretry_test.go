package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestLeaseBoundsWait: instance A takes a lease on a key, instance B
// (another store on the same Redis) drains what the key has left by
// direct decisions and is refused a request of 10 events: B's Wait is no later than when A's
// lease is back (its end plus returnDelay), for every leasing algorithm
// but gcra (see markedState), where the key alone would answer the
// window's end or the bucket's refill, seconds later; gcra answers the
// latter. On a fake clock.
func TestLeaseBoundsWait(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	limits := slowLimits(t)
	life := DefaultLeaseLife.Microseconds()
	for _, mode := range []string{"evalsha", "fcall"} {
		a, b := newTestStore(c), newTestStore(c)
		if mode == "fcall" {
			withFunctions(t, a)
			withFunctions(t, b)
		}
		for li, l := range limits {
			t.Run(fmt.Sprintf("%s/%s#%d", mode, l.Kind, li), func(t *testing.T) {
				ctx := context.Background()
				name := fmt.Sprintf("retry-%s-%d", mode, li)
				za := a.Zone(storage.Zone{Name: name, Limit: l, Lease: true}).(*zone)
				zb := b.Zone(storage.Zone{Name: name, Limit: l, Lease: true}).(*zone)
				now := epoch + 10*ms
				rkey := za.store.key("k", za.tail)
				d, n, lived, err := za.lease(ctx, now, rkey, amount(&l, algorithms.Milli), l.Capacity(), life, ended{})
				if err != nil || n == 0 {
					t.Fatalf("A's lease: %+v, %d events, %v: want a lease", d, n, err)
				}
				back := l.LeaseBack(&d, lived, returnDelay(life))
				now += ms
				var got algorithms.Decision
				for i := 0; ; i++ {
					if i > int(l.Capacity()/algorithms.Milli) {
						t.Fatalf("B still admitted after %d requests", i)
					}
					if got, err = zb.Take(ctx, "k", now, algorithms.Milli); err != nil {
						t.Fatal(err)
					}
					if !got.Allowed {
						break
					}
				}
				// A request of 10 events: a bucket refills a fraction of
				// one sooner than the lease is back (the lease was
				// charged its life's refill).
				if got, err = zb.Take(ctx, "k", now, 10*algorithms.Milli); err != nil || got.Allowed {
					t.Fatalf("B's request of 10 events: %+v, %v: want it refused", got, err)
				}
				// What the key alone would answer: the Go algorithm on
				// the same charges, without the lease's end.
				s := algorithms.NewState(&l)
				l.LeaseTake(&s, nil, epoch+10*ms, algorithms.Milli, l.Capacity(), life)
				alone := l.Take(&s, now, algorithms.Milli)
				for alone.Allowed {
					alone = l.Take(&s, now, algorithms.Milli)
				}
				alone = l.Take(&s, now, 10*algorithms.Milli)
				if alone.Wait <= back-now {
					t.Fatalf("the key alone answers a Wait of %dµs, within the lease's %dµs: the test tests nothing", alone.Wait, back-now)
				}
				if !markedState(&l) {
					if got.Wait != alone.Wait {
						t.Fatalf("B refused with Wait %dµs, want %dµs, the state's: gcra keeps no lease mark", got.Wait, alone.Wait)
					}
					return
				}
				if got.Wait <= 0 || got.Wait > back-got.At {
					t.Fatalf("A leased %d events at %d for %dµs; B refused at %d with Wait %dµs, want (0, %d] (A's lease back); the key alone: %dµs",
						n, d.At, lived, got.At, got.Wait, back-got.At, alone.Wait)
				}
			})
		}
	}
}

// slowLimits are a limit of each leasing algorithm whose rejections wait
// seconds, where a lease is back within 0.65 s.
func slowLimits(t *testing.T) []algorithms.Limit {
	t.Helper()
	return []algorithms.Limit{
		mustLimit(t, algorithms.TokenBucket, 10, time.Minute, 300, 0),
		mustLimit(t, algorithms.GCRA, 10, time.Minute, 300, 0),
		mustLimit(t, algorithms.LeakyBucket, 10, time.Minute, 300, 0),
		mustLimit(t, algorithms.FixedWindow, 500, time.Minute, 0, 0),
		utcDay(t, 500),
		mustLimit(t, algorithms.SlidingWindow, 500, time.Minute, 0, 0),
	}
}

// TestLeaseWaitCountsWhatLeasesHold: a rejection is told when the leases
// are back only if what is left and what they hold could admit it; a
// lease that is back (or lost with its instance) no longer counts once
// the leases taken after it are all that is out. fixed_window, fake clock.
func TestLeaseWaitCountsWhatLeasesHold(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	l := mustLimit(t, algorithms.FixedWindow, 500, time.Minute, 0, 0)
	a, b := newTestStore(c), newTestStore(c)
	za := a.Zone(storage.Zone{Name: "held", Limit: l, Lease: true}).(*zone)
	zb := b.Zone(storage.Zone{Name: "held", Limit: l, Lease: true}).(*zone)
	ctx := context.Background()
	rkey := za.store.key("k", za.tail)
	life := DefaultLeaseLife.Microseconds()
	now := epoch + 10*ms
	// A leases and dies with it: never returned.
	if _, n, _, err := za.lease(ctx, now, rkey, algorithms.Milli, 500, life, ended{}); err != nil || n == 0 {
		t.Fatalf("A's lease: %d events, %v", n, err)
	}
	// Once A's lease is back (by its time), B leases.
	now += time.Second.Microseconds()
	d, n, lived, err := zb.lease(ctx, now, rkey, algorithms.Milli, 500, life, ended{})
	if err != nil || n == 0 {
		t.Fatalf("B's lease: %d events, %v", n, err)
	}
	back := l.LeaseBack(&d, lived, returnDelay(life))
	now += ms
	for {
		got, err := zb.Take(ctx, "k", now, algorithms.Milli)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Allowed {
			break
		}
	}
	for _, tt := range []struct {
		need   int64
		capped bool
	}{{1, true}, {n, true}, {n + 1, false}} {
		got, err := zb.Take(ctx, "k", now, tt.need*algorithms.Milli)
		if err != nil || got.Allowed {
			t.Fatalf("a request of %d events: %+v, %v: want it refused", tt.need, got, err)
		}
		if capped := got.Wait <= back-got.At; capped != tt.capped {
			t.Errorf("a request of %d events, B's lease of %d out until %dµs later: Wait %dµs; want it told when the lease is back: %v",
				tt.need, n, back-got.At, got.Wait, tt.capped)
		}
	}
}

// markedState reports whether l's state on Redis keeps its leases' mark
// (back and leased, see common.lua): a hash does; gcra's string does not
// (an older release sharing the server parses it).
func markedState(l *algorithms.Limit) bool {
	return l.Kind != algorithms.GCRA
}

// TestLeaseKeepsGCRAStateAsOlderReleasesReadIt: gcra's state stays the
// string an older release sharing the server parses ("<µs>" or
// "<µs>:<ticks>") through lease calls, returns and refusals: its leases
// leave no mark (see markedState).
func TestLeaseKeepsGCRAStateAsOlderReleasesReadIt(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	l := mustLimit(t, algorithms.GCRA, 10, time.Minute, 300, 0)
	z := newTestStore(c).Zone(storage.Zone{Name: "gcra-format", Limit: l, Lease: true}).(*zone)
	ctx := context.Background()
	rkey := z.store.key("k", z.tail)
	life := DefaultLeaseLife.Microseconds()
	now := epoch + 10*ms
	check := func(what string) {
		t.Helper()
		v, err := c.Get(ctx, rkey).Result()
		if err != nil {
			t.Fatalf("%s: GET: %v", what, err)
		}
		tat, frac, _ := strings.Cut(v, ":")
		if _, err := strconv.ParseInt(tat, 10, 64); err != nil {
			t.Fatalf("%s: the state is %q, want <µs>[:<ticks>]", what, v)
		}
		if _, err := strconv.ParseInt(frac, 10, 64); frac != "" && err != nil {
			t.Fatalf("%s: the state is %q, want <µs>[:<ticks>]", what, v)
		}
	}
	d, n, lived, err := z.lease(ctx, now, rkey, amount(&l, algorithms.Milli), 100, life, ended{})
	if err != nil || n == 0 {
		t.Fatalf("lease: %+v, %d, %v", d, n, err)
	}
	check("after a lease")
	old := ended{unspent: n / 2, taken: d.At, life: lived, n: n}
	if _, _, _, err = z.lease(ctx, now+ms, rkey, amount(&l, algorithms.Milli), 100, life, old); err != nil {
		t.Fatal(err)
	}
	check("after a renewal")
	for i := 0; i < 400; i++ {
		got, err := z.Take(ctx, "k", now+2*ms, 3*algorithms.Milli)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Allowed {
			break
		}
	}
	check("after a refusal")
}
