package tollgate

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/storage"
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

	client  *shared.Pool
	poolKey string
	timeout time.Duration
	logger  *zap.Logger
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

// Provision resolves placeholders, checks the settings and gets the shared
// client for them.
func (r *RedisStorage) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	shared.RouteRedisLog(func() *zap.Logger { return caddy.Log().Named("http.handlers.rate_limit.redis") })
	opts, err := r.options()
	if err != nil {
		return err
	}
	prefix := redisstore.DefaultPrefix
	if r.KeyPrefix != nil {
		prefix = *r.KeyPrefix
	}

	pipeline, err := onOff("pipeline", r.Pipeline)
	if err != nil {
		return err
	}
	functions, err := onOff("functions", r.Functions)
	if err != nil {
		return err
	}

	r.poolKey = shared.PoolKey(opts, prefix, pipeline, functions)
	v, _, err := redisClients.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		return shared.NewPool(goredis.NewUniversalClient(opts), prefix, shared.PoolConfig{
			Keys: shared.KeysOf(opts, prefix), Timeout: r.timeout, Logger: r.logger,
			Pipeline: pipeline, Functions: functions,
		}), nil
	})
	if err != nil {
		return fmt.Errorf("redis client: %w", err)
	}
	r.client = v.(*shared.Pool)
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
// Timeout, once per client and config load (see shared.Pool.Ping).
func (r *RedisStorage) ping(ctx caddy.Context) error {
	return r.client.Ping(ctx, max(redisPingTimeout, r.timeout))
}

// options builds the client options from the fields, placeholders
// replaced and the timeout defaulted (see shared.ClientConfig).
func (r *RedisStorage) options() (*goredis.UniversalOptions, error) {
	r.timeout = time.Duration(r.Timeout)
	if r.timeout == 0 {
		r.timeout = DefaultRedisTimeout
	}
	repl := caddy.NewReplacer()
	c := shared.ClientConfig{
		URL:            repl.ReplaceAll(r.URL, ""),
		SentinelMaster: r.SentinelMaster,
		Username:       repl.ReplaceAll(r.Username, ""),
		Password:       repl.ReplaceAll(r.Password, ""),
		DB:             r.DB,
		PoolSize:       r.PoolSize,
		Cluster:        r.Cluster,
		TLS:            r.TLS != nil,
		Timeout:        r.timeout,
	}
	for _, a := range r.Addresses {
		c.Addresses = append(c.Addresses, repl.ReplaceAll(a, ""))
	}
	if r.TLS != nil {
		c.InsecureSkipVerify = r.TLS.InsecureSkipVerify
	}
	return c.Options()
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
	return r.client.Open(z), nil
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
)
