package shared

import (
	"context"
	"fmt"
	"sync"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// redisLog takes go-redis's own log lines (one per failed dial, for
// instance), which it would print as plain text to stderr, and writes them
// through a logger, structured and at most one line per LogInterval with
// the count of the lines held back.
type redisLog struct {
	logger   func() *zap.Logger
	now      func() int64
	throttle LogThrottle
}

// Printf implements go-redis's logging interface.
func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	suppressed, ok := l.throttle.Allow(l.now(), LogInterval)
	if !ok {
		return
	}
	l.logger().Warn("redis client", zap.String("message", fmt.Sprintf(format, v...)),
		zap.Int64("suppressed", suppressed))
}

// redisLogOnce routes go-redis's log, which is one per process, once.
var redisLogOnce sync.Once

// RouteRedisLog routes go-redis's log to the logger that logger returns
// when it logs, the first time it is called (go-redis's log is one per
// process).
func RouteRedisLog(logger func() *zap.Logger) {
	redisLogOnce.Do(func() {
		goredis.SetLogger(&redisLog{logger: logger, now: Micros})
	})
}
