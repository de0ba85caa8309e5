package memory

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

func TestPoolKey(t *testing.T) {
	limit := func(events int64, window time.Duration) algorithms.Limit {
		l, err := algorithms.NewLimit(algorithms.TokenBucket, events, window, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	conc := func(lease time.Duration) algorithms.Limit {
		l, err := algorithms.NewConcurrency(4, lease)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a := storage.Zone{Name: "z", Limit: limit(10, time.Minute), MaxKeys: 100}
	b := a
	b.Limit = limit(11, time.Minute)
	if PoolKey(a, false) == PoolKey(b, false) {
		t.Errorf("a zone whose limit changes keeps its key %q, want a fresh one", PoolKey(a, false))
	}
	if k := PoolKey(a, true); k == PoolKey(a, false) || !strings.HasPrefix(k, "local:") {
		t.Errorf("local copy's key %q, want it apart from the memory zone's", k)
	}
	c1 := storage.Zone{Name: "z", Limit: conc(time.Second), MaxKeys: 10}
	c2 := storage.Zone{Name: "z", Limit: conc(time.Minute), MaxKeys: 20}
	if PoolKey(c1, false) != PoolKey(c2, false) {
		t.Errorf("concurrency keys %q and %q differ, want requests in flight kept across a lease or max_keys change", PoolKey(c1, false), PoolKey(c2, false))
	}
}
