package memory

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestFloodKeepsActiveKey is an attacker's try at a small max_keys: a
// client over its limit (rate 1/h, its one request spent) keeps asking,
// while a flood of one-time keys (minted from a header, say) pushes
// through a zone of max_keys 100 at 20 new keys between each of its
// requests, all within one second. Evicting the client would forget
// its spent quota and admit it again. A key used since the eviction last
// came round to it must stay: it is asked for again well before 100 new
// keys pass it.
func TestFloodKeepsActiveKey(t *testing.T) {
	s := newStore(t, algorithms.TokenBucket, 1, time.Hour, 100)
	now := 100 * sec
	if !take(t, s, "client", now).Allowed {
		t.Fatal("client's first request rejected")
	}
	for i := 0; i < 2000; i++ {
		now++
		take(t, s, "flood-"+strconv.Itoa(i), now)
		if i%20 == 19 {
			if take(t, s, "client", now).Allowed {
				t.Fatalf("client admitted again after %d flood keys (%d evictions): its spent quota was forgotten", i+1, s.Evictions())
			}
		}
	}
	if s.Evictions() < 1800 {
		t.Fatalf("%d evictions, want the flood evicted (at least 1800)", s.Evictions())
	}
	checkConsistent(t, s)
}

// TestFloodKeepsKeyRejectedByTakeAll is the same attack on a request with
// two zones: the client is rejected by the first (1/h) while the second
// would admit it, so TakeAll only checks the first zone's key and takes
// nowhere. That check is a use of the key all the same.
func TestFloodKeepsKeyRejectedByTakeAll(t *testing.T) {
	strict := newStore(t, algorithms.TokenBucket, 1, time.Hour, 100)
	loose := newStore(t, algorithms.TokenBucket, 1000, time.Second, 0)
	now := 100 * sec
	reqs := []Request{{Store: strict, Key: "client", Cost: algorithms.Milli}, {Store: loose, Key: "client", Cost: algorithms.Milli}}
	ds := make([]algorithms.Decision, 2)
	if got := TakeAll(now, reqs, ds); got != -1 {
		t.Fatalf("client's first request rejected by zone %d", got)
	}
	for i := 0; i < 2000; i++ {
		now++
		take(t, strict, "flood-"+strconv.Itoa(i), now)
		if i%20 == 19 {
			if got := TakeAll(now, reqs, ds); got != 0 {
				t.Fatalf("client's request after %d flood keys: TakeAll = %d, want 0 (rejected by the strict zone): its spent quota was forgotten", i+1, got)
			}
		}
	}
	checkConsistent(t, strict)
}

// banZone is a zone with a ban (after 1 strike, for banFor) and a token
// bucket of 1 per rateOf, the ban's store holding at most banKeys keys.
// take decides a request of key at now for cost on both, its decisions in
// ds, and returns TakeAll's answer.
func banZone(t *testing.T, banFor, rateOf time.Duration, banKeys int) (ban, rate *Store, ds []algorithms.Decision, take func(key string, now, cost int64) int) {
	t.Helper()
	banL, err := algorithms.NewBan(1, time.Hour, banFor)
	if err != nil {
		t.Fatal(err)
	}
	ban = New(storage.Zone{Name: "ban", Limit: banL, MaxKeys: banKeys})
	rate = New(storage.Zone{Name: "rate", Limit: mustLimit(t, algorithms.TokenBucket, 1, rateOf), MaxKeys: 1000})
	ds = make([]algorithms.Decision, 2)
	take = func(key string, now, cost int64) int {
		return TakeAll(now, []Request{{Store: ban, Key: key}, {Store: rate, Key: key, Cost: cost, Strike: 1}}, ds)
	}
	return ban, rate, ds, take
}

// TestBanHoldsOnlyStruckKeys: a ban's store takes a key at its first
// strike only, so a flood of keys the zone admits cannot evict a ban,
// however small max_keys: only a flood of rejected keys can.
func TestBanHoldsOnlyStruckKeys(t *testing.T) {
	ban, _, ds, take := banZone(t, time.Hour, time.Hour, 4)
	decide := func(key string) int { return take(key, sec, 1000) }
	decide("banned")
	if got := decide("banned"); got != 0 || ban.Len() != 1 {
		t.Fatalf("the second request of 1/h: rejected by %d, ban holds %d keys; want the ban it starts", got, ban.Len())
	}
	for i := range 500 {
		if got := decide(fmt.Sprint("once-", i)); got != -1 {
			t.Fatalf("one-time key %d rejected by %d", i, got)
		}
	}
	if ban.Len() != 1 || ban.Evictions() != 0 {
		t.Fatalf("after 500 admitted keys the ban's store holds %d keys, %d evicted; want only the ban", ban.Len(), ban.Evictions())
	}
	// A ban in force answers for the rate, which is not decided.
	if got := decide("banned"); got != 0 || !storage.Skipped(ds[1]) {
		t.Fatalf("the banned key after the flood: rejected by %d, %+v; want its ban in force", got, ds)
	}
	// Three more keys fill the store; each one after evicts the first
	// key the hand finds not used since it last passed, often the key
	// struck before it (a new key starts unused, and may land where the
	// hand is): the ban, used once more above, goes once the hand has
	// passed it twice, well within 200 struck keys.
	for i := range 200 {
		k := fmt.Sprint("struck-", i)
		decide(k)
		decide(k)
	}
	if decide("banned"); storage.Skipped(ds[1]) {
		t.Fatalf("after 200 other keys were struck in a ban store of 4 keys, the first ban still holds: %+v", ds)
	}
}

// TestBannedWaitCoversTheRate: a request refused by a ban in force is
// told to come back when its zone's rate would admit it too (the rate
// looked at, nothing charged). Before, its Wait was the ban's time left
// only: with a ban shorter than the rate's wait, a client that obeyed
// came back to the rate's rejection, a strike, and a new ban.
func TestBannedWaitCoversTheRate(t *testing.T) {
	for _, c := range []struct {
		name      string
		ban, rate time.Duration // the ban's length; the rate: 1 per rate
		cost      int64
		wait      int64 // the banned request's Wait, 1s into the ban
	}{
		{"a ban shorter than the rate's wait", time.Minute, time.Hour, 1000, 3599 * sec},
		{"a ban longer than the rate's wait", time.Hour, time.Minute, 1000, 3599 * sec},
		{"a cost the rate never admits", time.Minute, time.Hour, 2000, algorithms.Never},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, rate, ds, take := banZone(t, c.ban, c.rate, 10)
			decide := func(now, cost int64) int { return take("k", now, cost) }
			decide(sec, 1000)
			if got := decide(sec, 1000); got != 0 || ds[0].Allowed {
				t.Fatalf("the second request: rejected by %d, %+v; want the ban it starts", got, ds)
			}
			before, _, _ := rate.Peek(context.Background(), "k", 2*sec)
			if got := decide(2*sec, c.cost); got != 0 || !storage.Skipped(ds[1]) {
				t.Fatalf("1s into the ban: rejected by %d, %+v; want the ban's rejection alone", got, ds)
			}
			if ds[0].Wait != c.wait || ds[0].Reset != c.ban.Microseconds()-sec {
				t.Errorf("1s into the ban: Wait %d, Reset %d; want Wait %d (until the ban and the rate admit) and Reset %d (the ban's end)",
					ds[0].Wait, ds[0].Reset, c.wait, c.ban.Microseconds()-sec)
			}
			if after, _, _ := rate.Peek(context.Background(), "k", 2*sec); after != before {
				t.Errorf("the rate's state moved: %+v, was %+v", after, before)
			}
		})
	}
}
