package tollgate

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	goredis "github.com/redis/go-redis/v9"

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
	promoted := goredis.NewClient(&goredis.Options{Addr: s.MasterAddr(t)})
	defer promoted.Close()
	fcalls, scripts := redistest.Calls(t, promoted, "fcall"), redistest.Calls(t, promoted, "eval")+redistest.Calls(t, promoted, "evalsha")
	checkExact(t, hammer(t, tester, "after", 24, 2*time.Second))
	// The function library came over with replication: the promoted
	// replica runs every decision by FCALL, with no EVAL for a missing
	// function.
	fcalls, scripts = redistest.Calls(t, promoted, "fcall")-fcalls, redistest.Calls(t, promoted, "eval")+redistest.Calls(t, promoted, "evalsha")-scripts
	if fcalls == 0 || scripts != 0 {
		t.Errorf("after the failover, the new primary ran %d FCALLs and %d EVALs and EVALSHAs; want FCALLs only", fcalls, scripts)
	}
}
