package zoneconf

import (
	"fmt"
	"sort"
)

// ValidName accepts zone names that can stand unquoted in logs, metrics
// labels, admin API paths and RateLimit header strings.
func ValidName(name string) error {
	if name == "" {
		return fmt.Errorf("zone name: must not be empty")
	}
	if len(name) > 64 {
		return fmt.Errorf("zone name: at most 64 characters, got %d", len(name))
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
		default:
			return fmt.Errorf("zone name %q: only letters, digits, '_', '-' and '.' are allowed", name)
		}
	}
	return nil
}

// Order returns the names of zones in evaluation order: order (the
// handler's zone_order), then the zones it does not name, sorted.
func Order[T any](order []string, zones map[string]T) ([]string, error) {
	names := make([]string, 0, len(zones))
	seen := make(map[string]bool, len(zones))
	for _, n := range order {
		if _, ok := zones[n]; !ok {
			return nil, fmt.Errorf("zone_order: %q is not a zone in rate_limits", n)
		}
		if seen[n] {
			return nil, fmt.Errorf("zone_order: %q given twice", n)
		}
		names = append(names, n)
		seen[n] = true
	}
	var rest []string
	for n := range zones {
		if !seen[n] {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	return append(names, rest...), nil
}

// Effect says what o does while the store is unreachable, for the log.
func (o OnError) Effect() string {
	switch o {
	case FailAllow:
		return "on_storage_error allow: every request is let through, unlimited"
	case FailDeny:
		return "on_storage_error deny: every request gets a 503 with Retry-After: 1"
	}
	return "on_storage_error local: the limit is enforced from this instance's memory"
}
