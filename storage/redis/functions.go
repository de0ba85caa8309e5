package redis

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// functions runs a store's scripts as functions of its library (see
// library) where the server has functions (Redis 7 and later): FCALL
// costs the server less than EVALSHA of the same code, since the library's
// helpers are defined once, when it loads, instead of on every call.
//
// It loads the library the first time a decision asks (so that a
// configuration that is only validated connects to nothing), in the
// background; decisions use EVALSHA until it has loaded. A call that finds
// the function missing (a server restarted without persistence, a FUNCTION
// FLUSH, a new Cluster primary) runs as EVAL of its script instead, and
// the library is loaded again (at once, or loadRetry after its last load
// if that was more recent). A server that refuses FUNCTION LOAD (one
// before Redis 7, a proxy without it, an ACL that denies it) gets EVALSHA
// for good; one that does not answer is asked again after loadRetry.
type functions struct {
	client  Client
	refused func(error) // told when the server refuses the library; may be nil

	on      atomic.Bool  // the library is loaded: FCALL
	off     atomic.Bool  // the server refused it: EVALSHA for good
	loading atomic.Bool  // a load is under way
	retry   atomic.Int64 // no load before this (Unix ns)
	loaded  atomic.Int64 // when the library last loaded (Unix ns)
	loads   atomic.Int64 // libraries loaded (read by tests)
}

// loadTimeout bounds one load of the library; loadRetry is how long a
// store waits to load it again after a load that failed without an answer
// from the server.
const (
	loadTimeout = 5 * time.Second
	loadRetry   = 10 * time.Second
)

// fcall reports whether calls may use FCALL now, and starts a load of the
// library when one is due.
func (f *functions) fcall() bool {
	if f == nil {
		return false
	}
	if f.on.Load() {
		return true
	}
	if !f.off.Load() && time.Now().UnixNano() >= f.retry.Load() && f.loading.CompareAndSwap(false, true) {
		go f.load()
	}
	return false
}

// lost records that the server did not have a function: calls use
// EVALSHA until the library is loaded again, at once, or after loadRetry
// if it was loaded less than loadRetry ago (a server that keeps losing it
// costs one load per loadRetry, not one per decision).
func (f *functions) lost() {
	if f == nil || !f.on.CompareAndSwap(true, false) {
		return
	}
	next := f.loaded.Load() + int64(loadRetry)
	if time.Now().UnixNano() >= next {
		next = 0
	}
	f.retry.Store(next)
}

// load loads the library on the server, on every primary of a Cluster, or
// on every shard of a Ring.
func (f *functions) load() {
	defer f.loading.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	defer cancel()
	load := func(ctx context.Context, c Client) error {
		return c.Process(ctx, goredis.NewStringCmd(ctx, "function", "load", "replace", library.src))
	}
	each := func(ctx context.Context, c *goredis.Client) error { return load(ctx, c) }
	var err error
	switch c := f.client.(type) {
	case interface {
		ForEachMaster(context.Context, func(context.Context, *goredis.Client) error) error
	}: // a Cluster
		err = c.ForEachMaster(ctx, each)
	case interface {
		ForEachShard(context.Context, func(context.Context, *goredis.Client) error) error
	}: // a Ring
		err = c.ForEachShard(ctx, each)
	default:
		err = load(ctx, f.client)
	}
	var reply goredis.Error
	switch {
	case err == nil:
		f.loads.Add(1)
		f.loaded.Store(time.Now().UnixNano())
		f.on.Store(true)
	case errors.As(err, &reply) && !transient(err):
		f.off.Store(true)
		if f.refused != nil {
			f.refused(err)
		}
	default:
		f.retry.Store(time.Now().Add(loadRetry).UnixNano())
	}
}

// transient reports whether a Redis error reply is one that passes (the
// server loading its data, a failover, a Cluster resharding) rather than
// a refusal: the next load tries again.
func transient(err error) bool {
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "BUSY", "OOM"} {
		if strings.HasPrefix(err.Error(), p) {
			return true
		}
	}
	return false
}

// noFunction reports whether err says the server has no such function (or
// no FCALL at all): the call runs as EVAL instead.
func noFunction(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "ERR Function not found") || strings.HasPrefix(msg, "ERR unknown command 'fcall'") ||
		strings.HasPrefix(msg, "ERR unknown command `fcall`")
}

// WithFunctions makes s run its scripts as functions where the server has
// them (see functions) and returns s; refused, if not nil, is told once if
// the server refuses the library. Call it before s decides anything.
func (s *Store) WithFunctions(refused func(error)) *Store {
	s.fns = &functions{client: s.client, refused: refused}
	if s.batch != nil {
		s.batch.fns = s.fns
	} else {
		s.run = direct{s.client, s.fns}
	}
	return s
}

// Functions reports whether s runs its scripts as functions (FCALL) now.
func (s *Store) Functions() bool { return s.fns != nil && s.fns.on.Load() }
