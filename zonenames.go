package tollgate

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
)

// A zone's name is global to a Caddy instance: on Redis a key's state is
// stored under the zone's name and algorithm, not under the rate_limit
// block it was written in. Two blocks of one configuration (two sites, two
// routes) that give one name different limits on the same Redis would read
// the same keys under both limits, so Provision refuses the second (of
// the same algorithm: another algorithm's keys are others).
// In memory each block keeps its own state, and the same name is allowed.
var redisZoneNames = struct {
	sync.Mutex
	// byConfig holds, per configuration being loaded (its context, which
	// every module of that configuration is provisioned with), each Redis
	// zone's storage and limits.
	byConfig map[context.Context]map[string]redisZoneClaim
}{byConfig: map[context.Context]map[string]redisZoneClaim{}}

// redisZoneClaim is what a zone name stands for on Redis in one
// configuration.
type redisZoneClaim struct {
	storage string // the handler's storage config (JSON): which Redis
	limits  string // the zone's limits, one per part, printed
}

// claimRedisZoneNames records the handler's Redis zones in the
// configuration's claims, and refuses a zone that another handler of the
// configuration defined on the same storage with other limits.
func (h *Handler) claimRedisZoneNames(ctx caddy.Context) error {
	if h.redis == nil || ctx.Context == nil {
		return nil
	}
	redisZoneNames.Lock()
	defer redisZoneNames.Unlock()
	claims, ok := redisZoneNames.byConfig[ctx.Context]
	if !ok {
		claims = map[string]redisZoneClaim{}
		cfg := ctx.Context
		redisZoneNames.byConfig[cfg] = claims
		context.AfterFunc(cfg, func() { // the configuration is unloaded, or failed to load
			redisZoneNames.Lock()
			defer redisZoneNames.Unlock()
			delete(redisZoneNames.byConfig, cfg)
		})
	}
	storage := string(h.StorageRaw)
	for _, z := range h.zones {
		var limits []string
		for _, p := range z.all {
			limits = append(limits, fmt.Sprintf("%+v", p.spec.Limit))
		}
		c := redisZoneClaim{storage: storage, limits: strings.Join(limits, "; ")}
		name := z.name + "\x00" + z.spec.Limit.Kind.String() // another algorithm has other keys
		prev, seen := claims[name]
		switch {
		case !seen:
			claims[name] = c
		case prev.storage == c.storage && prev.limits != c.limits:
			return fmt.Errorf("zone %q: another rate_limit block of this configuration has a zone of that name with other limits on the same Redis, where both would read the same keys; zone names are global to Caddy: give each zone a name of its own", z.name)
		}
	}
	return nil
}
