package zoneconf

import (
	"fmt"

	"github.com/caddy-tollgate/tollgate/algorithms"
)

// guards checks and parses the zone's concurrency (a number, or adaptive),
// concurrency_lease and ban_after (beside ban) into s.
func (zc *Zone) guards(s *Settings) error {
	if err := zc.adaptive(s); err != nil {
		return err
	}
	if zc.Concurrency < 0 {
		return fmt.Errorf("concurrency: must be greater than 0, got %d", zc.Concurrency)
	}
	if zc.ConcurrencyLease != 0 && zc.Concurrency == 0 {
		return fmt.Errorf("concurrency_lease: only with concurrency, got concurrency_lease %s without it", zc.ConcurrencyLease)
	}
	if zc.BanAfter != 0 && zc.Ban == 0 {
		return fmt.Errorf("ban_after: only with ban, got ban_after %d without it", zc.BanAfter)
	}
	if zc.Concurrency > 0 {
		lease := zc.ConcurrencyLease
		if lease == 0 {
			lease = DefaultLease
		}
		l, err := algorithms.NewConcurrency(zc.Concurrency, lease)
		if err != nil {
			return err
		}
		s.Slots = &l
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
		{"max_delay", zc.MaxDelay != 0, zc.MaxDelay},
		{"cost", zc.Cost != "", zc.Cost},
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

// ban checks and parses the zone's ban and ban_after into s.Ban.
func (zc *Zone) ban(s *Settings) error {
	if zc.Ban == 0 {
		return nil
	}
	if !s.Rate {
		return fmt.Errorf("ban: a ban counts the zone's rejections within its window, so it needs a rate (events and window); got ban %s in a zone with only concurrency", zc.Ban)
	}
	after := zc.BanAfter
	if after == 0 {
		after = 1
	}
	b, err := algorithms.NewBan(after, zc.Window, zc.Ban)
	if err != nil {
		return err
	}
	s.Ban = &b
	return nil
}
