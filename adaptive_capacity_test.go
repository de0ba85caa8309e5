package tollgate

import (
	"io"
	"net/http"
	"net/http/httptest"
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

func startLoad(t *testing.T, client *http.Client, url string, clients int, up *fixedCapacity) *loadRun {
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

// TestAdaptiveFindsCapacity: an upstream of C workers and a fixed service
// time, 8C clients. Behind a zone of concurrency adaptive with its
// defaults, the upstream's in flight settles near C, the admitted
// requests' latency near the service time, and the goodput near the
// capacity; when the capacity halves the limit follows within 10 s, and
// when it returns the limit grows back. Without the zone, the same load
// queues 8C deep at the upstream.
func TestAdaptiveFindsCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("a 45-second load run")
	}
	const (
		workers = 8
		// A service time well above what a loaded test machine adds
		// to a request through Caddy (tens of ms under the race
		// detector beside other packages' tests), which the controller
		// would take for queueing.
		service = 100 * time.Millisecond
		clients = 8 * workers
	)
	site := func(up, zone string) string {
		return globalOptions + `
		localhost:9080 {
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
		up := newFixedCapacity(t, workers, service)
		tester := caddytest.NewTester(t)
		tester.InitServer(site(up.URL, ""), "caddyfile")
		load := startLoad(t, tester.Client, base+"/", clients, up)
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

	t.Run("with the zone", func(t *testing.T) {
		followRealTime(t)
		up := newFixedCapacity(t, workers, service)
		tester := caddytest.NewTester(t)
		tester.InitServer(site(up.URL, `rate_limit {
				zone upstream {
					key upstream
					concurrency adaptive
				}
			}`), "caddyfile")
		load := startLoad(t, tester.Client, base+"/", clients, up)

		// From the initial limit (20, above the capacity) the first
		// probes find the queue the first windows learnt as service
		// time: about 15 windows.
		time.Sleep(16 * time.Second)
		t.Logf("after 16 s: %+v", adaptiveKey(t, "upstream", "upstream"))
		load.setPhase("full")
		time.Sleep(5 * time.Second)
		load.setPhase("halving")
		up.setWorkers(workers / 2)
		halved := time.Now()
		followed := time.Duration(-1)
		for time.Since(halved) < 12*time.Second && (followed < 0 || time.Since(halved) < followed+3*time.Second) {
			if l := adaptiveLimit(t, "upstream"); followed < 0 && float64(l) <= 1.6*workers/2 {
				followed = time.Since(halved)
				load.setPhase("half")
			}
			time.Sleep(100 * time.Millisecond)
		}
		load.setPhase("restored")
		up.setWorkers(workers)
		restored := time.Now()
		var grown int64
		for time.Since(restored) < 12*time.Second && float64(grown) < 0.8*workers {
			grown = max(grown, adaptiveLimit(t, "upstream"))
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("capacity restored to %d: the limit grew back to %d after %s", workers, grown, time.Since(restored).Round(100*time.Millisecond))
		load.setPhase("full again")
		time.Sleep(4 * time.Second)
		load.end()

		check(t, "at capacity", load.sample("full"), workers)
		if followed < 0 || followed > 10*time.Second {
			t.Errorf("capacity halved to %d: the limit did not come within 1.6x of it in 10 s (followed after %s)", workers/2, followed)
		} else {
			t.Logf("capacity halved to %d: the limit came within 1.6x of it after %s", workers/2, followed.Round(100*time.Millisecond))
		}
		if s := load.sample("half"); s != nil && len(s.inFlight) > 0 {
			t.Logf("at half capacity: upstream in flight median %d, admitted latency median %s", medianOf(s.inFlight), medianOf(s.latencies).Round(time.Millisecond))
		}
		if float64(grown) < 0.8*workers {
			t.Errorf("capacity restored to %d: the limit grew back only to %d", workers, grown)
		}
		check(t, "capacity restored", load.sample("full again"), workers)
	})
}
