package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// withFunctions makes s run its scripts as functions and waits until the
// library has loaded.
func withFunctions(t testing.TB, s *Store) *Store {
	t.Helper()
	s.WithFunctions(func(err error) { t.Errorf("the library was refused: %v", err) })
	waitFunctions(t, s, true)
	return s
}

// waitFunctions waits until s runs its scripts as functions (on) or not,
// asking for a load as a decision would.
func waitFunctions(t testing.TB, s *Store, on bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.fns.fcall() != on; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("functions on = %t after 5s, want %t", !on, on)
		}
	}
}

// libraries returns the names of the function libraries the server has.
func libraries(t testing.TB, c *goredis.Client) []string {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), goredis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range libs {
		names = append(names, l.Name)
	}
	return names
}

// TestLibrary: the library holds every algorithm and both main parts,
// without the call functions may not make, and its name and its
// functions' carry the hash of its code.
func TestLibrary(t *testing.T) {
	if !strings.Contains(commonLua, replicateCommands) {
		t.Fatal("common.lua no longer has the replicate_commands block the library leaves out")
	}
	if strings.Contains(library.src, "replicate_commands()") {
		t.Error("the library calls replicate_commands")
	}
	for _, part := range []string{bucketLua, gcraLua, fixedWindowLua, slidingWindowLua, slidingLogLua, concurrencyLua, banLua, singleLua, multiLua} {
		if !strings.Contains(library.src, part) {
			t.Errorf("the library lacks a part: %.60q", part)
		}
	}
	if !strings.HasPrefix(library.src, "#!lua name="+library.name+"\n") || len(library.name) != len("tollgate_")+16 {
		t.Errorf("library name %q, source starting %.40q", library.name, library.src)
	}
	for _, sc := range []*script{scripts[algorithms.TokenBucket], scripts[algorithms.Ban], multiScript} {
		if fn, _ := sc.fn.(string); !strings.HasPrefix(fn, library.name+"_") {
			t.Errorf("script function %v, want one of library %s", sc.fn, library.name)
		}
	}
}

// TestFunctions: a store loads its library at its first decision, not
// before, then decides by FCALL, directly and pipelined; a server that
// loses the library (FUNCTION FLUSH) gets every decision right meanwhile
// (EVAL) and the library again.
func TestFunctions(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	for _, pipelined := range []bool{false, true} {
		name := "direct"
		s := New(srv.Client(), DefaultPrefix)
		if pipelined {
			name = "pipelined"
			s = NewPipelined(srv.Client(), DefaultPrefix)
			defer s.Close()
		}
		t.Run(name, func(t *testing.T) {
			if err := c.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			s.WithFunctions(func(err error) { t.Errorf("the library was refused: %v", err) })
			time.Sleep(20 * time.Millisecond)
			if libs := libraries(t, c); len(libs) != 0 || s.Functions() {
				t.Fatalf("before any decision: libraries %v, functions %t; want none", libs, s.Functions())
			}
			zl := zoneOf(s, "fn-"+name, mustLimit(t, algorithms.TokenBucket, 1000, time.Hour, 0, 0))
			take := func(want int64) {
				t.Helper()
				d, err := zl.Take(ctx, "k", 0, algorithms.Milli)
				if err != nil || !d.Allowed || d.Remaining != want {
					t.Fatalf("take: %+v, %v; want allowed with %d left", d, err, want)
				}
			}
			left := int64(999)
			take(left) // asks for the library
			waitFunctions(t, s, true)
			if libs := libraries(t, c); len(libs) != 1 || libs[0] != library.name {
				t.Fatalf("libraries %v, want [%s]", libs, library.name)
			}
			fcalls, evalshas := redistest.Calls(t, c, "fcall"), redistest.Calls(t, c, "evalsha")
			// Concurrent takes, so that the pipelined store batches them.
			var wg sync.WaitGroup
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if d, err := zl.Take(ctx, "k", 0, algorithms.Milli); err != nil || !d.Allowed {
						t.Errorf("take: %+v, %v", d, err)
					}
				}()
			}
			wg.Wait()
			left -= 20
			take(left - 1)
			left--
			want := int64(21) // one each, or one per batch for the calls it combined
			if pipelined {
				want += s.batch.combined.Load() - s.batch.joined.Load()
			}
			if n := redistest.Calls(t, c, "fcall") - fcalls; n != want {
				t.Errorf("%d FCALLs for 21 takes, want %d", n, want)
			}
			if n := redistest.Calls(t, c, "evalsha") - evalshas; n != 0 {
				t.Errorf("%d EVALSHAs with the library loaded", n)
			}

			loads := s.fns.loads.Load()
			if err := c.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			evals := redistest.Calls(t, c, "eval")
			left--
			take(left) // FCALL finds no function: EVAL
			if n := redistest.Calls(t, c, "eval") - evals; n != 1 {
				t.Errorf("%d EVALs for the take that found no function", n)
			}
			// Lost right after it loaded: no load again before loadRetry
			// has passed, and EVALSHA meanwhile.
			if s.Functions() || s.fns.retry.Load() <= time.Now().UnixNano() {
				t.Fatalf("functions %t, next load at %d: want off, and no load before loadRetry", s.Functions(), s.fns.retry.Load())
			}
			for range 3 {
				left--
				take(left)
			}
			time.Sleep(20 * time.Millisecond)
			if n := s.fns.loads.Load(); n != loads {
				t.Errorf("%d loads before loadRetry passed, want %d", n, loads)
			}
			s.fns.retry.Store(time.Now().UnixNano()) // as if loadRetry had passed
			waitFunctions(t, s, true)
			if n := s.fns.loads.Load(); n != loads+1 {
				t.Errorf("%d loads after the flush, want %d", n, loads+1)
			}
			left--
			take(left)
		})
	}
}

// TestFunctionsRefused: a server that refuses FUNCTION LOAD (here an ACL)
// is told once, and gets every decision by EVALSHA.
func TestFunctionsRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	srv.AddUser("noload", "pw", "-function|load")
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Username: "noload", Password: "pw", ContextTimeoutEnabled: true})
	defer c.Close()
	var mu sync.Mutex
	var refusals []error
	s := New(c, DefaultPrefix).WithFunctions(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		refusals = append(refusals, err)
	})
	zl := zoneOf(s, "refused", mustLimit(t, algorithms.FixedWindow, 3, time.Hour, 0, 0))
	for i := range 5 {
		d, err := zl.Take(ctx, "k", 0, algorithms.Milli)
		if err != nil || d.Allowed != (i < 3) {
			t.Fatalf("take %d: %+v, %v", i, d, err)
		}
		time.Sleep(20 * time.Millisecond) // time for the load to be refused
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refusals) != 1 || !strings.Contains(refusals[0].Error(), "NOPERM") {
		t.Errorf("refusals %v, want one NOPERM", refusals)
	}
	if s.Functions() || len(libraries(t, admin)) != 0 {
		t.Errorf("functions %t, libraries %v after a refusal", s.Functions(), libraries(t, admin))
	}
	if n := redistest.Calls(t, admin, "fcall"); n != 0 {
		t.Errorf("%d FCALLs after a refusal", n)
	}
}

// TestFunctionsLoadAgainAfterNoAnswer: a load that gets no answer (the
// server down) is tried again after loadRetry, not given up.
func TestFunctionsLoadAgainAfterNoAnswer(t *testing.T) {
	srv := redistest.Start(t)
	s := New(srv.Client(), DefaultPrefix).WithFunctions(func(err error) { t.Errorf("refused: %v", err) })
	srv.Stop()
	s.fns.fcall()
	for deadline := time.Now().Add(10 * time.Second); s.fns.retry.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the load against a stopped server did not fail")
		}
	}
	if s.fns.off.Load() {
		t.Fatal("a load without an answer turned functions off for good")
	}
	srv.Restart()
	if s.fns.fcall() {
		t.Fatal("functions on before the retry")
	}
	s.fns.retry.Store(time.Now().UnixNano()) // as if loadRetry had passed
	waitFunctions(t, s, true)
}

// TestFunctionsRing: on a Ring, the library loads on every shard, and each
// key's FCALL finds it there.
func TestFunctionsRing(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}, ContextTimeoutEnabled: true})
	defer ring.Close()
	s := withFunctions(t, New(ring, DefaultPrefix))
	zl := zoneOf(s, "ring", mustLimit(t, algorithms.TokenBucket, 10, time.Hour, 0, 0))
	ca, cb := a.Client(), b.Client()
	before := map[*goredis.Client][2]int64{}
	for _, c := range []*goredis.Client{ca, cb} {
		before[c] = [2]int64{redistest.Calls(t, c, "fcall"), redistest.Calls(t, c, "eval", "evalsha")}
	}
	for i := range 40 {
		if d, err := zl.Take(context.Background(), fmt.Sprint("key-", i), 0, algorithms.Milli); err != nil || !d.Allowed || d.Remaining != 9 {
			t.Fatalf("take key-%d: %+v, %v", i, d, err)
		}
	}
	for name, c := range map[string]*goredis.Client{"a": ca, "b": cb} {
		fcalls, evals := redistest.Calls(t, c, "fcall")-before[c][0], redistest.Calls(t, c, "eval", "evalsha")-before[c][1]
		if fcalls == 0 || evals != 0 {
			t.Errorf("shard %s: %d FCALLs, %d EVALs and EVALSHAs; want FCALLs only", name, fcalls, evals)
		}
	}
}
