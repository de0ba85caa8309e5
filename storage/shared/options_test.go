package shared

import (
	"strings"
	"testing"
	"time"
)

func TestClientConfigOptions(t *testing.T) {
	o, err := ClientConfig{URL: "rediss+cluster://u:p@h:7000", Timeout: 100 * time.Millisecond}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if !o.IsClusterMode || len(o.Addrs) != 1 || o.Addrs[0] != "h:7000" || o.Username != "u" || o.Password != "p" || o.TLSConfig == nil {
		t.Errorf("cluster URL: got cluster %v, addrs %v, user %q, TLS %v; want a TLS cluster at h:7000 as u", o.IsClusterMode, o.Addrs, o.Username, o.TLSConfig != nil)
	}
	if o.MaxRetries != -1 || o.ReadTimeout != 100*time.Millisecond || o.PoolTimeout != 75*time.Millisecond || !o.ContextTimeoutEnabled {
		t.Errorf("got retries %d, read timeout %s, pool timeout %s; want no retry, 100ms, 75ms", o.MaxRetries, o.ReadTimeout, o.PoolTimeout)
	}
	if o, err := (ClientConfig{}).Options(); err != nil || len(o.Addrs) != 1 || o.Addrs[0] != "localhost:6379" {
		t.Errorf("no address: got %v, %v; want localhost:6379", o, err)
	}
	for _, c := range []struct {
		name string
		cfg  ClientConfig
		want string
	}{
		{"db", ClientConfig{DB: -1}, "db: must not be negative, got -1"},
		{"pool_size", ClientConfig{PoolSize: -2}, "pool_size: must not be negative, got -2"},
		{"timeout", ClientConfig{Timeout: -time.Second}, "timeout: must not be negative, got -1s"},
		{"address", ClientConfig{Addresses: []string{"h"}}, `addresses: want host:port, got "h"`},
		{"url and addresses", ClientConfig{URL: "redis://h:1", Addresses: []string{"h:2"}}, "url and addresses: give one or the other"},
		{"cluster db", ClientConfig{Addresses: []string{"a:1", "b:2"}, DB: 3}, "db: a Redis Cluster has only database 0, got 3"},
		{"sentinel cluster", ClientConfig{SentinelMaster: "m", Cluster: true}, "cluster and sentinel_master: "},
	} {
		if _, err := c.cfg.Options(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: Options() = %v, want an error starting %q", c.name, err, c.want)
		}
	}
}
