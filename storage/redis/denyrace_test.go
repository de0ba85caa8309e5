package redis

import (
	"context"
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
