package redis

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

// holdReply is a go-redis hook that, once armed, holds the reply of the
// next script call (EVALSHA, EVAL, FCALL) after Redis has answered it,
// until released: the caller has not seen the answer yet, and what it
// does with it comes after whatever the test does meanwhile.
type holdReply struct {
	armed   atomic.Bool
	held    chan struct{} // closed once a reply is held
	release chan struct{}
}

func newHoldReply() *holdReply {
	return &holdReply{held: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdReply) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *holdReply) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (h *holdReply) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		switch strings.ToLower(cmd.Name()) {
		case "evalsha", "eval", "fcall":
			if h.armed.CompareAndSwap(true, false) {
				close(h.held)
				<-h.release
			}
		}
		return err
	}
}

// TestDenyCacheNotStoredAfterAGiveBack: a request is refused by Redis
// (the key's one event taken), and before its answer reaches the store,
// this instance gives the event back (or resets the key, or grants it
// more). The rejection, older than the give-back, is not cached: the next
// request is decided by Redis, and admitted. Before, the give-back's
// forget ran before the rejection was stored, and the cache refused the
// key for up to a second after its own give-back.
func TestDenyCacheNotStoredAfterAGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range []struct {
		name string
		free func(t *testing.T, s *Store, zl *zone, now int64, taken algorithms.Decision)
	}{
		{"give-back", func(t *testing.T, s *Store, zl *zone, now int64, taken algorithms.Decision) {
			if err := zl.Undo(context.Background(), "k", now, 1000, taken); err != nil {
				t.Fatal(err)
			}
		}},
		{"reset", func(t *testing.T, s *Store, zl *zone, now int64, taken algorithms.Decision) {
			heard := make(chan struct{}, 1)
			stop := s.OnReset(zl, func(string, int64) { heard <- struct{}{} })
			defer stop()
			if _, err := zl.Reset(context.Background(), "k", now); err != nil {
				t.Fatal(err)
			}
			<-heard // this instance's listener has heard it too: no later forget
		}},
		{"grant", func(t *testing.T, s *Store, zl *zone, now int64, taken algorithms.Decision) {
			if _, err := zl.Grant(context.Background(), "k", now, 1000); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := srv.Client()
			hook := newHoldReply()
			client.AddHook(hook)
			s := cachedStore(client)
			defer s.Close()
			zl := zoneOf(s, "race-"+c.name, mustLimit(t, algorithms.FixedWindow, 1, time.Hour, 0, 0)).(*zone)
			reqs := []Request{{Zone: zl, Key: "k", Cost: 1000}}
			now := epoch - epoch%(3600*sec)
			ds, r, err := s.TakeAll(context.Background(), now, reqs)
			if err != nil || r != -1 {
				t.Fatalf("the first request: rejected %d, %v; want admitted", r, err)
			}
			taken := ds[0]

			hook.armed.Store(true)
			refused := make(chan int, 1)
			go func() {
				_, r, _ := s.TakeAll(context.Background(), now+1, reqs)
				refused <- r
			}()
			<-hook.held // Redis refused it; the store has not seen the answer
			c.free(t, s, zl, now+2, taken)
			close(hook.release)
			if r := <-refused; r != 0 {
				t.Fatalf("the second request: rejected %d, want 0 (Redis refused it before the event was freed)", r)
			}
			v, err := s.Decide(context.Background(), now+3, reqs)
			if err != nil {
				t.Fatal(err)
			}
			if !v.Decided || v.Rejected != -1 {
				t.Fatalf("after the %s: decided by Redis %v, rejected %d; want decided by Redis and admitted (the cached rejection is older than the %s)", c.name, v.Decided, v.Rejected, c.name)
			}
		})
	}
}

// dropReply is a go-redis hook that, once armed, drops the answer of the
// next script call after Redis has run it: the caller gets a timeout, as
// when the connection fails on the way back.
type dropReply struct{ armed atomic.Bool }

func (h *dropReply) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *dropReply) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (h *dropReply) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		switch strings.ToLower(cmd.Name()) {
		case "evalsha", "eval", "fcall":
			if h.armed.CompareAndSwap(true, false) {
				cmd.SetErr(context.DeadlineExceeded)
				return cmd.Err()
			}
		}
		return err
	}
}

// TestGrantRetriedAfterALostAnswer: a key's one event is taken and its
// rejection cached; a grant with an id runs on Redis, and its answer is
// lost (the caller is told it failed). Sent again with the same id, the
// grant applies nothing more, but it is the first answer this process
// gets for it: it reports applied (so that the caller logs and emits it
// once), this instance's deny cache forgets the key (the next request is
// decided by Redis, and admitted), and the other instances are told
// (another's deny cache forgets the key too). Before, the retry reported repeated: the
// grant was never logged, emitted or announced, and the cache refused
// the key for up to a second after it. A grant sent again once it was
// reported applied is repeated, as before.
func TestGrantRetriedAfterALostAnswer(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	drop := &dropReply{}
	client.AddHook(drop)
	s := cachedStore(client)
	defer s.Close()
	other := cachedStore(srv.Client()) // another instance
	defer other.Close()
	l := mustLimit(t, algorithms.FixedWindow, 1, time.Hour, 0, 0)
	zl := zoneOf(s, "lost", l).(*zone)
	reqs := []Request{{Zone: zl, Key: "k", Cost: 1000}}
	otherReqs := []Request{{Zone: zoneOf(other, "lost", l), Key: "k", Cost: 1000}}
	now := epoch - epoch%(3600*sec)
	if _, r, err := s.TakeAll(context.Background(), now, reqs); err != nil || r != -1 {
		t.Fatalf("the first request: rejected %d, %v; want admitted", r, err)
	}
	for _, st := range []*Store{s, other} { // each caches the rejection
		rs := reqs
		if st == other {
			rs = otherReqs
		}
		if v, _ := st.Decide(context.Background(), now+1, rs); v.Rejected != 0 {
			t.Fatalf("the second request: rejected %d, want 0", v.Rejected)
		}
		if v, _ := st.Decide(context.Background(), now+1, rs); v.Decided {
			t.Fatalf("the third request: decided by Redis, want answered from the deny cache")
		}
	}

	drop.armed.Store(true)
	if _, applied, err := zl.GrantOnce(context.Background(), "k", now+2, 1000, "lost-1"); err == nil || applied {
		t.Fatalf("the grant whose answer was lost: applied %v, err %v; want an error", applied, err)
	}
	d, applied, err := zl.GrantOnce(context.Background(), "k", now+3, 1000, "lost-1")
	if err != nil || !applied {
		t.Fatalf("the grant sent again: applied %v, err %v; want applied (the first answer this process got for it)", applied, err)
	}
	if d.Remaining != 1 {
		t.Errorf("the grant sent again: remaining %d, want 1 (granted once)", d.Remaining)
	}
	v, err := s.Decide(context.Background(), now+4, reqs)
	if err != nil || !v.Decided || v.Rejected != -1 {
		t.Errorf("after the grant: decided by Redis %v, rejected %d, %v; want decided by Redis and admitted", v.Decided, v.Rejected, err)
	}
	told := false
	for deadline := time.Now().Add(10 * time.Second); !told && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		v, err := other.Decide(context.Background(), now+4, otherReqs)
		told = err == nil && v.Decided
	}
	if !told {
		t.Errorf("the other instance's deny cache still answers for the key: it was not told of the grant")
	}
	if _, applied, err := zl.GrantOnce(context.Background(), "k", now+5, 1000, "lost-1"); err != nil || applied {
		t.Errorf("the grant sent a third time: applied %v, err %v; want repeated", applied, err)
	}
}

// TestDenyCacheStoredAfterAnotherKeysGiveBack: a give-back to another key
// while a request's script runs does not keep its rejection out of the
// cache: a busy zone gives back all the time, and a hot key's rejection
// is still cached (the next request is answered from memory). The other
// key is chosen in another stripe of the cache's forgets.
func TestDenyCacheStoredAfterAnotherKeysGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	hook := newHoldReply()
	client.AddHook(hook)
	s := cachedStore(client)
	defer s.Close()
	zl := zoneOf(s, "stripes", mustLimit(t, algorithms.FixedWindow, 1, time.Hour, 0, 0)).(*zone)
	other := ""
	for i := 0; other == ""; i++ {
		if k := "other-" + strconv.Itoa(i); s.deny.stripe(s.key(k, zl.tail)) != s.deny.stripe(s.key("k", zl.tail)) {
			other = k
		}
	}
	now := epoch - epoch%(3600*sec)
	var taken algorithms.Decision
	for _, key := range []string{"k", other} {
		ds, r, err := s.TakeAll(context.Background(), now, []Request{{Zone: zl, Key: key, Cost: 1000}})
		if err != nil || r != -1 {
			t.Fatalf("%s: rejected %d, %v; want admitted", key, r, err)
		}
		taken = ds[0]
	}
	reqs := []Request{{Zone: zl, Key: "k", Cost: 1000}}
	hook.armed.Store(true)
	refused := make(chan int, 1)
	go func() {
		_, r, _ := s.TakeAll(context.Background(), now+1, reqs)
		refused <- r
	}()
	<-hook.held
	if err := zl.Undo(context.Background(), other, now+2, 1000, taken); err != nil {
		t.Fatal(err)
	}
	close(hook.release)
	if r := <-refused; r != 0 {
		t.Fatalf("k: rejected %d, want 0", r)
	}
	if v, err := s.Decide(context.Background(), now+3, reqs); err != nil || v.Decided || v.Rejected != 0 {
		t.Fatalf("k again: decided by Redis %v, rejected %d, %v; want refused from the cache", v.Decided, v.Rejected, err)
	}
}
