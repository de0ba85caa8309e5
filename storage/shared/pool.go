package shared

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/storage"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// Pool is one Redis client with its runtime, shared by every handler
// whose storage settings are the same, across config reloads.
type Pool struct {
	client goredis.UniversalClient
	store  *redisstore.Store
	// keys identifies the keys the client's store reads and writes:
	// clients that differ only in how they connect share it.
	keys string
	// rt is what every call through the client goes through: breaker,
	// timeout, and the settlements Redis could not hear yet (kept in
	// rt.Owed until it does; while it keeps any, the client stays open).
	rt Runtime
	// lead is how far Redis's clock is ahead of this instance's (µs), as
	// the last decision Redis made showed it: never less than the true
	// lead, since a decision is made after the request's time was read.
	// The local copies keep Redis's clock with it (see follow).
	lead atomic.Int64
	// pinged is the PING at start that the handlers of one config load
	// share (see Ping).
	pinged struct {
		sync.Mutex
		load <-chan struct{} // the load's context's Done
		err  error
	}
	// refs counts the requests that hold a concurrency lease or a
	// settlement through the client: a reload that changes the storage
	// settings retires it, and it stays open until the last of them ends,
	// so that their leases are renewed and given back, and their
	// settlements made, not lost.
	refs struct {
		sync.Mutex
		held    int
		retired bool // no configuration uses it: close once held is 0
	}
	renewLog LogThrottle // failed lease renewals: one line per interval
	// waitedUnsent: a call's deadline with no network error means it
	// never got a connection (see waitedForConn): not on a Cluster.
	waitedUnsent bool
}

// PoolConfig is how NewPool sets up a Pool.
type PoolConfig struct {
	// Keys identifies the Redis keys the client reaches (its servers or
	// Sentinel master, database and key prefix).
	Keys string
	// Timeout bounds one call.
	Timeout time.Duration
	// Logger takes the runtime's lines: outages, lease renewals, and a
	// server that refuses the function library.
	Logger *zap.Logger
	// Pipeline: decisions made while others are in flight share round
	// trips. Functions: decide by FCALL of a function library where the
	// server has functions.
	Pipeline, Functions bool
}

// NewPool returns the runtime of client c, whose keys start with prefix.
func NewPool(c goredis.UniversalClient, prefix string, cfg PoolConfig) *Pool {
	_, cluster := c.(*goredis.ClusterClient)
	p := &Pool{client: c, store: redisstore.New(c, prefix), keys: cfg.Keys, waitedUnsent: !cluster}
	if cfg.Pipeline {
		p.store = redisstore.NewPipelined(c, prefix)
	}
	// Rejections answered from memory until their wait ends (at most a
	// second); resets clear them on every instance.
	p.store.WithDenyCache(c)
	logger := cfg.Logger
	if cfg.Functions {
		p.store.WithFunctions(func(err error) {
			logger.Warn("redis refused Tollgate's function library: deciding with EVALSHA instead (set functions off to skip the attempt)", zap.Error(err))
		})
	}
	p.rt.Breaker.Logger, p.rt.Timeout = logger, cfg.Timeout
	p.rt.Owed = Owed{
		Retry:   RetryEvery,
		Now:     Micros,
		Do:      func(fn func(context.Context) error) error { return p.rt.Call(context.Background(), fn) },
		Unsent:  p.unsent,
		Hold:    p.acquire,
		Release: p.release,
		Logger:  logger,
	}
	// A tick renews every lease due in one pipeline, which may take Redis
	// longer than one decision's timeout: it gets a second at least.
	p.store.WithLeases(max(cfg.Timeout, time.Second), func(err error) {
		if suppressed, ok := p.renewLog.Allow(Micros(), LogInterval); ok {
			logger.Error("rate limit store failed", zap.Error(err), zap.Int64("suppressed", suppressed))
		}
	})
	return p
}

// unsent reports whether a call through p that failed with err surely
// never ran on Redis: Unsent, or a deadline that ended while the call
// waited for a connection (see waitedForConn).
func (p *Pool) unsent(err error) bool {
	return Unsent(err) || p.waitedUnsent && waitedForConn(err)
}

// waitedForConn reports whether err is the call's deadline, with no
// network error, that ended before the call got a connection: go-redis
// dials a new one in the background, trying a refused dial 5 times 100ms
// apart, and returns the caller's context error if its deadline ends
// first. A client of one server returns no other context error once it
// has sent a call (it never retries: MaxRetries is -1), but a call that
// waited for its pipeline's batch (marked redisstore.ErrInFlight); a
// Cluster client retries, so its context errors are not taken as unsent.
func waitedForConn(err error) bool {
	var opErr *net.OpError
	return errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &opErr) && !errors.Is(err, redisstore.ErrInFlight)
}

// Client is the pool's Redis client.
func (p *Pool) Client() goredis.UniversalClient { return p.client }

// Runtime is what every call through the client goes through.
func (p *Pool) Runtime() *Runtime { return &p.rt }

// Destruct closes the client when no configuration uses it any more, or,
// if requests still hold leases or settlements through it, once the last
// one ends.
func (p *Pool) Destruct() error {
	p.refs.Lock()
	p.refs.retired = true
	idle := p.refs.held == 0
	p.refs.Unlock()
	if idle {
		return p.close()
	}
	return nil
}

func (p *Pool) close() error {
	p.store.Close()
	return p.client.Close()
}

// acquire counts a request holding a lease or settlement through the
// client, and reports false if the client is closed (retired with none
// held).
func (p *Pool) acquire() bool {
	p.refs.Lock()
	defer p.refs.Unlock()
	if p.refs.retired && p.refs.held == 0 {
		return false
	}
	p.refs.held++
	return true
}

// release ends what acquire counted, and closes a retired client that
// no request holds any more.
func (p *Pool) release() {
	p.refs.Lock()
	p.refs.held--
	last := p.refs.retired && p.refs.held == 0
	p.refs.Unlock()
	if last {
		_ = p.close()
	}
}

// Ping sends one PING, bounded by timeout, once per config load: the
// callers that pass the same load (the Done channel of the load's
// context, which every module of a config load shares) after the first
// get its answer, so that a Redis that does not answer delays the load by
// one timeout, not one a handler. It goes around the breaker: it is a
// check at start, not a decision.
func (p *Pool) Ping(ctx context.Context, timeout time.Duration) error {
	pg := &p.pinged
	pg.Lock()
	defer pg.Unlock()
	load := ctx.Done()
	if load != nil && load == pg.load {
		return pg.err
	}
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pg.load, pg.err = load, p.client.Ping(c).Err()
	return pg.err
}

// Open returns zone z's limiter on Redis: every call bounded by the
// timeout and short-circuited while Redis is known to be unreachable.
func (p *Pool) Open(z storage.Zone) *Limiter {
	return &Limiter{inner: p.store.Zone(z), name: z.Name, limit: z.Limit, rt: &p.rt, pool: p}
}

// Store is the pool's Redis store.
func (p *Pool) Store() *redisstore.Store { return p.store }

// Lead is how far Redis's clock is ahead of this instance's (µs), as the
// last decision Redis made showed it.
func (p *Pool) Lead() int64 { return p.lead.Load() }
