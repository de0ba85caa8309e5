package tollgate

import (
	"fmt"
	"io"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// The interaction test's stream steps (Redis only): one or both instances
// ask for one key of a stream zone (ix_stream, a token_bucket; ix_streamw,
// a sliding_window that takes grants: both lease) steadily, a request
// every 5-10 ms each for 1.2-1.5 s, so that the key stays busy and the
// sweeper renews its lease (docs/redis.md#quota-leases) while the main
// goroutine makes one fault at a random moment: a reset of the key, a
// grant to it, a reload that retires the Redis client (and returns the
// zones' leases), Redis paused or restarted without its data, or none.
// Its requests cost 1 or 2, which leaves leases sized by demand, and, in
// half the streams, 128 in the last 500 ms, which runs the key dry: leases
// capped small, then none, then refusals, so that quota a renewal minted
// would be admitted past the limit.
//
// The stream's answers are collected in its goroutines and merged into
// the checker's history after it, in the main goroutine, each admission
// at when it was answered and, for a bucket, perhaps decided as early as
// it was sent (see ixExceeds). Ambiguity is resolved leniently:
//   - an admission whose request overlaps an outage (a pause or a restart,
//     until every instance's decisions are Redis's again) is that
//     outage's, checked with its instance's local ones;
//   - a reset (or a restart) drops the admissions answered before it
//     began with the old history, and those whose request overlaps it,
//     which may have been decided before it;
//   - an admission whose request overlaps a span in which Redis answered
//     a call too late unasked (a stall: see excuseHiccup) is checked as an
//     outage's, and its excess counted as perhaps late.

// ixStreamZones are the zones a stream step streams to.
var ixStreamZones = func() (names []string) {
	for _, z := range ixZones {
		if z.stream {
			names = append(names, z.name)
		}
	}
	return names
}()

// ixGenerateStream makes s a stream step.
func ixGenerateStream(rng *rand.Rand, s ixStep) ixStep {
	s.kind = "stream"
	z := ixZoneNamed(ixStreamZones[rng.Intn(len(ixStreamZones))])
	s.path = z.paths[0]
	s.instance = rng.Intn(3) // 0: both
	s.cost = 1 + rng.Intn(2)
	s.n = 5 + rng.Intn(6) // ms between a stream's requests
	s.d = time.Duration(1200+rng.Intn(300)) * time.Millisecond
	if rng.Intn(2) == 0 {
		s.dry = s.d - ixStreamDry
	}
	faults := []string{"none", "reset", "reload", "pause", "restart"}
	if z.grants {
		faults = append(faults, "grant")
	}
	s.zone = faults[rng.Intn(len(faults))]
	// The fault comes once the sweeper may have renewed the key's first
	// lease (taken some 70 ms in, for 484 ms), and leaves the stream time
	// to go on after it.
	s.at = time.Duration(550+rng.Intn(int((s.d-850*time.Millisecond)/time.Millisecond))) * time.Millisecond
	s.hold = time.Duration(100+rng.Intn(300)) * time.Millisecond
	s.amount = 100 + rng.Intn(900)
	return s
}

// ixStreamDry is how long before its end a stream that runs its key dry
// costs ixStreamDryCost a request: some 40 requests an instance or more, more than
// the zones' 3,000 events.
const (
	ixStreamDry     = 500 * time.Millisecond
	ixStreamDryCost = 128
)

func ixStreamString(s ixStep) string {
	inst := "both"
	if s.instance > 0 {
		inst = fmt.Sprintf("i%d", s.instance)
	}
	fault := s.zone
	switch s.zone {
	case "pause":
		fault += fmt.Sprintf(" for %s", s.hold)
	case "grant":
		fault += fmt.Sprintf(" %d", s.amount)
	}
	if s.zone != "none" {
		fault += fmt.Sprintf(" at %s", s.at)
	}
	cost := strconv.Itoa(s.cost)
	if s.dry > 0 {
		cost += fmt.Sprintf(" (%d from %s)", ixStreamDryCost, s.dry)
	}
	return fmt.Sprintf("stream %s %s k%d cost=%s every %dms for %s, fault: %s", inst, s.path, s.key, cost, s.n, s.d, fault)
}

// ixStreamed is one request of a stream: its instance, when it was sent
// and answered (µs, the wall clock), and its status (0: err).
type ixStreamed struct {
	inst, cost     int
	sent, answered int64
	code           int
	err            error
}

// ixSpan is a span of the wall clock, in µs.
type ixSpan struct{ from, to int64 }

// overlaps reports whether request a ran, in part, within sp.
func (sp ixSpan) overlaps(a ixStreamed) bool { return a.sent <= sp.to && a.answered >= sp.from }

// stream runs stream step s: the stream, the fault during it, then its
// admissions merged into the history (see above).
func (r *ixRun) stream(s ixStep, step int) {
	r.streams++
	z := ixZoneNamed(ixZoneOfPath(s.path))
	id := z.name + "|" + r.key(s.key)
	insts := []int{s.instance}
	if s.instance == 0 {
		insts = []int{1, 2}
	}
	renewed := redisstore.LeaseRenewals()
	hS := ixHiccups()
	begin := time.Now()
	stop := begin.Add(s.d)
	results := make([][]ixStreamed, len(insts))
	inflight := make([]atomic.Int64, len(insts)) // when the request out was sent, or 0
	var wg sync.WaitGroup
	defer wg.Wait() // also when the fault fails the test
	for i, inst := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s2 := s
			s2.kind, s2.instance = "req", inst
			for time.Now().Before(stop) {
				if s.dry > 0 && time.Since(begin) >= s.dry {
					s2.cost = ixStreamDryCost
				}
				req := r.request(s2)
				res := ixStreamed{inst: inst, cost: s2.cost, sent: time.Now().UnixMicro()}
				inflight[i].Store(res.sent)
				resp, err := sendUnread(r.t, r.tester.Client, req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					res.code = resp.StatusCode
				}
				res.err, res.answered = err, time.Now().UnixMicro()
				inflight[i].Store(0)
				results[i] = append(results[i], res)
				time.Sleep(time.Duration(s.n) * time.Millisecond)
			}
		}()
	}

	if s.zone != "none" {
		time.Sleep(time.Until(begin.Add(s.at)))
	}
	hA, f0 := ixHiccups(), time.Now().UnixMicro()
	outage, reset := 0, false // the fault's outage; whether it reset the key
	switch s.zone {
	case "reset":
		r.reset(z.name, s.key, step)
		reset = r.leaseResets[id] >= f0 // it ran, or may have
	case "grant":
		r.grant(z.name, s.key, s.amount, step)
	case "reload":
		r.retireClient()
	case "pause":
		r.srv.Pause()
		r.outage = true
		r.outages++
		outage = r.outages
		time.Sleep(s.hold)
		r.srv.Resume()
		r.outage = false
		r.backToRedis(step)
	case "restart":
		r.outages++
		outage = r.outages
		r.restart(step)
		reset = true
	}
	// The fault ends once the requests sent before it ended have been
	// answered: a decision one of them made without Redis is counted
	// (ixHiccups) when it ends.
	for f := time.Now().UnixMicro(); ; time.Sleep(time.Millisecond) {
		out := false
		for i := range inflight {
			if at := inflight[i].Load(); at != 0 && at <= f {
				out = true
			}
		}
		if !out {
			break
		}
	}
	hB, f1 := ixHiccups(), time.Now().UnixMicro()
	wg.Wait()
	hE, end := ixHiccups(), time.Now().UnixMicro()
	renewed = redisstore.LeaseRenewals() - renewed
	r.renewals += int(renewed)

	// The spans in which Redis answered a call too late though the test
	// did not stop it: a fault's outage counts its own.
	var stalled []ixSpan
	if hA != hS {
		stalled = append(stalled, ixSpan{begin.UnixMicro(), f0})
	}
	if hB != hA && outage == 0 {
		stalled = append(stalled, ixSpan{f0, f1})
	}
	if hE != hB {
		stalled = append(stalled, ixSpan{f1, end})
	}
	if len(stalled) > 0 {
		r.hiccups++
		r.t.Logf("step %d: Redis answered a call too late (a stall the test did not cause): the stream's admissions then are checked as an outage's", step)
	}
	fault := ixSpan{f0, f1}
	r.group++
	var sent, admitted int
	for _, rs := range results {
		for _, res := range rs {
			sent++
			switch {
			case res.err != nil:
				r.failf("step %d: %s: instance %d: %v", step, s, res.inst, res.err)
				continue
			case res.code == 429:
				continue
			case res.code != 200:
				r.failf("step %d: %s: instance %d: status %d", step, s, res.inst, res.code)
				continue
			}
			admitted++
			if reset && (res.answered < f0 || fault.overlaps(res)) {
				continue // the history the reset (or the lost data) ended
			}
			a := ixAdmission{at: res.answered, sent: res.sent, cost: int64(res.cost), reserved: int64(res.cost),
				group: r.group, inst: res.inst}
			if outage > 0 && fault.overlaps(res) {
				a.outage, a.outageN = true, outage
			}
			late := r.stalls.during(time.UnixMicro(res.sent), time.UnixMicro(res.answered))
			for _, sp := range stalled {
				late = late || sp.overlaps(res)
			}
			if late && !a.outage {
				a.outage, a.outageN, a.late = true, -1-step, true
			}
			r.admitted[id] = append(r.admitted[id], a)
		}
	}
	r.t.Logf("step %d: %s: %d requests, %d admitted, %d leases renewed", step, s, sent, admitted, renewed)
}

// ixZoneOfPath is the name of the stream zone of path.
func ixZoneOfPath(path string) string {
	for _, name := range ixStreamZones {
		if ixZoneNamed(name).paths[0] == path {
			return name
		}
	}
	panic("no stream zone of " + path)
}

// retireClient reloads the configuration with a change of a storage redis
// setting (its timeout and pool_size), so that each instance gets a new
// Redis client and retires the old one (on memory, a change of jitter).
func (r *ixRun) retireClient() {
	n := r.settings
	if r.srv != nil {
		n.timeout = map[string]string{"500ms": "600ms", "600ms": "500ms"}[n.timeout]
		n.poolSize = 24 - n.poolSize // 8 <-> 16
	} else {
		n.jitter = map[string]string{"0": "0.5", "0.5": "0"}[n.jitter]
	}
	r.settings = n
	r.load()
}
