package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// scriptCalls returns how many scripts the server has run (EVALSHA, EVAL
// and FCALL), from INFO commandstats.
func scriptCalls(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	return redistest.Calls(t, c, "evalsha", "eval", "fcall")
}

func cachedStore(c *goredis.Client) *Store {
	s := newTestStore(c).WithDenyCache(c)
	s.listen()
	return s
}

// TestDenyCacheHotKey: a key over its limit is answered from memory until
// its wait ends, with the wait counting down; Redis sees the first
// rejection and the first request after the wait, and the cache never
// rejects what Redis would admit.
func TestDenyCacheHotKey(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := cachedStore(c)
	defer s.Close()
	l := mustLimit(t, algorithms.TokenBucket, 2, time.Second, 0, 0) // an event every 500ms
	zl := zoneOf(s, "hot", l)
	reqs := func(cost int64) []Request { return []Request{{Zone: zl, Key: "k", Cost: cost}} }
	now := epoch
	for i := 0; i < 2; i++ {
		if _, r, err := s.TakeAll(context.Background(), now, reqs(1000)); err != nil || r != -1 {
			t.Fatalf("take %d: rejected %d, %v; want admitted", i, r, err)
		}
	}
	before := scriptCalls(t, c)
	for i := 0; i < 1000; i++ {
		ds, r, err := s.TakeAll(context.Background(), now+int64(i)*400, reqs(1000)) // 0 to 399.6ms
		if err != nil || r != 0 {
			t.Fatalf("hot %d: rejected %d, %v; want rejected", i, r, err)
		}
		if want := 500*ms - int64(i)*400; ds[0].Wait != want {
			t.Fatalf("hot %d: Wait %d, want %d (counting down)", i, ds[0].Wait, want)
		}
	}
	if n := scriptCalls(t, c) - before; n != 1 {
		t.Fatalf("1000 rejections of a hot key ran %d scripts, want 1 (the rest from the cache)", n)
	}
	if hits := s.DenyCacheHits(); hits != 999 {
		t.Fatalf("cache hits %d, want 999", hits)
	}
	// A cheaper request than the refused one is not the cache's to refuse.
	if _, _, err := s.TakeAll(context.Background(), now+400*ms, reqs(0)); err != nil {
		t.Fatal(err)
	}
	if n := scriptCalls(t, c) - before; n != 2 {
		t.Fatalf("a cheaper request ran %d scripts in all, want 2", n)
	}
	// When the wait is over, Redis decides again, and admits.
	if _, r, err := s.TakeAll(context.Background(), now+500*ms, reqs(1000)); err != nil || r != -1 {
		t.Fatalf("after the wait: rejected %d, %v; want admitted", r, err)
	}
}

// TestDenyCacheNeverOlderThanASecond: a wait longer than DenyCacheFor is
// still refused from memory only for DenyCacheFor, then asked again.
func TestDenyCacheNeverOlderThanASecond(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := cachedStore(c)
	defer s.Close()
	zl := zoneOf(s, "slow", mustLimit(t, algorithms.FixedWindow, 1, time.Hour, 0, 0))
	reqs := []Request{{Zone: zl, Key: "k", Cost: 1000}}
	now := epoch - epoch%(3600*sec)
	s.TakeAll(context.Background(), now, reqs)
	s.TakeAll(context.Background(), now+1, reqs) // rejected, cached
	before := scriptCalls(t, c)
	s.TakeAll(context.Background(), now+1+DenyCacheFor-1, reqs) // still trusted
	if n := scriptCalls(t, c) - before; n != 0 {
		t.Fatalf("a rejection cached just under 1s ago ran %d scripts, want 0", n)
	}
	s.TakeAll(context.Background(), now+1+DenyCacheFor, reqs) // 1s after it was cached: asked again
	if n := scriptCalls(t, c) - before; n != 1 {
		t.Fatalf("a rejection cached 1s ago ran %d scripts, want 1", n)
	}
}

// TestDenyCacheResetEverywhere: a reset on one instance clears the key in
// the deny cache of another that listens on the same Redis.
func TestDenyCacheResetEverywhere(t *testing.T) {
	srv := redistest.Start(t)
	a, b := cachedStore(srv.Client()), cachedStore(srv.Client())
	defer a.Close()
	defer b.Close()
	l := mustLimit(t, algorithms.TokenBucket, 1, time.Hour, 0, 0)
	za, zb := zoneOf(a, "reset", l), zoneOf(b, "reset", l)
	now := epoch
	a.TakeAll(context.Background(), now, []Request{{Zone: za, Key: "k", Cost: 1000}})
	if _, r, _ := a.TakeAll(context.Background(), now, []Request{{Zone: za, Key: "k", Cost: 1000}}); r != 0 {
		t.Fatal("second take admitted, want rejected (and cached)")
	}
	time.Sleep(100 * time.Millisecond) // a's subscription is up
	if ok, err := zb.Reset(context.Background(), "k", 0); !ok || err != nil {
		t.Fatalf("reset on b: %v, %v", ok, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, r, err := a.TakeAll(context.Background(), now, []Request{{Zone: za, Key: "k", Cost: 1000}})
		if err == nil && r == -1 {
			break // a asked Redis, which had forgotten the key
		}
		if time.Now().After(deadline) {
			t.Fatal("after a reset on another instance, a still rejects from its cache")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDenyCacheMultiZone: a request two zones rejected is answered from
// the cache with both zones' waits; a request that only one of the zones
// applies to is not the cache's.
func TestDenyCacheMultiZone(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := cachedStore(c)
	defer s.Close()
	fast := zoneOf(s, "fast", mustLimit(t, algorithms.TokenBucket, 1, time.Second, 0, 0))
	slow := zoneOf(s, "slowz", mustLimit(t, algorithms.TokenBucket, 1, time.Minute, 0, 0))
	both := []Request{{Zone: fast, Key: "k", Cost: 1000}, {Zone: slow, Key: "k", Cost: 1000}}
	now := epoch
	s.TakeAll(context.Background(), now, both)
	ds, r, _ := s.TakeAll(context.Background(), now+1, both)
	if r != 0 || ds[1].Allowed {
		t.Fatalf("second: rejected %d, %+v; want both zones rejecting", r, ds)
	}
	before := scriptCalls(t, c)
	ds, r, _ = s.TakeAll(context.Background(), now+2, both)
	if r != 0 || ds[1].Wait != 60*sec-2 {
		t.Fatalf("cached: rejected %d, %+v; want the slow zone's wait 59.999998s", r, ds)
	}
	if n := scriptCalls(t, c) - before; n != 0 {
		t.Fatalf("the cached request ran %d scripts, want 0", n)
	}
	hits := s.DenyCacheHits()
	s.TakeAll(context.Background(), now+3, []Request{{Zone: fast, Key: "k", Cost: 1000}})
	if n := scriptCalls(t, c) - before; n == 0 || s.DenyCacheHits() != hits {
		t.Fatalf("a request of one of the zones ran %d scripts and hit the cache %d times, want Redis to decide it", n, s.DenyCacheHits()-hits)
	}
	var _ storage.Limiter = fast
}

// TestDenyCacheBanEndsAtTheBan: a banned request is cached until its ban
// ends, not for its whole Wait, which also covers its rate (a rate of
// 1/h behind a ban of 300ms): when the ban ends, Redis decides again (and
// counts the rate's rejection as a strike).
func TestDenyCacheBanEndsAtTheBan(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := cachedStore(c)
	defer s.Close()
	banL, err := algorithms.NewBan(1, time.Hour, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ban := zoneOf(s, "dban", banL)
	rate := zoneOf(s, "drate", mustLimit(t, algorithms.FixedWindow, 1, time.Hour, 0, 0))
	reqs := []Request{{Zone: ban, Key: "k"}, {Zone: rate, Key: "k", Cost: 1000, Strike: 1}}
	now := epoch - epoch%(3600*sec)
	s.TakeAll(context.Background(), now, reqs)
	if ds, r, _ := s.TakeAll(context.Background(), now+1, reqs); r != 0 || ds[0].Allowed {
		t.Fatalf("second: rejected %d, %+v; want the ban it starts", r, ds)
	}
	ds, r, _ := s.TakeAll(context.Background(), now+2, reqs) // banned, cached
	if r != 0 || ds[0].Reset != 300*ms-1 || ds[0].Wait != 3600*sec-2 {
		t.Fatalf("banned: rejected %d, %+v; want Reset the ban's 299.999ms and Wait the rate's 3599.999998s", r, ds)
	}
	before := scriptCalls(t, c)
	s.TakeAll(context.Background(), now+300*ms, reqs) // the ban's last µs
	if n := scriptCalls(t, c) - before; n != 0 {
		t.Fatalf("within the ban: %d scripts, want 0 (cached)", n)
	}
	ds, r, _ = s.TakeAll(context.Background(), now+300*ms+1, reqs)
	if n := scriptCalls(t, c) - before; n != 1 {
		t.Fatalf("after the ban: %d scripts, want 1 (Redis decides)", n)
	}
	if r != 0 || ds[0].Reset != 300*ms {
		t.Fatalf("after the ban: rejected %d, %+v; want a new ban of 300ms (the rate's rejection struck)", r, ds)
	}
}

// TestDecideReportsWhoDecided: Decide tells a decision Redis made from one
// the deny cache answered with an earlier decision of Redis's.
func TestDecideReportsWhoDecided(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	for _, cache := range []bool{false, true} {
		s := newTestStore(c)
		if cache {
			s = cachedStore(c)
		}
		zl := zoneOf(s, "who", mustLimit(t, algorithms.TokenBucket, 1, time.Hour, 0, 0))
		reqs := []Request{{Zone: zl, Key: "k", Cost: 1000}}
		for i, want := range []struct {
			rejected int
			decided  bool
		}{{-1, true}, {0, true}, {0, !cache}} {
			v, err := s.Decide(context.Background(), epoch, reqs)
			r, decided := v.Rejected, v.Decided
			if err != nil || r != want.rejected || decided != want.decided {
				t.Fatalf("cache %v, request %d: rejected %d, decided %v, %v; want %d, %v", cache, i, r, decided, err, want.rejected, want.decided)
			}
		}
		s.Close()
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOnReset: a reset on one instance calls, on another, the hooks of
// that zone with the resolved key, whatever bytes the key holds; not the
// hooks of another zone, nor one that was stopped.
func TestOnReset(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	a, b := cachedStore(c), cachedStore(c)
	defer a.Close()
	defer b.Close()
	l := mustLimit(t, algorithms.TokenBucket, 1, time.Hour, 0, 0)
	za, zb, other := zoneOf(a, "heard", l), zoneOf(b, "heard", l), zoneOf(b, "heard2", l)
	heard := make(chan string, 16)
	stop := a.OnReset(za, func(key string, _ int64) { heard <- key })
	a.OnReset(zoneOf(a, "heard2", l), func(key string, _ int64) { heard <- "heard2: " + key })
	if stop := b.OnReset(za, func(string, int64) { t.Error("a hook for another store's zone was called") }); stop == nil {
		t.Fatal("OnReset returned no stop")
	}
	for {
		n, err := c.PubSubNumSub(context.Background(), a.prefix+ResetChannel).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n[a.prefix+ResetChannel] >= 2 {
			break // a and b listen
		}
		time.Sleep(10 * time.Millisecond)
	}
	next := func() string {
		t.Helper()
		select {
		case key := <-heard:
			return key
		case <-time.After(10 * time.Second):
			t.Fatal("no hook was called 10s after a reset")
			return ""
		}
	}
	for _, key := range []string{"k", "a}:{b", "", "12:x}y", strings.Repeat("z", 200)} {
		if _, err := zb.Reset(context.Background(), key, 0); err != nil {
			t.Fatal(err)
		}
		if got := next(); got != key {
			t.Fatalf("reset of %q on b: a's hook got %q", key, got)
		}
	}
	stop()
	// Resets are heard in order: had the stopped hook been called for
	// the first, it would have been before the second zone's.
	for _, z := range []storage.Limiter{zb, other} {
		if _, err := z.Reset(context.Background(), "after", 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := next(); got != "heard2: after" {
		t.Fatalf("after stop: heard %q, want only the other zone's hook", got)
	}
}

func TestSplitKey(t *testing.T) {
	s := newTestStore(nil)
	for _, key := range []string{"", "k", "203.0.113.7", "a}:{b", "}", "{1:}"} {
		for _, zone := range []string{"z", "a:b", "per_ip"} {
			rkey := s.Key(zone, algorithms.SlidingLog, key)
			k, tail, ok := splitKey(s.prefix, rkey)
			if !ok || k != key || tail != keyTail(zone, algorithms.SlidingLog) {
				t.Errorf("splitKey(%q) = %q, %q, %v; want %q, %q", rkey, k, tail, ok, key, keyTail(zone, algorithms.SlidingLog))
			}
		}
	}
	for _, rkey := range []string{"", "other:{1:k}1:z:tb", s.prefix + "1:k}", s.prefix + "{x:k}1:z:tb", s.prefix + "{5:k}1:z:tb", s.prefix + "{1:kk1:z:tb", s.prefix + "{-1:k}"} {
		if k, tail, ok := splitKey(s.prefix, rkey); ok {
			t.Errorf("splitKey(%q) = %q, %q, true; want not a key", rkey, k, tail)
		}
	}
}
