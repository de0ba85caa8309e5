package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
)

// A zone is decided as up to three parts, each a limit of its own with
// its own state per key, decided together as one step (memory.TakeAll,
// one Redis script): its ban, its rate, its concurrency slots, in that
// order. A zone without ban and concurrency is one part, the rate. The
// zone's first part after the ban (the rate, or the slots of a zone
// without one) is the zone itself: the handler's zones list, the admin
// API and the metrics see it.
type partRole uint8

const (
	roleRate partRole = iota
	roleSlots
	roleBan
)

// guards checks and parses the zone's concurrency, concurrency_lease, ban
// and ban_after into s.
func (zc *Zone) guards(s *zoneSettings) error {
	if zc.Concurrency < 0 {
		return fmt.Errorf("concurrency: must be greater than 0, got %d", zc.Concurrency)
	}
	if zc.ConcurrencyLease != 0 && zc.Concurrency == 0 {
		return fmt.Errorf("concurrency_lease: only with concurrency, got concurrency_lease %s without it", time.Duration(zc.ConcurrencyLease))
	}
	if zc.BanAfter != 0 && zc.Ban == 0 {
		return fmt.Errorf("ban_after: only with ban, got ban_after %d without it", zc.BanAfter)
	}
	if zc.Concurrency > 0 {
		lease := time.Duration(zc.ConcurrencyLease)
		if lease == 0 {
			lease = defaultLease
		}
		l, err := algorithms.NewConcurrency(zc.Concurrency, lease)
		if err != nil {
			return err
		}
		s.slots = &l
	}
	return nil
}

// rateOnly refuses the options of a rate in a zone that has only
// concurrency: they would be silently ignored.
func (zc *Zone) rateOnly() error {
	for _, f := range []struct {
		name string
		set  bool
		val  any
	}{
		{"algorithm", zc.Algorithm != "", zc.Algorithm},
		{"burst", zc.Burst != 0, zc.Burst},
		{"max_delay", zc.MaxDelay != 0, time.Duration(zc.MaxDelay)},
		{"cost", zc.Cost != "", string(zc.Cost)},
		{"default_cost", zc.DefaultCost != nil, zc.DefaultCost},
	} {
		if f.set {
			if p, ok := f.val.(*float64); ok {
				f.val = *p
			}
			return fmt.Errorf("%s: belongs to a rate, and the zone has only concurrency (no events and window); got %s %v", f.name, f.name, f.val)
		}
	}
	return nil
}

// openPart opens a part of zone z (whose shared fields are set) for limit
// l: its own store state (under storeName: the zone's name, or a tier's),
// and a memory fallback for on_storage_error local.
func (h *Handler) openPart(z *zone, role partRole, l algorithms.Limit, storeName string) (*zone, error) {
	p := &zone{
		name:         z.name,
		role:         role,
		spec:         storage.Zone{Name: storeName, Limit: l, MaxKeys: h.MaxKeys},
		matchers:     z.matchers,
		key:          z.key,
		clientIP:     z.clientIP,
		header:       z.header,
		v4bits:       z.v4bits,
		v6bits:       z.v6bits,
		costTemplate: z.costTemplate,
		cost:         z.cost,
		defaultCost:  z.defaultCost,
		onError:      z.onError,
		dryRun:       z.dryRun,
	}
	p.base = p
	if z.base != nil {
		p.base = z.base
	}
	p.hname = z.name
	if role != roleBan {
		p.policy = policyItem(z.name, l)
		p.limitValue = l.Events
	}
	var err error
	if p.limiter, err = h.backend.OpenLimiter(p.spec); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if role == roleRate && h.memory {
		h.warnMemoryBound(p.spec)
	}
	p.mem, _ = p.limiter.(*memory.Store)
	if p.onError == failLocal && p.mem == nil {
		if role == roleRate {
			h.warnMemoryBound(p.spec)
		}
		if p.local, err = h.mem.OpenLimiter(p.spec); err != nil {
			return nil, fmt.Errorf("on_storage_error local: %w", err)
		}
		p.mem, _ = p.local.(*memory.Store)
		followRedis(h.backend, p, p.mem)
	}
	return p, nil
}

// holdsSlot reports whether res holds a concurrency slot to give back
// when the request ends.
func (res *result) holdsSlot() bool {
	return res.z.role == roleSlots && res.d.Allowed && !storage.Skipped(res.d)
}

// twin is the local count that a slot res holds in Redis is also counted
// in (see countSlots), or nil: a part of on_storage_error local whose
// slot Redis gave. A slot its local count gave (Redis did not answer) is
// counted there alone.
func (res *result) twin() *memory.Store {
	if res.z.local == nil || res.limiter == storage.Limiter(res.z.mem) {
		return nil
	}
	return res.z.mem
}

// countSlots counts in each concurrency part's local count (on_storage_error
// local) the slot Redis just gave the request, results, decided at now
// and admitted. A part's local count holds every request of the key this
// instance has in flight, those Redis admitted and those it admitted on
// its own while Redis did not answer, so that the instance never runs
// more than the part's limit at once, through an outage and back (Redis's
// count may lack the latter, or have let the former's leases lapse). A
// part whose local count is full rejects the request: it returns that
// part's index, with the local count's rejection as its decision, having
// given back everything the request took, in Redis and here; or -1. A
// dry-run part's rejection only gives back its own slot.
func countSlots(ctx context.Context, now int64, results []result) int {
	for i := range results {
		res := &results[i]
		m := res.twin()
		if m == nil || !res.holdsSlot() {
			continue
		}
		d, _ := m.Take(ctx, res.key, now, algorithms.Milli)
		if d.Allowed {
			continue
		}
		ctx := context.WithoutCancel(ctx)
		if res.z.dryRun {
			_ = res.limiter.Undo(ctx, res.key, now, algorithms.Milli, res.d)
			res.d = d
			continue
		}
		for j := range results {
			o := &results[j]
			switch {
			case j == i:
				_ = o.limiter.Undo(ctx, o.key, now, algorithms.Milli, o.d)
			case o.holdsSlot():
				if m := o.twin(); m != nil && j < i {
					_ = m.Undo(ctx, o.key, now, algorithms.Milli, o.d)
				}
				_ = o.limiter.Undo(ctx, o.key, now, algorithms.Milli, o.d)
			case o.charged():
				_ = o.limiter.Undo(ctx, o.key, now, o.cost, o.d)
			}
		}
		res.d = d
		return i
	}
	return -1
}

// slotHold is the concurrency slots an admitted request holds until it
// ends. A slot in Redis is a lease, which the store renews while it is
// held (one loop per store, see redisstore.Lease), and whose client stays
// open until it is given back, whatever reload comes meanwhile.
type slotHold struct {
	h     *Handler
	slots []heldSlot
	buf   [2]heldSlot // slots' first backing array
}

// heldSlot is one slot a request holds.
type heldSlot struct {
	res   result            // a copy: the request's results stay on its stack
	lease *redisstore.Lease // renewed while held; nil in memory
	pool  *pooledRedis      // kept open while held; nil in memory
}

// holdSlots holds the slots results hold (renewing those that are leases)
// and returns what release gives back, or nil when they hold none.
func (h *Handler) holdSlots(ctx context.Context, results []result) *slotHold {
	var hold *slotHold
	for i := range results {
		res := &results[i]
		if !res.holdsSlot() {
			continue
		}
		if hold == nil {
			hold = &slotHold{h: h}
			hold.slots = hold.buf[:0]
		}
		s := heldSlot{res: *res}
		if l, ok := res.limiter.(*redisLimiter); ok {
			s.pool, s.lease = l.hold(res.key, res.d)
		}
		hold.slots = append(hold.slots, s)
	}
	return hold
}

// release gives back the slots, however the request ended: the handler
// chain returned, failed, panicked, or the client went away. Each slot is
// given back where it was taken: its local count first, then Redis, so
// that the local count never holds a slot that Redis no longer does but
// for a request still running.
func (s *slotHold) release(ctx context.Context) {
	ctx = context.WithoutCancel(ctx) // the client may be gone
	now := s.h.now()
	for i := range s.slots {
		hs := &s.slots[i]
		res := &hs.res
		hs.lease.Release()
		if m := res.twin(); m != nil {
			_ = m.Undo(ctx, res.key, now, algorithms.Milli, res.d)
		}
		if err := res.limiter.Undo(ctx, res.key, now, algorithms.Milli, res.d); err != nil {
			s.h.logStoreError(res.z, fmt.Errorf("giving back a concurrency slot: %w", err))
		}
		if hs.pool != nil {
			hs.pool.release()
		}
	}
}

// appendParts appends a zone's parts to a request's results: its ban
// first, to which the others' rejections count as strikes, then its rate
// (rate: the request's tier) and its concurrency slot (one request each,
// whatever its cost).
func appendParts(results []result, z, rate *zone, key string, repl *caddy.Replacer) []result {
	strike := 0
	for _, p := range z.parts {
		res := result{z: p, key: key, cost: algorithms.Milli, strike: strike}
		switch p.role {
		case roleBan:
			strike = len(results) + 1
			res.strike = 0
		case roleRate:
			res.z, res.cost = rate, z.resolveCost(repl)
		}
		results = append(results, res)
	}
	return results
}

// zoneEnd is the end of the zone whose parts start at results[i]: a
// zone's parts are consecutive.
func zoneEnd(results []result, i int) int {
	j := i + 1
	for j < len(results) && results[j].z.base == results[i].z.base {
		j++
	}
	return j
}

// zoneOutcome is what a zone decided of a request.
type zoneOutcome uint8

const (
	outcomeAllowed  zoneOutcome = iota
	outcomeRejected             // by its rate or its concurrency
	outcomeBanned               // by a ban that held before the request
	outcomeBanStart             // rejected, and the rejection started a ban
)

// zoneResult is what a zone's parts decided (a banned zone's other parts
// are not decided, and a ban that the request's rejection started leaves
// them rejected).
func zoneResult(parts []result) zoneOutcome {
	banned, rejected := false, false
	for i := range parts {
		if !parts[i].d.Allowed {
			if parts[i].z.role == roleBan {
				banned = true
			} else {
				rejected = true
			}
		}
	}
	switch {
	case banned && rejected:
		return outcomeBanStart
	case banned:
		return outcomeBanned
	case rejected:
		return outcomeRejected
	}
	return outcomeAllowed
}

// noteBans logs and emits the bans the request's rejection started.
func (h *Handler) noteBans(r *http.Request, results []result) {
	for i := 0; i < len(results); {
		j := zoneEnd(results, i)
		parts := results[i:j]
		i = j
		if zoneResult(parts) != outcomeBanStart {
			continue
		}
		ban := &parts[0] // a zone's ban is its first part
		if ce := h.logger.Check(zap.InfoLevel, "rate limit ban started"); ce != nil {
			clientIP, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
			fields := []zap.Field{
				zap.String("zone", ban.z.name),
				zap.Duration("ban", time.Duration(ban.d.Wait)*time.Microsecond),
				zap.String("client_ip", clientIP),
				zap.Bool("dry_run", ban.z.dryRun),
			}
			if h.LogKey {
				fields = append(fields, zap.String("key", ban.key))
			}
			ce.Write(fields...)
		}
		h.emit(r, eventBanned, ban, ban.z.dryRun)
	}
}
