package tollgate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/adminapi"
	"github.com/caddy-tollgate/tollgate/internal/ratelimitheader"
	"github.com/caddy-tollgate/tollgate/internal/zoneconf"
	"github.com/caddy-tollgate/tollgate/storage"
	redisstore "github.com/caddy-tollgate/tollgate/storage/redis"
	"github.com/caddy-tollgate/tollgate/storage/shared"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is the admin API module admin.api.rate_limit. Caddy mounts it
// on its admin endpoint (localhost:2019 by default):
//
//	GET    /rate_limit/zones                    the live zones and their key counts
//	GET    /rate_limit/zones/<zone>/keys/<key>  one key's state
//	DELETE /rate_limit/zones/<zone>/keys/<key>  reset the key: its next request finds a fresh state (and no ban)
//	POST   /rate_limit/zones/<zone>/keys/<key>/grant  {"amount": n}: n events more for the key's current window
//	GET    /rate_limit/zones/<zone>/bans/<key>  the same as keys/<key>, in a zone with a ban
//	DELETE /rate_limit/zones/<zone>/bans/<key>  lift the key's ban (and forget its strikes), leaving its rate state
//
// In a zone with tiers, ?tier=<value> shows or resets the key's state in
// that tier; DELETE without it resets the key in every tier. A grant goes
// to the zone's own rate, or with ?tier= to that tier's.
//
// <key> is the resolved key, URL-path-escaped (a "/" in a key is %2F); an
// IP address is grouped by the zone's ipv4_prefix/ipv6_prefix and a long
// key hashed, as the handler does, so the client's IP or the raw header
// value can be given as it is. Answers are JSON; an unknown zone or key is
// a 404 with a JSON error.
//
// A zone name that several rate_limit handlers define is one zone to the
// API: GET shows the key's state from the first store that holds it, and
// DELETE resets it in every store of the zone. The list shows identical
// definitions once, and each differing definition separately.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the routes of the rate-limit admin API.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminapi.Prefix, Handler: caddy.AdminHandlerFunc(a.serveHTTP)}}
}

func (a *AdminAPI) serveHTTP(w http.ResponseWriter, r *http.Request) error {
	path := strings.TrimPrefix(r.URL.EscapedPath(), adminapi.Prefix)
	if path == "zones" {
		if r.Method != http.MethodGet {
			return methodNotAllowed(w, r, http.MethodGet)
		}
		return writeJSON(w, listZones())
	}
	rest, ok := strings.CutPrefix(path, "zones/")
	if !ok {
		return notFound("no such endpoint: %s", r.URL.Path)
	}
	rawZone, rawKey, ok := strings.Cut(rest, "/keys/")
	bans := false
	if !ok {
		rawZone, rawKey, bans = strings.Cut(rest, "/bans/")
	}
	if !ok && !bans {
		return notFound("no such endpoint: %s (want /rate_limit/zones/<zone>/keys/<key> or /bans/<key>)", r.URL.Path)
	}
	name, err1 := url.PathUnescape(rawZone)
	key, err2 := url.PathUnescape(rawKey)
	if err1 != nil || err2 != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("bad escape in path %s", r.URL.EscapedPath())}
	}
	zs := zonesNamed(name)
	if len(zs) == 0 {
		return notFound("unknown zone %q", name)
	}
	if bans && zs[0].z.ban == nil {
		return notFound("zone %q has no ban", name)
	}
	if k, ok := strings.CutSuffix(rawKey, "/grant"); ok && !bans {
		if r.Method != http.MethodPost {
			return methodNotAllowed(w, r, http.MethodPost)
		}
		if key, err2 = url.PathUnescape(k); err2 != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("bad escape in path %s", r.URL.EscapedPath())}
		}
		return grantKey(w, r, zs, key)
	}
	switch r.Method {
	case http.MethodGet:
		return showKey(w, r, zs, key)
	case http.MethodDelete:
		return resetKey(w, r, zs, key, bans)
	default:
		return methodNotAllowed(w, r, http.MethodGet, http.MethodDelete)
	}
}

// guardInfo fills in info the zone's concurrency and ban, and for a zone
// with only concurrency clears the rate's fields.
func guardInfo(info *adminapi.ZoneInfo, z *zone) {
	for _, p := range z.parts {
		l := p.spec.Limit
		switch p.role {
		case roleSlots:
			info.Concurrency, info.ConcurrencyLease = l.Events, float64(l.Window)/microsPerSecond
			if p == z {
				info.Algorithm, info.Events, info.Window, info.Burst = "", 0, 0, 0
			}
		case roleBan:
			info.Ban, info.BanAfter = float64(l.Hold)/microsPerSecond, l.Events
		}
	}
	if z.tiers != nil {
		info.TierKey, info.Tiers = z.tierKey, make(map[string]adminapi.TierInfo, len(z.tiers))
		for value, t := range z.tiers {
			if t == nil {
				info.Tiers[value] = adminapi.TierInfo{Unlimited: true}
				continue
			}
			l := t.spec.Limit
			info.Tiers[value] = adminapi.TierInfo{Events: l.Events, Window: float64(l.Window) / microsPerSecond, Burst: l.Burst, Calendar: l.Calendar.String()}
		}
	}
}

// adaptiveInfo fills in info the concurrency adaptive of zs (one zone
// name's live zones), its controllers added up over their distinct states,
// and for a zone of concurrency adaptive alone clears the rate's fields.
func adaptiveInfo(info *adminapi.ZoneInfo, zs []liveZone) {
	a := zs[0].z.adaptive
	if a == nil {
		return
	}
	cfg := a.Adaptive.Config()
	ai := &adminapi.AdaptiveInfo{Min: cfg.Floor, Max: cfg.Ceiling, Window: float64(cfg.Window) / microsPerSecond}
	seen := map[*shared.Adaptive]bool{}
	for _, lz := range zs {
		s := lz.z.adaptive.Adaptive
		if seen[s] {
			continue
		}
		seen[s] = true
		ai.Shed += s.Shed()
		s.Each(func(_ string, st shared.AdaptiveState, _ bool) {
			ai.Limit += st.Limit
			ai.InFlight += st.InFlight
		})
	}
	info.Adaptive = ai
	if a == zs[0].z {
		info.Algorithm, info.Events, info.Window, info.Burst = "", 0, 0, 0
	}
}

// listZones describes the live zones, sorted by name. Zones with the same
// name, limit, storage and dry_run are one entry, their distinct stores'
// keys added up.
func listZones() []adminapi.ZoneInfo {
	type group struct {
		spec    storage.Zone
		backend string
		dryRun  bool
		guards  string // the other parts' limits
	}
	var (
		out     = []adminapi.ZoneInfo{}
		groups  []group
		members [][]liveZone
	)
	for _, lz := range liveZones() {
		g := group{lz.z.spec, lz.backend, lz.z.DryRun, ""}
		for _, p := range lz.z.all {
			if p != lz.z {
				g.guards += fmt.Sprintf("%d:%s:%+v;", p.role, p.tier, p.spec.Limit)
			}
			if p.Adaptive != nil {
				g.guards += fmt.Sprintf("adaptive:%+v;", *p.Adaptive.Config())
			}
		}
		for _, v := range zoneconf.SortedTiers(lz.z.tiers) {
			if lz.z.tiers[v] == nil {
				g.guards += v + ":unlimited;"
			}
		}
		i := 0
		for i < len(groups) && groups[i] != g {
			i++
		}
		if i == len(groups) {
			groups = append(groups, g)
			members = append(members, nil)
		}
		members[i] = append(members[i], lz)
	}
	for i, g := range groups {
		l := g.spec.Limit
		info := adminapi.ZoneInfo{
			Zone:      g.spec.Name,
			Algorithm: l.Kind.String(),
			Events:    l.Events,
			Window:    float64(l.Window) / microsPerSecond,
			Burst:     l.Burst,
			Storage:   g.backend,
			DryRun:    g.dryRun,
		}
		if c := l.Calendar; c.Unit != algorithms.NoUnit {
			info.Calendar, info.Timezone = c.String(), "UTC"
			if c.Loc != nil {
				info.Timezone = c.Loc.String()
			}
		}
		guardInfo(&info, members[i][0].z)
		adaptiveInfo(&info, members[i])
		if stores := distinctStores(nil, members[i]...); len(stores) > 0 {
			n := 0
			for _, s := range stores {
				n += s.(keyCounter).Len()
			}
			info.Keys = &n
		}
		out = append(out, info)
	}
	return out
}

// zonesNamed returns the live zones called name with distinct limiters.
func zonesNamed(name string) []liveZone {
	var zs []liveZone
next:
	for _, lz := range liveZones() {
		if lz.z.name != name {
			continue
		}
		if reflect.TypeOf(lz.z.Limiter).Comparable() {
			for _, x := range zs {
				if x.z.Limiter == lz.z.Limiter {
					continue next
				}
			}
		}
		zs = append(zs, lz)
	}
	return zs
}

// tierOf returns the rate part of z that ?tier= names in r (z itself
// without one), or an API error.
func tierOf(r *http.Request, z *zone) (*zone, error) {
	tier, ok := r.URL.Query()["tier"]
	if !ok {
		return z, nil
	}
	t, listed := z.tiers[tier[0]]
	switch {
	case !listed:
		return nil, notFound("zone %q has no tier %q", z.name, tier[0])
	case t == nil:
		return nil, notFound("zone %q: tier %q is unlimited and keeps no state", z.name, tier[0])
	}
	return t, nil
}

func showKey(w http.ResponseWriter, r *http.Request, zs []liveZone, key string) error {
	for _, lz := range zs {
		rate, err := tierOf(r, lz.z)
		if err != nil {
			return err
		}
		stored := lz.z.storedKey(key)
		var st adminapi.KeyState
		held := false
		for _, p := range lz.z.parts {
			if p == lz.z {
				p = rate
			}
			d, granted, ok, err := storage.PeekGrant(r.Context(), p.Limiter, stored, lz.now())
			if err != nil {
				return storeUnavailable(lz.z.name, err)
			}
			held = held || ok
			if !ok { // a fresh state
				fresh := algorithms.State{}
				d = p.spec.Limit.Peek(&fresh, lz.now(), algorithms.Milli)
			}
			switch {
			case p.role == roleBan:
				st.Ban = &adminapi.BanState{Banned: !d.Allowed, Left: float64(d.Wait) / microsPerSecond, StrikesLeft: d.Remaining}
				continue
			case p.role == roleSlots:
				n := p.spec.Limit.Events
				if d.Allowed {
					n -= d.Remaining + 1
				}
				st.InFlight = &n
			}
			if p == rate {
				st.Allowed, st.Remaining = d.Allowed, ratelimitheader.ShownRemaining(d.Remaining)
				st.Reset, st.Wait = float64(d.Reset)/microsPerSecond, float64(d.Wait)/microsPerSecond
				st.Granted = float64(granted) / algorithms.Milli
				if lo, can := p.Limiter.(interface {
					LeaseOf(string) (int64, int64, bool)
				}); can {
					if n, left, ok := lo.LeaseOf(stored); ok {
						st.Lease = &adminapi.LeaseState{Events: float64(n), Left: float64(left) / microsPerSecond}
					}
				}
			}
		}
		if a := lz.z.adaptive; a != nil {
			if as, ok := a.Adaptive.State(stored); ok {
				held = true
				st.Adaptive = &adminapi.AdaptiveState{Limit: as.Limit, InFlight: as.InFlight,
					Baseline: float64(as.Baseline) / microsPerSecond, Recent: float64(as.Recent) / microsPerSecond,
					Gradient: as.Gradient, Windows: as.Windows}
				if a == lz.z { // concurrency adaptive alone: it is the quota
					st.Allowed, st.Remaining = as.InFlight < as.Limit, max(as.Limit-as.InFlight, 0)
					if !st.Allowed { // as a shed request's Retry-After: its recent round trip
						st.Wait = float64(max(as.Recent, 1)) / microsPerSecond
					}
				}
			}
		}
		if held {
			st.Zone, st.Key, st.Tier = lz.z.name, stored, rate.tier
			return writeJSON(w, st)
		}
	}
	return notFound("zone %q holds no key %q", zs[0].z.name, key)
}

// resetKey forgets the key in every part of the zone (lifting its ban),
// or with banOnly only lifts its ban. Its requests in flight stay counted:
// they are running, not history, and a reset that forgot them would let
// the key run n more beside them (in memory, their ends would then count
// against the new ones).
//
// A shared store's keys are reset once, as a grant is made once: see
// shared.Resets.
func resetKey(w http.ResponseWriter, r *http.Request, zs []liveZone, key string, banOnly bool) error {
	found := false
	stored := ""
	resets := shared.Resets{}
	for _, lz := range zs {
		stored = lz.z.storedKey(key)
		parts := lz.z.all // every part, every tier
		if _, ok := r.URL.Query()["tier"]; ok {
			rate, err := tierOf(r, lz.z)
			if err != nil {
				return err
			}
			parts = []*zone{rate}
		}
		for _, p := range parts {
			if banOnly && p.role != roleBan {
				continue
			}
			ok, err := resets.Reset(r.Context(), &p.Zone, p.role, stored, lz.now())
			if errors.Is(err, redisstore.ErrNotAnnounced) {
				// Applied: the missed notice is a warning.
				lz.h.logger.Warn("rate limit reset applied, but not announced to the other instances", zap.String("zone", lz.z.name), zap.Error(err))
			}
			found = found || ok
		}
	}
	if err := resets.Err(); err != nil {
		return storeUnavailable(zs[0].z.name, err)
	}
	if banOnly {
		if !found {
			return notFound("zone %q holds no ban or strike for key %q", zs[0].z.name, key)
		}
		return writeJSON(w, map[string]any{"zone": zs[0].z.name, "key": stored, "lifted": true})
	}
	if !found {
		return notFound("zone %q holds no key %q", zs[0].z.name, key)
	}
	return writeJSON(w, map[string]any{"zone": zs[0].z.name, "key": stored, "reset": true})
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func notFound(format string, args ...any) error {
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf(format, args...)}
}

func storeUnavailable(zone string, err error) error {
	return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("zone %q: store unavailable: %w", zone, err)}
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allowed ...string) error {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
}

// grantKey gives the key amount events more for its current window, in
// the zone's rate (or ?tier='s), in every store of the zone once: a
// memory store per distinct store, Redis once per server and zone. It
// answers with the key's state after the grant, logs the grant and emits
// rate_limit_granted.
func grantKey(w http.ResponseWriter, r *http.Request, zs []liveZone, key string) error {
	var req adminapi.GrantRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf(`grant: want a body such as {"amount": 100}: %w`, err)}
	}
	amount, ok := algorithms.CostMilli(req.Amount)
	if !ok || amount <= 0 || amount > algorithms.MaxGrant {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("grant: amount must be a number of events > 0 and at most %d, got %v", algorithms.MaxEvents, req.Amount)}
	}
	id, err := adminapi.GrantID(r.Header.Get("Idempotency-Key"), req.ID)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	var (
		st   adminapi.KeyState
		done = map[any]algorithms.Decision{} // the stores granted in, each once, and the decision after
	)
	granted, repeated := false, false
	for _, lz := range zs {
		rate, err := tierOf(r, lz.z)
		if err != nil {
			return err
		}
		if rate.role != roleRate {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("zone %q has only concurrency: there is no quota to grant", lz.z.name)}
		}
		if !rate.spec.Limit.Grantable() {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("zone %q is %s: %w", lz.z.name, rate.spec.Limit.Kind, algorithms.ErrNoGrant)}
		}
		if c := rate.spec.Limit.GrantCap(); amount > c {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("grant: zone %q is %s: a key's grants add up to at most %d events, got %v", lz.z.name, rate.spec.Limit.Kind, c/algorithms.Milli, req.Amount)}
		}
		scope := shared.GrantScope(rate.Limiter)
		stored := lz.z.storedKey(key)
		if d, ok := done[scope]; ok {
			// Granted through another handler's client: this one learns
			// it now, not when the message arrives.
			if !repeated {
				shared.GrantedElsewhere(rate.Limiter, stored, lz.now(), amount, d)
			}
			continue
		}
		d, applied, err := shared.GrantOnce(r.Context(), rate.Limiter, &rate.spec.Limit, scope, stored, lz.now(), amount, id)
		switch {
		case errors.Is(err, shared.ErrNoGrants):
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("zone %q: %w", rate.name, err)}
		case errors.Is(err, redisstore.ErrNotAnnounced):
			// Applied: the answer says so; the missed notice is a
			// warning (other instances learn it within a second, or at
			// their next decision on the key).
			lz.h.logger.Warn("rate limit grant applied, but not announced to the other instances", zap.String("zone", lz.z.name), zap.Error(err))
		case err != nil:
			return grantUnavailable(lz.z.name, id, err)
		}
		done[scope] = d
		if !applied {
			repeated = true
		}
		if !granted {
			st = adminapi.KeyState{Zone: lz.z.name, Key: stored, Tier: rate.tier, Allowed: d.Allowed, Remaining: ratelimitheader.ShownRemaining(d.Remaining),
				Reset: float64(d.Reset) / microsPerSecond, Wait: float64(d.Wait) / microsPerSecond}
			granted = true
		}
		if applied {
			lz.h.granted(rate, stored, req.Amount, d)
		}
	}
	out := map[string]any{"zone": st.Zone, "key": st.Key, "granted": req.Amount, "state": st}
	if st.Tier != "" {
		out["tier"] = st.Tier
	}
	if id != "" {
		out["id"] = id
	}
	if repeated {
		out["repeated"] = true // applied before: nothing changed now
	}
	return writeJSON(w, out)
}

// grantUnavailable is the answer to a grant the store did not confirm:
// it may yet be applied (a stalled Redis runs what it was sent once it
// resumes), so it is to be sent again with the same id, which applies it
// at most once.
func grantUnavailable(zone, id string, err error) error {
	again := "send it again with an id (the Idempotency-Key header or \"id\"), which applies it at most once"
	if id != "" {
		again = fmt.Sprintf("send it again with the same id %q, which applies it at most once", id)
	}
	return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable,
		Err: fmt.Errorf("zone %q: store unavailable: the grant is not known to be applied (%w): %s", zone, err, again)}
}

// Interface guards.
var (
	_ caddy.Module      = (*AdminAPI)(nil)
	_ caddy.AdminRouter = (*AdminAPI)(nil)
)
