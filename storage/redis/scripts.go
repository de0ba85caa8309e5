package redis

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"math/rand/v2"
	"strconv"
	"strings"

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
	//go:embed concurrency.lua
	concurrencyLua string
	//go:embed ban.lua
	banLua string
	//go:embed single.lua
	singleLua string
	//go:embed multi.lua
	multiLua string
	//go:embed batch.lua
	batchLua string
)

// script is a Lua script as the store runs it: EVALSHA by its hash, EVAL
// of its source when the server does not have it yet, or FCALL of the
// function that runs the same code in the store's function library (see
// functions).
type script struct {
	src  string
	hash any // hex SHA1 of src, boxed once for EVALSHA's arguments
	fn   any // the function's name in the library, boxed once for FCALL's
}

func newScript(src string) *script {
	h := sha1.Sum([]byte(src))
	return &script{src: src, hash: hex.EncodeToString(h[:])}
}

// word returns a script argument as an interface value, and a
// one-byte one (an op, a flag) without allocating: those are boxed once.
// (Boxing a string that is not a constant allocates.)
func word(s string) any {
	if len(s) == 1 {
		return oneByte[s[0]]
	}
	return s
}

var oneByte = func() (b [256]any) {
	for i := range b {
		b[i] = string([]byte{byte(i)})
	}
	return b
}()

// scripts holds each algorithm's one-key script: common.lua, the
// algorithm's file and single.lua. The script of an unknown kind is nil;
// Zone then fails every call.
var scripts = func() map[algorithms.Kind]*script {
	one := func(alg string) *script {
		sc := newScript(commonLua + alg + singleLua)
		sc.fn = library.single
		return sc
	}
	bucket := one(bucketLua)
	return map[algorithms.Kind]*script{
		algorithms.TokenBucket:   bucket,
		algorithms.LeakyBucket:   bucket,
		algorithms.GCRA:          one(bucketLua + gcraLua), // gcra meters as the bucket does
		algorithms.FixedWindow:   one(fixedWindowLua),
		algorithms.SlidingWindow: one(slidingWindowLua),
		algorithms.SlidingLog:    one(slidingLogLua),
		algorithms.Concurrency:   one(concurrencyLua),
		algorithms.Ban:           one(banLua),
	}
}()

// multiScript decides one request against several zones' keys in one slot
// (TakeAll): common.lua, every algorithm's file and multi.lua.
var multiScript = func() *script {
	sc := newScript(commonLua + allAlgorithmsLua + multiLua)
	sc.fn = library.multi
	return sc
}()

// allAlgorithmsLua is every algorithm's file.
var allAlgorithmsLua = bucketLua + gcraLua + fixedWindowLua + slidingWindowLua +
	slidingLogLua + concurrencyLua + banLua

// library is the scripts as one Redis function library (Redis 7's
// FUNCTION LOAD): common.lua and every algorithm's file once, and three
// functions, single.lua's, multi.lua's and batch.lua's main parts, each the
// body of a function of KEYS and ARGV. They decide exactly as the scripts do (the
// same code), but FCALL skips what every EVALSHA pays again: running
// common.lua and the algorithms' files to define their functions.
//
// Its name and its functions' carry a hash of its code, so that instances
// of different releases sharing one Redis each call their own code, and
// loading one never replaces another's.
var library = func() (l struct {
	name, src            string
	single, multi, batch any
}) {
	// Functions are always replicated by their effects: common.lua's
	// call to switch scripts to that is not for them (nor allowed while
	// a library loads).
	common := strings.Replace(commonLua, replicateCommands, "", 1)
	body := func(name string) string {
		return "#!lua name=" + name + "\n" + common + allAlgorithmsLua +
			"redis.register_function('" + name + "_single', function(KEYS, ARGV)\n" + singleLua + "\nend)\n" +
			"redis.register_function('" + name + "_multi', function(KEYS, ARGV)\n" + multiLua + "\nend)\n" +
			"redis.register_function('" + name + "_batch', function(KEYS, ARGV)\n" + batchLua + "\nend)\n"
	}
	h := sha1.Sum([]byte(body("tollgate")))
	l.name = "tollgate_" + hex.EncodeToString(h[:8])
	l.src = body(l.name)
	l.single, l.multi, l.batch = l.name+"_single", l.name+"_multi", l.name+"_batch"
	return l
}()

// replicateCommands is the part of common.lua a library leaves out.
const replicateCommands = "if redis.replicate_commands then\n\tredis.replicate_commands()\nend\n"

// The ops of a decision function; see common.lua.
const (
	opTake       = "t"
	opReject     = "r"
	opPeek       = "p"
	opUndo       = "u"
	opCheck      = "c"
	opCheckNever = "n"
	opRenew      = "l" // renew a concurrency lease
	opGrant      = "g" // grant extra quota for the window
	opReset      = "x" // single.lua: delete the key, and mark when
	opSkip       = "k" // multi.lua: not decided (the key's ban held)
	opSkipNever  = "m" // opSkip for a cost above the capacity ("n")
	opLease      = "q" // single.lua: a take and a quota lease (see quota.go)
	opEndLease   = "e" // single.lua: end a quota lease
)

// What multi.lua does with its keys (its ARGV[1]).
const (
	multiDecide = "d"
	multiCheck  = "c"
	multiStrike = "s" // check, and strike the bans of rejecting zones
	multiUndo   = "u"
)

// constants returns the algorithm's code and its 4 constants, as the
// scripts take them after ta and tr, formatted once per zone.
func constants(l *algorithms.Limit) []any {
	i := func(n int64) any { return strconv.FormatInt(n, 10) }
	code := kindCode(l.Kind)
	scale := max(l.Scale, 1)
	switch l.Kind {
	case algorithms.TokenBucket, algorithms.GCRA:
		return []any{code, i(l.Tau), i(l.Unit), i(0), i(scale)}
	case algorithms.LeakyBucket:
		return []any{code, i(l.Tau), i(l.Unit), i(l.MaxDelay), i(scale)}
	case algorithms.FixedWindow, algorithms.SlidingWindow:
		return []any{code, i(l.Window), i(l.Events * algorithms.Milli), i(0), i(0)}
	case algorithms.SlidingLog:
		return []any{code, i(l.Window), i(l.Events), i(0), i(0)}
	case algorithms.Concurrency:
		return []any{code, i(l.Events), i(l.Window), i(0), i(0)}
	case algorithms.Ban:
		return []any{code, i(l.Window), i(l.Events), i(l.Hold), i(0)}
	}
	return nil
}

// amount converts a cost in milli-units, 0 <= cost <= l.Capacity(), to what
// l's script counts (x): for the bucket family the refill time of the cost
// in ticks, ceil(cost * Unit / 1000), as Limit.inc computes it; for
// sliding_log the whole events, ceil(cost / 1000); for the other windows
// the cost itself. A concurrency slot counts one request, whatever its
// cost, and x is the new lease's id.
func amount(l *algorithms.Limit, cost int64) int64 {
	switch l.Kind {
	case algorithms.Concurrency:
		return newLeaseID()
	case algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.GCRA:
		return (cost*l.Unit + algorithms.Milli - 1) / algorithms.Milli
	case algorithms.SlidingLog:
		return (cost + algorithms.Milli - 1) / algorithms.Milli
	}
	return cost
}

// newLeaseID returns a random concurrency lease id in [1, 2^53): a double
// holds it exactly, and two leases of one key in flight at once share an
// id with a chance under 2^-40 even with thousands of slots.
func newLeaseID() int64 {
	return rand.Int64N(1<<53-1) + 1
}
