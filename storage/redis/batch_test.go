package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
)

// TestPipelinedParity runs the parity traces through a pipelined store,
// many at once so that their calls share batches: every decision must be
// the Go twin's, as through a store that runs each call alone.
//
// With functions, a batch's one-key calls go as one call of the library's
// batch function: the decisions must be the same, and some must have gone
// that way.
func TestPipelinedParity(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []string{"evalsha", "fcall"} {
		t.Run(mode, func(t *testing.T) {
			s := NewPipelined(srv.Client(), "test:"+mode+":")
			s.callerClock = true
			s.ttlSlack = testSlack.Milliseconds()
			defer s.Close()
			if mode == "fcall" {
				withFunctions(t, s)
			}
			pipelinedParity(t, s)
			combined := s.batch.combined.Load()
			if mode == "fcall" && combined == 0 {
				t.Errorf("no batch combined its one-key calls")
			}
			if mode == "evalsha" && combined != 0 {
				t.Errorf("%d batches combined calls without functions", combined)
			}
		})
	}
}

func pipelinedParity(t *testing.T, s *Store) {
	var wg sync.WaitGroup
	for i, tr := range parityTraces(t) {
		wg.Add(1)
		go func(i int, tr trace) {
			defer wg.Done()
			name := fmt.Sprintf("pipelined-%d", i)
			runParity(t, zoneOf(s, name, tr.limit), "k", tr.limit, tr.steps, nil)
		}(i, tr)
	}
	// Random traces too, on several keys of one zone at once.
	for kind := algorithms.TokenBucket; kind <= algorithms.LeakyBucket; kind++ {
		l := mustLimit(t, kind, 5, time.Second, 0, 0)
		zl := zoneOf(s, "pipelined-random-"+kind.String(), l)
		for k := 0; k < 4; k++ {
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(kind), uint64(k)))
				runParity(t, zl, fmt.Sprint("k", k), l, randomSteps(rng, &l, 300, true), nil)
			}(k)
		}
	}
	wg.Wait()
}

// TestPipelinedDeadlines: a call through the batcher returns by its
// deadline when Redis does not answer, and the batcher works again when it
// does; a restarted server without the scripts (NOSCRIPT) is handled.
func TestPipelinedDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	s := NewPipelined(srv.Client(), DefaultPrefix)
	defer s.Close()
	zl := zoneOf(s, "dl", mustLimit(t, algorithms.TokenBucket, 100, time.Second, 0, 0))
	if _, err := zl.Take(context.Background(), "k", 0, algorithms.Milli); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			// The caller's deadline, or the batch's read timeout at the
			// same instant: an error either way.
			if _, err := zl.Take(ctx, "k", 0, algorithms.Milli); err == nil {
				t.Errorf("take while Redis hangs: no error, want its deadline's")
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("take while Redis hangs returned after %s, want about its 100ms deadline", el)
			}
		}()
	}
	wg.Wait()
	srv.Resume()
	srv.Restart() // a new, empty server: the scripts must be sent again
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		d, err := zl.Take(ctx, "k", 0, algorithms.Milli)
		cancel()
		if err == nil {
			if !d.Allowed || d.Remaining != 99 {
				t.Fatalf("first take on the restarted server: %+v, want allowed with 99 left", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("take after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Close()
	if _, err := zl.Take(context.Background(), "k", 0, algorithms.Milli); err == nil {
		t.Fatal("take on a closed pipelined store succeeded, want an error")
	}
}

// pausedBatches is a pipelined store whose server is paused, with one
// call in flight directly and one batch of one call in flight: where the
// batch tests start.
type pausedBatches struct {
	t       *testing.T
	srv     *redistest.Server
	b       *batcher
	zl      storage.Limiter
	errs    chan error
	calls   int // calls made, the first two included
	resumed bool
}

func startPausedBatches(t *testing.T) *pausedBatches {
	return startPausedBatchesWith(t, nil)
}

// startPausedBatchesWith is startPausedBatches with setup, which runs on
// the server and the store before the server pauses (after one call has
// loaded the script).
func startPausedBatchesWith(t *testing.T, setup func(*redistest.Server, *Store)) *pausedBatches {
	srv := redistest.Start(t)
	s := NewPipelined(srv.Client(), DefaultPrefix)
	t.Cleanup(s.Close)
	p := &pausedBatches{t: t, srv: srv, b: s.batch, errs: make(chan error, 1000),
		zl: zoneOf(s, "share", mustLimit(t, algorithms.TokenBucket, 1000, time.Second, 0, 0))}
	if _, err := p.zl.Take(context.Background(), "warm", 0, algorithms.Milli); err != nil {
		t.Fatal(err) // loads the script: no EVAL retry below
	}
	if setup != nil {
		setup(srv, s)
	}
	srv.Pause()
	t.Cleanup(func() {
		if !p.resumed {
			srv.Resume()
		}
	})
	p.take() // alone: direct, no batch
	p.waitFor("the direct call", func() bool { return p.b.inflight.Load() == 1 })
	p.take() // a batch of its own, sent at once
	p.waitFor("the first batch", func() bool { return p.b.sent.Load() == 1 })
	return p
}

// take makes one more call, in a goroutine of its own; its error (or a
// rejection) goes to p.errs.
func (p *pausedBatches) take() {
	key := fmt.Sprint("k", p.calls)
	p.calls++
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := p.zl.Take(ctx, key, 0, algorithms.Milli)
		if err == nil && !d.Allowed {
			err = fmt.Errorf("take %s: rejected", key)
		}
		p.errs <- err
	}()
}

// queued waits until every call made is with the batcher (in run, and past
// its queue), then a little longer, for a batch that would go now to go.
func (p *pausedBatches) queued() {
	p.t.Helper()
	p.waitFor("the calls to queue", func() bool {
		return p.b.inflight.Load() == int64(p.calls) && len(p.b.calls) == 0
	})
	time.Sleep(20 * time.Millisecond)
}

func (p *pausedBatches) waitFor(what string, cond func() bool) {
	p.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// sent fails the test unless want batches have been sent.
func (p *pausedBatches) sent(want int, why string) {
	p.t.Helper()
	if got := p.b.sent.Load(); got != int64(want) {
		p.t.Fatalf("%d batches sent, want %d: %s", got, want, why)
	}
}

// resume resumes the server and waits for every call's answer.
func (p *pausedBatches) resume() {
	p.t.Helper()
	p.srv.Resume()
	p.resumed = true
	for range p.calls {
		if err := <-p.errs; err != nil {
			p.t.Fatal(err)
		}
	}
}

// TestBatchesWaitForTheBatchInFlight: calls that arrive while a batch is in
// flight go out together when it returns (one more pipeline, not one
// each), and they go then, although fewer than shareBatch are waiting.
func TestBatchesWaitForTheBatchInFlight(t *testing.T) {
	p := startPausedBatches(t)
	const waiting = 5 // fewer than shareBatch
	for range waiting {
		p.take()
	}
	p.queued()
	p.sent(1, "the calls that arrived sent while the first batch was in flight")
	p.resume()
	p.sent(2, "the first, and the calls that waited for it")
}

// TestBatchesGoWhenShareBatchWait: while batches are in flight, shareBatch
// waiting calls go as one more batch without waiting for them, up to
// batchSenders batches at once; past that, calls wait for a batch to
// return, and then all of them are answered.
func TestBatchesGoWhenShareBatchWait(t *testing.T) {
	p := startPausedBatches(t)
	for want := 2; want <= batchSenders; want++ {
		for range shareBatch - 1 {
			p.take()
		}
		p.queued()
		p.sent(want-1, "fewer than shareBatch calls waiting sent a batch")
		p.take() // the shareBatch-th: its batch goes now
		p.waitFor(fmt.Sprintf("batch %d", want), func() bool { return p.b.sent.Load() == int64(want) })
	}
	// Every sender is busy: more calls wait, however many.
	for range shareBatch / 2 {
		p.take()
	}
	p.queued()
	p.sent(batchSenders, "calls sent with every sender busy")
	p.resume()
	p.sent(batchSenders+1, "the last calls waited for a sender")
}

// TestCombinedCalls: the one-key calls of a batch that go as one call of
// the library's batch function are each answered as if alone. A decision
// that raises an error (a key holding another type) fails alone, with
// its own error, and the others are decided; when the whole call fails
// because the server lost the library, every call runs again as EVAL.
func TestCombinedCalls(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lose  bool // the server loses the library before the calls
		wrong bool // one call's key holds a string
	}{
		{name: "wrong type", wrong: true},
		{name: "library lost", lose: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bad string
			p := startPausedBatchesWith(t, func(srv *redistest.Server, s *Store) {
				withFunctions(t, s)
				c := srv.Client()
				bad = s.Key("share", algorithms.TokenBucket, "bad")
				if tc.wrong {
					if err := c.Set(context.Background(), bad, "x", 0).Err(); err != nil {
						t.Fatal(err)
					}
				}
				if tc.lose {
					if err := c.FunctionFlush(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
				}
			})
			const waiting = 5
			for range waiting {
				p.take()
			}
			badErr := make(chan error, 1)
			if tc.wrong {
				go func() {
					_, err := p.zl.Take(context.Background(), "bad", 0, algorithms.Milli)
					badErr <- err
				}()
				p.calls++
				p.queued()
				p.calls--
			} else {
				p.queued()
			}
			p.resume()
			if got := p.b.combined.Load(); got != 1 {
				t.Errorf("%d batches combined their calls, want 1", got)
			}
			if tc.wrong {
				if err := <-badErr; err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
					t.Errorf("take on a key holding a string: %v, want WRONGTYPE", err)
				}
			}
		})
	}
}

// TestCombinedProfiles: a combined call carries what a zone's decisions
// share (all but key, op and x) once, as a profile its decisions name.
// The decisions of three zones of different algorithms, interleaved in one
// combined call, are each their own zone's Go twin's (all made at the
// call's one instant, so whatever their order within a key, the same set),
// and the call carried three profiles for eight decisions.
func TestCombinedProfiles(t *testing.T) {
	limits := map[string]algorithms.Limit{
		"share": mustLimit(t, algorithms.TokenBucket, 1000, time.Second, 0, 0),
		"fw":    mustLimit(t, algorithms.FixedWindow, 2, time.Hour, 0, 0),
		"gc":    mustLimit(t, algorithms.GCRA, 3, time.Hour, 2, 0),
	}
	zones := map[string]storage.Limiter{}
	p := startPausedBatchesWith(t, func(_ *redistest.Server, s *Store) {
		withFunctions(t, s)
		for name, l := range limits {
			zones[name] = zoneOf(s, name, l)
		}
	})
	steps := []struct{ zone, key string }{
		{"share", "a"}, {"fw", "x"}, {"gc", "y"}, {"fw", "x"},
		{"share", "b"}, {"gc", "y"}, {"fw", "x"}, {"gc", "y"},
	}
	type result struct {
		step int
		d    algorithms.Decision
	}
	results := make(chan result, len(steps))
	for i, st := range steps {
		p.calls++
		go func() {
			d, err := zones[st.zone].Take(context.Background(), st.key, 0, algorithms.Milli)
			results <- result{i, d}
			p.errs <- err
		}()
	}
	p.queued()
	p.resume()
	if got := p.b.combined.Load(); got != 1 {
		t.Fatalf("%d combined calls, want 1", got)
	}
	if got, want := p.b.joined.Load(), int64(len(steps)); got != want {
		t.Errorf("the combined call carried %d decisions, want %d", got, want)
	}
	if got := p.b.profiles.Load(); got != 3 {
		t.Errorf("the combined call carried %d profiles, want 3 (one a zone)", got)
	}
	got := map[string][]string{}
	var at int64
	for range steps {
		r := <-results
		st := steps[r.step]
		got[st.zone+" "+st.key] = append(got[st.zone+" "+st.key], fmt.Sprintf("%+v", r.d))
		at = r.d.At
	}
	want := map[string][]string{}
	states := map[string]*algorithms.State{}
	for _, st := range steps {
		k := st.zone + " " + st.key
		if states[k] == nil {
			states[k] = &algorithms.State{}
		}
		l := limits[st.zone]
		want[k] = append(want[k], fmt.Sprintf("%+v", l.Take(states[k], at, algorithms.Milli)))
	}
	for k := range want {
		slices.Sort(got[k])
		slices.Sort(want[k])
		if !slices.Equal(got[k], want[k]) {
			t.Errorf("%s: decisions\n%s\nwant (the Go twin's at %d)\n%s", k, strings.Join(got[k], "\n"), at, strings.Join(want[k], "\n"))
		}
	}
}

// TestCombinedCallsAcrossSlots: a single address that answers for several
// slots but refuses a call whose keys span them (CROSSSLOT: here a Cluster
// node reached as a single server, in the field a sharding proxy) gets
// each of a combined call's decisions again alone, every one decided, and
// no more combined calls.
func TestCombinedCallsAcrossSlots(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	of := masterOf(t, cl, cl.Client())
	node := cl.Servers[0]
	s := NewPipelined(node.Client(), DefaultPrefix)
	defer s.Close()
	withFunctions(t, s)
	l := mustLimit(t, algorithms.TokenBucket, 1000, time.Second, 0, 0)
	zl := zoneOf(s, "slots", l)
	// Keys that node serves, in different slots.
	var keys []string
	seen := map[int]bool{}
	for i := 0; len(keys) < 32 && i < 100000; i++ {
		k := fmt.Sprint("k", i)
		sl := slot(s.Key("slots", l.Kind, k))
		if of(sl) == node && !seen[sl] {
			seen[sl] = true
			keys = append(keys, k)
		}
	}
	if len(keys) < 32 {
		t.Fatalf("found %d keys on %s", len(keys), node.Addr)
	}
	ctx := context.Background()
	for round := 0; round < 20 && s.batch.combined.Load() == 0; round++ {
		var wg sync.WaitGroup
		for _, k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if d, err := zl.Take(ctx, k, 0, algorithms.Milli); err != nil || !d.Allowed {
					t.Errorf("take %s: %+v, %v", k, d, err)
				}
			}()
		}
		wg.Wait()
	}
	if s.batch.combined.Load() == 0 {
		t.Fatal("no batch combined its calls")
	}
	if !s.batch.apart.Load() {
		t.Fatal("after CROSSSLOT, calls are still combined")
	}
	before := s.batch.combined.Load()
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := zl.Take(ctx, k, 0, algorithms.Milli); err != nil {
				t.Errorf("take %s: %v", k, err)
			}
		}()
	}
	wg.Wait()
	if n := s.batch.combined.Load() - before; n != 0 {
		t.Errorf("%d more combined calls after CROSSSLOT", n)
	}
}
