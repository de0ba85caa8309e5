package tollgate

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
)

func init() {
	caddy.RegisterModule(MemoryStorage{})
}

// MemoryStorage keeps limiter state in this process: the default. State
// survives config reloads: a zone with the same name, algorithm, limit and
// max_keys finds the state the previous configuration left.
//
// OpenLimiter and Cleanup are called while a configuration is provisioned
// and cleaned up, which Caddy does on one goroutine.
type MemoryStorage struct {
	opened []string // pool keys to release
	local  bool     // holds on_storage_error local's local copies, not memory zones
}

// CaddyModule returns the Caddy module information.
func (MemoryStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit.storage.memory",
		New: func() caddy.Module { return new(MemoryStorage) },
	}
}

// memoryZones holds every zone's memory store across config reloads.
var memoryZones = caddy.NewUsagePool()

// pooledStore is a memory store in memoryZones.
type pooledStore struct{ *memory.Store }

// Destruct implements caddy.Destructor; a memory store holds no resources
// beyond memory.
func (pooledStore) Destruct() error { return nil }

// OpenLimiter returns the zone's memory store, the same one across reloads.
func (m *MemoryStorage) OpenLimiter(z storage.Zone) (storage.Limiter, error) {
	return m.open(z)
}

// open is OpenLimiter, returning the store by its type.
func (m *MemoryStorage) open(z storage.Zone) (*memory.Store, error) {
	key := memory.PoolKey(z, m.local)
	v, _, err := memoryZones.LoadOrNew(key, func() (caddy.Destructor, error) {
		return pooledStore{memory.New(z)}, nil
	})
	if err != nil {
		return nil, err
	}
	m.opened = append(m.opened, key)
	return v.(pooledStore).Store, nil
}

// Cleanup releases the zones this module opened; a zone's state is dropped
// when no configuration uses it any more.
func (m *MemoryStorage) Cleanup() error {
	for _, key := range m.opened {
		_, _ = memoryZones.Delete(key)
	}
	m.opened = nil
	return nil
}

// UnmarshalCaddyfile sets up the module from Caddyfile tokens: `storage
// memory` takes no options.
func (m *MemoryStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(d.Nesting()) {
		return d.Errf("storage memory takes no options, got '%s'", d.Val())
	}
	return nil
}

// warnMemoryBound logs memory.BoundWarning for a zone on the memory store.
func (h *Handler) warnMemoryBound(z storage.Zone) {
	if msg := memory.BoundWarning(z); msg != "" {
		h.logger.Warn(msg)
	}
}

// Interface guards.
var (
	_ Backend               = (*MemoryStorage)(nil)
	_ caddy.CleanerUpper    = (*MemoryStorage)(nil)
	_ caddyfile.Unmarshaler = (*MemoryStorage)(nil)
)
