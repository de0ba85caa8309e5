package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

var allKinds = []algorithms.Kind{
	algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow,
	algorithms.SlidingLog, algorithms.FixedWindow, algorithms.LeakyBucket,
}

func TestKey(t *testing.T) {
	s := New(nil, "p:")
	tests := []struct {
		zone string
		kind algorithms.Kind
		key  string
		want string
	}{
		{"api", algorithms.TokenBucket, "203.0.113.7", "p:{11:203.0.113.7}3:api:tb"},
		{"a:b", algorithms.GCRA, "c", "p:{1:c}3:a:b:gc"},
		{"a", algorithms.GCRA, "b:c", "p:{3:b:c}1:a:gc"},
		{"", algorithms.SlidingLog, "", "p:{0:}0::sl"},
		{"z", algorithms.LeakyBucket, "k", "p:{1:k}1:z:lb"},
		{"z", algorithms.SlidingWindow, "}{", "p:{2:}{}1:z:sw"},
		{"{z}", algorithms.FixedWindow, "{k}", "p:{3:{k}}3:{z}:fw"},
	}
	for _, tt := range tests {
		if got := s.Key(tt.zone, tt.kind, tt.key); got != tt.want {
			t.Errorf("Key(%q, %s, %q) = %q, want %q", tt.zone, tt.kind, tt.key, got, tt.want)
		}
	}
}

// TestKeyUnambiguous builds the keys of zones and resolved keys made of
// the bytes that could confuse a layout ('{', '}', ':', digits), and wants
// no two alike, and the hash tag of each to depend on the resolved key
// alone.
func TestKeyUnambiguous(t *testing.T) {
	alphabet := []string{"a", ":", "{", "}", "1"}
	words := []string{""}
	for n := 0; n < 3; n++ {
		for _, w := range words {
			if len(w) == n {
				for _, c := range alphabet {
					words = append(words, w+c)
				}
			}
		}
	}
	type owner struct {
		zone, key string
		kind      algorithms.Kind
	}
	for _, prefix := range []string{"p:", "", "{", "}", "{tag}", "3:"} {
		s := New(nil, prefix)
		seen := make(map[string]owner, 2*len(words)*len(words))
		for _, zone := range words {
			for _, key := range words {
				for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA} {
					k := s.Key(zone, kind, key)
					if prev, dup := seen[k]; dup {
						t.Fatalf("prefix %q: Key(%q, %s, %q) = %q, the key of %+v too", prefix, zone, kind, key, k, prev)
					}
					seen[k] = owner{zone, key, kind}
					if want := hashTag(s.Key("other", algorithms.SlidingLog, key)); hashTag(k) != want {
						t.Fatalf("prefix %q: Key(%q, %s, %q) = %q has hash tag %q; another zone has %q", prefix, zone, kind, key, k, hashTag(k), want)
					}
				}
			}
		}
	}
}

// TestHashTag checks the hash tag rules of the Redis Cluster
// specification; TestTakeAllCluster checks slot against CLUSTER KEYSLOT.
func TestHashTag(t *testing.T) {
	tests := []struct{ key, tag string }{
		{"foo", "foo"},
		{"{user1000}.following", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"},
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
		{"{", "{"},
		{"}{", "}{"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := hashTag(tt.key); got != tt.tag {
			t.Errorf("hashTag(%q) = %q, want %q", tt.key, got, tt.tag)
		}
	}
	// The CRC-16/XMODEM check value.
	if got := slot("123456789"); got != 0x31c3 {
		t.Errorf("slot(\"123456789\") = %#x, want 0x31c3", got)
	}
}

// TestServerClock runs the production path: the scripts read Redis TIME
// and the now passed in is ignored.
func TestServerClock(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	zl := zoneOf(s, "clock", mustLimit(t, algorithms.TokenBucket, 3, time.Minute, 0, 0))
	ctx := context.Background()
	for i := int64(0); i < 3; i++ {
		d, err := zl.Take(ctx, "k", 0, algorithms.Milli)
		if err != nil {
			t.Fatalf("take %d: %v", i+1, err)
		}
		if !d.Allowed || d.Remaining != 2-i {
			t.Fatalf("take %d = %+v, want allowed with %d remaining", i+1, d, 2-i)
		}
	}
	// Were now honoured, 2^50 µs later the bucket would be full again.
	d, err := zl.Take(ctx, "k", 1<<50, algorithms.Milli)
	if err != nil {
		t.Fatalf("take 4: %v", err)
	}
	sec := time.Second.Microseconds()
	if d.Allowed || d.Wait <= 19*sec || d.Wait > 20*sec {
		t.Fatalf("take 4 = %+v, want rejected with Wait about 20s", d)
	}
	if d.Reset <= 59*sec || d.Reset > 60*sec {
		t.Errorf("take 4: Reset = %d, want about 60s", d.Reset)
	}

	// A window algorithm's windows are aligned on the server's clock.
	fw := zoneOf(s, "clock", mustLimit(t, algorithms.FixedWindow, 2, time.Hour, 0, 0))
	d, err = fw.Take(ctx, "k", 0, algorithms.Milli)
	if err != nil {
		t.Fatalf("fixed_window take: %v", err)
	}
	tm, err := srv.Client().Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	toNext := time.Hour - tm.Sub(tm.Truncate(time.Hour))
	if got := time.Duration(d.Reset) * time.Microsecond; !d.Allowed || got > toNext+time.Second || got < toNext-time.Second {
		t.Errorf("fixed_window take = %+v, want allowed with Reset about %s", d, toNext)
	}
}

// TestTTL checks, on the server's clock, that every algorithm's key
// expires no sooner than its state is fresh, and then disappears.
func TestTTL(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := New(c, DefaultPrefix)
	ctx := context.Background()
	window := 200 * time.Millisecond
	for _, kind := range allKinds {
		t.Run(kind.String(), func(t *testing.T) {
			var maxDelay time.Duration
			if kind == algorithms.LeakyBucket {
				maxDelay = window
			}
			l := mustLimit(t, kind, 2, window, 0, maxDelay)
			zl := zoneOf(s, "ttl", l)
			key := s.Key("ttl", kind, "k")
			var last algorithms.Decision
			for i := 0; i < 3; i++ {
				start := time.Now()
				d, err := zl.Take(ctx, "k", 0, algorithms.Milli)
				if err != nil {
					t.Fatalf("take: %v", err)
				}
				want := (d.Reset + 999) / 1000 // ms, rounded up
				got := pttl(t, c, key)
				// The TTL runs down from the script's run until PTTL's. A
				// take that changes nothing (a rejection) keeps the TTL an
				// earlier take set for the same instant of freshness: rounded
				// up there, and PTTL counts whole ms, so it may read 1ms above
				// this take's rounding, never below the state's freshness.
				elapsed := time.Since(start).Milliseconds()
				if d.Reset > 0 && (got <= 0 || got > want+1 || got < want-elapsed-1) {
					t.Errorf("take %d = %+v: PTTL = %dms, want %dms (set to Reset rounded up)", i+1, d, got, want)
				}
				last = d
			}
			if kind == algorithms.LeakyBucket && last.Delay == 0 {
				t.Errorf("leaky_bucket: third take = %+v, want it delayed", last)
			}
			time.Sleep(time.Duration(last.Reset)*time.Microsecond + 20*time.Millisecond)
			if exists(t, c, key) {
				t.Errorf("key %s still exists %s after its Reset", key, time.Duration(last.Reset)*time.Microsecond)
			}
			if _, ok, err := zl.Peek(ctx, "k", 0); err != nil || ok {
				t.Errorf("Peek after expiry: ok = %v, %v; want false", ok, err)
			}
		})
	}
}

// TestFreshStateNotStored checks that a write that leaves the state fresh
// deletes the key instead of storing it.
func TestFreshStateNotStored(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := New(c, DefaultPrefix)
	ctx := context.Background()
	for _, kind := range allKinds {
		t.Run(kind.String(), func(t *testing.T) {
			zl := zoneOf(s, "fresh", mustLimit(t, kind, 5, time.Hour, 0, 0))
			key := s.Key("fresh", kind, "k")
			if _, err := zl.Take(ctx, "k", 0, 0); err != nil {
				t.Fatalf("take 0: %v", err)
			}
			if exists(t, c, key) {
				t.Errorf("a take of cost 0 stored %s", key)
			}
			hour := func() int {
				tm, err := c.Time(ctx).Result()
				if err != nil {
					t.Fatalf("TIME: %v", err)
				}
				return tm.Hour()
			}
			before := hour()
			d, err := zl.Take(ctx, "k", 0, 2500)
			if err != nil {
				t.Fatalf("take: %v", err)
			}
			if !exists(t, c, key) {
				t.Fatalf("a take stored no %s", key)
			}
			if err := zl.Undo(ctx, "k", 0, 2500, d); err != nil {
				t.Fatalf("undo: %v", err)
			}
			// A window that rolled between take and undo keeps the cost
			// in its previous window.
			if exists(t, c, key) && hour() == before {
				t.Errorf("after undoing everything, %s still exists", key)
			}
			if err := zl.Undo(ctx, "absent", 0, 1000, d); err != nil {
				t.Fatalf("undo of an absent key: %v", err)
			}
			if exists(t, c, s.Key("fresh", kind, "absent")) {
				t.Errorf("undo of an absent key created it")
			}
		})
	}
}

func TestPeekAndReset(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	ctx := context.Background()
	for _, kind := range allKinds {
		t.Run(kind.String(), func(t *testing.T) {
			zl := zoneOf(s, "pr", mustLimit(t, kind, 3, time.Hour, 0, 0))
			if _, ok, err := zl.Peek(ctx, "k", 0); err != nil || ok {
				t.Fatalf("Peek(new key): ok = %v, %v; want false", ok, err)
			}
			if ok, err := zl.Reset(ctx, "k", 0); err != nil || ok {
				t.Fatalf("Reset(new key) = %v, %v; want false", ok, err)
			}
			for i := 0; i < 3; i++ {
				if d, err := zl.Take(ctx, "k", 0, 1000); err != nil || !d.Allowed {
					t.Fatalf("take %d = %+v, %v; want allowed", i+1, d, err)
				}
			}
			d, ok, err := zl.Peek(ctx, "k", 0)
			if err != nil || !ok || d.Allowed || d.Remaining != 0 || d.Wait <= 0 {
				t.Fatalf("Peek(full key) = %+v, %v, %v; want ok, rejected", d, ok, err)
			}
			// Peek charges nothing.
			if d2, _, _ := zl.Peek(ctx, "k", 0); d2.Allowed || d2.Remaining != 0 {
				t.Errorf("second Peek = %+v", d2)
			}
			if ok, err := zl.Reset(ctx, "k", 0); err != nil || !ok {
				t.Fatalf("Reset(full key) = %v, %v; want true", ok, err)
			}
			if d, err := zl.Take(ctx, "k", 0, 1000); err != nil || !d.Allowed || d.Remaining != 2 {
				t.Fatalf("take after Reset = %+v, %v; want allowed, 2 remaining", d, err)
			}
		})
	}
}

func TestIsolation(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	ctx := context.Background()
	one := mustLimit(t, algorithms.TokenBucket, 1, time.Hour, 0, 0)
	long := strings.Repeat("x", 1000)
	pairs := []struct{ zone, key string }{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "c"}, {"b", "c"}, {"a", "b"},
		{"a}", "{b"}, {"a", "}{b"}, {"", ""}, {"", ":"}, {":", ""},
		{"a", "{b}"}, {"{a}", "b"}, {"a", "1:b}"}, {"a", "b}1:a"}, {"b", "}1:a"},
		{"z", storage.BoundKey(long + "1")}, {"z", storage.BoundKey(long + "2")},
	}
	for _, p := range pairs {
		d, err := zoneOf(s, p.zone, one).Take(ctx, p.key, 0, 1000)
		if err != nil || !d.Allowed {
			t.Errorf("zone %q key %q: first take = %+v, %v; want allowed (isolated)", p.zone, p.key, d, err)
		}
	}
	for _, p := range pairs {
		d, err := zoneOf(s, p.zone, one).Take(ctx, p.key, 0, 1000)
		if err != nil || d.Allowed {
			t.Errorf("zone %q key %q: second take = %+v, %v; want rejected", p.zone, p.key, d, err)
		}
	}
	if k := s.Key("z", algorithms.TokenBucket, storage.BoundKey(long)); len(k) > 80 {
		t.Errorf("key of a long resolved key is %d bytes: %q", len(k), k)
	}
	// Another algorithm under the same zone name keeps its own state.
	d, err := zoneOf(s, "a", mustLimit(t, algorithms.SlidingLog, 1, time.Hour, 0, 0)).Take(ctx, "c", 0, 1000)
	if err != nil || !d.Allowed {
		t.Errorf("sliding_log zone a key c = %+v, %v; want allowed", d, err)
	}
}

// TestConcurrentTakes hammers one key from 64 goroutines: exactly Burst
// requests may pass.
func TestConcurrentTakes(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	const burst, goroutines, each = 100, 64, 10
	zl := zoneOf(s, "hammer", mustLimit(t, algorithms.TokenBucket, burst, time.Hour, 0, 0))
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				d, err := zl.Take(context.Background(), "k", 0, algorithms.Milli)
				if err != nil {
					failed.Add(1)
					continue
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d takes failed", failed.Load())
	}
	if got := admitted.Load(); got != burst {
		t.Errorf("admitted %d of %d, want exactly %d", got, goroutines*each, burst)
	}
}

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client()
	s := New(cc, DefaultPrefix)
	ctx := context.Background()
	slots := map[int64]bool{}
	thirds := map[int64]bool{}
	for _, kind := range allKinds {
		zl := zoneOf(s, "cl-"+kind.String(), mustLimit(t, kind, 2, time.Hour, 0, 0))
		for i := 0; i < 10; i++ {
			key := "client-" + strconv.Itoa(i)
			slot, err := cc.ClusterKeySlot(ctx, s.Key("cl-"+kind.String(), kind, key)).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT: %v", err)
			}
			slots[slot] = true
			thirds[slot*3/16384] = true
			for j := 0; j < 3; j++ {
				d, err := zl.Take(ctx, key, 0, algorithms.Milli)
				if err != nil {
					t.Fatalf("%s %s take %d: %v", kind, key, j+1, err)
				}
				if d.Allowed != (j < 2) {
					t.Fatalf("%s %s take %d = %+v, want allowed %v", kind, key, j+1, d, j < 2)
				}
			}
			if _, ok, err := zl.Peek(ctx, key, 0); err != nil || !ok {
				t.Fatalf("%s %s Peek: ok = %v, %v", kind, key, ok, err)
			}
			if ok, err := zl.Reset(ctx, key, 0); err != nil || !ok {
				t.Fatalf("%s %s Reset = %v, %v", kind, key, ok, err)
			}
		}
	}
	if len(thirds) < 3 {
		t.Errorf("keys hashed to %d slots, in %d of the 3 masters' ranges; want all 3", len(slots), len(thirds))
	}
}

// TestStoreFailures checks errors, deadlines and recovery when Redis is
// down, hangs, and comes back empty (its script cache too).
func TestStoreFailures(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	zl := zoneOf(s, "faults", mustLimit(t, algorithms.GCRA, 10, time.Second, 0, 0))
	timeout := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 100*time.Millisecond)
	}

	ctx, cancel := timeout()
	if _, err := zl.Take(ctx, "k", 0, 1000); err != nil {
		t.Fatalf("take: %v", err)
	}
	cancel()

	srv.Pause()
	ctx, cancel = timeout()
	start := time.Now()
	_, err := zl.Take(ctx, "k", 0, 1000)
	cancel()
	if err == nil || !strings.HasPrefix(err.Error(), `redis store: take "faults": `) {
		t.Errorf("take on a hung server: err = %v, want a wrapped error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("take on a hung server took %s, want about its 100ms deadline", d)
	}
	srv.Resume()

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := zl.Take(ctx, "k", 0, 1000); !errors.Is(err, context.Canceled) {
		t.Errorf("take with a canceled context: err = %v, want context.Canceled", err)
	}

	srv.Stop()
	ctx, cancel = timeout()
	if err := zl.Undo(ctx, "k", 0, 1000, algorithms.Decision{}); err == nil || !strings.HasPrefix(err.Error(), `redis store: undo "faults": `) {
		t.Errorf("undo on a stopped server: err = %v, want a wrapped error", err)
	}
	cancel()

	srv.Restart() // empty, without the scripts: EVALSHA fails with NOSCRIPT
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := zl.Take(ctx, "k", 0, 1000)
	if err != nil || !d.Allowed || d.Remaining != 9 {
		t.Errorf("take after restart = %+v, %v; want allowed, 9 remaining", d, err)
	}
}

// TestUndoHugeCost gives back a cost no Take could have charged (the
// largest CostMilli returns) for a take of the whole capacity: all of it
// is given back, without overflow.
func TestUndoHugeCost(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix)
	ctx := context.Background()
	huge, _ := algorithms.CostMilli(1e300)
	for _, kind := range allKinds {
		t.Run(kind.String(), func(t *testing.T) {
			zl := zoneOf(s, "huge", mustLimit(t, kind, 3, time.Hour, 0, 0))
			taken, err := zl.Take(ctx, "k", 0, 3*algorithms.Milli)
			if err != nil || !taken.Allowed {
				t.Fatalf("take: %+v, %v", taken, err)
			}
			if err := zl.Undo(ctx, "k", 0, huge, taken); err != nil {
				t.Fatalf("Undo(%d): %v", huge, err)
			}
			d, err := zl.Take(ctx, "k", 0, 3*algorithms.Milli)
			if err != nil || !d.Allowed {
				t.Errorf("take of the whole capacity after Undo(%d) = %+v, %v; want allowed", huge, d, err)
			}
		})
	}
}
