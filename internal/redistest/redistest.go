// Package redistest starts real redis-server processes for tests: a single
// server on a free loopback port (Start), or a Redis Cluster of several
// masters (StartCluster). Each server runs from its own temporary
// directory without persistence, and is killed when the test ends.
//
// Tests need redis-server (and redis-cli for a cluster) on PATH. Without
// them a test is skipped, unless the environment variable CI is set: then it
// fails, so that a CI machine cannot silently skip the Redis tests.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// readyTimeout bounds how long a server may take to answer PING.
const readyTimeout = 10 * time.Second

// Server is one redis-server process started for a test. Its methods are
// safe for concurrent use; they fail the test on error.
type Server struct {
	// Addr is the server's address, 127.0.0.1:port. It stays the same
	// across Stop and Restart.
	Addr string

	tb    testing.TB
	bin   string
	dir   string
	extra []string // more redis-server arguments (cluster mode)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Start starts a redis-server on a free loopback port and registers its
// shutdown with tb.Cleanup.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb)
}

// StartWith starts a redis-server as Start does, with more redis-server
// arguments, such as "--enable-debug-command", "yes".
func StartWith(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	for attempt := 0; ; attempt++ {
		s := newServer(tb, bin, freePort(tb), extra)
		err := s.start()
		if err == nil {
			return s
		}
		if attempt == 4 {
			tb.Fatalf("redistest: %v", err)
		}
		// Most likely another process took the port meanwhile; try another.
	}
}

func newServer(tb testing.TB, bin string, port int, extra []string) *Server {
	s := &Server{
		Addr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		tb:    tb,
		bin:   bin,
		dir:   tb.TempDir(),
		extra: extra,
	}
	// Registered after TempDir, so it runs first: the process dies before
	// its directory is removed.
	tb.Cleanup(s.Stop)
	return s
}

// Client returns a new client for the server, closed when the test ends.
// It honours contexts' deadlines (ContextTimeoutEnabled).
func (s *Server) Client() *goredis.Client {
	c := goredis.NewClient(&goredis.Options{
		Addr:                  s.Addr,
		ContextTimeoutEnabled: true,
	})
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Calls returns how many times the server c talks to has run the commands
// named (lower case, as INFO commandstats names them: "fcall",
// "evalsha"), failed calls included.
func Calls(tb testing.TB, c *goredis.Client, names ...string) int64 {
	tb.Helper()
	ctx, cancel := withTimeout(5 * time.Second)
	defer cancel()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("redistest: INFO commandstats: %v", err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, name := range names {
			if prefix := "cmdstat_" + name + ":calls="; strings.HasPrefix(line, prefix) {
				v, err := strconv.ParseInt(strings.Split(strings.TrimPrefix(line, prefix), ",")[0], 10, 64)
				if err != nil {
					tb.Fatalf("redistest: commandstats line %q: %v", line, err)
				}
				n += v
			}
		}
	}
	return n
}

// AddUser creates an ACL user that logs in with password and may run
// every command on every key and channel except the rules' (ACL SETUSER
// syntax: "-function|load" denies FUNCTION LOAD).
func (s *Server) AddUser(name, password string, rules ...string) {
	s.tb.Helper()
	ctx, cancel := withTimeout(5 * time.Second)
	defer cancel()
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr})
	defer c.Close()
	args := []any{"acl", "setuser", name, "on", ">" + password, "~*", "&*", "+@all"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := c.Do(ctx, args...).Err(); err != nil {
		s.tb.Fatalf("redistest: ACL SETUSER %s: %v", name, err)
	}
}

// Stop kills the server (SIGKILL: as abrupt as a crash) and waits for it to
// exit. Its data are lost. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart stops the server if it runs and starts a new, empty one on the
// same address.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: restart: %v", err)
}

// Pause freezes the server (SIGSTOP): it keeps its connections but answers
// nothing, as a server that hangs. Resume undoes it.
func (s *Server) Pause() {
	s.tb.Helper()
	s.signal(sigStop)
}

// Resume lets a paused server run again (SIGCONT).
func (s *Server) Resume() {
	s.tb.Helper()
	s.signal(sigCont)
}

func (s *Server) signal(sig os.Signal) {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatalf("redistest: %s: server %s is not running", sig, s.Addr)
	}
	if sig == nil {
		s.tb.Fatalf("redistest: pausing a server is not supported on this system")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Fatalf("redistest: %s: %v", sig, err)
	}
}

// start runs redis-server and waits until it answers PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, port, _ := net.SplitHostPort(s.Addr)
	logPath := filepath.Join(s.dir, "redis.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := append([]string{
		"--port", port,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", "",
	}, s.extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(readyTimeout)
	for {
		if ping(s.Addr) == nil {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on %s exited before it was ready: %s", s.Addr, tail(logPath))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on %s not ready after %s: %s", s.Addr, readyTimeout, tail(logPath))
		}
	}
}

// FreePort returns a loopback TCP port that was free a moment ago, for a
// test's own servers.
func FreePort(tb testing.TB) int {
	tb.Helper()
	return freePort(tb)
}

// ping sends one inline PING and checks for +PONG.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING: %q", strings.TrimSpace(line))
	}
	return nil
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

// lookPath finds a Redis binary, or skips (fails when CI is set) the test.
func lookPath(tb testing.TB, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("%s not installed, and CI is set so Redis tests may not be skipped: apt-get install redis-server", name)
	}
	tb.Skipf("%s not installed: apt-get install redis-server", name)
	return ""
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// withTimeout is a context for one setup step.
func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// Sentinel is a Sentinel-managed Redis for tests: a master, a replica and
// three sentinels, each a process started here on a free loopback port.
type Sentinel struct {
	Master, Replica *Server
	// Sentinels are the sentinels' addresses; Name is the master's name.
	Sentinels []string
	Name      string
}

// StartSentinel starts a master, its replica and three sentinels that
// watch it (down after 1s, failover timeout 5s) and waits until the
// sentinels know the replica. The processes stop when the test ends.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	s := &Sentinel{Name: "tollgate-test"}
	// No diskless-sync delay: by default a master waits 5s for more
	// replicas before it sends the first one its data.
	s.Master = StartWith(tb, "--repl-diskless-sync-delay", "0")
	_, mport, _ := net.SplitHostPort(s.Master.Addr)
	s.Replica = StartWith(tb, "--replicaof", "127.0.0.1", mport)
	s.Replica.waitSynced()
	for i := 0; i < 3; i++ {
		port := freePort(tb)
		dir := tb.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
			"sentinel monitor %s 127.0.0.1 %s 2\n"+
			"sentinel down-after-milliseconds %s 1000\n"+
			"sentinel failover-timeout %s 5000\n"+
			"sentinel parallel-syncs %s 1\n", port, dir, s.Name, mport, s.Name, s.Name, s.Name)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			tb.Fatal(err)
		}
		log, err := os.Create(filepath.Join(dir, "sentinel.log"))
		if err != nil {
			tb.Fatal(err)
		}
		cmd := exec.Command(bin, conf, "--sentinel")
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = sysProcAttr()
		if err := cmd.Start(); err != nil {
			tb.Fatalf("redistest: starting a sentinel: %v", err)
		}
		tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); log.Close() })
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.Sentinels = append(s.Sentinels, addr)
	}
	// Wait until every sentinel answers and knows the replica.
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range s.Sentinels {
		c := goredis.NewSentinelClient(&goredis.Options{Addr: addr})
		for {
			ctx, cancel := withTimeout(time.Second)
			replicas, err := c.Replicas(ctx, s.Name).Result()
			cancel()
			if err == nil && len(replicas) > 0 {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: sentinel %s not ready: %v", addr, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = c.Close()
	}
	return s
}

// waitSynced waits until s, a replica, has its master's data and follows
// its writes (master_link_status:up).
func (s *Server) waitSynced() {
	s.tb.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := withTimeout(time.Second)
		info, err := c.Info(ctx, "replication").Result()
		cancel()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("redistest: replica %s not in sync after 30s: %v %s", s.Addr, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MasterAddr asks a sentinel which server is the master now.
func (s *Sentinel) MasterAddr(tb testing.TB) string {
	tb.Helper()
	c := goredis.NewSentinelClient(&goredis.Options{Addr: s.Sentinels[0]})
	defer c.Close()
	ctx, cancel := withTimeout(2 * time.Second)
	defer cancel()
	hp, err := c.GetMasterAddrByName(ctx, s.Name).Result()
	if err != nil || len(hp) != 2 {
		tb.Fatalf("redistest: asking sentinel for the master: %v", err)
	}
	return net.JoinHostPort(hp[0], hp[1])
}
