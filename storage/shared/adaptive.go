package shared

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// Adaptive is an adaptive concurrency part's state (concurrency
// adaptive): one controller (algorithms.AdaptiveConfig) per key, in this
// process, whatever store the zone's other parts are on. Each instance
// learns from the round trips of the requests it admitted, so each
// adapts on its own; nothing of it is shared through Redis.
//
// It is a storage.Limiter whose Take counts a request in flight and whose
// Undo ends it, teaching nothing (a request another part rejected); a
// request that went on ends with AdaptiveHold.End, which teaches its round
// trip. Keys beyond MaxKeys share one controller until a sweep forgets an
// idle key: a flood of distinct keys holds at most MaxKeys states (about
// 1.3 KB each) and is still shed.
type Adaptive struct {
	cfg     algorithms.AdaptiveConfig
	maxKeys int
	idle    int64 // µs a key with nothing in flight is kept
	seed    maphash.Seed

	shed atomic.Int64 // requests shed, or that a dry run would have shed

	mu       sync.Mutex // guards n and overflow's creation
	n        int
	shards   [adaptiveShards]adaptiveShard
	overflow *adaptiveKey
}

const adaptiveShards = 32

// adaptiveIdleWindows is how many windows a key with nothing in flight is
// kept before a sweep forgets it (and with it what it learnt).
const adaptiveIdleWindows = 60

type adaptiveShard struct {
	mu   sync.Mutex
	keys map[string]*adaptiveKey
}

// adaptiveKey is one key's controller, guarded by its shard's lock (the
// overflow's by Adaptive.mu).
type adaptiveKey struct {
	mu   *sync.Mutex
	s    algorithms.AdaptiveState
	last int64 // µs of the last admission
}

// NewAdaptive returns the state of an adaptive part whose controller is
// cfg (see algorithms.NewAdaptive), holding at most maxKeys keys.
func NewAdaptive(cfg algorithms.AdaptiveConfig, maxKeys int) *Adaptive {
	a := &Adaptive{cfg: cfg, maxKeys: max(maxKeys, 1), seed: maphash.MakeSeed()}
	a.idle = adaptiveIdleWindows * cfg.Window
	for i := range a.shards {
		a.shards[i].keys = make(map[string]*adaptiveKey)
	}
	return a
}

// Config is the part's controller configuration.
func (a *Adaptive) Config() *algorithms.AdaptiveConfig { return &a.cfg }

// key returns key's controller, created at now if it has none (the
// overflow's when MaxKeys are held).
func (a *Adaptive) key(key string, now int64) *adaptiveKey {
	h := maphash.String(a.seed, key)
	sh := &a.shards[h%adaptiveShards]
	sh.mu.Lock()
	if k := sh.keys[key]; k != nil {
		return k // locked
	}
	a.mu.Lock()
	if a.n >= a.maxKeys {
		if a.overflow == nil {
			a.overflow = &adaptiveKey{mu: &a.mu, s: a.cfg.NewState(now, h)}
		}
		sh.mu.Unlock()
		return a.overflow // locked: a.mu
	}
	a.n++
	a.mu.Unlock()
	k := &adaptiveKey{mu: &sh.mu, s: a.cfg.NewState(now, h)}
	sh.keys[key] = k
	return k // locked
}

// Admit decides a request of key at now: admitted when fewer than the
// key's limit are in flight (always in a dry run, which reports what it
// would shed), and then counted in flight until the hold's End. A
// rejection's Wait is the key's recent round trip (at least 1 µs): a
// request shed by an upstream's queue may come back once it has moved.
func (a *Adaptive) Admit(key string, now int64, dryRun bool) (AdaptiveHold, algorithms.Decision) {
	k := a.key(key, now)
	defer k.mu.Unlock()
	k.last = now
	ok := a.cfg.Admit(&k.s)
	if !ok {
		a.shed.Add(1)
		if dryRun {
			a.cfg.AdmitOver(&k.s)
		}
	}
	d := a.decision(&k.s, ok)
	if !ok && !dryRun {
		return AdaptiveHold{}, d
	}
	return AdaptiveHold{a: a, k: k, start: now}, d
}

// decision is a decision of the state s: allowed, and what is left of its
// limit.
func (a *Adaptive) decision(s *algorithms.AdaptiveState, allowed bool) algorithms.Decision {
	d := algorithms.Decision{Allowed: allowed, Remaining: max(a.cfg.Read(s)-s.InFlight, 0)}
	if !allowed {
		d.Wait = max(s.Recent, 1)
	}
	return d
}

// AdaptiveHold is a request counted in flight by an adaptive part, until
// End. The zero value holds nothing.
type AdaptiveHold struct {
	a     *Adaptive
	k     *adaptiveKey
	start int64 // µs of the admission
}

// Sent restarts the round trip of the request h holds at now: it was held
// back (a shaping delay) before it went to the upstream.
func (h *AdaptiveHold) Sent(now int64) { h.start = now }

// SentAdaptive restarts, at now, the round trips of the requests parts
// hold (see AdaptiveHold.Sent).
func SentAdaptive[Z any](now int64, parts []Part[Z]) {
	for i := range parts {
		parts[i].Hold.Sent(now)
	}
}

// End ends the request h holds at now: answered at answered (µs; the round
// trip is answered - admission), with outcome o (algorithms.Cancelled for
// a request that teaches nothing). A second End does nothing.
func (h *AdaptiveHold) End(now, answered int64, o algorithms.Outcome) {
	k := h.k
	if k == nil {
		return
	}
	h.k = nil
	k.mu.Lock()
	h.a.cfg.End(&k.s, now, max(answered-h.start, 0), o)
	k.mu.Unlock()
}

// AdaptiveState is a key's controller as the admin API and the metrics
// see it.
type AdaptiveState struct {
	Limit    int64   // requests admitted in flight now
	InFlight int64   // requests in flight
	Baseline int64   // µs, 0 before the first window closed
	Recent   int64   // µs, the last window's percentile round trip
	Gradient float64 // the last window's
	Windows  int64   // windows closed
}

func (a *Adaptive) state(k *adaptiveKey) AdaptiveState {
	s := &k.s
	return AdaptiveState{Limit: a.cfg.Read(s), InFlight: s.InFlight, Baseline: s.Baseline, Recent: s.Recent, Gradient: s.Gradient, Windows: s.Windows}
}

// State returns key's controller, ok false for a key the part does not
// hold.
func (a *Adaptive) State(key string) (st AdaptiveState, ok bool) {
	sh := &a.shards[maphash.String(a.seed, key)%adaptiveShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[key]
	if k == nil {
		return st, false
	}
	return a.state(k), true
}

// Each calls f with every key's controller (the overflow's as key ""
// with overflow true), each read under its lock.
func (a *Adaptive) Each(f func(key string, st AdaptiveState, overflow bool)) {
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for key, k := range sh.keys {
			f(key, a.state(k), false)
		}
		sh.mu.Unlock()
	}
	a.mu.Lock()
	o := a.overflow
	var st AdaptiveState
	if o != nil {
		st = a.state(o)
	}
	a.mu.Unlock()
	if o != nil {
		f("", st, true)
	}
}

// Shed is the number of requests the part shed, or in a dry run would
// have shed.
func (a *Adaptive) Shed() int64 { return a.shed.Load() }

// Len is the number of keys the part holds a controller for (the
// overflow's aside).
func (a *Adaptive) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// Sweep forgets, at now, the keys with nothing in flight and no admission
// for adaptiveIdleWindows windows, and returns how many.
func (a *Adaptive) Sweep(now int64) int {
	n := 0
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for key, k := range sh.keys {
			if k.s.InFlight == 0 && now-k.last >= a.idle {
				delete(sh.keys, key)
				n++
			}
		}
		sh.mu.Unlock()
	}
	a.mu.Lock()
	a.n -= n
	a.mu.Unlock()
	return n
}

// Take counts a request of key in flight at now if the key's limit admits
// it (cost aside: a request is one in flight); Undo ends it.
func (a *Adaptive) Take(_ context.Context, key string, now, _ int64) (algorithms.Decision, error) {
	_, d := a.Admit(key, now, false)
	return d, nil
}

// Undo ends a request that Take admitted, teaching nothing.
func (a *Adaptive) Undo(_ context.Context, key string, now, _ int64, taken algorithms.Decision) error {
	if !taken.Allowed {
		return nil
	}
	sh := &a.shards[maphash.String(a.seed, key)%adaptiveShards]
	sh.mu.Lock()
	if k := sh.keys[key]; k != nil && k.s.InFlight > 0 {
		a.cfg.End(&k.s, now, 0, algorithms.Cancelled)
		sh.mu.Unlock()
		return nil
	}
	sh.mu.Unlock()
	a.mu.Lock() // a key beyond MaxKeys: the overflow's
	if a.overflow != nil {
		a.cfg.End(&a.overflow.s, now, 0, algorithms.Cancelled)
	}
	a.mu.Unlock()
	return nil
}

// Peek reports whether one more request of key would be admitted now.
func (a *Adaptive) Peek(_ context.Context, key string, _ int64) (algorithms.Decision, bool, error) {
	sh := &a.shards[maphash.String(a.seed, key)%adaptiveShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[key]
	if k == nil {
		return algorithms.Decision{}, false, nil
	}
	ok := k.s.InFlight < a.cfg.Read(&k.s)
	return a.decision(&k.s, ok), true, nil
}

// Reset makes key's controller learn afresh from now (its limit back to
// the initial one, its baseline forgotten), keeping its requests in
// flight: they are running, and their ends free their places.
func (a *Adaptive) Reset(_ context.Context, key string, now int64) (bool, error) {
	sh := &a.shards[maphash.String(a.seed, key)%adaptiveShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[key]
	if k == nil {
		return false, nil
	}
	inFlight := k.s.InFlight
	k.s = a.cfg.NewState(now, maphash.String(a.seed, key))
	k.s.InFlight = inFlight
	return true, nil
}

// AdmitAdaptive decides a request's adaptive parts (each Zone.Adaptive)
// at now, before its other parts: each admits it into its key's limit and
// holds it in flight (Part.Hold), a dry run whatever the limit. It
// returns the index of the first part that sheds the request, or -1; a
// shed request holds nothing (the parts before it are ended, teaching
// nothing). Deciding these first keeps a shed request off the shared
// store: shedding costs no Redis round trip while the upstream is
// overloaded.
func AdmitAdaptive[Z any](now int64, parts []Part[Z]) int {
	for i := range parts {
		p := &parts[i]
		p.Hold, p.D = p.Zone.Adaptive.Admit(p.Key, now, p.Zone.DryRun)
		if !p.D.Allowed && !p.Zone.DryRun {
			EndAdaptive(now, parts[:i], now, algorithms.Cancelled)
			return i
		}
	}
	return -1
}

// EndAdaptive ends the requests parts hold (see AdmitAdaptive) at now,
// answered at answered, with outcome o. A part already ended is not
// ended again.
func EndAdaptive[Z any](now int64, parts []Part[Z], answered int64, o algorithms.Outcome) {
	for i := range parts {
		parts[i].Hold.End(now, answered, o)
	}
}
