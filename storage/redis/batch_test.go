package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// TestPipelinedParity runs the parity traces through a pipelined store,
// many at once so that their calls share batches: every decision must be
// the Go twin's, as through a store that runs each call alone.
func TestPipelinedParity(t *testing.T) {
	srv := redistest.Start(t)
	s := NewPipelined(srv.Client(), "test:")
	s.callerClock = true
	s.ttlSlack = testSlack.Milliseconds()
	defer s.Close()
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

// TestBatchesWaitForTheBatchInFlight: calls that arrive while a batch is in
// flight go out together when it returns (one more pipeline, not one
// each), and they go then, although fewer than shareBatch are waiting.
func TestBatchesWaitForTheBatchInFlight(t *testing.T) {
	srv := redistest.Start(t)
	s := NewPipelined(srv.Client(), DefaultPrefix)
	defer s.Close()
	b := s.batch
	zl := zoneOf(s, "share", mustLimit(t, algorithms.TokenBucket, 100, time.Second, 0, 0))
	if _, err := zl.Take(context.Background(), "warm", 0, algorithms.Milli); err != nil {
		t.Fatal(err) // loads the script: no EVAL retry below
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	const waiting = 5 // fewer than shareBatch
	errs := make(chan error, 2+waiting)
	take := func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := zl.Take(ctx, key, 0, algorithms.Milli)
		if err == nil && !d.Allowed {
			err = fmt.Errorf("take %s: rejected", key)
		}
		errs <- err
	}
	go take("direct") // alone: direct, no batch
	waitFor("the direct call", func() bool { return b.inflight.Load() == 1 })
	go take("first") // a batch of its own, sent at once
	waitFor("the first batch", func() bool { return b.sent.Load() == 1 })
	for i := range waiting {
		go take(fmt.Sprint("later-", i))
	}
	waitFor("the later calls to reach the dispatcher", func() bool {
		return b.inflight.Load() == 2+waiting && len(b.calls) == 0
	})
	time.Sleep(20 * time.Millisecond) // a sender that would send them now has time to
	if n := b.sent.Load(); n != 1 {
		t.Fatalf("%d batches sent while the first was in flight, want 1", n)
	}
	srv.Resume()
	resumed = true
	for range 2 + waiting {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := b.sent.Load(); n != 2 {
		t.Errorf("%d batches sent, want 2: the first, and the %d calls that waited for it", n, waiting)
	}
}

// TestBatchesGoWhenShareBatchWait: while batches are in flight, shareBatch
// waiting calls go as one more batch without waiting for them, up to
// batchSenders batches at once; past that, calls wait for a batch to
// return, and then all of them are answered.
func TestBatchesGoWhenShareBatchWait(t *testing.T) {
	srv := redistest.Start(t)
	s := NewPipelined(srv.Client(), DefaultPrefix)
	defer s.Close()
	b := s.batch
	zl := zoneOf(s, "full", mustLimit(t, algorithms.TokenBucket, 1000, time.Second, 0, 0))
	if _, err := zl.Take(context.Background(), "warm", 0, algorithms.Milli); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	queued := func(n int) func() bool { // n callers in, their calls with the dispatcher
		return func() bool { return b.inflight.Load() == int64(n) && len(b.calls) == 0 }
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	total := 2 + (batchSenders-1)*shareBatch + shareBatch/2
	errs := make(chan error, total)
	take := func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := zl.Take(ctx, key, 0, algorithms.Milli)
		if err == nil && !d.Allowed {
			err = fmt.Errorf("take %s: rejected", key)
		}
		errs <- err
	}
	go take("direct")
	waitFor("the direct call", func() bool { return b.inflight.Load() == 1 })
	go take("first")
	waitFor("the first batch", func() bool { return b.sent.Load() == 1 })
	n := 2
	for want := 2; want <= batchSenders; want++ {
		for range shareBatch - 1 {
			go take(fmt.Sprint("k", n))
			n++
		}
		waitFor("calls to queue", queued(n))
		time.Sleep(10 * time.Millisecond)
		if got := b.sent.Load(); got != int64(want-1) {
			t.Fatalf("%d calls waiting sent batch %d early", shareBatch-1, got)
		}
		go take(fmt.Sprint("k", n)) // the shareBatch-th: its batch goes now
		n++
		waitFor(fmt.Sprintf("batch %d", want), func() bool { return b.sent.Load() == int64(want) })
	}
	// Every sender is busy: more calls wait, however many.
	for n < total {
		go take(fmt.Sprint("k", n))
		n++
	}
	waitFor("the last calls to queue", queued(n))
	time.Sleep(20 * time.Millisecond)
	if got := b.sent.Load(); got != batchSenders {
		t.Fatalf("%d batches sent with every sender busy, want %d", got, batchSenders)
	}
	srv.Resume()
	resumed = true
	for range total {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := b.sent.Load(); got != batchSenders+1 {
		t.Errorf("%d batches sent, want %d: the last calls waited for a sender", got, batchSenders+1)
	}
}
