package tollgate

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
	"github.com/caddy-tollgate/tollgate/storage/shared"
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
	roleAdaptive // concurrency adaptive: decided in this process, before the others
)

// openPart opens a part of zone z (whose shared fields are set) for limit
// l: its own store state (under storeName: the zone's name, or a tier's),
// and its local copy for on_storage_error local.
func (h *Handler) openPart(z *zone, role partRole, l algorithms.Limit, storeName string) (*zone, error) {
	p := &zone{
		name:         z.name,
		role:         role,
		spec:         storage.Zone{Name: storeName, Limit: l, MaxKeys: h.MaxKeys, Lease: z.lease && role == roleRate},
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
		lease:        z.lease,
		Zone:         shared.Zone{DryRun: z.DryRun, Rate: role == roleRate, Slots: role == roleSlots},
	}
	p.base = p
	if z.base != nil {
		p.base = z.base
	}
	p.quota = ratelimitheader.Quota{Name: z.name, Limit: &p.spec.Limit}
	if role != roleBan {
		p.quota.Policy = ratelimitheader.PolicyItem(z.name, l)
		p.limitValue = l.Events
	}
	var err error
	if p.Limiter, err = h.backend.OpenLimiter(p.spec); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if role == roleRate && h.memory {
		h.warnMemoryBound(p.spec)
	}
	p.Memory, _ = p.Limiter.(*memory.Store)
	if p.onError == zoneconf.FailLocal && p.Memory == nil {
		if role == roleRate {
			h.warnMemoryBound(p.spec)
		}
		if p.Local, err = h.mem.open(p.spec); err != nil {
			return nil, fmt.Errorf("on_storage_error local: %w", err)
		}
		p.Memory = p.Local
		h.store.Follow(&p.Zone)
	}
	return p, nil
}

// appendParts appends a zone's parts to a request's results: its ban
// first, to which the others' rejections count as strikes, then its rate
// (rate: the request's tier) and its concurrency slot (one request each,
// whatever its cost).
func appendParts(results []result, z, rate *zone, key string, repl *caddy.Replacer) []result {
	strike := 0
	for _, p := range z.parts {
		res := result{Z: p, Zone: &p.Zone, Key: key, Cost: algorithms.Milli, Strike: strike}
		switch p.role {
		case roleBan:
			strike = len(results) + 1
			res.Strike = 0
		case roleRate:
			res.Z, res.Zone, res.Cost = rate, &rate.Zone, z.resolveCost(repl)
		}
		results = append(results, res)
	}
	return results
}

// zoneEnd is the end of the zone whose parts start at results[i]: a
// zone's parts are consecutive.
func zoneEnd(results []result, i int) int {
	j := i + 1
	for j < len(results) && results[j].Z.base == results[i].Z.base {
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
		if !parts[i].D.Allowed {
			if parts[i].Z.role == roleBan {
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
				zap.String("zone", ban.Z.name),
				zap.Duration("ban", time.Duration(ban.D.Wait)*time.Microsecond),
				zap.String("client_ip", clientIP),
				zap.Bool("dry_run", ban.Z.DryRun),
			}
			if h.LogKey {
				fields = append(fields, zap.String("key", ban.Key))
			}
			ce.Write(fields...)
		}
		h.emit(r, eventBanned, ban, ban.Z.DryRun)
	}
}
