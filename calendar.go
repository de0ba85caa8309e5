package tollgate

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// A window is a duration ("1h", "1d": caddy.ParseDuration's syntax), a
// number of weeks ("1w", 7 days each) or a number of calendar months
// ("1mo"), which has no fixed length and needs align calendar. In JSON a
// window of months is a string such as "1mo"; every other window stays a
// duration (nanoseconds, or a duration string).

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// parseWindow parses a window: a duration, "<n>w" or "<n>mo".
func parseWindow(s string) (time.Duration, int64, error) {
	if n, ok := strings.CutSuffix(s, "mo"); ok {
		months, err := strconv.ParseInt(n, 10, 64)
		if err != nil || months <= 0 {
			return 0, 0, fmt.Errorf("want a whole number of months > 0 such as 1mo, got '%s'", s)
		}
		return 0, months, nil
	}
	if n, ok := strings.CutSuffix(s, "w"); ok {
		weeks, err := strconv.ParseInt(n, 10, 64)
		if err != nil || weeks <= 0 || weeks > int64(1<<62/week) {
			return 0, 0, fmt.Errorf("want a whole number of weeks > 0 such as 1w, got '%s'", s)
		}
		return time.Duration(weeks) * week, 0, nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, 0, fmt.Errorf("want a duration such as 1m, got '%s': %v (also 1d, 1w, and with align calendar 1mo)", s, err)
	}
	return d, 0, nil
}

// formatWindow writes a window as the config gives it.
func formatWindow(d caddy.Duration, months int64) string {
	if months > 0 {
		return strconv.FormatInt(months, 10) + "mo"
	}
	return time.Duration(d).String()
}

// windowJSON is a window in JSON: months as "<n>mo", any other window as
// caddy.Duration reads and writes it.
type windowJSON struct {
	d      *caddy.Duration
	months *int64
}

func (w windowJSON) MarshalJSON() ([]byte, error) {
	if *w.months > 0 {
		return json.Marshal(formatWindow(0, *w.months))
	}
	return json.Marshal(*w.d)
}

func (w windowJSON) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		d, months, err := parseWindow(s)
		if err != nil {
			return fmt.Errorf("window: %w", err)
		}
		*w.d, *w.months = caddy.Duration(d), months
		return nil
	}
	*w.months = 0
	return json.Unmarshal(b, w.d)
}

// MarshalJSON writes the zone, a window of months as "<n>mo".
func (zc Zone) MarshalJSON() ([]byte, error) {
	type plain Zone
	if zc.months == 0 {
		return json.Marshal(plain(zc)) // the fields in their order
	}
	return json.Marshal(struct {
		plain
		Window *windowJSON `json:"window,omitempty"`
	}{plain(zc), windowOf(&zc.Window, &zc.months)})
}

// UnmarshalJSON reads the zone, its window as a duration or "<n>mo".
func (zc *Zone) UnmarshalJSON(b []byte) error {
	type plain Zone
	aux := struct {
		*plain
		Window *windowJSON `json:"window,omitempty"`
	}{plain: (*plain)(zc), Window: &windowJSON{&zc.Window, &zc.months}}
	return json.Unmarshal(b, &aux)
}

// MarshalJSON writes the tier, a window of months as "<n>mo".
func (t Tier) MarshalJSON() ([]byte, error) {
	type plain Tier
	if t.months == 0 {
		return json.Marshal(plain(t))
	}
	return json.Marshal(struct {
		plain
		Window *windowJSON `json:"window,omitempty"`
	}{plain(t), windowOf(&t.Window, &t.months)})
}

// UnmarshalJSON reads the tier, its window as a duration or "<n>mo".
func (t *Tier) UnmarshalJSON(b []byte) error {
	type plain Tier
	aux := struct {
		*plain
		Window *windowJSON `json:"window,omitempty"`
	}{plain: (*plain)(t), Window: &windowJSON{&t.Window, &t.months}}
	return json.Unmarshal(b, &aux)
}

// windowOf is a window to marshal, nil (omitted) when it is not set.
func windowOf(d *caddy.Duration, months *int64) *windowJSON {
	if *d == 0 && *months == 0 {
		return nil
	}
	return &windowJSON{d, months}
}
