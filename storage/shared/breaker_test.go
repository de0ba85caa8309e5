package shared

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestRedisFailureEvidence(t *testing.T) {
	live := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		name   string
		parent context.Context
		err    error
		want   evidence
	}{
		{"answered", live, nil, answered},
		{"nil reply", live, goredis.Nil, answered},
		{"slow reply", live, context.DeadlineExceeded, weakEvidence},
		{"wrapped slow reply", live, fmt.Errorf("redis store: take %q: %w", "z", context.DeadlineExceeded), weakEvidence},
		{"error reply", live, errors.New("ERR something"), weakEvidence},
		{"dial timeout", live, dialTimeout, weakEvidence},
		{"refused", live, fmt.Errorf("take: %w", refused), down},
		{"reset", live, reset, down},
		{"closed by peer", live, fmt.Errorf("take: %w", errEOF()), down},
		{"pool busy", live, goredis.ErrPoolTimeout, noEvidence},
		{"caller gone", gone, context.Canceled, noEvidence},
		{"caller gone while refused", gone, refused, noEvidence},
	} {
		if got := failure(c.parent, c.err); got != c.want {
			t.Errorf("%s: failure(%v) = %d, want %d", c.name, c.err, got, c.want)
		}
	}
}

// TestRedisFailureOfAnAnswerAllocatesNothing: every Redis decision is
// classified, and an answered one must cost no allocation (the target of
// an errors.As escaped to the heap on every call).
func TestRedisFailureOfAnAnswerAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { failure(ctx, nil) }); n != 0 {
		t.Errorf("failure of an answered call: %v allocations, want 0", n)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func errEOF() error { return fmt.Errorf("read: %w", io.EOF) }

// TestRedisBreakerOpensOnEvidence: one slow reply, or a few, never open the
// breaker; FailStreak in a row do, and so does one refused
// connection; an answer in between starts the count again. The outage is
// logged once when it opens and once when it closes.
func TestRedisBreakerOpensOnEvidence(t *testing.T) {
	ctx := context.Background()
	slow := context.DeadlineExceeded
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

	newHealth := func() (*Breaker, *observer.ObservedLogs) {
		core, logs := observer.New(zapcore.InfoLevel)
		return &Breaker{Logger: zap.New(core)}, logs
	}
	// call makes one call whose outcome is err; it reports whether the
	// breaker let it through.
	call := func(h *Breaker, parent context.Context, err error) bool {
		ran := false
		h.Do(parent, func() (bool, error) {
			ran = true
			return true, err
		})
		return ran
	}
	// admits reports whether the breaker lets a call through now, and
	// gives back the probe if that call took it, observing nothing.
	admits := func(h *Breaker) bool {
		ran := false
		h.Do(ctx, func() (bool, error) {
			ran = true
			return false, nil
		})
		return ran
	}

	t.Run("one slow reply", func(t *testing.T) {
		h, logs := newHealth()
		call(h, ctx, slow)
		if !admits(h) {
			t.Fatal("after one slow reply the breaker is open, want it closed")
		}
		if logs.Len() != 0 {
			t.Errorf("one slow reply logged %d lines, want none", logs.Len())
		}
	})
	t.Run("slow replies with answers between", func(t *testing.T) {
		h, _ := newHealth()
		for i := 0; i < 10*FailStreak; i++ {
			err := slow
			if i%FailStreak == FailStreak-1 {
				err = nil
			}
			if !call(h, ctx, err) {
				t.Fatalf("call %d: breaker open after fewer than %d failures in a row", i, FailStreak)
			}
		}
	})
	t.Run("a streak of slow replies", func(t *testing.T) {
		h, logs := newHealth()
		for i := 0; i < FailStreak; i++ {
			if !call(h, ctx, slow) {
				t.Fatalf("call %d: breaker open before %d failures in a row", i, FailStreak)
			}
		}
		if admits(h) {
			t.Fatalf("after %d failures in a row the breaker is closed, want open", FailStreak)
		}
		if logs.Len() != 1 || logs.All()[0].Level != zapcore.ErrorLevel {
			t.Fatalf("logs: %v, want one error line", logs.All())
		}
		h.retryAt.Store(0) // the retry time has come
		if !call(h, ctx, nil) {
			t.Fatal("probe not admitted after the retry time")
		}
		if !admits(h) || logs.Len() != 2 || logs.All()[1].Level != zapcore.InfoLevel {
			t.Fatalf("after a good probe: admit %v, logs %v; want closed and one info line", admits(h), logs.All())
		}
	})
	t.Run("refused", func(t *testing.T) {
		h, _ := newHealth()
		call(h, ctx, refused)
		if admits(h) {
			t.Fatal("after a refused connection the breaker is closed, want open")
		}
	})
	t.Run("pool busy and caller gone", func(t *testing.T) {
		h, _ := newHealth()
		gone, cancel := context.WithCancel(ctx)
		cancel()
		for i := 0; i < 3*FailStreak; i++ {
			if !call(h, ctx, goredis.ErrPoolTimeout) || !call(h, gone, context.Canceled) {
				t.Fatalf("call %d: breaker open on failures that are not Redis's", i)
			}
		}
	})
	t.Run("one probe at a time", func(t *testing.T) {
		h, _ := newHealth()
		call(h, ctx, refused)
		h.retryAt.Store(0)
		ran := false
		h.Do(ctx, func() (bool, error) {
			ran = true
			if admits(h) {
				t.Error("second concurrent probe admitted")
			}
			return true, slow // the probe failed: stays open, retry later
		})
		if !ran {
			t.Fatal("first probe not admitted")
		}
		if admits(h) {
			t.Fatal("after a failed probe the breaker is closed, want open until the next retry time")
		}
	})
}

// TestRedisBreakerProbeAlwaysGoesBack: the breaker's one probe is taken
// and given back by one function, so no call can keep it, and only
// Redis's own reply closes the breaker (issue 27, item 1). Before, a call
// that took the probe and did not report back (a reset's follow) kept the
// breaker open for good; a request the deny cache answered closed it; and
// a call admitted before the breaker opened gave back the probe another
// call held, letting a second probe through.
func TestRedisBreakerProbeAlwaysGoesBack(t *testing.T) {
	ctx := context.Background()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	opened := func() *Breaker {
		h := &Breaker{Logger: zap.NewNop()}
		h.Do(ctx, func() (bool, error) { return true, refused })
		h.retryAt.Store(0) // the retry time has come
		return h
	}
	probes := func(h *Breaker) bool { // takes and gives back the probe
		ran := false
		h.Do(ctx, func() (bool, error) { ran = true; return false, nil })
		return ran
	}

	t.Run("not answered by Redis", func(t *testing.T) {
		h := opened()
		// A probe that a deny cache answered: no round trip.
		if err := h.Do(ctx, func() (bool, error) { return false, nil }); err != nil {
			t.Fatalf("probe: %v", err)
		}
		if h.downSince.Load() == 0 {
			t.Error("a call Redis did not answer closed the breaker")
		}
		if !probes(h) {
			t.Error("the probe did not go back: no call can probe any more")
		}
	})
	t.Run("a call that panics", func(t *testing.T) {
		h := opened()
		func() {
			defer func() { _ = recover() }()
			h.Do(ctx, func() (bool, error) { panic("in the call") })
		}()
		if !probes(h) {
			t.Error("the probe did not go back after a panic")
		}
	})
	t.Run("a call that never held it", func(t *testing.T) {
		h := &Breaker{Logger: zap.NewNop()}
		admitted, release := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() { // admitted while closed; ends while another probes
			defer close(done)
			h.Do(ctx, func() (bool, error) {
				close(admitted)
				<-release
				return true, context.DeadlineExceeded
			})
		}()
		<-admitted
		h.Do(ctx, func() (bool, error) { return true, refused }) // opens
		h.retryAt.Store(0)
		h.Do(ctx, func() (bool, error) { // the probe, in flight
			close(release)
			<-done
			if probes(h) {
				t.Error("a second probe went through while the first was in flight: a call that never held the probe gave it back")
			}
			return true, nil
		})
		if h.downSince.Load() != 0 || !probes(h) {
			t.Error("after the probe's answer the breaker is open, want closed")
		}
	})
}
