package tollgate

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// dialOutlastsTimeout: as TestSettlementKeptThroughOutage, with a
// timeout (250ms) shorter than go-redis's retries of a refused dial (5
// tries, 100ms apart; the default timeout is 100ms), and pipeline on or
// off. Two successful logins hold both events of a key; Redis (keeping
// its data in an append-only file) is killed; they end while it is down,
// and their settlements fail with the call's deadline, not with the
// refused dial: no connection was made, so they are kept, and reach Redis
// once it is back. Redis stays down for outage, over which the kept
// settlements are tried again (every 250ms).
func dialOutlastsTimeout(t *testing.T, pipeline string, outage time.Duration) {
	srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "always")
	up := newLoginUpstream(t, true)
	tester := caddytest.NewTester(t)
	site := owedSite(up.addr(), srv.Addr, "250ms", "algorithm fixed_window\n\t\t\t\ton_storage_error deny")
	site = strings.Replace(site, "timeout 250ms", "timeout 250ms\n\t\t\t\tpipeline "+pipeline, 1)
	tester.InitServer(site, "caddyfile")
	wait := holdLogins(t, tester, up, "dial", 2)
	srv.Stop()
	close(up.release) // and every login after
	wait()
	time.Sleep(outage)
	srv.Restart() // from its append-only file: both reservations held
	waitFor(t, "the kept give-backs to reach Redis (both events free)", bothFree("dial"))
	if got, want := statuses(t, tester, 2, []string{"/login"}, "X-Client: dial"), "200 200 "; got != want {
		t.Fatalf("after Redis came back: %q, want %q", got, want)
	}
}

// TestSettlementKeptWhenTheDialOutlastsTheTimeout: pipeline off, each
// settlement its own call. Before, a settlement that failed with its
// deadline was taken for a call that may have run, and dropped: the key
// stayed spent (the interaction test's settle steps found it: a kill
// while logins were held).
func TestSettlementKeptWhenTheDialOutlastsTheTimeout(t *testing.T) {
	dialOutlastsTimeout(t, "off", 0)
}

// TestKeptSettlementRetriedWhenTheDialOutlastsTheTimeout: the same, Redis
// down for a second: the kept settlements are tried again while it is
// down, and those tries fail with their deadline too. Before, such a try
// was taken for a call that may have run, and the settlement dropped
// ("settlements Redis did not hear dropped").
func TestKeptSettlementRetriedWhenTheDialOutlastsTheTimeout(t *testing.T) {
	dialOutlastsTimeout(t, "off", time.Second)
}

// TestSettlementKeptWhenTheDialOutlastsTheTimeoutPipelined: pipeline on
// (the default), the two settlements at once: the second waits for a
// batch, whose pipeline waits for the same dial, and its deadline ends
// first. It was dropped: the batcher answered its caller at once with
// ErrInFlight (the batch may have been sent). A give-back or settlement
// now waits for its batch's verdict, which says the batch never got a
// connection, and is kept.
func TestSettlementKeptWhenTheDialOutlastsTheTimeoutPipelined(t *testing.T) {
	dialOutlastsTimeout(t, "on", 0)
}
