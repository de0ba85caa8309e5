package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
)

// Request is one zone's part of a request's decision by TakeAll.
type Request struct {
	// Zone is the zone's limiter, as Zone of the store that runs TakeAll
	// returned it.
	Zone storage.Limiter
	// Key is the resolved key, bounded with storage.BoundKey.
	Key string
	// Cost is the request's cost in milli-units.
	Cost int64
	// DryRun marks a zone that never rejects: its rejection does not stop
	// the other zones, and, like every rejecting zone, it is not charged.
	DryRun bool
	// Strike links the request to its zone's ban, as memory.Request.Strike
	// does: 1 + the index in reqs of an earlier request whose zone has a
	// Ban limit and the same key (so that a Cluster keeps both in one
	// slot), or 0.
	Strike int
}

// grouping is how TakeAll splits a request's keys into the groups that one
// script run can decide together.
type grouping uint8

const (
	// oneServer: one server holds every key; one group.
	oneServer grouping = iota
	// bySlot: a Redis Cluster runs a script only on keys of one slot.
	bySlot
	// byTag: one group per hash tag, which is safe for a Cluster and for
	// a Ring (which shards by tag, not by slot) alike.
	byTag
)

var (
	errForeignZone = errors.New("a zone that is not from this store")
	errSameKey     = errors.New("the same zone and key twice")
)

// TakeAll decides reqs, the zones that apply to one request, as one request
// at now (ignored: the Redis server's clock decides): it is admitted only
// if every zone that is not a dry run admits it. Then every admitting zone
// is charged, dry runs too; otherwise nothing is charged anywhere. It
// returns one Decision per request, in order, and the index of the first
// rejecting zone that is not a dry run, or -1 when the request is
// admitted. A rejected request's Decisions are what each zone would decide
// with nothing charged.
//
// Requests whose keys a single script can reach (all of them on a server
// or a Sentinel-managed primary; those in one slot on a Cluster, such as
// zones that key the same identity, see Key) are decided by one script
// run, atomically: check every zone, then take in every admitting one.
// When the keys span slots, TakeAll decides one slot group after another,
// each atomically, in the order of reqs; if a group rejects, it gives back
// what the earlier groups took before it returns. Until then, those zones
// look fuller than they are to concurrent requests, which errs towards
// rejecting: no zone ever admits more than its limit. After a rejection,
// the later groups are only checked.
//
// A zone's cost above its capacity is rejected with Wait algorithms.Never,
// as in Take. Each zone and key may appear once. A single request is
// decided exactly as the zone's Take decides it.
//
// When err is not nil, the request is undecided, and TakeAll has given
// back what it took, or left it to give back in the background if its
// deadline came first (as far as Redis answers; a charge it could not give
// back expires with its key); the caller may decide zone by zone instead.
// A deadline of ctx bounds the whole decision, every round trip of it
// giving back included: no request waits for Redis longer than that one
// deadline, whatever its zones span.
func (s *Store) TakeAll(ctx context.Context, now int64, reqs []Request) (ds []algorithms.Decision, rejected int, err error) {
	v, err := s.Decide(ctx, now, reqs)
	return v.Decisions, v.Rejected, err
}

// Verdict is what Decide found for a request.
type Verdict struct {
	// Decisions holds one Decision per request, in order, as TakeAll
	// returns them. Their At is not always a time: a concurrency slot's
	// decision carries its lease id there (Undo and Renew name the lease
	// by it). Clock is the time.
	Decisions []algorithms.Decision
	// Rejected is the index of the first rejecting zone that is not a
	// dry run, or -1 when the request is admitted.
	Rejected int
	// Decided reports that Redis decided the request: false when the deny
	// cache answered it, with decisions Redis made earlier.
	Decided bool
	// Clock is the time on Redis's clock, µs, that Redis decided the
	// request at, as a decision that carries it shows (a rate's or a
	// ban's; see zone.timed), or 0 when none does: the deny cache answered,
	// or every zone was a concurrency slot or skipped for its ban. A
	// caller that keeps Redis's clock (a local copy of its state) takes
	// it from here only.
	Clock int64
}

// Decide is TakeAll, which it runs, and reports what it found as a
// Verdict: whether Redis decided the request, and Redis's clock.
func (s *Store) Decide(ctx context.Context, now int64, reqs []Request) (Verdict, error) {
	if len(reqs) == 0 {
		return Verdict{Rejected: -1}, nil
	}
	parts, err := s.parts(reqs)
	if err != nil {
		return Verdict{Rejected: -1}, fmt.Errorf("redis store: take all: %w", err)
	}
	if len(parts) == 1 && parts[0].z.leases {
		// A hot key: from a lease (see quota.go).
		if v, ok, err := s.leased(ctx, now, parts, reqs[0].Cost); ok {
			if err != nil {
				return Verdict{Rejected: -1}, err
			}
			return v, nil
		}
	}
	var freed uint64
	if s.deny != nil {
		if ds, rejected, ok := s.cached(now, parts); ok {
			return Verdict{Decisions: ds, Rejected: rejected}, nil
		}
		freed = s.deny.since(parts)
	}
	ds, rejected, err := s.takeAll(ctx, now, parts)
	if err != nil {
		return Verdict{Rejected: -1}, err
	}
	if s.deny != nil && rejected >= 0 && cacheable(parts, ds) {
		s.deny.store(now, freed, parts, ds)
	}
	return Verdict{Decisions: ds, Rejected: rejected, Decided: true, Clock: clockOf(parts, ds)}, nil
}

// cached answers parts at now from the deny cache, if it can: a request
// the cache answers costs no round trip.
func (s *Store) cached(now int64, parts []part) ([]algorithms.Decision, int, bool) {
	s.listen()
	ds := make([]algorithms.Decision, len(parts))
	if s.deny.lookup(now, parts, ds) {
		return ds, firstRejecting(parts, ds), true
	}
	return nil, -1, false
}

// timed reports whether d, a decision of z, carries in d.At the time on
// Redis's clock that Redis made it at: every decision of a rate or a ban
// does; a concurrency slot's carries its lease id there instead
// (concurrency.lua), and a part that its ban skipped carries nothing
// (storage.Skipped).
func (z *zone) timed(d algorithms.Decision) bool {
	return z.limit.Kind != algorithms.Concurrency && !storage.Skipped(d)
}

// clockOf is the time Redis decided parts at, from the first decision
// in ds that carries it, or 0.
func clockOf(parts []part, ds []algorithms.Decision) int64 {
	for i := range parts {
		if parts[i].z.timed(ds[i]) {
			return ds[i].At
		}
	}
	return 0
}

// cacheable reports whether a rejected request may be answered from the
// deny cache until its wait is over: not when it holds a concurrency slot
// (a slot frees when a request ends, which no wait predicts), nor when a
// zone with a ban rejected it by its limit (each such rejection must reach
// Redis to count as a strike). A ban's own rejection is exact and cached.
func cacheable(parts []part, ds []algorithms.Decision) bool {
	for i := range parts {
		switch {
		case parts[i].z.limit.Kind == algorithms.Concurrency:
			return false
		case parts[i].strike > 0 && !ds[i].Allowed:
			return false
		}
	}
	return true
}

// firstRejecting is the index of the first rejecting part that is not a
// dry run, or -1.
func firstRejecting(parts []part, ds []algorithms.Decision) int {
	for i := range parts {
		if parts[i].block && !ds[i].Allowed {
			return i
		}
	}
	return -1
}

func (s *Store) takeAll(ctx context.Context, now int64, parts []part) (ds []algorithms.Decision, rejected int, err error) {
	if len(parts) == 1 {
		// One zone: its one-key script, as its Take runs it.
		p := &parts[0]
		op := opTake
		if p.op == opCheckNever {
			op = opReject
		}
		d, err := p.z.runKey(ctx, op, p.key, now, p.x, algorithms.Decision{})
		if err != nil {
			return nil, -1, fmt.Errorf("redis store: take %q: %w", p.z.name, err)
		}
		rejected = -1
		if !d.Allowed && p.block {
			rejected = 0
		}
		return []algorithms.Decision{d}, rejected, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, -1, fmt.Errorf("redis store: take all: %w", err)
	}
	groups := s.groups(parts)
	budget := time.Duration(0) // the request's, for what settle leaves to the background
	if dl, ok := ctx.Deadline(); ok && len(groups) > 1 {
		budget = time.Until(dl)
	}
	ds = make([]algorithms.Decision, len(parts))
	for gi, g := range groups {
		if err := s.runGroup(ctx, multiDecide, now, parts, g, ds); err != nil {
			err = fmt.Errorf("redis store: take all: %w", err)
			if gi > 0 {
				err = errors.Join(err, s.settle(ctx, budget, now, parts, groups[:gi], nil, ds))
			}
			return nil, -1, err
		}
		if blocked(parts, g, ds) {
			if err := s.settle(ctx, budget, now, parts, groups[:gi], groups[gi+1:], ds); err != nil {
				return nil, -1, fmt.Errorf("redis store: take all: %w", err)
			}
			break
		}
	}
	return ds, firstRejecting(parts, ds), nil
}

// part is one request as the scripts take it.
type part struct {
	z      *zone
	key    string // the Redis key
	op     string // opCheck, opCheckNever, or opUndo when giving back
	x      int64
	block  bool // not a dry run
	strike int  // Request.Strike
}

// own returns l as a zone of s.
func (s *Store) own(l storage.Limiter) (*zone, error) {
	z, ok := l.(*zone)
	if !ok || z.store != s {
		return nil, fmt.Errorf("%w: %T", errForeignZone, l)
	}
	if z.script == nil {
		return nil, fmt.Errorf("zone %q: unknown algorithm %s", z.name, z.limit.Kind)
	}
	return z, nil
}

// parts converts reqs for the scripts.
func (s *Store) parts(reqs []Request) ([]part, error) {
	parts := make([]part, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		z, err := s.own(r.Zone)
		if err != nil {
			return nil, err
		}
		p := part{z: z, key: s.key(r.Key, z.tail), op: opCheck, x: amount(&z.limit, max(r.Cost, 0)), block: !r.DryRun, strike: r.Strike}
		if p.strike < 0 || p.strike > i || (p.strike > 0 && parts[p.strike-1].z.limit.Kind != algorithms.Ban) {
			return nil, fmt.Errorf("zone %q: strike %d does not name an earlier request with a ban", z.name, p.strike)
		}
		if r.Cost > z.limit.Capacity() {
			p.op, p.x = opCheckNever, 0
		}
		for j := 0; j < i; j++ {
			if parts[j].key == p.key {
				return nil, fmt.Errorf("%w: zone %q, key %q", errSameKey, z.name, r.Key)
			}
		}
		parts[i] = p
	}
	return parts, nil
}

// groups splits parts into the groups that one script run can decide, in
// the order of their first parts, as lists of indexes into parts.
func (s *Store) groups(parts []part) [][]int {
	if s.group == oneServer {
		all := make([]int, len(parts))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	same := func(a, b string) bool { return hashTag(a) == hashTag(b) }
	if s.group == bySlot {
		same = func(a, b string) bool { return slot(a) == slot(b) }
	}
	var groups [][]int
	of := make([]int, len(parts)) // the group of each part
	for i := range parts {
		g := -1
		for j := 0; j < i && g < 0; j++ {
			if same(parts[i].key, parts[j].key) {
				g = of[j]
			}
		}
		if g < 0 {
			g = len(groups)
			groups = append(groups, nil)
		}
		of[i] = g
		groups[g] = append(groups[g], i)
	}
	return groups
}

// blocked reports whether a zone of group g that is not a dry run rejects.
func blocked(parts []part, g []int, ds []algorithms.Decision) bool {
	for _, i := range g {
		if parts[i].block && !ds[i].Allowed {
			return true
		}
	}
	return false
}

// settle finishes a request that a group rejected or failed on: it gives
// back what the groups taken took and checks the groups later, filling in
// their Decisions. It runs even when ctx is cancelled (its caller gone:
// what was taken must still be given back), but within ctx's deadline,
// the request's one budget for the store, never a second one after it
// (before, a decision across slots could wait twice its timeout). A
// group that the deadline leaves no time to give back is given back in
// the background, with budget (as long as the request had) of its own,
// while the request goes on without waiting for it: until then its zone
// looks fuller than it is, which errs towards rejecting. A give-back that
// was sent and got no reply in time is not sent again (it may have run,
// and giving back twice would admit more than the limit): its charge
// expires with its key.
func (s *Store) settle(ctx context.Context, budget time.Duration, now int64, parts []part, taken, later [][]int, ds []algorithms.Decision) error {
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		defer cancel()
	} else {
		ctx = context.WithoutCancel(ctx)
	}
	var errs []error
	for k, g := range taken {
		if ctx.Err() != nil {
			s.giveBackLater(budget, now, parts, taken[k:], ds)
			errs = append(errs, fmt.Errorf("giving back: %w (left to the background)", ctx.Err()))
			break
		}
		if err := s.giveBack(ctx, now, parts, g, ds); err != nil {
			errs = append(errs, err)
		}
	}
	for _, g := range later {
		// Not charged, since an earlier group rejected the request, but
		// decided: a zone here that rejects it counts a strike, as when
		// every zone is decided in one step.
		if err := s.runGroup(ctx, multiStrike, now, parts, g, ds); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// giveBack gives back what group g took, ds holding the decisions that
// charged it, and stores there what each zone holds since.
func (s *Store) giveBack(ctx context.Context, now int64, parts []part, g []int, ds []algorithms.Decision) error {
	for _, i := range g {
		switch {
		case storage.Skipped(ds[i]) && parts[i].op == opCheckNever:
			parts[i].op = opSkipNever
		case storage.Skipped(ds[i]):
			parts[i].op = opSkip
		case ds[i].Allowed && parts[i].x > 0:
			parts[i].op = opUndo
		}
	}
	if err := s.runGroup(ctx, multiCheck, now, parts, g, ds); err != nil {
		return fmt.Errorf("giving back: %w", err)
	}
	return nil
}

// lateGiveBacks is how many requests' give-backs a store runs in the
// background at once (see settle); past it, a charge expires with its key.
const lateGiveBacks = 64

// giveBackLater gives back the groups taken in a goroutine of its own,
// bounded by budget, on copies of parts and ds (the caller keeps its own).
// It does not block.
func (s *Store) giveBackLater(budget time.Duration, now int64, parts []part, taken [][]int, ds []algorithms.Decision) {
	if budget <= 0 {
		return
	}
	select {
	case s.late <- struct{}{}:
	default:
		return
	}
	parts, ds = slices.Clone(parts), slices.Clone(ds)
	go func() {
		defer func() { <-s.late }()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		for _, g := range taken {
			_ = s.giveBack(ctx, now, parts, g, ds)
		}
	}()
}

// runGroup runs multi.lua (what: multiDecide or multiCheck) on the parts of
// group g, and stores their decisions in ds (a part that gives back reads
// there the decision that charged it).
func (s *Store) runGroup(ctx context.Context, what string, now int64, parts []part, g []int, ds []algorithms.Decision) error {
	// A give-back reads each key's reset mark too (see multi.lua).
	marked := false
	for _, i := range g {
		marked = marked || parts[i].op == opUndo
	}
	nkeys := len(g)
	if marked {
		nkeys *= 2
	}
	c := newCall(multiScript, s.fns.fcall(), nkeys)
	args := slices.Grow(c.args, nkeys+3+11*len(g))
	for _, i := range g {
		args = append(args, parts[i].key)
	}
	if marked {
		for _, i := range g {
			args = append(args, resetMark(parts[i].key))
		}
	}
	args = append(args, word(what), s.clock(now), s.ttlSlack)
	for _, i := range g {
		p := &parts[i]
		block := "0"
		if p.block {
			block = "1"
		}
		var ta, tr int64 // what an undo gives back, ds[i] charged
		if p.op == opUndo {
			ta, tr = ds[i].At, ds[i].Reset
		}
		args = append(args, word(p.op), p.z.arg(p.x), word(block), ta, tr)
		args = append(args, p.z.constsAt(now)...)
		args = append(args, groupIndex(g, p.strike-1)+1)
	}
	c.args = args
	v, err := s.run.run(ctx, c)
	if err == nil && len(v) != 6*len(g) {
		err = fmt.Errorf("%w: %v", errReply, v)
	}
	if err != nil {
		return fmt.Errorf("zones %s: %w", zoneNames(parts, g), err)
	}
	for k, i := range g {
		ds[i] = decision(v[6*k:])
	}
	return nil
}

// groupIndex is the position of part i in group g, or -1.
func groupIndex(g []int, i int) int {
	for k, j := range g {
		if j == i {
			return k
		}
	}
	return -1
}

// zoneNames lists the names of group g's zones for an error message.
func zoneNames(parts []part, g []int) string {
	var b strings.Builder
	for k, i := range g {
		if k > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", parts[i].z.name)
	}
	return b.String()
}

// hashTag returns the part of key that Redis hashes to its Cluster slot:
// the bytes between the first '{' and the next '}', if there are any, or
// else the whole key.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	n := strings.IndexByte(key[open+1:], '}')
	if n <= 0 {
		return key
	}
	return key[open+1 : open+1+n]
}

// slot returns key's Redis Cluster slot: the CRC-16 (XMODEM) of its hash
// tag, modulo 16384.
func slot(key string) int {
	tag := hashTag(key)
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc & 0x3fff)
}
