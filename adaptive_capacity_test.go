package tollgate

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
)

// fixedCapacity is an upstream of fixed capacity: a request waits for a
// free worker, then takes the service time. Its capacity can change.
type fixedCapacity struct {
	*httptest.Server
	service  time.Duration
	inFlight atomic.Int64 // requests at the upstream, waiting or served

	mu       sync.Mutex
	cond     *sync.Cond
	workers  int
	busy     int
	maxQueue int64
}

func newFixedCapacity(t *testing.T, workers int, service time.Duration) *fixedCapacity {
	u := &fixedCapacity{service: service, workers: workers}
	u.cond = sync.NewCond(&u.mu)
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.inFlight.Add(1)
		defer u.inFlight.Add(-1)
		u.mu.Lock()
		for u.busy >= u.workers {
			u.cond.Wait()
		}
		u.busy++
		u.mu.Unlock()
		time.Sleep(u.service)
		u.mu.Lock()
		u.busy--
		u.cond.Broadcast()
		u.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *fixedCapacity) setWorkers(n int) {
	u.mu.Lock()
	u.workers = n
	u.cond.Broadcast()
	u.mu.Unlock()
}

// loadSample is what the load saw over a span: the upstream's requests
// in flight (sampled), the admitted requests' latencies, and the count of
// answers by status.
type loadSample struct {
	inFlight  []int64
	latencies []time.Duration
	ok, shed  int
	span      time.Duration
}

func medianOf[T int64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := append([]T(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// loadRun drives clients against url: each sends a request, and after a
// refusal waits one service time. Samples are taken per span, named by the
// phase the caller sets.
type loadRun struct {
	mu      sync.Mutex
	phase   string
	samples map[string]*loadSample
	stop    chan struct{}
	wg      sync.WaitGroup
}

func startLoad(t *testing.T, url string, clients int, up *fixedCapacity) *loadRun {
	// A connection kept per client: caddytest's client keeps 2 idle
	// connections, so each of 256 clients would dial (and log) anew at
	// almost every request, work enough on 2 cores to lift the round
	// trips the controller reads.
	tr := &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	l := &loadRun{samples: map[string]*loadSample{}, stop: make(chan struct{})}
	l.setPhase("warmup")
	for i := 0; i < clients; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				resp, err := client.Get(url)
				if err != nil {
					time.Sleep(up.service)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				took := time.Since(start)
				l.mu.Lock()
				s := l.samples[l.phase]
				if resp.StatusCode == 200 {
					s.ok++
					s.latencies = append(s.latencies, took)
				} else {
					s.shed++
				}
				l.mu.Unlock()
				if resp.StatusCode != 200 {
					time.Sleep(up.service)
				}
			}
		}()
	}
	l.wg.Add(1)
	go func() { // the upstream's in flight, every 10 ms
		defer l.wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
				l.mu.Lock()
				s := l.samples[l.phase]
				s.inFlight = append(s.inFlight, up.inFlight.Load())
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(l.end)
	return l
}

var phaseStart sync.Map

func (l *loadRun) setPhase(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.samples[l.phase]; s != nil {
		v, _ := phaseStart.Load(l)
		s.span = time.Since(v.(time.Time))
	}
	l.phase = name
	l.samples[name] = &loadSample{}
	phaseStart.Store(l, time.Now())
}

func (l *loadRun) end() {
	select {
	case <-l.stop:
		return
	default:
	}
	l.setPhase("done")
	close(l.stop)
	l.wg.Wait()
}

func (l *loadRun) sample(name string) *loadSample {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.samples[name]
}

// followRealTime makes the tests' fake clock follow the real one, in
// steps of a millisecond, until the test ends: the adaptive controller
// learns round trips from it.
func followRealTime(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	from, start := fakeNow.Load(), time.Now()
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				fakeNow.Store(from + time.Since(start).Microseconds())
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// adaptiveLimit reads the zone's limit (its one key's) from the admin API.
func adaptiveLimit(t *testing.T, zone string) int64 {
	var zones []adminapi.ZoneInfo
	adminDo(t, "GET", "/rate_limit/zones", &zones)
	for _, z := range zones {
		if z.Zone == zone && z.Adaptive != nil {
			return z.Adaptive.Limit
		}
	}
	t.Fatalf("zones: no adaptive zone %q in %+v", zone, zones)
	return 0
}

// TestAdaptiveFindsCapacity: an upstream of C workers (C = 2, 4, 8 and
// 32) of a fixed service time, 8C clients. Behind a zone of concurrency
// adaptive with its defaults, from 10 s after the start, after a halving
// of the capacity and after its return, the upstream's in flight is
// within 0.7-1.6 C, the admitted requests' latency within 1.6 service
// times and the goodput at least 80% of the capacity (after the halving
// of C = 2, to one worker, only logged); the limit follows the halving
// within 10 s. Without the zone, the same load queues 8C deep
// at the upstream.
//
// It asserts latencies and goodput measured on the machine's clock: a
// timed test, run only when TOLLGATE_CAPACITY is set, alone (beside other
// tests a loaded machine adds its own latency, which the controller takes
// for queueing); the controller's properties are in the default suite on
// a simulated clock (algorithms/adaptive_sim_test.go).
func TestAdaptiveFindsCapacity(t *testing.T) {
	if os.Getenv("TOLLGATE_CAPACITY") == "" {
		t.Skip("a timed load run of 4 minutes: run it alone with TOLLGATE_CAPACITY=1 go test -run TestAdaptiveFindsCapacity -v . (TOLLGATE_TEST_ADMIN_PORT and TOLLGATE_CAPACITY_PORT move its ports)")
	}
	// The site's port: 9280, or TOLLGATE_CAPACITY_PORT, so that with
	// TOLLGATE_TEST_ADMIN_PORT the run needs no port of another test's.
	port := "9280"
	if p := os.Getenv("TOLLGATE_CAPACITY_PORT"); p != "" {
		port = p
	}
	url := "http://localhost:" + port + "/"
	// judged is how long each phase is measured, from its 10th second:
	// 200 answers at 2 workers, so that one probe window (half the limit
	// for a second or two) does not decide the goodput.
	const judged = 10 * time.Second
	// A service time well above what a loaded machine adds to a request
	// through Caddy, which the controller would take for queueing.
	const service = 100 * time.Millisecond
	site := func(up, zone string) string {
		return globalOptions + `
		http://localhost:` + port + ` {
			` + zone + `
			reverse_proxy ` + strings.TrimPrefix(up, "http://") + `
		}`
	}
	check := func(t *testing.T, what string, s *loadSample, workers int) {
		t.Helper()
		inFlight, lat := medianOf(s.inFlight), medianOf(s.latencies)
		goodput := float64(s.ok) / s.span.Seconds()
		capacity := float64(workers) / service.Seconds()
		t.Logf("%s: upstream in flight median %d (C=%d), admitted latency median %s (S=%s), goodput %.0f/s of %.0f (%.0f%%), %d shed",
			what, inFlight, workers, lat.Round(time.Millisecond), service, goodput, capacity, 100*goodput/capacity, s.shed)
		if lo, hi := 0.7*float64(workers), 1.6*float64(workers); float64(inFlight) < lo || float64(inFlight) > hi {
			t.Errorf("%s: the upstream's in flight median %d, want within [%.1f, %.1f]", what, inFlight, lo, hi)
		}
		if lat > service*16/10 {
			t.Errorf("%s: admitted latency median %s, want at most 1.6 x %s", what, lat, service)
		}
		if goodput < 0.8*capacity {
			t.Errorf("%s: goodput %.0f/s, want at least 80%% of %.0f/s", what, goodput, capacity)
		}
	}

	t.Run("without the zone", func(t *testing.T) {
		const workers = 8
		up := newFixedCapacity(t, workers, service)
		tester := caddytest.NewTester(t)
		tester.InitServer(site(up.URL, ""), "caddyfile")
		load := startLoad(t, url, 8*workers, up)
		time.Sleep(2 * time.Second)
		load.setPhase("queued")
		time.Sleep(3 * time.Second)
		load.end()
		s := load.sample("queued")
		inFlight, lat := medianOf(s.inFlight), medianOf(s.latencies)
		t.Logf("upstream in flight median %d (C=%d), latency median %s (S=%s), goodput %.0f/s", inFlight, workers, lat.Round(time.Millisecond), service, float64(s.ok)/s.span.Seconds())
		if inFlight < 4*workers || lat < 4*service {
			t.Errorf("without the zone the load should queue at the upstream: in flight %d, latency %s", inFlight, lat)
		}
	})

	for _, workers := range []int{2, 4, 8, 32} {
		t.Run(fmt.Sprintf("C=%d", workers), func(t *testing.T) {
			followRealTime(t)
			up := newFixedCapacity(t, workers, service)
			tester := caddytest.NewTester(t)
			// A zone of its own: a zone of the same name and settings
			// would keep the last subtest's state across the reload.
			zone := fmt.Sprintf("upstream%d", workers)
			tester.InitServer(site(up.URL, `rate_limit {
				zone `+zone+` {
					key upstream
					concurrency adaptive
				}
			}`), "caddyfile")
			load := startLoad(t, url, 8*workers, up)

			// From the initial limit (2) slow start doubles the limit
			// a window until a queue shows. Each phase is judged from
			// its 10th second.
			time.Sleep(10 * time.Second)
			t.Logf("after 10 s: %+v", adaptiveKey(t, zone, "upstream"))
			load.setPhase("full")
			time.Sleep(judged)

			load.setPhase("halving")
			up.setWorkers(workers / 2)
			followed := watchLimit(t, zone, func(l int64) bool { return float64(l) <= 1.6*float64(workers/2) })
			load.setPhase("half")
			time.Sleep(judged)

			load.setPhase("restoring")
			up.setWorkers(workers)
			grown := watchLimit(t, zone, func(l int64) bool { return l >= int64(workers) })
			load.setPhase("full again")
			time.Sleep(judged)
			load.end()

			check(t, "at capacity", load.sample("full"), workers)
			if followed < 0 {
				t.Errorf("capacity halved to %d: the limit did not come within 1.6x of it in 10 s", workers/2)
			} else {
				t.Logf("capacity halved to %d: the limit came within 1.6x of it after %s", workers/2, followed.Round(100*time.Millisecond))
			}
			if half := load.sample("half"); workers/2 >= 2 {
				check(t, "at half capacity", half, workers/2)
			} else {
				// One worker: a limit of 2 is twice its capacity, and
				// the limit's growth from 1 reaches 2 before the next
				// cut: it alternates, and the range is C >= 2.
				t.Logf("at half capacity (1 worker, not judged): upstream in flight median %d, admitted latency median %s",
					medianOf(half.inFlight), medianOf(half.latencies).Round(time.Millisecond))
			}
			if grown < 0 {
				t.Logf("capacity restored to %d: the limit did not reach it again in 10 s", workers)
			} else {
				t.Logf("capacity restored to %d: the limit reached it again after %s", workers, grown.Round(100*time.Millisecond))
			}
			check(t, "capacity restored", load.sample("full again"), workers)
		})
	}
}

// watchLimit reads the zone's limit every 100 ms for 10 s, and returns how
// long it took to satisfy reached, or -1.
func watchLimit(t *testing.T, zone string, reached func(int64) bool) time.Duration {
	t.Helper()
	start, at := time.Now(), time.Duration(-1)
	for time.Since(start) < 10*time.Second {
		if at < 0 && reached(adaptiveLimit(t, zone)) {
			at = time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return at
}
