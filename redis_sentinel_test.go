package tollgate

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// TestRedisSentinelFailover: three instances on a Sentinel-managed Redis
// (a master, a replica, three sentinels). Exact while the master lives;
// the master is killed under load and the sentinels promote the replica;
// no request gets a 5xx meanwhile (each zone's on_storage_error, local,
// holds each instance to its own limit), and once the instances follow
// the new master they are exact again. What the failover admits over b +
// r*t is logged: it is this instance-local allowance plus what the
// replica had not yet received when the master died (asynchronous
// replication can lose the last writes).
func TestRedisSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	tester := caddytest.NewTester(t)
	tester.InitServer(threeInstances("addresses "+strings.Join(s.Sentinels, " ")+"\n\t\t\t\tsentinel_master "+s.Name), "caddyfile")

	checkExact(t, hammer(t, tester, "before", 24, 2*time.Second))

	done := make(chan load)
	go func() { done <- hammer(t, tester, "failover", 24, 8*time.Second) }()
	time.Sleep(time.Second)
	old := s.MasterAddr(t)
	s.Master.Stop() // killed: the replica may miss its last writes
	during := <-done
	if during.other != 0 {
		t.Errorf("%d requests failed or got a 5xx during the failover, want none", during.other)
	}
	const burst, rate = 50, 100.0
	upper := burst + rate*during.lastRecv.Sub(during.firstSend).Seconds()
	t.Logf("failover: admitted %d in %.1fs, b + r*t = %.1f (%.2fx)", during.admitted,
		during.lastRecv.Sub(during.firstSend).Seconds(), upper, float64(during.admitted)/upper)

	deadline := time.Now().Add(20 * time.Second)
	for s.MasterAddr(t) == old {
		if time.Now().After(deadline) {
			t.Fatal("the sentinels did not promote the replica")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the instances' breakers close and clients follow
	checkExact(t, hammer(t, tester, "after", 24, 2*time.Second))
}
