package tollgate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
	"github.com/caddy-tollgate/tollgate/storage/shared"
	dto "github.com/prometheus/client_model/go"
)

// The interaction test: one configuration holding zones of every kind (a
// rate of each algorithm, concurrency, a ban, tiers, a request that two
// zones decide), on memory and on Redis with two instances, driven by a
// seeded random sequence of steps: requests of random keys and costs, held
// requests that end or whose client leaves, admin resets and unbans,
// reloads that change a setting, and (Redis) the server paused, stalled or
// restarted, and a key asked for steadily across one of these faults, so
// that its quota lease is renewed (interaction_stream_test.go). After every step it checks the limits' invariants:
//
//   - admitted cost per key never exceeds the definition (checked against
//     the algorithm's own bound, from the key's last reset on); on Redis,
//     the admissions Redis decided alone, and those a zone's local copy
//     made during an outage at most a capacity per instance per outage;
//   - a ban's key is admitted by nothing while it is banned;
//   - requests of a key in flight never exceed `concurrency` on an
//     instance, nor across instances while every one in flight was
//     admitted by Redis;
//   - once Redis answers again, decisions go back to it within a second
//     (a deny zone answers, and Redis runs a script for each instance);
//   - no 5xx but a deny zone's 503 while Redis does not answer;
//   - no goroutine left behind once the sequence ends.
//
// A failure prints the seed and the shortest sequence found that still
// fails, to replay with TOLLGATE_INTERACT_SEED (and TOLLGATE_INTERACT_STEPS
// for the shrunk steps). TOLLGATE_INTERACT sets the time each store runs
// for (default a few seconds; hours for a soak).

// ixPort is one below the first instance's port: 9181 and 9182, or from
// TOLLGATE_INTERACT_PORT on, so that a long run (with
// TOLLGATE_TEST_ADMIN_PORT) can go on beside the rest of the suite.
var ixPort = func() int {
	if p, err := strconv.Atoi(os.Getenv("TOLLGATE_INTERACT_PORT")); err == nil && p > 0 {
		return p - 1
	}
	return 9180
}()

// ixBudget is how long each store's sequence runs.
func ixBudget(t *testing.T, short time.Duration) time.Duration {
	if v := os.Getenv("TOLLGATE_INTERACT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("TOLLGATE_INTERACT=%q: %v", v, err)
		}
		return d
	}
	return short
}

func ixSeed(t *testing.T) int64 {
	if v := os.Getenv("TOLLGATE_INTERACT_SEED"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("TOLLGATE_INTERACT_SEED=%q: %v", v, err)
		}
		return s
	}
	return time.Now().UnixNano()
}

// ixZone is one zone of the test configuration, as the checker knows it.
type ixZone struct {
	name, algo string
	paths      []string
	events     int64 // per window (a tier's: see tiers)
	window     time.Duration
	costly     bool   // cost from X-Cost
	onError    string // Redis: local (""), allow or deny
	ban        time.Duration
	slots      int // concurrency
	tiers      map[string]int64
	failures   bool // count_response { status 401 }: only failed requests count
	// settle: cost_response: the estimate is X-Est (default 1), settled to
	// the actual cost the upstream answers (ixUpstream's /cost).
	settle bool
	grants bool           // the test grants its keys quota (a grant step)
	tz     *time.Location // align calendar in this time zone (window 1d)
	// adaptive: concurrency adaptive, at most this many in flight (max),
	// starting at it; each instance (here one process) adapts alone.
	adaptive int
	// llm: a model's budget, as docs/recipes.md's money budget: the
	// request's JSON (POST {"model": m, "max_tokens": est}) names the
	// model, which is part of the key and, through Caddy's map, its price
	// (ixPrice); the estimate is the expression max_tokens × price
	// (default_cost 1 without max_tokens), settled to the expression
	// (completion + prompt tokens) × price of the response's usage (or of
	// X-Usage, with a reload's usage "header"). The checker's id is
	// zone|key|model.
	llm bool
	// lease: on Redis, its keys lease (quota leases, on by default): in a
	// burst, with a limit that a burst's leases approach, or in a stream
	// (see stream). After a reset, an instance that has not heard of it
	// yet may spend its lease, and after Redis lost its data (a restart)
	// any instance the lease it took before, at most an eighth of the
	// limit, for a lease's life (see docs/redis.md), which the checker
	// allows.
	lease bool
	// stream: on Redis, a stream step's zone (see interaction_stream_test.go):
	// its key is asked for steadily, so that the sweeper renews its lease,
	// across a fault; no other step sends to its path.
	stream bool
}

const ixWindow = time.Hour

var ixZones = []ixZone{
	{name: "ix_tb", algo: "token_bucket", paths: []string{"/tb", "/multi"}, events: 4, window: ixWindow, costly: true},
	{name: "ix_gcra", algo: "gcra", paths: []string{"/gcra"}, events: 4, window: ixWindow, onError: "deny"},
	{name: "ix_sw", algo: "sliding_window", paths: []string{"/sw", "/multi"}, events: 4, window: ixWindow, costly: true, grants: true},
	{name: "ix_sl", algo: "sliding_log", paths: []string{"/sl"}, events: 4, window: ixWindow, grants: true},
	{name: "ix_fw", algo: "fixed_window", paths: []string{"/fw"}, events: 4, window: ixWindow, costly: true, grants: true},
	{name: "ix_lb", algo: "leaky_bucket", paths: []string{"/lb"}, events: 4, window: ixWindow, onError: "allow"},
	{name: "ix_ban", algo: "token_bucket", paths: []string{"/ban"}, events: 2, window: ixWindow, ban: 10 * time.Minute},
	{name: "ix_tier", algo: "token_bucket", paths: []string{"/tier"}, events: 2, window: ixWindow, tiers: map[string]int64{"gold": 6}},
	{name: "ix_conc", paths: []string{"/hold"}, slots: 2},
	{name: "ix_login", algo: "token_bucket", paths: []string{"/login"}, events: 3, window: ixWindow, failures: true},
	{name: "ix_cost", algo: "token_bucket", paths: []string{"/cost"}, events: 4, window: ixWindow, settle: true},
	{name: "ix_costg", algo: "gcra", paths: []string{"/cost"}, events: 5, window: ixWindow, settle: true},
	{name: "ix_day", algo: "fixed_window", paths: []string{"/day"}, events: 5, window: 24 * time.Hour, costly: true, grants: true, tz: ixKolkata},
	{name: "ix_adapt", paths: []string{"/ahold"}, adaptive: ixAdaptiveMax},
	{name: "ix_lease", algo: "fixed_window", paths: []string{"/lease"}, events: 48, window: ixWindow, costly: true, grants: true, lease: true},
	{name: "ix_llm", algo: "token_bucket", paths: []string{"/llm"}, events: 12, window: ixWindow, settle: true, llm: true},
	{name: "ix_stream", algo: "token_bucket", paths: []string{"/stream"}, events: 3000, window: ixWindow, costly: true, lease: true, stream: true},
	{name: "ix_streamw", algo: "sliding_window", paths: []string{"/streamw"}, events: 3000, window: ixWindow, costly: true, grants: true, lease: true, stream: true},
}

// ixModel is the model of a /llm request: m2 for plan gold, else m1.
func ixModel(s ixStep) string {
	if s.plan == "gold" {
		return "m2"
	}
	return "m1"
}

// ixPrice is a model's price, as the configuration's map has it.
func ixPrice(model string) int64 { return map[string]int64{"m1": 1, "m2": 2}[model] }

// ixAdaptiveMax is ix_adapt's max: requests of a key in flight in this
// process, its instances together, never exceed it.
const ixAdaptiveMax = 2

// ixKolkata is the calendar zone's time zone: a half-hour offset.
var ixKolkata = func() *time.Location {
	l, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		panic(err)
	}
	return l
}()

var ixPaths = []string{"/tb", "/gcra", "/sw", "/sl", "/fw", "/lb", "/ban", "/tier", "/multi", "/login", "/cost", "/day", "/lease", "/llm"}

// ixGrantZones are the zones a grant step grants in: those with grants
// (a stream zone's grants are a stream step's).
var ixGrantZones = func() (names []string) {
	for _, z := range ixZones {
		if z.grants && !z.stream {
			names = append(names, z.name)
		}
	}
	return names
}()

// ixSettings is what a reload changes.
type ixSettings struct {
	jitter   string
	maxKeys  int
	poolSize int
	timeout  string
	usage    string // where ix_cost and ix_llm read the actual cost: "json" (the body) or "header"
}

func ixConfig(up string, redisAddr string, instances int, s ixSettings) string {
	cfg := withGlobal("grace_period 5s\n\tmetrics")
	cfg = strings.Replace(cfg, "\tgrace_period 1ns\n", "", 1)
	// The proxy closes a connection to the upstream idle for 500 ms, before
	// the upstream does (after a second, see newIxUpstream): else a request
	// sent on a connection the upstream is closing meanwhile fails (a POST
	// is not sent again: 502, broken pipe).
	cfg += "\n(ixTransport) {\n\ttransport http {\n\t\tkeepalive 500ms\n\t}\n}\n"
	for i := 1; i <= instances; i++ {
		var zones strings.Builder
		for _, z := range ixZones {
			key := "{http.request.header.X-Client}"
			if z.llm {
				key += "-{http.rate_limit.request.json.model}"
			}
			fmt.Fprintf(&zones, "\t\t\tzone %s {\n\t\t\t\tmatch {\n\t\t\t\t\tpath %s\n\t\t\t\t}\n\t\t\t\tkey %s\n", z.name, strings.Join(z.paths, " "), key)
			switch {
			case z.tz != nil:
				fmt.Fprintf(&zones, "\t\t\t\talgorithm %s\n\t\t\t\tevents %d\n\t\t\t\twindow 1d\n\t\t\t\talign calendar\n\t\t\t\ttimezone %s\n", z.algo, z.events, z.tz)
			case z.algo != "":
				fmt.Fprintf(&zones, "\t\t\t\talgorithm %s\n\t\t\t\tevents %d\n\t\t\t\twindow %s\n", z.algo, z.events, z.window)
			}
			switch {
			case z.llm:
				zones.WriteString("\t\t\t\tcost \"{http.rate_limit.request.json.max_tokens} * {ix_price}\"\n\t\t\t\tdefault_cost 1\n")
				usage := "({http.rate_limit.response.json.usage.total_tokens} - {http.rate_limit.response.json.usage.prompt_tokens} + {http.rate_limit.response.json.usage.prompt_tokens}) * {ix_price}"
				if s.usage == "header" {
					usage = "{http.response.header.X-Usage} * {ix_price}"
				}
				fmt.Fprintf(&zones, "\t\t\t\tcost_response \"%s\"\n", usage)
			case z.settle:
				zones.WriteString("\t\t\t\tcost {http.request.header.X-Est}\n")
				usage := "{http.rate_limit.response.json.usage.total_tokens}"
				if s.usage == "header" {
					usage = "{http.response.header.X-Usage}"
				}
				fmt.Fprintf(&zones, "\t\t\t\tcost_response %s\n", usage)
			}
			if z.costly {
				zones.WriteString("\t\t\t\tcost {http.request.header.X-Cost}\n")
			}
			if z.onError != "" && redisAddr != "" {
				fmt.Fprintf(&zones, "\t\t\t\ton_storage_error %s\n", z.onError)
			}
			if z.ban > 0 {
				fmt.Fprintf(&zones, "\t\t\t\tban %s\n", z.ban)
			}
			if z.slots > 0 {
				fmt.Fprintf(&zones, "\t\t\t\tconcurrency %d\n", z.slots)
			}
			if z.adaptive > 0 {
				fmt.Fprintf(&zones, "\t\t\t\tconcurrency adaptive {\n\t\t\t\t\tmin 1\n\t\t\t\t\tmax %d\n\t\t\t\t\tinitial %d\n\t\t\t\t\tmin_samples 2\n\t\t\t\t}\n", z.adaptive, z.adaptive)
			}
			if z.failures {
				zones.WriteString("\t\t\t\tcount_response {\n\t\t\t\t\tstatus 401\n\t\t\t\t}\n")
			}
			if z.tiers != nil {
				zones.WriteString("\t\t\t\ttier {http.request.header.X-Plan} {\n")
				for v, n := range z.tiers {
					fmt.Fprintf(&zones, "\t\t\t\t\t%s %d/h\n", v, n)
				}
				zones.WriteString("\t\t\t\t}\n")
			}
			zones.WriteString("\t\t\t}\n")
		}
		storage := ""
		if redisAddr != "" {
			// The second instance sends each call on its own
			// (pipeline off), the first pipelines them (the default).
			pipeline := map[bool]string{true: "on", false: "off"}[i == 1]
			storage = fmt.Sprintf("\t\t\tstorage redis {\n\t\t\t\taddresses %s\n\t\t\t\ttimeout %s\n\t\t\t\tpool_size %d\n\t\t\t\tpipeline %s\n\t\t\t}\n", redisAddr, s.timeout, s.poolSize+i, pipeline)
		} else {
			storage = fmt.Sprintf("\t\t\tmax_keys %d\n", s.maxKeys)
		}
		cfg += fmt.Sprintf(`
	http://localhost:%d {
		header -X-Usage
		map {http.rate_limit.request.json.model} {ix_price} {
			m2 2
			default 1
		}
		rate_limit {
%s%s			jitter %s
		}
		handle /hold {
			reverse_proxy %s {
				header_up X-Instance %d
				import ixTransport
			}
		}
		handle /ahold {
			reverse_proxy %s {
				header_up X-Instance %d
				import ixTransport
			}
		}
		handle /cost {
			encode {
				gzip
				minimum_length 1
			}
			reverse_proxy %s {
				import ixTransport
			}
		}
		handle /login {
			reverse_proxy %s {
				import ixTransport
			}
		}
		handle /llm {
			encode {
				gzip
				minimum_length 1
			}
			reverse_proxy %s {
				import ixTransport
			}
		}
		respond "ok"
	}`, ixPort+i, zones.String(), storage, s.jitter, strings.TrimPrefix(up, "http://"), i, strings.TrimPrefix(up, "http://"), i, strings.TrimPrefix(up, "http://"), strings.TrimPrefix(up, "http://"), strings.TrimPrefix(up, "http://"))
	}
	return cfg
}

// ixUpstream holds each request until the test releases it (or its
// client leaves), checking on arrival the requests of its key in flight.
type ixUpstream struct {
	*httptest.Server
	slots int
	mu    sync.Mutex
	held  map[string]*ixHeld // by X-Hold id
	seen  map[string]bool    // every X-Hold id that arrived
	// settling are the /login and /cost requests held (see settle), by
	// X-Hold id: closing one's channel lets it answer.
	settling map[string]chan struct{}
	fault    string // the first violation seen
}

type ixHeld struct {
	key, instance string
	adaptive      bool // an /ahold request, in ix_adapt
	excused       bool // admitted while Redis did not answer, or before a Redis restart
	release       chan struct{}
}

func newIxUpstream(t *testing.T, slots int) *ixUpstream {
	u := &ixUpstream{slots: slots, held: map[string]*ixHeld{}, seen: map[string]bool{}, settling: map[string]chan struct{}{}}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cost" || r.URL.Path == "/login" || r.URL.Path == "/llm" {
			if r.URL.Path == "/llm" {
				// The limiter read the request's JSON: the upstream gets
				// it as the client sent it.
				body, err := io.ReadAll(r.Body)
				if want := r.Header.Get("X-Body"); err != nil || string(body) != want {
					u.mu.Lock()
					if u.fault == "" {
						u.fault = fmt.Sprintf("a /llm request's body reached the upstream as %q (%v), sent as %q", body, err, want)
					}
					u.mu.Unlock()
				}
			}
			if id := r.Header.Get("X-Hold"); id != "" {
				u.holdSettling(r, id)
			}
			if r.URL.Path != "/login" {
				ixUsage(w, r)
			} else if r.Header.Get("X-Fail") != "" {
				w.WriteHeader(http.StatusUnauthorized) // a failed login
			}
			return
		}
		h := &ixHeld{key: r.Header.Get("X-Client"), instance: r.Header.Get("X-Instance"),
			excused: r.Header.Get("X-Outage") != "", release: make(chan struct{}), adaptive: r.URL.Path == "/ahold"}
		id := r.Header.Get("X-Hold")
		u.mu.Lock()
		u.held[id] = h
		u.seen[id] = true
		var here, all, excused int
		for _, o := range u.held {
			if o.key == h.key && o.adaptive == h.adaptive {
				all++
				if o.instance == h.instance {
					here++
				}
				if o.excused {
					excused++
				}
			}
		}
		if u.fault == "" {
			switch {
			case h.adaptive:
				// Memory, whatever the storage: no outage excuses it.
				if all > ixAdaptiveMax {
					u.fault = fmt.Sprintf("key %s: %d requests in flight in ix_adapt, max %d", h.key, all, ixAdaptiveMax)
				}
			case here > u.slots:
				u.fault = fmt.Sprintf("key %s: %d requests in flight on instance %s, concurrency %d", h.key, here, h.instance, u.slots)
			case all > u.slots && excused == 0:
				u.fault = fmt.Sprintf("key %s: %d requests in flight across instances, all admitted by Redis, concurrency %d", h.key, all, u.slots)
			}
		}
		u.mu.Unlock()
		defer func() {
			u.mu.Lock()
			delete(u.held, id)
			u.mu.Unlock()
		}()
		w.Write([]byte("start\n"))
		w.(http.Flusher).Flush()
		select {
		case <-h.release:
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	}))
	// Caddy cleans an old config's proxy transports up when the config
	// stops, before its servers' last requests end: their connections to
	// the upstream then idle until the transport's 2-minute timeout. At
	// the test's rate of reloads that held some 20,000 sockets (a
	// 61-minute memory run stopped after 17 minutes: too many open
	// files); the upstream closes an idle connection itself after a
	// second.
	u.Server.Config.IdleTimeout = time.Second
	u.Start()
	t.Cleanup(u.Close)
	return u
}

// ixUsage answers a /cost request with the actual cost its X-Actual
// header asks for, as an LLM API reports token usage: in X-Usage and in
// the body's usage.total_tokens, a JSON body or (X-Stream) the last event
// of an event stream that holds it. Without X-Actual, the answer carries
// no usage, and the zone keeps the estimate. The site hides X-Usage from
// clients (`header -X-Usage`) and gzips the answer (`encode` inside
// rate_limit, for the Go client, which asks for gzip): the zones read
// both as the upstream wrote them.
func ixUsage(w http.ResponseWriter, r *http.Request) {
	actual := r.Header.Get("X-Actual")
	usage := "{}"
	if actual != "" {
		w.Header().Set("X-Usage", actual)
		usage = `{"prompt_tokens":1,"total_tokens":` + actual + `}`
	}
	if r.Header.Get("X-Stream") == "" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"ix","choices":[{"text":"ok"}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"o\"}}]}\n\n")
	w.(http.Flusher).Flush()
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
}

// excuseAll marks every request in flight as admitted outside Redis's
// count (Redis restarted and forgot their leases).
func (u *ixUpstream) excuseAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, h := range u.held {
		h.excused = true
	}
}

func (u *ixUpstream) releaseHold(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if h, ok := u.held[id]; ok {
		close(h.release)
		delete(u.held, id)
		return true
	}
	return false
}

// saw reports whether request id ever reached the upstream.
func (u *ixUpstream) saw(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[id]
}

// holds reports whether the upstream still runs request id.
func (u *ixUpstream) holds(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.held[id]
	return ok
}

func (u *ixUpstream) violation() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.fault
}

var ixDefaults = ixSettings{jitter: "0", maxKeys: 1000, poolSize: 8, timeout: "500ms", usage: "json"}

// ixStep is one step of a sequence, generated from the seed.
type ixStep struct {
	kind     string // req, burst, hold, release, leave, advance, reset, unban, grant, reload, pause, restart, settle, stream
	instance int
	path     string
	key      int
	cost     int
	// A /cost request's estimate (X-Est) and the actual cost its response
	// reports (X-Actual), -1 for none; stream: the usage comes in an
	// event stream.
	est, actual int
	stream      bool
	plan        string
	n           int
	d           time.Duration
	zone        string
	settings    ixSettings
	// A settle step's requests (of path, each on its instance, failing
	// a login with cost 2, with est and actual), held across the fault
	// named by zone: reload, kill or freeze.
	parts []ixStep
	// A stream step's fault (zone) comes at from the stream's start; a
	// pause lasts hold, a grant gives amount. From dry on (0: never), its
	// requests cost ixStreamDryCost.
	at, hold, dry time.Duration
	amount        int
}

func (s ixStep) String() string {
	switch s.kind {
	case "req", "burst":
		if s.path == "/cost" {
			return fmt.Sprintf("%s i%d %s k%d est=%d actual=%d stream=%v n=%d", s.kind, s.instance, s.path, s.key, s.est, s.actual, s.stream, s.n)
		}
		if s.path == "/llm" {
			return fmt.Sprintf("%s i%d %s k%d model=%s est=%d actual=%d stream=%v n=%d", s.kind, s.instance, s.path, s.key, ixModel(s), s.est, s.actual, s.stream, s.n)
		}
		return fmt.Sprintf("%s i%d %s k%d cost=%d plan=%q n=%d", s.kind, s.instance, s.path, s.key, s.cost, s.plan, s.n)
	case "hold":
		return fmt.Sprintf("hold i%d %s k%d", s.instance, s.path, s.key)
	case "release", "leave":
		return fmt.Sprintf("%s #%d", s.kind, s.n)
	case "advance":
		return fmt.Sprintf("advance %s", s.d)
	case "reset", "unban":
		return fmt.Sprintf("%s %s k%d", s.kind, s.zone, s.key)
	case "grant":
		return fmt.Sprintf("grant %s k%d %d, then i%d.. cost=%d until refused", s.zone, s.key, s.n, s.instance, s.cost)
	case "reload":
		return fmt.Sprintf("reload %+v", s.settings)
	case "settle":
		return ixSettleString(s)
	case "stream":
		return ixStreamString(s)
	case "pause":
		return fmt.Sprintf("pause %d requests, reset k%d in %s=%v, for %s", s.n, s.key, s.zone, s.cost > 0, s.d)
	}
	return s.kind
}

// ixGenerate makes n steps from seed.
func ixGenerate(seed int64, n int, redis bool) []ixStep {
	rng := rand.New(rand.NewSource(seed))
	steps := make([]ixStep, 0, n)
	for len(steps) < n {
		p := rng.Intn(100)
		s := ixStep{instance: 1, key: rng.Intn(4), cost: 1 + rng.Intn(2)}
		if redis {
			s.instance = 1 + rng.Intn(2)
		}
		// A /cost request: an estimate 1 to 3 or none (1), settled to 0
		// to 8 or to nothing readable; mostly near the estimate.
		s.est, s.actual, s.stream = rng.Intn(4), rng.Intn(9), rng.Intn(3) == 0
		if s.est == 0 {
			s.est = -1
		}
		if rng.Intn(5) == 0 {
			s.actual = -1
		}
		if rng.Intn(3) == 0 {
			s.plan = "gold"
		}
		s.path = ixPaths[rng.Intn(len(ixPaths))]
		switch {
		case p < 35:
			s.kind = "req"
		case p < 36:
			// 0.5%: a settle step takes about 0.75s on Redis (a kill or
			// a freeze), the rest of a round about 3s; on Redis, 0.5%
			// more: a stream step, about 1.5s.
			switch {
			case rng.Intn(2) == 0:
				s = ixGenerateSettle(rng, s, redis)
			case redis:
				s = ixGenerateStream(rng, s)
			default:
				s.kind = "req"
			}
		case p < 40:
			s.kind, s.zone, s.n = "grant", ixGrantZones[rng.Intn(len(ixGrantZones))], 1+rng.Intn(3)
		case p < 50:
			s.kind, s.n = "burst", 4+rng.Intn(6)
		case p < 60:
			s.kind, s.path = "hold", []string{"/hold", "/ahold"}[rng.Intn(2)]
		case p < 67:
			s.kind, s.n = "release", rng.Intn(1000)
		case p < 72:
			s.kind, s.n = "leave", rng.Intn(1000)
		case p < 80:
			if redis {
				s.kind = "req"
			} else {
				s.kind, s.d = "advance", time.Duration(rng.Intn(20))*time.Minute
			}
		case p < 85:
			s.kind, s.zone = "reset", ixZones[rng.Intn(len(ixZones))].name
		case p < 88:
			s.kind, s.zone = "unban", "ix_ban"
		case p < 92:
			s.kind = "reload"
			s.settings = ixSettings{
				jitter:   []string{"0", "0.5"}[rng.Intn(2)],
				maxKeys:  1000 + 1000*rng.Intn(2),
				poolSize: 8 + 8*rng.Intn(2),
				timeout:  []string{"500ms", "600ms"}[rng.Intn(2)],
				usage:    []string{"json", "header"}[rng.Intn(2)],
			}
		case p < 98:
			// An outage is a pause in 1 of 8 of these (0.75% of
			// steps): it takes about a second and a half, the rest of a
			// round of 200 steps about one and a half, so that an hour
			// holds about a thousand rounds, and more outages than when
			// they were 6% of steps (each then took three seconds).
			if !redis || rng.Intn(8) > 0 {
				s.kind = "req"
				break
			}
			// Five failed calls open the breaker: half the outages do.
			s.kind, s.n = "pause", rng.Intn(10)
			s.zone = []string{"ix_tb", "ix_sw", "ix_sl", "ix_fw", "ix_ban", "ix_tier", "ix_cost", "ix_day", "ix_llm"}[rng.Intn(9)]
			s.cost = rng.Intn(2) // reset after the resume
			s.d = time.Duration(rng.Intn(400)) * time.Millisecond
		default:
			if redis {
				s.kind = "restart"
			} else {
				s.kind = "req"
			}
		}
		steps = append(steps, s)
	}
	return steps
}

// ixAdmission is one admitted request of a zone and key.
type ixAdmission struct {
	at   int64 // µs: the fake clock (memory), the wall clock (Redis)
	cost int64 // what it was charged in the end: a settled zone's actual cost
	// reserved is what a settled zone reserved (the estimate), and group
	// the requests it ran beside: one request alone, or a burst. Its
	// settlement came after every admission of an earlier group, and
	// perhaps after any of its own group's.
	reserved int64
	group    int
	outage   bool // decided while Redis did not answer
	inst     int
	outageN  int // which outage
	// late: made in a step in which Redis answered a call too late
	// unasked (see excuseHiccup): its settlement may have been kept and
	// reached Redis after any admission that followed it.
	late bool
	// sent is when its request was sent, if it may have been decided
	// well before at (a stream step's: see ixExceeds); 0: at.
	sent int64
}

// from is the earliest the admission may have been decided.
func (a ixAdmission) from() int64 {
	if a.sent != 0 {
		return a.sent
	}
	return a.at
}

// ixRun is one run of a sequence.
type ixRun struct {
	t         *testing.T
	tester    *caddytest.Tester
	up        *ixUpstream
	srv       *redistest.Server // nil: memory
	instances int
	prefix    string // keys of this run
	settings  ixSettings

	admitted map[string][]ixAdmission // zone + "|" + key (+ "|" + plan)
	grants   map[string][]ixGrant     // zone + "|" + key
	group    int                      // the last group of requests sent (see ixAdmission)
	banned   map[string]int64         // ban zone key -> banned until (µs)
	// forgotten are the bans a Redis restart forgot, until they would
	// have ended: an instance's deny cache trusts a ban's rejection until
	// then, so a 429 of the key may be that cache's, not a new ban.
	forgotten map[string]int64
	holds     []ixHoldReq
	outage    bool // Redis does not answer
	outages   int
	errs      []string
	// What the runs exercised, for the log: admissions of a settled zone
	// that owed an excess, grants made, admissions of a calendar zone.
	owing, granted, calendar, steps int
	llm                             int // admissions of ix_llm
	// settled are the keys of settle steps and what their state must
	// show, checked again after later steps; settles counts the settle
	// steps, excused the settlements a freeze may have lost.
	settled          []ixSettled
	settles, excused int
	// hiccupBase is ixHiccups at the start of the step; hiccups counts
	// the steps in which Redis answered a call too late though the test
	// did not stop it (see excuseHiccup).
	hiccupBase float64
	hiccups    int
	stalls     *ixStallLog              // when Redis stalled unannounced (see ixStalls), or nil
	took       map[string]time.Duration // by step kind, for the log
	redisDir   string                   // where Redis keeps its append-only file
	// leaseResets are when the keys of a lease zone were last reset, and
	// leaseRestart when Redis last lost its data (see ixZone.lease).
	leaseResets  map[string]int64
	leaseRestart int64
	// streams counts the stream steps, renewals the leases the sweepers
	// renewed during them.
	streams, renewals int
}

// ixGrant is a grant made to a key: its amount counts in the window that
// held the grant, between from and to (the clock before and after the
// admin call).
type ixGrant struct {
	from, to int64
	amount   int64
}

type ixHoldReq struct {
	id     string
	cancel context.CancelFunc
	done   <-chan struct{}
	key    int  // its key
	ahold  bool // an /ahold request, in ix_adapt
}

func (r *ixRun) now() int64 {
	if r.srv == nil {
		return fakeNow.Load()
	}
	return time.Now().UnixMicro()
}

func (r *ixRun) key(k int) string { return fmt.Sprintf("%sk%d", r.prefix, k) }

func (r *ixRun) failf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *ixRun) url(instance int, path string) string {
	return fmt.Sprintf("http://localhost:%d%s", ixPort+instance, path)
}

// request is step s's request.
func (r *ixRun) request(s ixStep) *http.Request {
	req, _ := http.NewRequest(http.MethodGet, r.url(s.instance, s.path), nil)
	if s.path == "/llm" {
		body := `{"model":"` + ixModel(s) + `"}`
		if s.est >= 0 {
			body = fmt.Sprintf(`{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":%d}`, ixModel(s), s.est)
		}
		req, _ = http.NewRequest(http.MethodPost, r.url(s.instance, s.path), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Body", body)
	}
	req.Header.Set("X-Client", r.key(s.key))
	req.Header.Set("X-Cost", strconv.Itoa(s.cost))
	if s.cost == 2 && s.path == "/login" {
		req.Header.Set("X-Fail", "1") // a failed login
	}
	if s.plan != "" {
		req.Header.Set("X-Plan", s.plan)
	}
	if s.est >= 0 {
		req.Header.Set("X-Est", strconv.Itoa(s.est))
	}
	if s.actual >= 0 {
		req.Header.Set("X-Actual", strconv.Itoa(s.actual))
	}
	if s.stream {
		req.Header.Set("X-Stream", "1")
	}
	return req
}

// send sends one request, records what it was admitted by, and returns
// its status.
func (r *ixRun) send(s ixStep, step int) int {
	req := r.request(s)
	sent := r.now()
	resp, err := sendUnread(r.t, r.tester.Client, req)
	if err != nil {
		r.failf("step %d: %s: %v", step, s, err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.checkRetryAfter(s, step, resp, sent)
	r.group++
	r.record(s, step, resp.StatusCode)
	return resp.StatusCode
}

// checkRetryAfter checks the Retry-After of a refusal on ix_lease's path,
// sent at sent: 1, when what the refusal needed is out in leases that are
// back within 0.65 s (docs/redis.md#quota-leases), or the window's end,
// spread by a jitter of at most 0.5; never between, nor later. (A cost
// above the capacity has none; near the window's end it is not checked.)
func (r *ixRun) checkRetryAfter(s ixStep, step int, resp *http.Response, sent int64) {
	if resp.StatusCode != 429 || s.path != ixZoneNamed("ix_lease").paths[0] || resp.Header.Get("Retry-After") == "" {
		return
	}
	got := r.now()
	ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
	if err != nil || ra < 1 {
		r.failf("step %d: %s: Retry-After %q", step, s, resp.Header.Get("Retry-After"))
		return
	}
	w := ixWindow.Microseconds()
	if sent/w != got/w || w-got%w < 3_000_000 {
		return // the window ends about now
	}
	lo := (w-got%w)/1_000_000 - 1
	hi := int64(math.Ceil(float64(w-sent%w)/1e6*1.5)) + 1
	if ra > hi || ra > 1 && ra < lo {
		r.failf("step %d: %s: Retry-After %d, want 1 (leases back) or the window's end, %d to %d", step, s, ra, lo, hi)
	}
}

// record notes what a request of step s was answered with.
func (r *ixRun) record(s ixStep, step int, code int) {
	key := r.key(s.key)
	switch code {
	case 200, 401:
		if code == 401 && s.path != "/login" {
			r.failf("step %d: %s: status 401", step, s)
			return
		}
		at := r.now()
		for _, z := range ixZones {
			if !contains(z.paths, s.path) || z.slots > 0 || z.failures && code != 401 {
				continue // a zone that did not apply, or counts only failures
			}
			if r.outage && z.onError == "allow" {
				continue // fails open: not counted
			}
			cost := int64(1)
			if z.costly {
				cost = int64(s.cost)
			}
			reserved := cost
			if z.llm {
				price := ixPrice(ixModel(s))
				reserved, cost = 1, 1 // default_cost: no max_tokens
				if s.est >= 0 {
					reserved, cost = int64(s.est)*price, int64(s.est)*price
				}
				if s.actual >= 0 {
					cost = int64(s.actual) * price
				}
			} else if z.settle {
				reserved, cost = 1, 1
				if s.est >= 0 {
					reserved, cost = int64(s.est), int64(s.est)
				}
				if s.actual >= 0 {
					cost = int64(s.actual) // else it keeps the estimate
				}
			}
			id := z.name + "|" + key
			if z.tiers != nil {
				id += "|" + s.plan
			}
			if z.llm {
				id += "|" + ixModel(s)
			}
			switch {
			case z.settle && cost > reserved:
				r.owing++
			case z.tz != nil:
				r.calendar++
			}
			if z.llm {
				r.llm++
			}
			r.admitted[id] = append(r.admitted[id], ixAdmission{at: at, cost: cost, reserved: reserved, group: r.group,
				outage: r.outage, inst: s.instance, outageN: r.outages})
			if z.ban > 0 && !r.outage {
				if until, ok := r.banned[key]; ok && at < until {
					r.failf("step %d: %s admitted while banned (until %d, now %d)", step, s, until, at)
				}
			}
		}
	case 429:
		if until, ok := r.forgotten[key]; ok && r.now() < until {
			break // perhaps a deny cache's rejection of the forgotten ban
		}
		if s.path == "/ban" && !r.outage {
			if _, ok := r.banned[key]; !ok || r.banned[key] <= r.now() {
				r.banned[key] = r.now() + ixZones[6].ban.Microseconds()
			}
		}
	case 503:
		if !((r.outage || r.hiccup()) && s.path == "/gcra") {
			r.failf("step %d: %s: 503 (Redis answering: %v)", step, s, !r.outage)
		}
	default:
		r.failf("step %d: %s: status %d", step, s, code)
	}
}

// ixHiccups counts, over the process, what a Redis that answers a call
// after its timeout (a stall the test did not cause: -race on a loaded
// machine) leaves behind: decisions a zone made without Redis (its
// storage_error results: on_storage_error local decided alone, deny
// answered 503), settlements kept until Redis hears them (applied,
// pending or dropped, so that one applied later does not count again) and
// those whose call timed out once sent (dropped: Redis may have applied
// them, or not).
func ixHiccups() float64 {
	var n float64
	for _, z := range ixZones {
		var m dto.Metric
		if rateLimitMetrics.requests.WithLabelValues(z.name, resultStorageError).Write(&m) == nil {
			n += m.GetCounter().GetValue()
		}
	}
	pending, applied, dropped := shared.Settlements()
	return n + float64(pending+applied+dropped)
}

// hiccup reports whether, in the step running, Redis failed a call
// though the test neither stopped nor paused it.
func (r *ixRun) hiccup() bool {
	return r.srv != nil && ixHiccups() != r.hiccupBase
}

// excuseHiccup treats the admissions of the groups after g0, made in step
// while Redis answered late, as an outage's: those of a zone that decided
// alone went on from its local copy, and a settlement kept for later
// reaches Redis after the admissions that follow it (docs/reference.md's
// bound counts its excess, which the checker's shared history, owing only
// the last group's, does not). Each instance's are checked as a local
// copy's are.
func (r *ixRun) excuseHiccup(g0, step int) {
	r.hiccups++
	for id, adm := range r.admitted {
		for j := range adm {
			if adm[j].group > g0 && !adm[j].outage {
				adm[j].outage, adm[j].outageN, adm[j].late = true, -1-step, true
			}
		}
		r.admitted[id] = adm
	}
	r.t.Logf("step %d: Redis answered a call too late (a stall the test did not cause): its admissions are checked as an outage's", step)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// hold starts a request that the upstream holds, and returns once it is in
// flight (or was refused).
func (r *ixRun) hold(s ixStep, step int) { r.held(r.startHold(s, step, r.outage)) }

// ixStarted is a held request once started: in flight (h), or not; fault
// says what went wrong.
type ixStarted struct {
	h     *ixHoldReq
	fault string
}

// held records a started held request.
func (r *ixRun) held(st ixStarted) {
	if st.fault != "" {
		r.failf("%s", st.fault)
	}
	if st.h != nil {
		r.holds = append(r.holds, *st.h)
	}
}

// startHold sends a held request (outage: while Redis does not answer)
// and returns once it is in flight or was refused. It records nothing
// (see held): several may start at once.
func (r *ixRun) startHold(s ixStep, step int, outage bool) ixStarted {
	ctx, cancel := context.WithCancel(context.Background())
	id := fmt.Sprintf("%s%d", r.prefix, step)
	path := "/hold"
	if s.path == "/ahold" {
		path = s.path
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url(s.instance, path), nil)
	req.Header.Set("X-Client", r.key(s.key))
	req.Header.Set("X-Hold", id)
	// Its connection is not kept: a hold may outlive a reload, and a
	// connection to the old servers back in the client's pool would have
	// a later request decided by the old config (see load).
	req.Close = true
	if outage {
		req.Header.Set("X-Outage", "1")
	}
	resp, err := r.tester.Client.Do(req)
	// A reload closes idle connections: one the client picked just then
	// is reset before the request was read. Sent again if the upstream
	// never saw it (one it saw was admitted: the reset is a fault).
	for try := 0; try < 3 && err != nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)) && !r.up.saw(id); try++ {
		r.t.Logf("%s %s: %v; sending it again", req.Method, req.URL, err)
		time.Sleep(50 * time.Millisecond)
		resp, err = r.tester.Client.Do(req)
	}
	if err != nil {
		cancel()
		return ixStarted{fault: fmt.Sprintf("step %d: %s: %v", step, s, err)}
	}
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != 429 && (path != "/ahold" || resp.StatusCode != 503) {
			return ixStarted{fault: fmt.Sprintf("step %d: %s: status %d", step, s, resp.StatusCode)}
		}
		return ixStarted{}
	}
	var st ixStarted
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		st.fault = fmt.Sprintf("step %d: %s: reading the first line: %v", step, s, err)
	}
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		close(done)
	}()
	st.h = &ixHoldReq{id: id, cancel: cancel, done: done, key: s.key, ahold: path == "/ahold"}
	return st
}

// end ends held request n (mod how many there are): released by the
// upstream, or its client leaves.
func (r *ixRun) end(n int, leave bool) {
	if len(r.holds) == 0 {
		return
	}
	i := n % len(r.holds)
	h := r.holds[i]
	r.holds = append(r.holds[:i], r.holds[i+1:]...)
	if leave {
		h.cancel()
	} else {
		r.up.releaseHold(h.id)
	}
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		r.failf("held request %s did not end", h.id)
	}
	h.cancel()
	// A client that leaves ends the proxied request at once, and Caddy
	// frees its slot, while the upstream may not have seen the connection
	// close yet: what it counts in flight waits for it.
	for deadline := time.Now().Add(10 * time.Second); r.up.holds(h.id); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			r.failf("the upstream still holds request %s", h.id)
			break
		}
	}
}

func (r *ixRun) admin(method, path string) int {
	return r.adminBody(method, path, "")
}

// adminBody sends an admin call with body, a new request each time it is
// sent again: a reload restarts the admin server, closing an idle
// connection to it (a request it never read).
func (r *ixRun) adminBody(method, path, body string) int {
	var (
		resp *http.Response
		err  error
	)
	for try := 0; try < 4; try++ {
		req, _ := http.NewRequest(method, adminBase+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if resp, err = http.DefaultClient.Do(req); err == nil || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)) {
			break
		}
		r.t.Logf("%s %s: %v; sending it again", method, path, err)
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		r.failf("%s %s: %v", method, path, err)
		return 0
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable && !r.outage && bytes.Contains(msg, []byte("store unavailable")) {
		r.t.Logf("%s %s: Redis answered too late (a stall the test did not cause): %s", method, path, bytes.TrimSpace(msg))
		return ixStalled
	}
	return resp.StatusCode
}

// ixStalled is what adminBody returns for a call that failed because
// Redis answered too late though the test had not stopped it: a stall
// (TOLLGATE_INTERACT_STALLS, or a loaded machine's -race run). The call
// may or may not have reached Redis, and the checker allows either.
const ixStalled = -1

// adminFailed reports whether an admin call's status is a failure: not
// 200 or 404, nor a stall's, nor a 503 while the test has Redis down.
func (r *ixRun) adminFailed(code int) bool {
	return code != 200 && code != 404 && code != ixStalled && !(r.outage && code == http.StatusServiceUnavailable)
}

// adminMayHaveRun reports whether an admin call's status says it ran or
// may have run.
func adminMayHaveRun(code int) bool {
	return code == 200 || code == 404 || code == ixStalled
}

// reset resets a key in a zone; the checker then starts its history anew.
func (r *ixRun) reset(zone string, k int, step int) {
	key := r.key(k)
	if ixZoneNamed(zone).llm {
		// A key per model: each is reset, and forgotten alone.
		for _, m := range []string{"m1", "m2"} {
			code := r.admin(http.MethodDelete, "/rate_limit/zones/"+zone+"/keys/"+url.PathEscape(key+"-"+m))
			if r.adminFailed(code) {
				r.failf("step %d: reset %s %s: status %d", step, zone, key+"-"+m, code)
			}
			if adminMayHaveRun(code) {
				delete(r.admitted, zone+"|"+key+"|"+m)
			}
		}
		return
	}
	code := r.admin(http.MethodDelete, "/rate_limit/zones/"+zone+"/keys/"+url.PathEscape(key))
	if r.adminFailed(code) {
		r.failf("step %d: reset %s %s: status %d", step, zone, key, code)
	}
	if adminMayHaveRun(code) {
		if ixZoneNamed(zone).lease {
			if r.leaseResets == nil {
				r.leaseResets = map[string]int64{}
			}
			r.leaseResets[zone+"|"+key] = r.now()
		}
		for id := range r.admitted {
			if id == zone+"|"+key || strings.HasPrefix(id, zone+"|"+key+"|") {
				delete(r.admitted, id)
			}
		}
		delete(r.grants, zone+"|"+key)
		if zone == "ix_ban" {
			delete(r.banned, key)
		}
	}
}

// grant gives key k n events more in zone's current window; the checker
// then allows them in that window.
func (r *ixRun) grant(zone string, k, n int, step int) bool {
	key := r.key(k)
	from := r.now()
	code := r.adminBody(http.MethodPost, "/rate_limit/zones/"+zone+"/keys/"+url.PathEscape(key)+"/grant", fmt.Sprintf(`{"amount": %d}`, n))
	id := zone + "|" + key
	if code == ixStalled {
		// Perhaps granted: the checker allows it.
		r.grants[id] = append(r.grants[id], ixGrant{from: from, to: r.now(), amount: int64(n)})
		return false
	}
	if code != 200 {
		r.failf("step %d: grant %s %s %d: status %d", step, zone, key, n, code)
		return false
	}
	r.grants[id] = append(r.grants[id], ixGrant{from: from, to: r.now(), amount: int64(n)})
	r.granted++
	return true
}

func ixZoneNamed(name string) ixZone {
	for _, z := range ixZones {
		if z.name == name {
			return z
		}
	}
	panic("no zone " + name)
}

func (r *ixRun) unban(k int, step int) {
	key := r.key(k)
	code := r.admin(http.MethodDelete, "/rate_limit/zones/ix_ban/bans/"+url.PathEscape(key))
	if r.adminFailed(code) {
		r.failf("step %d: unban %s: status %d", step, key, code)
	}
	if adminMayHaveRun(code) {
		delete(r.banned, key)
	}
}

// backToRedis checks that, within a second of Redis answering again,
// every instance's decisions are Redis's: a deny zone answers and Redis
// runs a script for each. It probes every 20ms rather than waiting the
// second out: most outages end at the breaker's next probe (250ms).
func (r *ixRun) backToRedis(step int) {
	c := r.srv.Client()
	defer c.Close()
	start := time.Now()
	deadline := start.Add(time.Second)
	for i := 1; i <= r.instances; i++ {
		for try := 0; ; try++ {
			before := redistest.Calls(r.t, c, "evalsha", "eval", "fcall", "fcall_ro")
			req, _ := http.NewRequest(http.MethodGet, r.url(i, "/gcra"), nil)
			req.Header.Set("X-Client", fmt.Sprintf("%sprobe%d-%d-%d", r.prefix, step, i, try))
			sent := time.Now()
			resp, err := sendUnread(r.t, r.tester.Client, req)
			if err != nil {
				r.failf("step %d: probe of instance %d: %v", step, i, err)
				break
			}
			resp.Body.Close()
			after := redistest.Calls(r.t, c, "evalsha", "eval", "fcall", "fcall_ro")
			if resp.StatusCode == 200 && after != before {
				break
			}
			// A stall the test did not cause (ixStalls', or a loaded
			// machine's: a probe answered after the zones' timeout)
			// opens the breaker again: a second from its end, within 10.
			if now := time.Now(); (now.Sub(sent) > 400*time.Millisecond || r.stalls.during(sent, now)) && now.Before(start.Add(9*time.Second)) {
				deadline = now.Add(time.Second)
			}
			if time.Now().After(deadline) {
				r.failf("step %d: a second after Redis answered again, instance %d: status %d, scripts run %d (want 200 and a script)", step, i, resp.StatusCode, after-before)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// do runs one step.
func (r *ixRun) do(s ixStep, step int) {
	switch s.kind {
	case "req":
		// A client of a settled zone spends what it owes at once: its
		// requests one after another until one is refused.
		for j := 0; r.send(s, step) == 200 && (s.path == "/cost" || s.path == "/llm") && j < 6; j++ {
		}
	case "burst":
		r.burst(s, step)
	case "hold":
		r.hold(s, step)
	case "release":
		r.end(s.n, false)
	case "leave":
		r.end(s.n, true)
	case "advance":
		advance(s.d)
	case "reset":
		r.reset(s.zone, s.key, step)
	case "unban":
		r.unban(s.key, step)
	case "grant":
		// Granted quota is spent at once, as a customer who asked for
		// more does: requests of the key, spread over the instances,
		// until one is refused.
		if !r.grant(s.zone, s.key, s.n, step) {
			break
		}
		for j := 0; j < 16; j++ {
			s2 := s
			s2.kind, s2.path = "req", ixZoneNamed(s.zone).paths[0]
			if r.instances > 1 {
				s2.instance = 1 + j%r.instances
			}
			if r.send(s2, step) != 200 {
				break
			}
		}
	case "reload":
		if r.srv == nil && s.settings.maxKeys != r.settings.maxKeys {
			// A memory zone whose max_keys changes starts afresh (the
			// documented rule); its requests in flight keep their slots.
			r.admitted = map[string][]ixAdmission{}
			r.grants = map[string][]ixGrant{}
			r.banned = map[string]int64{}
		}
		r.settings = s.settings
		r.load()
	case "pause":
		r.srv.Pause()
		r.outage = true
		r.outages++
		// The requests go at once, as a load does: the breaker opens
		// after the first few time out together, not one timeout after
		// another (which took most of the Redis half's time).
		var during, holds []ixStep
		for j := 0; j < s.n; j++ {
			s2 := s
			s2.kind, s2.path = "req", ixPaths[(s.key+j)%len(ixPaths)]
			if r.instances > 1 {
				s2.instance = 1 + j%r.instances
			}
			if j%3 == 2 {
				s2.n = step*100 + j
				holds = append(holds, s2)
				continue
			}
			during = append(during, s2)
		}
		// The held requests go with the others: each waits for the
		// timeout until the breaker opens (one after another, they took
		// a third of the Redis half's time).
		started := make([]ixStarted, len(holds))
		var wg sync.WaitGroup
		for i, h := range holds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				started[i] = r.startHold(h, h.n, true) // a slot of this instance's own
			}()
		}
		r.concurrently(during, step)
		wg.Wait()
		for _, st := range started {
			r.held(st)
		}
		time.Sleep(s.d)
		r.srv.Resume()
		if s.cost > 0 {
			// A reset as Redis answers again, and one heard after the
			// breaker's next probe is due.
			r.reset(s.zone, s.key, step)
			time.Sleep(300 * time.Millisecond)
			r.reset(s.zone, s.key, step)
		}
		r.outage = false
		r.backToRedis(step)
	case "settle":
		r.settle(s, step)
	case "stream":
		r.stream(s, step)
	case "restart":
		r.restart(step)
	}
}

// restart kills Redis and starts it again without its data, and tells the
// checker.
func (r *ixRun) restart(step int) {
	// A Redis that loses its data: killed, its append-only file
	// removed (a settle step's kill keeps it).
	r.srv.Stop()
	if err := os.RemoveAll(filepath.Join(r.redisDir, "appendonlydir")); err != nil {
		r.t.Fatalf("removing Redis's append-only file: %v", err)
	}
	r.srv.Restart()
	r.settled = nil
	r.up.excuseAll()
	r.admitted = map[string][]ixAdmission{}
	r.grants = map[string][]ixGrant{}
	// A lease debited before the data was lost may still be spent,
	// as after a reset (see ixZone.lease).
	r.leaseRestart = r.now()
	for k, until := range r.banned {
		r.forgotten[k] = max(r.forgotten[k], until)
	}
	r.banned = map[string]int64{}
	r.backToRedis(step)
}

// burst sends s.n requests at once, spread over the instances.
func (r *ixRun) burst(s ixStep, step int) {
	n := s.n
	if ixZoneNamed("ix_lease").paths[0] == s.path {
		// Enough on each instance for the key to be hot there (8
		// requests in 250 ms) and lease (see ixZone.lease), near its
		// limit.
		n *= 8
	}
	ss := make([]ixStep, n)
	for j := range ss {
		ss[j] = s
		ss[j].kind = "req"
		if r.instances > 1 {
			ss[j].instance = 1 + j%r.instances
		}
	}
	r.concurrently(ss, step)
}

// concurrently sends the requests of ss at once, and records them as one
// group.
func (r *ixRun) concurrently(ss []ixStep, step int) {
	codes := make([]int, len(ss))
	order := make([]int, len(ss))
	for j := range order {
		order[j] = j
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for j, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// send records under the run's state: one at a time there.
			req := r.request(s)
			mu.Lock()
			sent := r.now()
			mu.Unlock()
			resp, err := sendUnread(r.t, r.tester.Client, req) // a reload just before may reset it unread
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.failf("step %d: %s: %v", step, s, err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[j] = resp.StatusCode
			r.checkRetryAfter(s, step, resp, sent)
		}()
	}
	wg.Wait()
	// Their order is unknown: the admissions are recorded first, the most
	// lenient order for a ban's check.
	sort.SliceStable(order, func(a, b int) bool { return codes[order[a]] == 200 && codes[order[b]] != 200 })
	r.group++
	for _, j := range order {
		r.record(ss[j], step, codes[j])
	}
}

// load (re)loads the configuration with the run's settings.
func (r *ixRun) load() {
	addr := ""
	if r.srv != nil {
		addr = r.srv.Addr
	}
	reload(r.t, ixConfig(r.up.URL, addr, r.instances, r.settings))
	// The old servers shut down in the background: a request on a
	// connection one of them still keeps would be decided by the old
	// config, and a memory zone whose max_keys changed has a store of
	// its own there, which the checker forgot at the reload. New
	// connections go to the new servers.
	r.tester.Client.CloseIdleConnections()
}

// reload loads a Caddyfile into the running test Caddy, as an operator's
// reload does: POST /load to the admin API. caddytest's InitServer skips
// the test when the admin endpoint does not answer at once, which a run
// of hundreds of reloads meets now and then (the admin server restarts
// with each load): a skip would pass the sequence silently.
func reload(t *testing.T, caddyfile string) {
	t.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapting the configuration: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Post(adminBase+"/load", "application/json", bytes.NewReader(cfg))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			t.Fatalf("POST /load: status %d: %s", resp.StatusCode, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("POST /load: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check checks the invariants after a step.
func (r *ixRun) check(step int) {
	if v := r.up.violation(); v != "" {
		r.failf("step %d: %s", step, v)
	}
	for id, adm := range r.admitted {
		name, _, _ := strings.Cut(id, "|")
		z := ixZoneNamed(name)
		events := z.events
		if z.tiers != nil && strings.HasSuffix(id, "|gold") {
			events = z.tiers["gold"]
		}
		grants := r.grants[id] // a zone with grants has no tiers: id is zone|key
		if at := max(r.leaseResets[id], r.leaseRestart); at > 0 && z.lease && r.srv != nil {
			// Each instance may spend, after a reset, what it leased
			// before it until it hears of it, and after Redis lost its
			// data what it leased before: at most an eighth of the
			// limit, for at most a lease's life.
			for _, a := range adm {
				if a.at < at+redisstore.DefaultLeaseLife.Microseconds() {
					events += int64(r.instances) * events / algorithms.QuotaLeaseShare
					break
				}
			}
		}
		var shared []ixAdmission
		local := map[[2]int][]ixAdmission{} // (outage, instance) -> admissions
		for _, a := range adm {
			if a.outage {
				k := [2]int{a.outageN, a.inst}
				local[k] = append(local[k], a)
			} else {
				shared = append(shared, a)
			}
		}
		if msg := ixExceeds(z, events, shared, grants); msg != "" {
			r.failf("step %d: %s: %s", step, id, msg)
		}
		for k, la := range local {
			// A local copy goes on from where the key stood, a capacity
			// at most: the algorithm's bound for a settled or granted
			// zone, else a capacity an outage.
			if z.settle || z.grants {
				if msg := ixExceeds(z, events, la, grants); msg != "" {
					r.failf("step %d: %s: instance %d on its own during outage %d: %s", step, id, k[1], k[0], msg)
				}
				continue
			}
			var c int64
			for _, a := range la {
				c += a.cost
			}
			if c > events {
				r.failf("step %d: %s: instance %d admitted cost %d on its own during outage %d, capacity %d", step, id, k[1], c, k[0], events)
			}
		}
	}
}

// checkAdaptive checks that ix_adapt counts in flight, for each key,
// exactly the /ahold requests the run holds: none leaked by a client that
// left, a reload or a Redis restart, none forgotten. A request that ended
// is given back as its handler returns, just after its client saw the
// end: the count may lag for a moment. A reload's old server ends the
// requests it still runs once its grace period is over: those are no
// longer held, though the run has not ended them.
func (r *ixRun) checkAdaptive(step int) {
	for k := 0; k < 4; k++ {
		var got, want int64
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			want = 0
			for _, h := range r.holds {
				if h.ahold && h.key == k && !closed(h.done) {
					want++
				}
			}
			got = r.adaptiveInFlight(k)
			if got == want || time.Now().After(deadline) {
				break
			}
		}
		if got != want {
			r.failf("step %d: ix_adapt key %s: %d in flight, the run holds %d", step, r.key(k), got, want)
		}
	}
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// adaptiveInFlight reads ix_adapt's requests in flight of key k from the
// admin API (0 for a key it holds no controller for).
func (r *ixRun) adaptiveInFlight(k int) int64 {
	resp, err := http.Get(adminBase + "/rate_limit/zones/ix_adapt/keys/" + r.key(k))
	if err != nil {
		r.failf("GET ix_adapt key: %v", err)
		return -1
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return 0
	}
	var st adminapi.KeyState
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Adaptive == nil {
		r.failf("GET ix_adapt key %s: status %d, %v, %+v", r.key(k), resp.StatusCode, err, st)
		return -1
	}
	return st.Adaptive.InFlight
}

// windowOf is the window that holds at, of a window algorithm's zone: a
// multiple of the window since the epoch, or a calendar day in z.tz (as
// yyyymmdd).
func (z ixZone) windowOf(at int64) int64 {
	if z.tz != nil {
		y, m, d := time.UnixMicro(at).In(z.tz).Date()
		return int64(y*10000 + int(m)*100 + d)
	}
	return at / z.window.Microseconds()
}

// ixExceeds checks admissions against the algorithm's definition (a fresh
// key starts full) and says how they exceed it, or "". A settled zone
// (cost_response) may exceed it by what its settlements owe, as the docs
// state the bound; a window may hold what was granted in it.
func ixExceeds(z ixZone, events int64, adm []ixAdmission, grants []ixGrant) string {
	if len(adm) == 0 {
		return ""
	}
	sort.SliceStable(adm, func(i, j int) bool { return adm[i].at < adm[j].at })
	w := z.window.Microseconds()
	n := float64(events)
	const eps = 1e-6
	// granted is what the grants made in window k add to it. A grant
	// whose call spanned two windows counts in both.
	granted := func(k int64) int64 {
		var g int64
		for _, gr := range grants {
			if z.windowOf(gr.from) == k || z.windowOf(gr.to) == k {
				g += gr.amount
			}
		}
		return g
	}
	switch z.algo {
	case "token_bucket", "gcra", "leaky_bucket":
		// docs/reference.md, cost_response: "over any interval t, the
		// requests admitted cost at most burst + rate × t + X, X the
		// excess of those settled after the interval's last admission".
		// Over any run of admissions i..j, the actual cost admitted is
		// at most B + r * elapsed + X, X the excess (actual cost over the
		// estimate reserved) of those of i..j that may have settled
		// after j was admitted: j's group (itself, or its burst), whose
		// admissions are the last of i..j, and the late ones (whose
		// settlement may have been kept for Redis).
		// An admission is at when it was answered (sorted so): one sent
		// earlier may have been decided as early as that, so the span
		// of i..j starts at the earliest of their sends.
		for i := range adm {
			var sum, owed, late float64
			group := -1
			from := adm[i].from()
			for j := i; j < len(adm); j++ {
				from = min(from, adm[j].from())
				sum += float64(adm[j].cost)
				if adm[j].group != group {
					group, owed = adm[j].group, 0
				}
				if excess := float64(max(adm[j].cost-adm[j].reserved, 0)); adm[j].late {
					late += excess
				} else {
					owed += excess
				}
				if allowed := n + n*float64(adm[j].at-from)/float64(w) + owed + late; sum > allowed+eps {
					return fmt.Sprintf("%s: cost %g admitted in %dµs, at most %g (%g owed by settlements after the last)", z.algo, sum, adm[j].at-from, allowed, owed+late)
				}
			}
		}
	case "fixed_window":
		per := map[int64]int64{}
		for _, a := range adm {
			k := z.windowOf(a.at)
			per[k] += a.cost
			if g := granted(k); per[k] > events+g {
				return fmt.Sprintf("fixed_window: cost %d in window %d, at most %d and %d granted", per[k], k, events, g)
			}
		}
	case "sliding_log":
		// A grant lasts W from when it was made, and one made while
		// another lasts adds to it and lasts W from then: the grants
		// whose calls overlap in such a chain add up until W after the
		// chain's last call ended.
		sort.Slice(grants, func(i, j int) bool { return grants[i].from < grants[j].from })
		logGrant := func(at int64) int64 {
			var g, end int64
			for _, gr := range grants {
				if gr.from >= end { // a new chain
					if at < end {
						return g
					}
					g = 0
				}
				if gr.from <= at {
					g += gr.amount
				}
				end = max(end, gr.to+w)
			}
			if at < end {
				return g
			}
			return 0
		}
		for j := range adm {
			var sum int64
			for i := 0; i <= j; i++ {
				if adm[i].at > adm[j].at-w {
					sum += adm[i].cost
				}
			}
			if g := logGrant(adm[j].at); sum > events+g {
				return fmt.Sprintf("sliding_log: cost %d in the window before %d, at most %d and %d granted", sum, adm[j].at, events, g)
			}
		}
	case "sliding_window":
		for j := range adm {
			k := adm[j].at / w
			var prev, cur float64
			for i := 0; i <= j; i++ {
				switch adm[i].at / w {
				case k - 1:
					prev += float64(adm[i].cost)
				case k:
					cur += float64(adm[i].cost)
				}
			}
			// What the previous window's grants admitted does not weigh.
			prev = max(0, prev-float64(granted(k-1)))
			elapsed := float64(adm[j].at-k*w) / float64(w)
			if est, g := prev*(1-elapsed)+cur, float64(granted(k)); est > n+g+0.01 {
				return fmt.Sprintf("sliding_window: estimate %g at %d, at most %g and %g granted", est, adm[j].at, n, g)
			}
		}
	}
	return ""
}

// run runs steps from a fresh configuration and returns the failures.
func (r *ixRun) run(steps []ixStep, budget time.Duration) (failed int, errs []string) {
	r.admitted = map[string][]ixAdmission{}
	r.grants = map[string][]ixGrant{}
	r.banned = map[string]int64{}
	r.forgotten = map[string]int64{}
	r.settled = nil
	r.errs = nil
	r.up.mu.Lock()
	r.up.fault = ""
	r.up.mu.Unlock()
	r.settings = ixDefaults
	r.load()
	stop := time.Now().Add(budget)
	defer func() {
		for len(r.holds) > 0 {
			r.end(0, false)
		}
		if r.outage {
			r.srv.Resume()
			r.outage = false
		}
	}()
	for i, s := range steps {
		if budget > 0 && time.Now().After(stop) {
			return -1, nil
		}
		began := time.Now()
		r.hiccupBase = ixHiccups()
		g0, outages := r.group, r.outages
		r.do(s, i)
		if r.hiccup() && !r.outage && r.outages == outages && s.kind != "restart" && s.kind != "settle" && s.kind != "stream" {
			r.excuseHiccup(g0, i)
		}
		kind := s.kind
		if kind == "settle" || kind == "stream" {
			kind += " " + s.zone
		}
		r.took[kind] += time.Since(began)
		r.steps++
		r.check(i)
		switch s.kind {
		case "hold", "release", "leave", "reload", "restart", "stream":
			r.checkAdaptive(i)
		}
		if len(r.errs) > 0 {
			return i, r.errs
		}
	}
	if r.recheck(len(steps) - 1); len(r.errs) > 0 {
		return len(steps) - 1, r.errs
	}
	return -1, nil
}

// ixStalls stalls srv now and then (DEBUG SLEEP, 0.5 to 0.9s, past the
// zones' 500-600ms timeout) without telling the run, until the test ends:
// as a loaded machine does to a run under -race. The checker finds each
// stall's effects (see excuseHiccup); the run checks that nothing else
// gives. A stall begins every every to 3×every. The log it returns tells
// when Redis stalled.
func ixStalls(t *testing.T, srv *redistest.Server, seed int64, every time.Duration) *ixStallLog {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c := srv.Client()
	log := &ixStallLog{}
	go func() {
		defer close(done)
		rng := rand.New(rand.NewSource(seed))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every + time.Duration(rng.Int63n(int64(2*every)))):
			}
			from := time.Now()
			log.add(from, from) // under way
			c.Do(ctx, "DEBUG", "SLEEP", fmt.Sprintf("%.1f", 0.5+float64(rng.Intn(5))/10))
			log.end(time.Now())
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		c.Close()
	})
	return log
}

// ixStallLog is when ixStalls stalled Redis.
type ixStallLog struct {
	mu    sync.Mutex
	spans [][2]time.Time // from, to (to zero: under way)
}

func (l *ixStallLog) add(from, _ time.Time) {
	l.mu.Lock()
	l.spans = append(l.spans, [2]time.Time{from})
	l.mu.Unlock()
}

func (l *ixStallLog) end(to time.Time) {
	l.mu.Lock()
	l.spans[len(l.spans)-1][1] = to
	l.mu.Unlock()
}

// during reports whether Redis stalled, at least in part, between from
// and to (false for no log: no stalls caused).
func (l *ixStallLog) during(from, to time.Time) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, sp := range l.spans {
		if sp[0].Before(to) && (sp[1].IsZero() || sp[1].After(from)) {
			return true
		}
	}
	return false
}

// ixStallEvery is how often TOLLGATE_INTERACT_STALLS stalls Redis: a
// duration (a stall every that to three times that), or any other value
// for every 1 s; 0 when unset.
func ixStallEvery(t *testing.T) time.Duration {
	v := os.Getenv("TOLLGATE_INTERACT_STALLS")
	if v == "" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			t.Fatalf("TOLLGATE_INTERACT_STALLS=%q: want a duration above 0 (or 1)", v)
		}
		return d
	}
	return time.Second
}

func TestInteraction(t *testing.T) {
	seed := ixSeed(t)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			r := &ixRun{t: t, tester: caddytest.NewTester(t), up: newIxUpstream(t, 2), instances: 1, took: map[string]time.Duration{}}
			budget := ixBudget(t, 10*time.Second)
			if store == "redis" {
				// Redis decides by its clock, and a calendar zone's span
				// is computed from the instance's: for a grant, from the
				// handler's clock, which the memory run moved.
				setClock(t, time.Now())
				// A Redis that keeps its data across a kill (each write
				// reaches the append-only file before its reply): a
				// settle step's kill loses nothing, and every settlement
				// held across it must reach Redis exactly once.
				r.srv = redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "no", "--enable-debug-command", "yes")
				if every := ixStallEvery(t); every > 0 {
					r.stalls = ixStalls(t, r.srv, seed, every)
				}
				c := r.srv.Client()
				dir, err := c.ConfigGet(t.Context(), "dir").Result()
				c.Close()
				if err != nil {
					t.Fatalf("CONFIG GET dir: %v", err)
				}
				r.redisDir = dir["dir"]
				r.instances = 2
				budget = ixBudget(t, 25*time.Second)
			}
			// Goroutines are counted with a configuration without
			// Tollgate loaded, before and after the sequence: whatever the
			// sequence started has ended by then.
			plain := withGlobal("") + fmt.Sprintf("\n\thttp://localhost:%d {\n\t\trespond \"ok\"\n\t}\n", ixPort+1)
			r.tester.InitServer(plain, "caddyfile")
			r.tester.Client.CloseIdleConnections()
			goroutines, _ := ixGoroutines()
			var steps []ixStep
			if v := os.Getenv("TOLLGATE_INTERACT_STEPS"); v != "" {
				all := ixGenerate(seed, 1_000_000, r.srv != nil)
				for _, f := range strings.Split(v, ",") {
					i, err := strconv.Atoi(f)
					if err != nil || i < 0 || i >= len(all) {
						t.Fatalf("TOLLGATE_INTERACT_STEPS: bad step %q", f)
					}
					steps = append(steps, all[i])
				}
			}
			round := 0
			for deadline := time.Now().Add(budget); time.Now().Before(deadline); round++ {
				s := seed + int64(round)
				steps := steps
				if steps == nil {
					steps = ixGenerate(s, 200, r.srv != nil)
				}
				r.prefix = fmt.Sprintf("s%d-", s)
				failed, errs := r.run(steps, time.Until(deadline))
				if failed < 0 {
					if os.Getenv("TOLLGATE_INTERACT_STEPS") != "" {
						break
					}
					continue
				}
				shrunk := r.shrink(s, steps[:failed+1])
				t.Fatalf("seed %d (TOLLGATE_INTERACT_SEED=%d), step %d:\n\t%s\nshortest failing sequence found (TOLLGATE_INTERACT_STEPS=%s):\n\t%s",
					s, s, failed, strings.Join(errs, "\n\t"), shrunk.indexes, strings.Join(shrunk.lines, "\n\t"))
			}
			t.Logf("seed %d: %d rounds, %d steps in %s: %d admissions owing an excess, %d grants, %d admissions by a calendar day, %d of a model's budget, %d settle steps (%d keys a freeze excused), %d stream steps (%d leases renewed during them), %d steps in which Redis answered late unasked", seed, round, r.steps, budget, r.owing, r.granted, r.calendar, r.llm, r.settles, r.excused, r.streams, r.renewals, r.hiccups)
			t.Logf("time by step kind: %v", r.took)
			if r.srv != nil {
				taken, returned, expired, lost, decisions := redisstore.LeaseTotals()
				t.Logf("quota leases (the process's): %d taken (%d of them renewed by a sweeper), %d returned, %d expired, %d lost; %d decisions from leases", taken, redisstore.LeaseRenewals(), returned, expired, lost, decisions)
			}
			reload(t, plain)
			r.tester.Client.CloseIdleConnections()
			var leftover int
			var stacks string
			for waitUntil := time.Now().Add(10 * time.Second); time.Now().Before(waitUntil); time.Sleep(100 * time.Millisecond) {
				if leftover, stacks = ixGoroutines(); leftover <= goroutines {
					break
				}
			}
			if leftover > goroutines {
				t.Errorf("%d goroutines of Tollgate or its Redis client left behind (%d before):\n%s", leftover, goroutines, stacks)
			}
		})
	}
}

// ixGoroutines counts the goroutines running Tollgate's code or its Redis
// client's (the test's own aside), and returns their stacks.
func ixGoroutines() (int, string) {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	var out strings.Builder
	for _, g := range strings.Split(string(buf), "\n\n") {
		if (strings.Contains(g, "caddy-tollgate/tollgate") || strings.Contains(g, "go-redis")) &&
			!strings.Contains(g, "TestInteraction") && !strings.Contains(g, "_test.go") {
			n++
			out.WriteString(g + "\n\n")
		}
	}
	return n, out.String()
}

type ixShrunk struct {
	indexes string
	lines   []string
}

// shrink finds a shorter sequence that still fails: chunks of steps are
// dropped, halves first and single steps last, for as long as the
// sequence still fails, within a minute.
func (r *ixRun) shrink(seed int64, steps []ixStep) ixShrunk {
	keep := make([]int, len(steps))
	for i := range keep {
		keep[i] = i
	}
	stop := time.Now().Add(time.Minute)
	tries := 0
	for size := len(keep) / 2; size >= 1 && time.Now().Before(stop); size /= 2 {
		// The last step is the one that failed: it stays.
		for i := len(keep) - 1 - size; i >= 0 && time.Now().Before(stop); i -= size {
			try := append(append([]int(nil), keep[:i]...), keep[i+size:]...)
			var seq []ixStep
			for _, k := range try {
				seq = append(seq, steps[k])
			}
			tries++
			r.prefix = fmt.Sprintf("s%d-shrink%d-", seed, tries)
			if failed, _ := r.run(seq, 0); failed >= 0 {
				keep = try
			}
		}
	}
	var out ixShrunk
	var idx []string
	for _, k := range keep {
		idx = append(idx, strconv.Itoa(k))
		out.lines = append(out.lines, fmt.Sprintf("%d: %s", k, steps[k]))
	}
	out.indexes = strings.Join(idx, ",")
	return out
}
