package tollgate

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

func init() {
	caddy.RegisterModule(RedisStorage{})
}

// RedisStorage keeps limiter state in Redis, shared exactly by every Caddy
// instance that points at the same Redis: each decision is one Lua script
// run atomically on the server and timed by the server's clock. One address
// is a standalone Redis, several a Redis Cluster; SentinelMaster means
// Sentinel, with Addresses the sentinels.
type RedisStorage struct {
	// URL is a redis:// or rediss:// URL, e.g. redis://user:pass@host:6379/0.
	// Use it or Addresses, not both. Placeholders such as {env.REDIS_URL}
	// are replaced. Default: none.
	URL string `json:"url,omitempty"`

	// Addresses are host:port pairs: one for a standalone Redis, several
	// for a Cluster, the sentinels with SentinelMaster. Default:
	// localhost:6379.
	Addresses []string `json:"addresses,omitempty"`

	// SentinelMaster is the name of the master to ask the sentinels for.
	// Default: none (no Sentinel).
	SentinelMaster string `json:"sentinel_master,omitempty"`

	// Username for Redis ACLs. Placeholders are replaced. Default: none.
	Username string `json:"username,omitempty"`

	// Password, e.g. {env.REDIS_PASSWORD}. Placeholders are replaced; the
	// password is never logged. Default: none.
	Password string `json:"password,omitempty"`

	// DB is the database number (standalone and Sentinel). Default: 0.
	DB int `json:"db,omitempty"`

	// TLS, if set, connects with TLS. Default: none (no TLS, unless the
	// URL is rediss://).
	TLS *RedisTLS `json:"tls,omitempty"`

	// KeyPrefix starts every key Tollgate writes. Default: "tollgate:".
	KeyPrefix *string `json:"key_prefix,omitempty"`

	// Timeout bounds one decision, connecting included; past it the zone's
	// on_storage_error applies. Default: 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// PoolSize is the most connections per Redis node. Default: go-redis's,
	// 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// Cluster makes a single address a Redis Cluster's configuration
	// endpoint (as AWS ElastiCache and Google Memorystore give one), instead
	// of a standalone Redis. Several addresses are a Cluster without it. The
	// URL form is redis+cluster:// or rediss+cluster://. Default: false.
	Cluster bool `json:"cluster,omitempty"`

	// Pipeline is "on" (the default) or "off". On, decisions made while
	// others are in flight share network round trips: they go to Redis
	// together as one pipeline, each still one atomic script, so decisions
	// stay exact. Off, each decision is its own round trip. Default: on.
	Pipeline string `json:"pipeline,omitempty"`

	// Functions is "on" (the default) or "off". On, where the server has
	// functions (Redis 7 and later), Tollgate loads its scripts once as a
	// function library (FUNCTION LOAD, named tollgate_ and a hash of its
	// code) and decides by FCALL, which costs Redis less per decision than
	// EVALSHA of the same code; with pipeline on and one server
	// (standalone or Sentinel), a pipeline's one-zone decisions go as one
	// FCALL of the library's batch function, each decided as alone. A
	// server that refuses the library gets EVALSHA, with one warning in
	// the log. Off, always EVALSHA. Default: on.
	Functions string `json:"functions,omitempty"`

	client  *pooledRedis
	poolKey string
	// slotCopies: a concurrency zone on this storage counts its slots
	// locally too (on_storage_error local, see countSlots).
	slotCopies bool
	timeout    time.Duration
	logger     *zap.Logger
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// InsecureSkipVerify skips verifying the server's certificate.
	// Default: false.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (RedisStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit.storage.redis",
		New: func() caddy.Module { return new(RedisStorage) },
	}
}

// DefaultRedisTimeout bounds one decision when Timeout is not set.
const DefaultRedisTimeout = 100 * time.Millisecond

// redisClients holds the clients across config reloads: one per distinct
// set of connection settings, shared by every handler that uses them.
var redisClients = caddy.NewUsagePool()

// pooledRedis is a client in redisClients, with its runtime.
type pooledRedis struct {
	client goredis.UniversalClient
	store  *redisstore.Store
	// keys identifies the keys the client's store reads and writes (see
	// redisKeysOf): clients that differ only in how they connect share it.
	keys string
	// rt is what every call through the client goes through: breaker,
	// timeout, and the settlements Redis could not hear yet (kept in
	// rt.Owed until it does; while it keeps any, the client stays open).
	rt shared.Runtime
	// lead is how far Redis's clock is ahead of this instance's (µs), as
	// the last decision Redis made showed it: never less than the true
	// lead, since a decision is made after the request's time was read.
	// The local copies of on_storage_error local keep Redis's clock with
	// it (see follow).
	lead atomic.Int64
	// pinged is the PING at start that the handlers of one config load
	// share (see RedisStorage.ping).
	pinged struct {
		sync.Mutex
		load <-chan struct{} // the load's context's Done
		err  error
	}
	// refs counts the requests that hold a concurrency lease through the
	// client: a reload that changes the storage settings retires it, and
	// it stays open until the last of them gives its slot back, so that
	// their leases are renewed and given back, not left to lapse.
	refs struct {
		sync.Mutex
		held    int
		retired bool // no configuration uses it: close once held is 0
	}
	renewLog logThrottle // failed lease renewals: one line per interval
	// waitedUnsent: a call's deadline with no network error means it
	// never got a connection (see waitedForConn): not on a Cluster.
	waitedUnsent bool
}

// Destruct closes the client when no configuration uses it any more, or,
// if requests still hold leases through it, once the last one ends.
func (p *pooledRedis) Destruct() error {
	p.refs.Lock()
	p.refs.retired = true
	idle := p.refs.held == 0
	p.refs.Unlock()
	if idle {
		return p.close()
	}
	return nil
}

func (p *pooledRedis) close() error {
	p.store.Close()
	return p.client.Close()
}

// acquire counts a request holding a lease through the client, and
// reports false if the client is closed (retired with none held).
func (p *pooledRedis) acquire() bool {
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
func (p *pooledRedis) release() {
	p.refs.Lock()
	p.refs.held--
	last := p.refs.retired && p.refs.held == 0
	p.refs.Unlock()
	if last {
		_ = p.close()
	}
}

// Provision resolves placeholders, checks the settings and gets the shared
// client for them.
func (r *RedisStorage) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	routeRedisLog()
	opts, err := r.options()
	if err != nil {
		return err
	}
	r.timeout = time.Duration(r.Timeout)
	if r.timeout == 0 {
		r.timeout = DefaultRedisTimeout
	}
	prefix := redisstore.DefaultPrefix
	if r.KeyPrefix != nil {
		prefix = *r.KeyPrefix
	}
	opts.ContextTimeoutEnabled = true // the per-decision deadline is the context's
	opts.ReadTimeout = r.timeout
	opts.WriteTimeout = r.timeout
	// No retries: a script whose reply was lost may have run, and running
	// it again would charge the request twice.
	opts.MaxRetries = -1
	// A call that waits for a pool connection gives up with
	// ErrPoolTimeout before its deadline, so that the breaker can tell a
	// busy pool (load on this instance) from a slow Redis.
	opts.PoolTimeout = r.timeout * 3 / 4

	pipeline, err := onOff("pipeline", r.Pipeline)
	if err != nil {
		return err
	}
	functions, err := onOff("functions", r.Functions)
	if err != nil {
		return err
	}

	r.poolKey = redisPoolKey(opts, prefix, pipeline, functions)
	v, _, err := redisClients.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		c := goredis.NewUniversalClient(opts)
		_, cluster := c.(*goredis.ClusterClient)
		p := &pooledRedis{client: c, store: redisstore.New(c, prefix), keys: redisKeysOf(opts, prefix), waitedUnsent: !cluster}
		if pipeline {
			p.store = redisstore.NewPipelined(c, prefix)
		}
		// Rejections answered from memory until their wait ends (at
		// most a second); resets clear them on every instance.
		p.store.WithDenyCache(c)
		if functions {
			logger := r.logger
			p.store.WithFunctions(func(err error) {
				logger.Warn("redis refused Tollgate's function library: deciding with EVALSHA instead (set functions off to skip the attempt)", zap.Error(err))
			})
		}
		p.rt.Breaker.Logger, p.rt.Timeout = r.logger, r.timeout
		p.rt.Owed = shared.Owed{
			Retry:   shared.RetryEvery,
			Now:     monotonicMicros,
			Do:      func(fn func(context.Context) error) error { return p.rt.Call(context.Background(), fn) },
			Unsent:  p.unsent,
			Hold:    p.acquire,
			Release: p.release,
			Logger:  r.logger,
		}
		logger := r.logger
		// A tick renews every lease due in one pipeline, which may take
		// Redis longer than one decision's timeout: it gets a second at
		// least.
		p.store.WithLeases(max(r.timeout, time.Second), func(err error) {
			if suppressed, ok := p.renewLog.allow(monotonicMicros(), logThrottleInterval); ok {
				logger.Error("rate limit store failed", zap.Error(err), zap.Int64("suppressed", suppressed))
			}
		})
		return p, nil
	})
	if err != nil {
		return fmt.Errorf("redis client: %w", err)
	}
	r.client = v.(*pooledRedis)
	return nil
}

// onOff reads a switch that is on unless it is "off".
func onOff(field, v string) (bool, error) {
	switch v {
	case "", "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("%s: must be on or off, got %q", field, v)
}

// redisPingTimeout bounds the PING at start: long enough for a first
// connection to a Redis across a network, short enough that a Redis that
// does not answer delays a config load by little.
const redisPingTimeout = time.Second

// ping sends one PING, bounded by the larger of redisPingTimeout and
// Timeout, once per client and config load: the handlers provisioned in
// ctx (every module of a config load shares its context) after the first
// get its answer, so that a Redis that does not answer delays the load by
// one timeout, not one a handler. It goes around the breaker: it is a
// check at start, not a decision.
func (r *RedisStorage) ping(ctx caddy.Context) error {
	p := &r.client.pinged
	p.Lock()
	defer p.Unlock()
	load := ctx.Done()
	if load != nil && load == p.load {
		return p.err
	}
	c, cancel := context.WithTimeout(ctx, max(redisPingTimeout, r.timeout))
	defer cancel()
	p.load, p.err = load, r.client.client.Ping(c).Err()
	return p.err
}

// options builds the client options from the fields, placeholders replaced.
func (r *RedisStorage) options() (*goredis.UniversalOptions, error) {
	repl := caddy.NewReplacer()
	o := &goredis.UniversalOptions{
		Username:   repl.ReplaceAll(r.Username, ""),
		Password:   repl.ReplaceAll(r.Password, ""),
		DB:         r.DB,
		MasterName: r.SentinelMaster,
		PoolSize:   r.PoolSize,
	}
	if r.DB < 0 {
		return nil, fmt.Errorf("db: must not be negative, got %d", r.DB)
	}
	if r.PoolSize < 0 {
		return nil, fmt.Errorf("pool_size: must not be negative, got %d", r.PoolSize)
	}
	if r.Timeout < 0 {
		return nil, fmt.Errorf("timeout: must not be negative, got %s", time.Duration(r.Timeout))
	}
	for _, a := range r.Addresses {
		a = repl.ReplaceAll(a, "")
		if _, port, ok := strings.Cut(a, ":"); !ok || port == "" {
			return nil, fmt.Errorf("addresses: want host:port, got %q", a)
		}
		o.Addrs = append(o.Addrs, a)
	}
	o.IsClusterMode = r.Cluster
	if u := repl.ReplaceAll(r.URL, ""); u != "" {
		if len(o.Addrs) > 0 {
			return nil, fmt.Errorf("url and addresses: give one or the other")
		}
		for _, scheme := range []string{"redis", "rediss"} {
			if rest, ok := strings.CutPrefix(u, scheme+"+cluster://"); ok {
				u, o.IsClusterMode = scheme+"://"+rest, true
			}
		}
		parsed, err := parseRedisURL(u)
		if err != nil {
			return nil, err
		}
		o.Addrs = []string{parsed.Addr}
		if o.Username == "" {
			o.Username = parsed.Username
		}
		if o.Password == "" {
			o.Password = parsed.Password
		}
		if r.DB == 0 {
			o.DB = parsed.DB
		}
		o.TLSConfig = parsed.TLSConfig
	}
	if len(o.Addrs) == 0 {
		o.Addrs = []string{"localhost:6379"}
	}
	if o.MasterName == "" && (len(o.Addrs) > 1 || o.IsClusterMode) && o.DB != 0 {
		return nil, fmt.Errorf("db: a Redis Cluster has only database 0, got %d", o.DB)
	}
	if o.MasterName != "" && o.IsClusterMode {
		return nil, fmt.Errorf("cluster and sentinel_master: a Sentinel-managed Redis is not a Cluster; give one or the other")
	}
	if r.TLS != nil {
		if o.TLSConfig == nil {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.TLSConfig.InsecureSkipVerify = r.TLS.InsecureSkipVerify
	}
	return o, nil
}

// parseRedisURL parses a redis:// or rediss:// URL. Its error names the
// URL with the password hidden, and never holds the password: the errors
// of net/url quote the whole URL, and may quote a piece of it.
func parseRedisURL(u string) (*goredis.Options, error) {
	o, err := goredis.ParseURL(u)
	if err == nil {
		return o, nil
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // without the URL it quotes
	}
	msg := err.Error()
	if strings.Contains(u, "@") {
		// A URL with user info that does not parse may hold its password
		// anywhere the parsers echo it: keep only what the message says
		// of the kind of fault, before any quoted or appended input.
		msg = faultKind(msg)
	}
	return nil, fmt.Errorf("url %q: %s", redactURL(u), msg)
}

// faultKind is the part of a URL parser's message that names the fault,
// without the input it quotes or appends: `invalid port ":x" after host`
// is "invalid port", `redis: unexpected option: foo` "unexpected option".
func faultKind(msg string) string {
	for _, prefix := range []string{"redis: ", "net/url: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	if i := strings.IndexByte(msg, '"'); i >= 0 {
		msg = msg[:i]
	}
	if i := strings.Index(msg, ": "); i >= 0 {
		msg = msg[:i]
	}
	return strings.TrimSpace(msg)
}

// userInfo returns where a URL's user info starts and ends (at its last
// '@', or -1 without one): after the scheme's "://" when the URL starts
// with a scheme (letters, digits, '+', '-', '.') and "://" comes before
// the '@', else at the start.
func userInfo(u string) (start, at int) {
	at = strings.LastIndexByte(u, '@')
	if i := strings.Index(u, "://"); i > 0 && i < at && isScheme(u[:i]) {
		start = i + 3
	}
	return start, at
}

// isScheme reports whether s can be a URL scheme.
func isScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}

// redactURL hides a URL's password for error messages: as net/url does
// for a URL with plain user info, else the whole user info (in a URL that
// does not parse, what looks like the name may be a piece of the
// password).
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil && strings.Count(s, "@") == 1 {
		return u.Redacted() // user:xxxxx@, the name kept
	}
	start, at := userInfo(s)
	if at < 0 {
		return s
	}
	return s[:start] + "xxxxx" + s[at:]
}

// redisPoolKey identifies a client by every setting that makes it
// different, hashed so that the password is not kept in the clear.
func redisPoolKey(o *goredis.UniversalOptions, prefix string, pipeline, functions bool) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q|%q|%q|%d|%q|%d|%v|%q|%d|%v|%v", o.Addrs, o.Username, o.Password, o.DB, o.MasterName, o.PoolSize, o.TLSConfig != nil && o.TLSConfig.InsecureSkipVerify, prefix, o.ReadTimeout, pipeline, functions)
	if o.TLSConfig != nil {
		h.Write([]byte("|tls"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// redisKeysOf identifies the Redis keys a client with options o and key
// prefix reaches: its servers (or Sentinel master), database and prefix,
// hashed as redisPoolKey is. Clients whose pool size, timeouts,
// pipelining or credentials differ reach the same keys.
func redisKeysOf(o *goredis.UniversalOptions, prefix string) string {
	addrs := slices.Clone(o.Addrs)
	slices.Sort(addrs)
	h := sha256.Sum256(fmt.Appendf(nil, "%q|%d|%q|%q", addrs, o.DB, o.MasterName, prefix))
	return hex.EncodeToString(h[:])
}

// Cleanup releases the shared client.
func (r *RedisStorage) Cleanup() error {
	if r.client != nil {
		_, err := redisClients.Delete(r.poolKey)
		r.client = nil
		return err
	}
	return nil
}

// OpenLimiter returns the zone's limiter on Redis: every call bounded by
// Timeout and short-circuited while Redis is known to be unreachable.
func (r *RedisStorage) OpenLimiter(z storage.Zone) (storage.Limiter, error) {
	if r.client == nil {
		return nil, errors.New("redis storage is not provisioned")
	}
	return &redisLimiter{inner: r.client.store.Zone(z), name: z.Name, limit: z.Limit, rt: &r.client.rt, pool: r.client}, nil
}

// redisLimiter is a zone's limiter on Redis: each call goes through the
// client's runtime (breaker, timeout, settlements kept while Redis cannot
// hear them), and the zone's local copy, if any, follows.
type redisLimiter struct {
	inner storage.Limiter
	name  string // the zone's
	limit algorithms.Limit
	rt    *shared.Runtime // the client's: every call goes through it
	pool  *pooledRedis    // the client inner runs on
	// copy is the zone's local copy for on_storage_error local (see
	// follow), or nil: a give-back Redis makes is made there too, and a
	// reset any instance makes is followed (see resetCopy).
	copy       *memory.Store
	stopResets func()
	resets     chan struct{} // bounds the resets followed at once
}

// Close stops following resets.
func (l *redisLimiter) Close() {
	if l.stopResets != nil {
		l.stopResets()
	}
}

// heard follows, in the local copy, a reset (grant 0) or a grant of
// grant milli-units to key that an instance published (see
// redisstore.Store.OnReset): a grant as a grant, a reset by resetCopy.
func (l *redisLimiter) heard(key string, grant int64) {
	if grant > 0 {
		_, _ = l.copy.Grant(context.Background(), key, clock(), grant)
		return
	}
	l.resetCopy(key)
}

// resetCopy brings the local copy of key up to its state on Redis after
// an instance (this one or another) reset it there, and published the
// reset once done: a Peek made after the reset was heard of reads what
// Redis holds since, which the copy is reseeded from (or forgets the key,
// if Redis holds none): a decision's reply is merged into the copy,
// which never moves back, but a reset must take it back. Without it, a
// client reset elsewhere stayed refused by this instance's copy, whenever
// Redis did not answer in time. If the Peek fails, or too many resets
// are being followed at once, the copy stays as it was, which errs
// towards refusing. It does not block.
func (l *redisLimiter) resetCopy(key string) {
	select {
	case l.resets <- struct{}{}:
	default:
		return
	}
	go func() {
		defer func() { <-l.resets }()
		var (
			d    algorithms.Decision
			held bool
		)
		err := l.rt.Call(context.Background(), func(ctx context.Context) error {
			var err error
			d, held, err = l.inner.Peek(ctx, key, monotonicMicros())
			return err
		})
		switch {
		case err != nil:
		case held:
			l.copy.Reseed(key, d) // a reset takes the copy back: not a merge
		default:
			_, _ = l.copy.Reset(context.Background(), key, monotonicMicros())
		}
	}()
}

// followedResets is how many resets a zone's copy follows at once.
const followedResets = 64

func (l *redisLimiter) Take(ctx context.Context, key string, now, cost int64) (d algorithms.Decision, err error) {
	err = l.rt.Call(ctx, func(c context.Context) error {
		d, err = l.inner.Take(c, key, now, cost)
		return err
	})
	return d, err
}

func (l *redisLimiter) Undo(ctx context.Context, key string, now, cost int64, taken algorithms.Decision) error {
	err := l.rt.Call(ctx, func(c context.Context) error {
		return l.inner.Undo(c, key, now, cost, taken)
	})
	if err != nil && l.limit.Kind != algorithms.Concurrency {
		err = l.keep(key, taken, cost, err)
	}
	// A slot's local count is given back by its request itself (see
	// countSlots): it is not a copy of Redis's.
	if err == nil && l.copy != nil && l.copy.Limit().Kind != algorithms.Concurrency {
		l.copy.Undo(ctx, key, now, cost, taken)
	}
	return err
}

// keep keeps a settlement that failed with err, giving back give
// milli-units (owing -give), until Redis hears it (see shared.Owed), and
// returns nil if it was kept, else err. A settlement whose call may have
// reached Redis is not kept: it may have been applied.
func (l *redisLimiter) keep(key string, taken algorithms.Decision, give int64, err error) error {
	s, ok := l.inner.(storage.Settler)
	if !ok || !l.pool.unsent(err) {
		return err
	}
	// Counted from now, not from taken.At: Redis's clock is not this
	// instance's, and a little late is harmless (past its window, a
	// settlement changes nothing).
	if !l.rt.Owed.Keep(s, key, taken, give, monotonicMicros()+storage.Horizon(&l.limit)) {
		return fmt.Errorf("%w (not kept: the window has ended, or too many are kept)", err)
	}
	return nil
}

// unsent reports whether a call through p that failed with err surely
// never ran on Redis: shared.Unsent, or a deadline that ended while the
// call waited for a connection (see waitedForConn).
func (p *pooledRedis) unsent(err error) bool {
	return shared.Unsent(err) || p.waitedUnsent && waitedForConn(err)
}

// waitedForConn reports whether err is the call's deadline, with no
// network error, that ended before the call got a connection: go-redis
// dials a new one in the background, trying a refused dial 5 times 100ms
// apart, and returns the caller's context error if its deadline ends
// first. A client of one server returns no other context error once it
// has sent a call (it never retries), but a call that waited for its
// pipeline's batch (marked ErrInFlight); a Cluster client retries, so
// its context errors are not taken as unsent.
func waitedForConn(err error) bool {
	var opErr *net.OpError
	return errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &opErr) && !errors.Is(err, redisstore.ErrInFlight)
}

// Grant gives key extra quota for its current window on Redis (see
// storage.Granter).
func (l *redisLimiter) Grant(ctx context.Context, key string, now, amount int64) (algorithms.Decision, error) {
	d, _, err := l.GrantOnce(ctx, key, now, amount, "")
	return d, err
}

// GrantOnce gives key extra quota for its current window on Redis, once
// for an id (see storage.OnceGranter), through the breaker and timeout
// of a decision. The local copy of on_storage_error local follows a grant
// applied as it follows any decision: the grant, then the state after it.
// An error that wraps redisstore.ErrNotAnnounced says the grant was
// applied.
func (l *redisLimiter) GrantOnce(ctx context.Context, key string, now, amount int64, id string) (d algorithms.Decision, applied bool, err error) {
	g, ok := l.inner.(storage.OnceGranter)
	if !ok {
		return d, false, fmt.Errorf("%T keeps no grants", l.inner)
	}
	var notice error // a grant applied but not announced: Redis answered it
	err = l.rt.Call(ctx, func(c context.Context) error {
		var err error
		d, applied, err = g.GrantOnce(c, key, now, amount, id)
		if errors.Is(err, redisstore.ErrNotAnnounced) {
			notice, err = err, nil
		}
		return err
	})
	if err == nil {
		err = notice
	}
	if applied {
		l.grantCopy(key, now, amount, d)
	}
	return d, applied, err
}

// grantCopy has the local copy follow a grant of amount to key, d the
// decision after it.
func (l *redisLimiter) grantCopy(key string, now, amount int64, d algorithms.Decision) {
	if l.copy != nil {
		_, _ = l.copy.Grant(context.Background(), key, now, amount)
		l.copy.Seed(key, d, 0, false)
	}
}

// grantScope identifies where l's grants are kept: its Redis keys (see
// redisKeysOf), zone and algorithm.
func (l *redisLimiter) grantScope() string {
	return fmt.Sprintf("redis %s %q %s", l.pool.keys, l.name, l.limit.Kind)
}

// grantedElsewhere has l learn a grant of amount to key that another
// handler's client made on the same Redis keys in this process (see
// grantScope), d the decision after it: its deny cache forgets the key's
// rejection, and its local copy follows the grant, as GrantOnce does
// (this process skips its own notices).
func (l *redisLimiter) grantedElsewhere(key string, now, amount int64, d algorithms.Decision) {
	if f, ok := l.inner.(interface{ Forget(key string) }); ok {
		f.Forget(key)
	}
	l.grantCopy(key, now, amount, d)
}

// leaseHolder is a Redis zone whose slots are leases (redis.Store's
// concurrency zones).
type leaseHolder interface {
	Hold(key string, taken algorithms.Decision) *redisstore.Lease
}

// hold has the store renew the lease of the slot taken holds for key
// until it is released, and keeps the client open meanwhile: the caller
// releases the lease, then gives the slot back, then releases pool. Both
// are nil when the client is closed already (the lease lapses).
func (l *redisLimiter) hold(key string, taken algorithms.Decision) (pool *pooledRedis, lease *redisstore.Lease) {
	h, ok := l.inner.(leaseHolder)
	if !ok || !l.pool.acquire() {
		return nil, nil
	}
	return l.pool, h.Hold(key, taken)
}

func (l *redisLimiter) Peek(ctx context.Context, key string, now int64) (d algorithms.Decision, ok bool, err error) {
	err = l.rt.Call(ctx, func(c context.Context) error {
		d, ok, err = l.inner.Peek(c, key, now)
		return err
	})
	return d, ok, err
}

// Reset resets key on Redis. An error that wraps
// redisstore.ErrNotAnnounced says the reset was applied.
func (l *redisLimiter) Reset(ctx context.Context, key string, now int64) (ok bool, err error) {
	var notice error // applied but not announced: Redis answered it
	err = l.rt.Call(ctx, func(c context.Context) error {
		ok, err = l.inner.Reset(c, key, now)
		if errors.Is(err, redisstore.ErrNotAnnounced) {
			notice, err = err, nil
		}
		return err
	})
	if err == nil {
		err = notice
	}
	return ok, err
}

// takeAll decides all of a request's zones as one step: every zone is
// charged if every non-dry-run zone admits the request, none otherwise. It
// fills each result's decision and limiter and returns the index of the
// first rejecting zone, or -1. It uses the store's TakeAll: one atomic script where the zones' keys can share one (always
// on a standalone or Sentinel Redis; on a Cluster when they hash to one
// slot). It goes through the same breaker and timeout as a single Take.
func (r *RedisStorage) takeAll(ctx context.Context, now int64, results []result) (rejected int, err error) {
	var buf [inlineZones]redisstore.Request
	reqs := buf[:0]
	settling := false
	for i := range results {
		res := &results[i]
		lim, ok := res.z.limiter.(*redisLimiter)
		if !ok {
			return -1, fmt.Errorf("zone %s is not on this Redis storage", res.z.name)
		}
		reqs = append(reqs, redisstore.Request{Zone: lim.inner, Key: res.key, Cost: res.cost, DryRun: res.z.dryRun, Strike: res.strike})
		settling = settling || res.z.base.response != nil
	}
	if settling {
		// A request to settle when its response is complete holds the
		// client open until it has (see settled): a reload may retire
		// the client meanwhile.
		pool := r.client
		if pool.acquire() {
			defer func() {
				if err != nil || rejected >= 0 || !settles(results) {
					pool.release()
				}
			}()
		}
	}
	// Redis decides by its own clock; the store's deny cache times its
	// entries by this instance's monotonic one (the handler's now may be
	// a test's fake clock).
	var v redisstore.Verdict
	err = r.client.rt.Breaker.Do(ctx, func() (bool, error) {
		var err error
		v, err = r.client.store.Decide(r.client.rt.Deadline(), monotonicMicros(), reqs)
		return v.Decided, err // a request the deny cache answered says nothing of Redis
	})
	if err != nil {
		return -1, err
	}
	for i := range results {
		results[i].d, results[i].limiter = v.Decisions[i], results[i].z.limiter
	}
	if v.Decided {
		r.client.follow(now, v.Clock, results, v.Rejected < 0)
	}
	if v.Rejected < 0 && r.slotCopies {
		return countSlots(ctx, now, results), nil
	}
	return v.Rejected, nil
}

// settled ends what takeAll began for a request to settle once its
// settlements are made (or kept): the client it decided on may close.
func settled(results []result) {
	for i := range results {
		if l, ok := results[i].limiter.(*redisLimiter); ok {
			l.pool.release()
			return
		}
	}
}

// follow keeps the local copies of on_storage_error local up with what
// Redis decided for a request read at now, at clock on Redis's clock (0:
// no decision of the request carried Redis's time, see
// redisstore.Verdict), charged telling whether it was admitted: Redis's
// clock's lead, and each part's state, so that a decision Redis cannot
// make in time goes on from where the shared state stood at this
// instance's last decision on the key, not from a fresh key. The copies
// follow this instance's decisions only: what other instances take
// meanwhile, this one learns at its next decision.
func (p *pooledRedis) follow(now, clock int64, results []result, charged bool) {
	if clock != 0 {
		p.lead.Store(clock - now)
	}
	for i := range results {
		res := &results[i]
		if storage.Skipped(res.d) {
			continue // a zone its ban answered for: not decided
		}
		if res.z.local != nil && res.z.mem != nil {
			res.z.mem.Seed(res.key, res.d, res.cost, charged && res.d.Allowed)
		}
	}
}

// followRedis makes mem, zone part p's store for on_storage_error local,
// the local copy of p's state on Redis (see follow): kept on Redis's clock,
// given back what Redis gives back, and reset when Redis is (see
// resetCopy). A part on another backend keeps no copy.
func followRedis(b Backend, p *zone, mem *memory.Store) {
	r, ok := b.(*RedisStorage)
	if !ok || r.client == nil || mem == nil {
		return
	}
	mem.Follow(&r.client.lead)
	l, ok := p.limiter.(*redisLimiter)
	if !ok {
		return
	}
	l.copy = mem
	if p.spec.Limit.Kind == algorithms.Concurrency {
		r.slotCopies = true
	}
	// A concurrency part's local store counts the requests of each key
	// this instance has in flight (see countSlots), not a copy of
	// Redis's: not seeded, not reset.
	if p.spec.Limit.Kind != algorithms.Concurrency {
		l.resets = make(chan struct{}, followedResets)
		l.stopResets = r.client.store.OnReset(l.inner, l.heard)
	}
}

// UnmarshalCaddyfile sets up the module from Caddyfile tokens. Syntax:
//
//	storage redis {
//		url        redis://user:pass@host:6379/0   # or the fields below
//		addresses  <host:port>...   # several: a Redis Cluster
//		sentinel_master <name>      # with sentinel addresses
//		username   <string>
//		password   <string>         # placeholders such as {env.REDIS_PASSWORD}
//		db         <n>
//		tls        [insecure_skip_verify]
//		key_prefix <string>         # default "tollgate:"
//		timeout    <duration>       # per decision, default 100ms
//		pool_size  <n>
//		cluster                     # one address that is a Cluster's endpoint
//		pipeline   on|off           # batch concurrent decisions; default on
//		functions  on|off           # FCALL of a function library (Redis 7+); default on
//	}
func (r *RedisStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("storage redis: option '%s' given twice", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "url":
			r.URL, err = stringArg(d)
		case "addresses":
			r.Addresses = d.RemainingArgs()
			if len(r.Addresses) == 0 {
				return d.ArgErr()
			}
		case "sentinel_master":
			r.SentinelMaster, err = stringArg(d)
		case "username":
			r.Username, err = stringArg(d)
		case "password":
			r.Password, err = stringArg(d)
		case "db":
			var v int64
			v, err = intArg(d)
			r.DB = int(v)
		case "tls":
			r.TLS = new(RedisTLS)
			for _, a := range d.RemainingArgs() {
				if a != "insecure_skip_verify" {
					return d.Errf("storage redis: tls: unknown option '%s'", a)
				}
				r.TLS.InsecureSkipVerify = true
			}
		case "key_prefix":
			var p string
			p, err = stringArg(d)
			r.KeyPrefix = &p
		case "timeout":
			r.Timeout, err = durationArg(d)
		case "pool_size":
			var v int64
			v, err = intArg(d)
			r.PoolSize = int(v)
		case "cluster":
			if d.NextArg() {
				return d.ArgErr()
			}
			r.Cluster = true
		case "pipeline", "functions":
			field := &r.Pipeline
			if opt == "functions" {
				field = &r.Functions
			}
			*field, err = stringArg(d)
			if err == nil && *field != "on" && *field != "off" {
				return d.Errf("storage redis: %s: must be on or off, got '%s'", opt, *field)
			}
		default:
			return d.Errf("storage redis: unrecognized subdirective '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Interface guards.
var (
	_ Backend               = (*RedisStorage)(nil)
	_ caddy.Provisioner     = (*RedisStorage)(nil)
	_ caddy.CleanerUpper    = (*RedisStorage)(nil)
	_ caddyfile.Unmarshaler = (*RedisStorage)(nil)
	_ storage.Limiter       = (*redisLimiter)(nil)
	_ storage.Granter       = (*redisLimiter)(nil)
	_ storage.OnceGranter   = (*redisLimiter)(nil)
	_ sharedLimiter         = (*redisLimiter)(nil)
)
