package tollgate

import (
	"context"
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// redisLog takes go-redis's own log lines (one per failed dial, for
// instance), which it would print as plain text to stderr, and writes them
// through Caddy's logger, structured and at most one line per
// logThrottleInterval with the count of the lines held back.
type redisLog struct {
	logger   func() *zap.Logger
	now      func() int64
	throttle logThrottle
}

// Printf implements go-redis's logging interface.
func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	suppressed, ok := l.throttle.allow(l.now(), logThrottleInterval)
	if !ok {
		return
	}
	l.logger().Warn("redis client", zap.String("message", fmt.Sprintf(format, v...)),
		zap.Int64("suppressed", suppressed))
}

// redisLogOnce routes go-redis's log, which is one per process, to Caddy's
// logger when the first Redis storage is provisioned.
var redisLogOnce sync.Once

func routeRedisLog() {
	redisLogOnce.Do(func() {
		goredis.SetLogger(&redisLog{
			logger: func() *zap.Logger { return caddy.Log().Named("http.handlers.rate_limit.redis") },
			now:    monotonicMicros,
		})
	})
}
