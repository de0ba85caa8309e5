package zoneconf

import (
	"fmt"
	"time"
	_ "time/tzdata" // time zones by name on any machine, whatever its OS has

	"github.com/caddy-tollgate/tollgate/algorithms"
)

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// AlignCalendar is the one value of align.
const AlignCalendar = "calendar"

// location checks the zone's align and timezone and returns the time zone
// of a calendar window, or nil when the zone's windows align to the epoch.
func (zc *Zone) location(kind algorithms.Kind) (*time.Location, error) {
	switch zc.Align {
	case "":
		if zc.Timezone != "" {
			return nil, fmt.Errorf("timezone: only a calendar window (align calendar) has a time zone, got %q without it", zc.Timezone)
		}
		if zc.Months > 0 {
			return nil, fmt.Errorf("window: %dmo has no fixed length: a window of months needs align calendar", zc.Months)
		}
		return nil, nil
	case AlignCalendar:
	default:
		return nil, fmt.Errorf("align: must be calendar, got %q", zc.Align)
	}
	if kind != algorithms.FixedWindow {
		return nil, fmt.Errorf("align: only fixed_window aligns its windows to the calendar, not %s", kind)
	}
	if zc.Ban != 0 {
		return nil, fmt.Errorf("ban: a ban counts rejections within a window of fixed length, and a calendar window has none; give the ban a zone of its own")
	}
	name := zc.Timezone
	switch name {
	case "":
		return time.UTC, nil
	case "Local":
		return nil, fmt.Errorf("timezone: Local is each machine's own zone, which instances need not share; name an IANA zone such as Europe/Berlin")
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("timezone: unknown time zone %q (want an IANA name such as Europe/Berlin or America/New_York)", name)
	}
	return loc, nil
}

// calendarLimit is the limit of events per window (w, or months) on the
// calendar of loc: whole days, weeks or months.
func calendarLimit(events int64, w time.Duration, months int64, loc *time.Location) (algorithms.Limit, error) {
	cal := algorithms.Calendar{Loc: loc}
	switch {
	case months > 0:
		cal.Unit, cal.Count = algorithms.Month, months
	case w > 0 && w%week == 0:
		cal.Unit, cal.Count = algorithms.Week, int64(w/week)
	case w > 0 && w%day == 0:
		cal.Unit, cal.Count = algorithms.Day, int64(w/day)
	default:
		return algorithms.Limit{}, fmt.Errorf("window: align calendar needs whole days, weeks or months (1d, 1w, 1mo and multiples), got %s", w)
	}
	return algorithms.NewCalendarLimit(events, cal)
}
