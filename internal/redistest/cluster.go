package redistest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters without replicas, started for a
// test by StartCluster.
type Cluster struct {
	// Addrs are the masters' addresses.
	Addrs []string
	// Servers are the masters, for fault tests.
	Servers []*Server

	tb testing.TB
}

// StartCluster starts masters (at least 3) cluster-enabled redis-servers,
// joins them with redis-cli --cluster create, and waits until every node
// sees the cluster as ok. The servers are killed when the test ends.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	bin := lookPath(tb, "redis-server")
	cli := lookPath(tb, "redis-cli")
	c := &Cluster{tb: tb}
	for i := 0; i < masters; i++ {
		c.Servers = append(c.Servers, startNode(tb, bin))
		c.Addrs = append(c.Addrs, c.Servers[i].Addr)
	}

	ctx, cancel := withTimeout(time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitOK(masters)
	return c
}

// startNode starts one cluster-enabled server. The cluster bus listens on
// the port + 10000 (the default, so that any Redis version works), so both
// ports must be free.
func startNode(tb testing.TB, bin string) *Server {
	tb.Helper()
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		port := 20000 + rand.IntN(25000)
		if !portFree(port) || !portFree(port+10000) {
			continue
		}
		s := newServer(tb, bin, port, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
		})
		if err = s.start(); err == nil {
			return s
		}
	}
	tb.Fatalf("redistest: starting a cluster node: %v", err)
	return nil
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// waitOK waits until every node reports cluster_state:ok and knows every
// node.
func (c *Cluster) waitOK(masters int) {
	c.tb.Helper()
	want := []string{"cluster_state:ok", "cluster_known_nodes:" + strconv.Itoa(masters)}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Servers {
		rc := goredis.NewClient(&goredis.Options{Addr: s.Addr})
		for {
			ctx, cancel := withTimeout(time.Second)
			info, err := rc.ClusterInfo(ctx).Result()
			cancel()
			if err == nil && containsAll(info, want) {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				c.tb.Fatalf("redistest: cluster node %s not ok: %v\n%s", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Client returns a new cluster client, closed when the test ends. It
// honours contexts' deadlines (ContextTimeoutEnabled).
func (c *Cluster) Client() *goredis.ClusterClient {
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 c.Addrs,
		ContextTimeoutEnabled: true,
	})
	c.tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// String lists the masters' addresses.
func (c *Cluster) String() string {
	return fmt.Sprintf("cluster%v", c.Addrs)
}
