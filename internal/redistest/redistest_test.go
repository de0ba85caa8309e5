package redistest_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-tollgate/tollgate/internal/redistest"
)

func TestServerLifecycle(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client()
	ctx := context.Background()

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	cfg, err := c.ConfigGet(ctx, "save").Result()
	if err != nil {
		t.Fatalf("CONFIG GET save: %v", err)
	}
	if cfg["save"] != "" {
		t.Errorf("save = %q, want persistence off", cfg["save"])
	}

	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Errorf("PING after Stop: no error, want one")
	}
	s.Stop() // idempotent

	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS k after Restart = %d, %v; want 0 (data lost)", n, err)
	}
}

func TestServerPause(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	s.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Ping(ctx).Err()
	if err == nil {
		t.Fatalf("PING to a paused server: no error")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("PING to a paused server: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("PING to a paused server took %s, want about the 100ms deadline", d)
	}
	s.Resume()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	if len(c.Addrs) != 3 {
		t.Fatalf("Addrs = %v, want 3", c.Addrs)
	}
	cc := c.Client()
	ctx := context.Background()
	nodes := map[string]bool{}
	for i := 0; i < 30; i++ {
		k := "key" + strconv.Itoa(i)
		if err := cc.Set(ctx, k, i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		slot, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
		}
		nodes[strconv.FormatInt(slot*3/16384, 10)] = true
	}
	if len(nodes) != 3 {
		t.Errorf("keys spread over %d thirds of the slots, want 3", len(nodes))
	}
	var masters atomic.Int64
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New(m.Options().Addr + " holds no keys")
		}
		masters.Add(1)
		return nil
	})
	if err != nil {
		t.Fatalf("DBSIZE on every master: %v", err)
	}
	if got := masters.Load(); got != 3 {
		t.Errorf("%d masters hold keys, want 3", got)
	}
}

func TestAddUser(t *testing.T) {
	s := redistest.Start(t)
	s.AddUser("limited", "pw", "-function|load")
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr, Username: "limited", Password: "pw"})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET as the user: %v", err)
	}
	err := c.FunctionLoad(ctx, "#!lua name=x\nredis.register_function('f', function() return 1 end)").Err()
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("FUNCTION LOAD as a user without it: %v, want NOPERM", err)
	}
	bad := goredis.NewClient(&goredis.Options{Addr: s.Addr, Username: "limited", Password: "wrong"})
	defer bad.Close()
	if err := bad.Ping(ctx).Err(); err == nil {
		t.Fatal("PING with the wrong password succeeded")
	}
}

// TestSentinelReplicaInSync: StartSentinel returns with the replica
// following the master: a write reaches it.
func TestSentinelReplicaInSync(t *testing.T) {
	s := redistest.StartSentinel(t)
	m := s.Master.Client()
	ctx := context.Background()
	if err := m.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := m.Wait(ctx, 1, time.Second).Result()
	if err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas acknowledged, %v; want 1", n, err)
	}
	if v, err := s.Replica.Client().Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k on the replica: %q, %v", v, err)
	}
}

// TestCalls: Calls counts the commands named, and only those.
func TestCalls(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client()
	ctx := context.Background()
	set, get := redistest.Calls(t, c, "set"), redistest.Calls(t, c, "get")
	for range 3 {
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Get(ctx, "k").Err()
	if n := redistest.Calls(t, c, "set") - set; n != 3 {
		t.Errorf("%d SETs counted, want 3", n)
	}
	if n := redistest.Calls(t, c, "set", "get") - set - get; n != 4 {
		t.Errorf("%d SETs and GETs counted, want 4", n)
	}
}
