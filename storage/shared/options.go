package shared

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ClientConfig is what chooses a Redis client: the storage redis options
// of the root package's RedisStorage, placeholders replaced.
type ClientConfig struct {
	URL            string
	Addresses      []string
	SentinelMaster string
	Username       string
	Password       string
	DB             int
	PoolSize       int
	Cluster        bool
	// TLS is whether the tls option is given, and InsecureSkipVerify its
	// insecure_skip_verify.
	TLS                bool
	InsecureSkipVerify bool
	// Timeout bounds each call (0: not set, checked only).
	Timeout time.Duration
}

// Options checks c and returns its client's options, each error naming
// the field and the value. Every call is bounded by Timeout, and a call is
// never retried.
func (c ClientConfig) Options() (*goredis.UniversalOptions, error) {
	o := &goredis.UniversalOptions{
		Username:   c.Username,
		Password:   c.Password,
		DB:         c.DB,
		MasterName: c.SentinelMaster,
		PoolSize:   c.PoolSize,
	}
	if c.DB < 0 {
		return nil, fmt.Errorf("db: must not be negative, got %d", c.DB)
	}
	if c.PoolSize < 0 {
		return nil, fmt.Errorf("pool_size: must not be negative, got %d", c.PoolSize)
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("timeout: must not be negative, got %s", c.Timeout)
	}
	for _, a := range c.Addresses {
		if _, port, ok := strings.Cut(a, ":"); !ok || port == "" {
			return nil, fmt.Errorf("addresses: want host:port, got %q", a)
		}
		o.Addrs = append(o.Addrs, a)
	}
	o.IsClusterMode = c.Cluster
	if u := c.URL; u != "" {
		if len(o.Addrs) > 0 {
			return nil, fmt.Errorf("url and addresses: give one or the other")
		}
		for _, scheme := range []string{"redis", "rediss"} {
			if rest, ok := strings.CutPrefix(u, scheme+"+cluster://"); ok {
				u, o.IsClusterMode = scheme+"://"+rest, true
			}
		}
		parsed, err := ParseURL(u)
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
		if c.DB == 0 {
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
	if c.TLS {
		if o.TLSConfig == nil {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.TLSConfig.InsecureSkipVerify = c.InsecureSkipVerify
	}
	o.ContextTimeoutEnabled = true // the per-decision deadline is the context's
	o.ReadTimeout = c.Timeout
	o.WriteTimeout = c.Timeout
	// No retries: a script whose reply was lost may have run, and running
	// it again would charge the request twice.
	o.MaxRetries = -1
	// A call that waits for a pool connection gives up with
	// ErrPoolTimeout before its deadline, so that the breaker can tell a
	// busy pool (load on this instance) from a slow Redis.
	o.PoolTimeout = c.Timeout * 3 / 4
	return o, nil
}
