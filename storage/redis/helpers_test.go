package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// testSlack is the TTL slack of stores driven by the caller's clock: keys
// must outlive the test however long it holds its clock still.
const testSlack = 10 * time.Minute

// newTestStore returns a store whose scripts use the now the tests pass
// (instead of the server's TIME) and whose keys live testSlack longer than
// their state needs.
func newTestStore(c Client) *Store {
	s := New(c, "test:")
	s.callerClock = true
	s.ttlSlack = testSlack.Milliseconds()
	return s
}

func mustLimit(t testing.TB, kind algorithms.Kind, events int64, window time.Duration, burst int64, maxDelay time.Duration) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewLimit(kind, events, window, burst, maxDelay)
	if err != nil {
		t.Fatalf("NewLimit(%s, %d, %s, %d, %s): %v", kind, events, window, burst, maxDelay, err)
	}
	return l
}

func zoneOf(s *Store, name string, l algorithms.Limit) storage.Limiter {
	return s.Zone(storage.Zone{Name: name, Limit: l})
}

// pttl returns a key's remaining TTL in ms: -2 for no key, -1 for no TTL.
func pttl(t testing.TB, c goredis.UniversalClient, key string) int64 {
	t.Helper()
	v, err := c.Do(context.Background(), "PTTL", key).Int64()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return v
}

func exists(t testing.TB, c goredis.UniversalClient, key string) bool {
	t.Helper()
	n, err := c.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

// copyState returns a deep copy of s, so that a reference Peek cannot
// change the state the later steps see (the Redis Peek writes nothing).
func copyState(s algorithms.State) algorithms.State {
	if s.Log != nil {
		s.Log = append([]int64(nil), s.Log...)
	}
	return s
}
