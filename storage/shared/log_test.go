package shared

import (
	"context"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestLogThrottle(t *testing.T) {
	const sec = 1_000_000
	var th LogThrottle
	for i, step := range []struct {
		now        int64
		ok         bool
		suppressed int64
	}{
		{0, true, 0},
		{1, false, 0},
		{5 * sec, false, 0},
		{10*sec - 1, false, 0},
		{10 * sec, true, 3},
		{10 * sec, false, 0},
		{30 * sec, true, 1},
		{31 * sec, false, 0},
	} {
		suppressed, ok := th.Allow(step.now, 10*sec)
		if ok != step.ok || suppressed != step.suppressed {
			t.Errorf("step %d: Allow(%d) = %d, %v, want %d, %v", i, step.now, suppressed, ok, step.suppressed, step.ok)
		}
	}
}

// TestRedisClientLogIsThrottled: go-redis's own lines go through the
// logger, structured, one per interval with the count held back.
func TestRedisClientLogIsThrottled(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	now := int64(0)
	l := &redisLog{logger: func() *zap.Logger { return zap.New(core) }, now: func() int64 { return now }}
	for i := 0; i < 1000; i++ {
		l.Printf(context.Background(), "redis: dial tcp %s: connect: connection refused", "127.0.0.1:1")
	}
	now += LogInterval
	l.Printf(context.Background(), "again")
	if logs.Len() != 2 {
		t.Fatalf("1001 lines over one interval gave %d log entries, want 2", logs.Len())
	}
	first, second := logs.All()[0], logs.All()[1]
	if first.ContextMap()["message"] != "redis: dial tcp 127.0.0.1:1: connect: connection refused" {
		t.Errorf("first entry: %v, want the formatted go-redis line as a field", first.ContextMap())
	}
	if second.ContextMap()["suppressed"] != int64(999) {
		t.Errorf("second entry: suppressed %v, want 999", second.ContextMap()["suppressed"])
	}
}
