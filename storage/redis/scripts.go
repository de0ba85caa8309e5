package redis

import (
	_ "embed"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

var (
	//go:embed common.lua
	commonLua string
	//go:embed bucket.lua
	bucketLua string
	//go:embed gcra.lua
	gcraLua string
	//go:embed fixed_window.lua
	fixedWindowLua string
	//go:embed sliding_window.lua
	slidingWindowLua string
	//go:embed sliding_log.lua
	slidingLogLua string
)

// scripts holds each algorithm's script, the shared prologue first. The
// script of an unknown kind is nil; Zone then fails every call.
var scripts = func() map[algorithms.Kind]*goredis.Script {
	bucket := goredis.NewScript(commonLua + bucketLua)
	return map[algorithms.Kind]*goredis.Script{
		algorithms.TokenBucket:   bucket,
		algorithms.LeakyBucket:   bucket,
		algorithms.GCRA:          goredis.NewScript(commonLua + gcraLua),
		algorithms.FixedWindow:   goredis.NewScript(commonLua + fixedWindowLua),
		algorithms.SlidingWindow: goredis.NewScript(commonLua + slidingWindowLua),
		algorithms.SlidingLog:    goredis.NewScript(commonLua + slidingLogLua),
	}
}()

// The ops of ARGV[1]; see common.lua.
const (
	opTake   = "t"
	opReject = "r"
	opPeek   = "p"
	opUndo   = "u"
)

// constants returns a script's ARGV[5...] for l, formatted once per zone.
func constants(l *algorithms.Limit) []any {
	i := func(n int64) any { return strconv.FormatInt(n, 10) }
	switch l.Kind {
	case algorithms.TokenBucket:
		return []any{i(l.Tau), i(l.Unit), i(0)}
	case algorithms.LeakyBucket:
		return []any{i(l.Tau), i(l.Unit), i(l.MaxDelay)}
	case algorithms.GCRA:
		return []any{i(l.Tau), i(l.Unit)}
	case algorithms.FixedWindow, algorithms.SlidingWindow:
		return []any{i(l.Window), i(l.Events * algorithms.Milli)}
	case algorithms.SlidingLog:
		return []any{i(l.Window), i(l.Events)}
	}
	return nil
}

// amount converts a cost in milli-units, 0 <= cost <= l.Capacity(), to what
// l's script counts (ARGV[4]): for the bucket family the refill time of the
// cost in µs, ceil(cost * Unit / 1000), as Limit.inc computes it; for
// sliding_log the whole events, ceil(cost / 1000); for the other windows
// the cost itself.
func amount(l *algorithms.Limit, cost int64) int64 {
	switch l.Kind {
	case algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.GCRA:
		return (cost*l.Unit + algorithms.Milli - 1) / algorithms.Milli
	case algorithms.SlidingLog:
		return (cost + algorithms.Milli - 1) / algorithms.Milli
	}
	return cost
}
