package memory

import (
	"strconv"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
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
