package tollgate

import (
	"fmt"
	"net/http"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// leasedZone is the rate_limit block of leasedInstances' zone: the
// same zone (name, key, storage) in the test's Caddy and in a child's.
func leasedZone(addr, zone string, pool int) string {
	return fmt.Sprintf(`
		rate_limit {
			zone leased {
				key {http.request.header.X-Client}
				%s
			}
			storage redis {
				addresses %s
				functions off
				pool_size %d
				timeout `+testTimeout+`
			}
		}
		respond "ok"`, zone, addr, pool)
}

// startLeasedChild starts a child Caddy process (the test binary, see
// TestMain) serving the zone on a free port, and returns its URL and the
// process, killed at the end of the test if still alive.
func startLeasedChild(t *testing.T, addr, zone string) (string, *exec.Cmd) {
	t.Helper()
	url, child := startChildCaddy(t, leasedZone(addr, zone, 19))
	waitFor(t, "the child Caddy", func() bool {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-Client", "probe") // another key: the test's stays untouched
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return url, child
}

// killedLoad is what killMidRun saw.
type killedLoad struct {
	admitted      int64 // 200s from all three instances
	child         int64 // of which the child's, before it was killed
	firstSend     time.Time
	lastRecv      time.Time
	liveRequests  int64 // requests the two live instances answered
	liveAnswerBad int64 // live answers other than 200/429, or failed
}

// killMidRun hammers key from clients goroutines spread over the two
// in-process instances at live and the child at childURL. Once the
// child has admitted killAt requests, it is SIGKILLed while its clients
// still send (it holds a lease: a hot key's requests take a new one as
// the last is spent). The live clients go on until more() says stop;
// the child's stop at their first error.
func killMidRun(t *testing.T, tester *caddytest.Tester, child *exec.Cmd, childURL string, live []string, key string, clients int, killAt int64, more func(liveSent, inRow int, admitted int64) bool) killedLoad {
	t.Helper()
	var l killedLoad
	var ok, childOK, liveN, bad atomic.Int64
	var liveLeft atomic.Int64 // live clients still sending
	liveLeft.Store(int64(clients - clients/3))
	var mu sync.Mutex
	killed := make(chan struct{})
	var killOnce sync.Once
	kill := func() {
		killOnce.Do(func() {
			// Closed first: another child client's request may fail
			// as soon as the signal lands, and must find it closed.
			close(killed)
			if err := child.Process.Kill(); err != nil { // SIGKILL
				t.Error(err)
			}
		})
	}
	l.firstSend = time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			isChild := c%3 == 2
			url := childURL
			if !isChild {
				url = live[c%3]
			}
			if !isChild {
				defer liveLeft.Add(-1)
			}
			for sent, inRow := 0, 0; ; sent++ {
				switch {
				case !isChild && !more(sent, inRow, ok.Load()):
					return
				case isChild && (inRow >= 40 || liveLeft.Load() == 0):
					return // never killed: reported below
				}
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Client", key)
				resp, err := tester.Client.Do(req)
				recv := time.Now()
				if isChild {
					if err != nil {
						select {
						case <-killed:
						default:
							t.Errorf("the child failed before it was killed: %v", err)
						}
						return
					}
					resp.Body.Close()
					inRow++
					if resp.StatusCode == 200 {
						inRow = 0
						ok.Add(1)
						if childOK.Add(1) >= killAt {
							kill()
						}
					}
					continue
				}
				mu.Lock()
				if recv.After(l.lastRecv) {
					l.lastRecv = recv
				}
				mu.Unlock()
				if err != nil {
					bad.Add(1)
					return
				}
				resp.Body.Close()
				liveN.Add(1)
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
					inRow = 0
				case 429:
					inRow++
				default:
					bad.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-killed:
	default:
		t.Fatalf("the child admitted %d, never %d: it was not killed mid-run", childOK.Load(), killAt)
	}
	_ = child.Wait()
	l.admitted, l.child, l.liveRequests, l.liveAnswerBad = ok.Load(), childOK.Load(), liveN.Load(), bad.Load()
	return l
}

// leasedPair is two in-process Caddy sites on the zone, on free ports
// (not 9081-9083: a child process and a suite running elsewhere must not
// share them), and their URLs.
func leasedPair(t *testing.T, addr, zone string) (string, []string) {
	cfg := withGlobal("metrics")
	var urls []string
	for i := 1; i <= 2; i++ {
		port := redistest.FreePort(t)
		cfg += fmt.Sprintf("\n\thttp://localhost:%d {%s\n\t}", port, leasedZone(addr, zone, 16+i))
		urls = append(urls, fmt.Sprintf("http://localhost:%d/", port))
	}
	return cfg, urls
}

// TestLeasesKilledInstanceThroughCaddy: three Caddy instances on one
// real redis-server hammer one fixed_window key (leases on by default),
// one of them a child process SIGKILLed mid-run while it holds a lease.
// Never over the limit (on Redis and in what the clients were admitted);
// once the two live instances have been refused, rounds apart, until a
// round admits nothing, what the killed instance took with it (N minus
// all admitted) is within the bound docs/redis.md states: its lease, at
// most 1/8 of what the key had left when it was taken, plus the requests
// its clients had in flight (decided on Redis, unanswered).
func TestLeasesKilledInstanceThroughCaddy(t *testing.T) {
	const n, clients = 6000, 24
	srv := redistest.Start(t)
	c := srv.Client()
	zone := fmt.Sprintf("algorithm fixed_window\n\t\t\t\tevents %d\n\t\t\t\twindow 1h", n)
	childURL, child := startLeasedChild(t, srv.Addr, zone)
	tester := caddytest.NewTester(t)
	cfg, live := leasedPair(t, srv.Addr, zone)
	tester.InitServer(cfg, "caddyfile")
	const key = "killed"
	rkey := redisstore.New(c, redisstore.DefaultPrefix).Key("leased", algorithms.FixedWindow, key)
	hour := func() int64 { return time.Now().Unix() / 3600 }
	start := hour()
	decisions0 := scrape(t)["caddy_http_rate_limit_lease_decisions_total"]

	// Killed once it has admitted a sixth of the limit: the key is hot on
	// it, far from the limit, so it leases.
	l := killMidRun(t, tester, child, childURL, live, key, clients, n/6, func(_, inRow int, admitted int64) bool {
		return inRow < 40 && admitted <= n+n/2 // well over: the test fails, and ends
	})
	if l.liveAnswerBad != 0 {
		t.Errorf("%d live requests failed or got a status other than 200/429", l.liveAnswerBad)
	}
	admitted := l.admitted
	t.Logf("the child admitted %d before the kill; %d in all in the first round", l.child, admitted)
	if held := windowCount(t, c, rkey); held > n || admitted > n {
		skipIfHourEnded(t, start, hour())
		t.Fatalf("Redis counts %d, admitted %d: more than the limit %d", held, admitted, n)
	}
	// Rounds on the live instances, a deny cache's hold apart (their
	// leases come back within 125 ms of quiet), until one admits nothing.
	for round := 1; ; round++ {
		if round == 10 {
			t.Fatalf("still admitting after 10 rounds: %d of %d", admitted, n)
		}
		time.Sleep(time.Duration(redisstore.DenyCacheFor) * time.Microsecond)
		var got int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range 2 * clients / 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// untilRefused's loop, on the live instances only.
				n := liveUntilRefused(t, tester, live[i%2], key, 40, n/8)
				mu.Lock()
				got += n
				mu.Unlock()
			}()
		}
		wg.Wait()
		admitted += got
		held := windowCount(t, c, rkey)
		t.Logf("round %d: admitted %d (%d in all); Redis counts %d", round, got, admitted, held)
		if held > n || admitted > n {
			skipIfHourEnded(t, start, hour())
			t.Fatalf("round %d: Redis counts %d, admitted %d: more than the limit %d", round, held, admitted, n)
		}
		if got == 0 {
			break
		}
	}
	skipIfHourEnded(t, start, hour())
	fromLeases := scrape(t)["caddy_http_rate_limit_lease_decisions_total"] - decisions0
	loss := n - admitted
	bound := int64(n/8 + clients/3)
	t.Logf("admitted %d of %d: the killed instance took %d with it (bound %d: 1/8 of %d, and %d in flight); %v live decisions from leases",
		admitted, n, loss, bound, n, clients/3, fromLeases)
	if admitted > n {
		t.Fatalf("admitted %d, more than the limit %d", admitted, n)
	}
	if loss > bound {
		t.Errorf("the killed instance took %d with it, more than its lease's bound %d", loss, bound)
	}
	if loss == 0 {
		t.Error("the killed instance took nothing with it: it held no lease, the test tests nothing")
	}
	if fromLeases == 0 {
		t.Error("no live decision from a lease: the test tests nothing")
	}
}

// skipIfHourEnded skips the test if the window (an hour) it counts in
// ended during it: two windows' counts are not one limit.
func skipIfHourEnded(t *testing.T, start, now int64) {
	t.Helper()
	if now != start {
		t.Skip("the hour ended during the test")
	}
}

// liveUntilRefused sends requests for key to url until refused refused
// times in a row, or max admitted, and returns the count admitted.
func liveUntilRefused(t *testing.T, tester *caddytest.Tester, url, key string, refused int, max int64) int64 {
	var ok int64
	for inRow := 0; inRow < refused && ok < max; {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-Client", key)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Error(err)
			return ok
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			ok++
			inRow = 0
		case 429:
			inRow++
		default:
			t.Errorf("%s: status %d", url, resp.StatusCode)
			return ok
		}
	}
	return ok
}

// TestLeasedBucketKilledInstanceThroughCaddy: TestLeasedBucketThroughCaddy
// with one of the three instances a child process, SIGKILLed mid-run
// while it holds a lease: never more than burst + rate x t over the
// whole run, t from the first request sent to the last answer.
func TestLeasedBucketKilledInstanceThroughCaddy(t *testing.T) {
	const rate, burst, clients = 200, 3000, 24
	srv := redistest.Start(t)
	zone := fmt.Sprintf("rate %d/s\n\t\t\t\tburst %d", rate, burst)
	childURL, child := startLeasedChild(t, srv.Addr, zone)
	tester := caddytest.NewTester(t)
	cfg, live := leasedPair(t, srv.Addr, zone)
	tester.InitServer(cfg, "caddyfile")
	decisions0 := scrape(t)["caddy_http_rate_limit_lease_decisions_total"]
	// The child is killed once it has admitted 500 (a sixth of the burst,
	// the bucket still deep enough to lease); each live client sends 400
	// requests, more than the rate refills: the bucket runs dry.
	l := killMidRun(t, tester, child, childURL, live, "bucket-killed", clients, 500, func(sent, _ int, _ int64) bool { return sent < 400 })
	fromLeases := scrape(t)["caddy_http_rate_limit_lease_decisions_total"] - decisions0
	upper := burst + rate*l.lastRecv.Sub(l.firstSend).Seconds()
	t.Logf("admitted %d (%d by the child before the kill), B + r*T at most %.1f; %v live decisions from leases",
		l.admitted, l.child, upper, fromLeases)
	if l.liveAnswerBad != 0 {
		t.Errorf("%d live requests failed or got a status other than 200/429", l.liveAnswerBad)
	}
	if float64(l.admitted) > upper+1 {
		t.Errorf("admitted %d, above B + r*T = %.1f: the instances over-admitted", l.admitted, upper)
	}
	if fromLeases == 0 {
		t.Error("no live decision from a lease: the test tests nothing")
	}
}
