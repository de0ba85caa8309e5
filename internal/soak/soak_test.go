//go:build soak

// Package soak holds Tollgate's soak test: a bounded run on loopback that
// floods a zone with 10 million distinct keys and drives three Caddy
// instances sharing one Redis through faults, and prints its figures. Run
// it with scripts/soak.sh (or go test -tags soak -run Soak -v
// ./internal/soak/); it is not part of the ordinary test run.
package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
)

// envInt reads a number from the environment, for longer or shorter runs.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestSoakFlood: 10 million distinct keys through a zone of max_keys
// 100,000, as the handler drives the memory store. The heap must stay
// flat once the zone is full.
func TestSoakFlood(t *testing.T) {
	keys := envInt("SOAK_KEYS", 10_000_000)
	const maxKeys = 100_000
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.SlidingLog} {
		l, err := algorithms.NewLimit(kind, 100, time.Minute, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := memory.New(storage.Zone{Name: "flood", Limit: l, MaxKeys: maxKeys})
		var ms runtime.MemStats
		heap := func() uint64 {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		base := heap()
		now := int64(1_800_000_000_000_000)
		var full uint64
		report(t, "flood %s: keys sent | keys held | evictions | heap MiB", kind)
		start := time.Now()
		for i := 1; i <= keys; i++ {
			now++
			s.Take(context.Background(), "client-"+strconv.Itoa(i), now, algorithms.Milli)
			if i%(keys/10) == 0 {
				h := heap() - base
				report(t, "flood %s: %9d | %9d | %9d | %7.1f", kind, i, s.Len(), s.Evictions(), float64(h)/(1<<20))
				if s.Len() != maxKeys {
					t.Errorf("%s: after %d keys the zone holds %d, want max_keys %d", kind, i, s.Len(), maxKeys)
				}
				if full == 0 {
					full = h
				} else if float64(h) > 1.25*float64(full)+(1<<20) {
					t.Errorf("%s: heap grew from %d to %d bytes after the zone was full", kind, full, h)
				}
			}
		}
		report(t, "flood %s: %d keys in %s (%.0f ns a key)", kind, keys, time.Since(start).Round(time.Millisecond), float64(time.Since(start).Nanoseconds())/float64(keys))
	}
}

// instance is one Caddy process.
type instance struct {
	base, admin string
	cmd         *exec.Cmd
}

// buildCaddy builds cmd/caddy once for the test.
func buildCaddy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "caddy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building caddy: %v\n%s", err, out)
	}
	return bin
}

// startCaddy runs bin with a Caddyfile on free ports and waits until it
// answers.
func startCaddy(t *testing.T, bin, site string) *instance {
	t.Helper()
	port, admin := redistest.FreePort(t), redistest.FreePort(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	skip_install_trust
	log {
		output file %s
		level WARN
	}
}
http://:%d {
%s
}
`, admin, port, filepath.Join(dir, "caddy.log"), port, site)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	in := &instance{base: fmt.Sprintf("http://127.0.0.1:%d", port), admin: fmt.Sprintf("http://localhost:%d", admin), cmd: cmd}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(in.base + "/ping")
		if err == nil {
			resp.Body.Close()
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("caddy on %s did not start: %v (log: %s)", in.base, err, filepath.Join(dir, "caddy.log"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSoakFloodThroughCaddy: distinct keys from a header through one real
// Caddy; the zone's key count, read from the admin API, stays at max_keys.
func TestSoakFloodThroughCaddy(t *testing.T) {
	n := envInt("SOAK_HTTP_KEYS", 200_000)
	bin := buildCaddy(t)
	in := startCaddy(t, bin, `	rate_limit {
		zone flood {
			key {http.request.header.X-Key}
			rate 100/m
		}
		max_keys 10000
	}
	respond "ok"`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var next atomic.Int64
	var bad atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < 16; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodGet, in.base+"/", nil)
				req.Header.Set("X-Key", "k"+strconv.FormatInt(i, 10))
				resp, err := client.Do(req)
				if err != nil {
					bad.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	resp, err := http.Get(in.admin + "/rate_limit/zones")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var zones []struct {
		Zone string `json:"zone"`
		Keys int    `json:"keys"`
	}
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, &zones); err != nil {
		t.Fatalf("zones: %v: %s", err, body)
	}
	report(t, "http flood: %d distinct keys in %s, %d not 200, zone keys %s", n, time.Since(start).Round(time.Millisecond), bad.Load(), body)
	if bad.Load() != 0 {
		t.Errorf("%d requests with a fresh key were not answered 200", bad.Load())
	}
	if len(zones) != 1 || zones[0].Keys != 10000 {
		t.Errorf("zones: %s, want one zone holding max_keys 10000", body)
	}
}

// phase is one stretch of load on the three instances.
type phase struct {
	name  string
	fault func(t *testing.T, srv *redistest.Server, stop <-chan struct{})
}

// result counts a phase's answers for one zone.
type result struct {
	phase, mode        string
	admitted, rejected int64
	fivexx, errors     int64
	seconds            float64
	definition, ratio  float64
	enforced           bool
}

// TestSoakClusterFaults: three Caddy instances share one Redis; 6 clients
// per zone send as fast as they can on one key, spread over the
// instances, for a few seconds per phase, while Redis is quiet, while the
// machine's cores are busy, while Redis is stopped and restarted, paused
// (SIGSTOP), and stalled (DEBUG SLEEP 0.15 every second). Two zones take
// the load side by side: the default on_storage_error (local) and allow.
// No request may get a 5xx; with Redis answering, the default mode stays
// within 5% of b + r*t.
func TestSoakClusterFaults(t *testing.T) {
	seconds := envInt("SOAK_PHASE_SECONDS", 4)
	srv := redistest.StartWith(t, "--enable-debug-command", "yes")
	bin := buildCaddy(t)
	site := func() string {
		zone := func(name, extra string) string {
			return fmt.Sprintf(`		zone %s {
			match {
				path /%s
			}
			key {http.request.header.X-Key}
			rate 10/s
			burst 40
			%s
		}
`, name, name, extra)
		}
		return "	rate_limit {\n" + zone("local", "") + zone("allow", "on_storage_error allow") +
			"		storage redis {\n			addresses " + srv.Addr + "\n		}\n	}\n	respond \"ok\""
	}()
	var ins []*instance
	for i := 0; i < 3; i++ {
		ins = append(ins, startCaddy(t, bin, site))
	}

	busy := func(t *testing.T, _ *redistest.Server, stop <-chan struct{}) {
		var procs []*exec.Cmd
		for i := 0; i < 2*runtime.NumCPU(); i++ {
			cmd := exec.Command("sh", "-c", "while :; do :; done")
			if err := cmd.Start(); err == nil {
				procs = append(procs, cmd)
			}
		}
		<-stop
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}
	at := func(d time.Duration, stop <-chan struct{}) bool {
		select {
		case <-time.After(d):
			return true
		case <-stop:
			return false
		}
	}
	span := time.Duration(seconds) * time.Second
	phases := []phase{
		{"quiet", nil},
		{"cpu busy", busy},
		{"redis restarted", func(t *testing.T, srv *redistest.Server, stop <-chan struct{}) {
			if at(span/4, stop) {
				srv.Stop()
				if at(span/3, stop) {
					srv.Restart()
					return
				}
				srv.Restart()
			}
		}},
		{"redis paused", func(t *testing.T, srv *redistest.Server, stop <-chan struct{}) {
			if at(span/4, stop) {
				srv.Pause()
				at(span/3, stop)
				srv.Resume()
			}
		}},
		{"redis stalled", func(t *testing.T, srv *redistest.Server, stop <-chan struct{}) {
			c := srv.Client()
			for at(time.Second, stop) {
				go c.Do(context.Background(), "DEBUG", "SLEEP", "0.15")
			}
		}},
	}
	var results []result
	for _, ph := range phases {
		results = append(results, runPhase(t, ph, srv, ins, span)...)
		time.Sleep(300 * time.Millisecond) // let Redis and the breakers settle
	}

	report(t, "%-16s %-6s %9s %10s %6s %8s %4s %6s", "phase", "mode", "admitted", "b+r*t", "ratio", "429", "5xx", "errors")
	for _, r := range results {
		report(t, "%-16s %-6s %9d %10.1f %6.2f %8d %4d %6d", r.phase, r.mode, r.admitted, r.definition, r.ratio, r.rejected, r.fivexx, r.errors)
		if r.fivexx > 0 {
			t.Errorf("%s/%s: %d responses were 5xx, want none", r.phase, r.mode, r.fivexx)
		}
		if r.enforced && r.mode == "local" && r.ratio > 1.05 {
			t.Errorf("%s/%s: admitted %d, %.1f%% above b + r*t = %.1f; want within 5%%", r.phase, r.mode, r.admitted, 100*(r.ratio-1), r.definition)
		}
	}
}

// runPhase loads both zones for span with 6 clients each on one fresh key
// while ph's fault runs.
func runPhase(t *testing.T, ph phase, srv *redistest.Server, ins []*instance, span time.Duration) []result {
	stop := make(chan struct{})
	var faultDone sync.WaitGroup
	if ph.fault != nil {
		faultDone.Add(1)
		go func() { defer faultDone.Done(); ph.fault(t, srv, stop) }()
	}
	key := strings.ReplaceAll(ph.name, " ", "-") + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	var out []result
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, mode := range []string{"local", "allow"} {
		var admitted, rejected, fivexx, errs atomic.Int64
		var first, last atomic.Int64
		deadline := time.Now().Add(span)
		var zw sync.WaitGroup
		for c := 0; c < 6; c++ {
			zw.Add(1)
			go func(c int) {
				defer zw.Done()
				for i := c; time.Now().Before(deadline); i++ {
					req, _ := http.NewRequest(http.MethodGet, ins[i%len(ins)].base+"/"+mode, nil)
					req.Header.Set("X-Key", key)
					resp, err := client.Do(req)
					if err != nil {
						errs.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch {
					case resp.StatusCode == 200:
						now := time.Now().UnixNano()
						first.CompareAndSwap(0, now)
						last.Store(now)
						admitted.Add(1)
					case resp.StatusCode == 429:
						rejected.Add(1)
					case resp.StatusCode >= 500:
						fivexx.Add(1)
					}
				}
			}(c)
		}
		wg.Add(1)
		go func(mode string) {
			defer wg.Done()
			zw.Wait()
			secs := float64(last.Load()-first.Load()) / 1e9
			def := 40 + 10*secs
			mu.Lock()
			out = append(out, result{
				phase: ph.name, mode: mode,
				admitted: admitted.Load(), rejected: rejected.Load(), fivexx: fivexx.Load(), errors: errs.Load(),
				seconds: secs, definition: def, ratio: float64(admitted.Load()) / def,
				enforced: ph.name == "quiet" || ph.name == "cpu busy",
			})
			mu.Unlock()
		}(mode)
	}
	wg.Wait()
	close(stop)
	faultDone.Wait()
	if out[0].mode != "local" {
		out[0], out[1] = out[1], out[0]
	}
	return out
}

// report prints a line of the soak's figures, in the test log and on
// stdout for scripts/soak.sh.
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	fmt.Println("SOAK " + fmt.Sprintf(format, args...))
}
