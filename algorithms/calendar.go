package algorithms

import (
	"errors"
	"fmt"
	"time"
)

// Unit is the calendar unit of a calendar window.
type Unit uint8

// The calendar units. NoUnit, the zero value, is no calendar: windows are
// fixed spans aligned to multiples of the span since the Unix epoch.
const (
	NoUnit Unit = iota
	Day         // from local midnight
	Week        // ISO weeks, from Monday's local midnight
	Month       // from the 1st's local midnight
)

// Calendar aligns a fixed_window's windows to the civil calendar of a time
// zone: each window is Count days, weeks or months, starting at local
// midnight, on a Monday, on the 1st. A day of 23 or 25 hours at a DST
// change, and a month of 28 to 31 days, is one whole period. Windows of
// several units are numbered from the epoch's own (1970-01-01, the week of
// Monday 1969-12-29, January 1970) in the local calendar, so that 3 months
// are quarters and 12 months years.
//
// Period and Span compute a window's bounds from a time; they are pure
// (time.Location holds its rules in memory) and allocate nothing, but a
// decision never calls them: it takes the bounds as input (see Span), so
// that a store on another clock, whose Lua has no time zone database,
// decides exactly as the Go code does.
type Calendar struct {
	Unit  Unit
	Count int64          // units per window, >= 1
	Loc   *time.Location // nil is UTC
}

// maxUnitHours is a unit's longest length in hours (a DST day of 25 hours),
// for the bound on Count.
var maxUnitHours = [...]int64{Day: 25, Week: 7*24 + 1, Month: 31*24 + 1}

// nominal is a unit's usual length, for display and the checks NewLimit
// makes on the rate.
var nominal = [...]time.Duration{Day: 24 * time.Hour, Week: 7 * 24 * time.Hour, Month: 30 * 24 * time.Hour}

// String returns the window as written in a config: "1d", "2w", "1mo".
func (c Calendar) String() string {
	suffix := [...]string{NoUnit: "", Day: "d", Week: "w", Month: "mo"}
	if c.Unit == NoUnit || int(c.Unit) >= len(suffix) {
		return ""
	}
	return fmt.Sprintf("%d%s", c.Count, suffix[c.Unit])
}

// Nominal is the window's usual length: Count days of 24 hours, weeks of
// 7 days, months of 30 days. A window's real length is its period's.
func (c Calendar) Nominal() time.Duration {
	if c.Unit == NoUnit || int(c.Unit) >= len(nominal) {
		return 0
	}
	return time.Duration(c.Count) * nominal[c.Unit]
}

func (c Calendar) loc() *time.Location {
	if c.Loc == nil {
		return time.UTC
	}
	return c.Loc
}

// Period is one calendar window: [Start, End) in µs since the Unix epoch.
type Period struct {
	Start, End int64
}

// Span is a calendar window and the one after it, [Start, Mid) and
// [Mid, End) in µs, as a decision takes them (see Limit.TakeIn). A store
// whose clock is another's (Redis's) computes the span from its own clock
// and lets the decision pick the period that holds the deciding clock's
// now, so that two instances whose clocks disagree still count in one
// period. The zero Span is that of a limit without a calendar.
type Span struct {
	Start, Mid, End int64
}

// civilDay is the day number of a civil date, 0 for 1970-01-01.
func civilDay(y int, m time.Month, d int) int64 {
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
}

// floorDiv is a/b rounded toward minus infinity, b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 { // Go's remainder takes a's sign
		q--
	}
	return q
}

// index is the number of the unit that holds now in the local calendar,
// counted from the epoch's, rounded down to a multiple of Count.
func (c Calendar) index(now int64) int64 {
	y, m, d := time.UnixMicro(now).In(c.loc()).Date()
	var i int64
	switch c.Unit {
	case Day:
		i = civilDay(y, m, d)
	case Week:
		i = floorDiv(civilDay(y, m, d)+3, 7) // Monday 1969-12-29 is week 0
	case Month:
		i = int64(y-1970)*12 + int64(m-1)
	}
	return floorDiv(i, c.Count) * c.Count
}

// start is the local midnight that starts unit i: where a DST change
// skips that midnight (America/Santiago, clocks from 00:00 to 01:00), the
// first instant of the day, the change itself. time.Date places a skipped
// midnight in the day before (23:00 of the old offset).
func (c Calendar) start(i int64) int64 {
	y, m, d := 1970, time.January, 1+int(i)
	switch c.Unit {
	case Week:
		y, m, d = 1969, time.December, 29+7*int(i)
	case Month:
		m, d = 1+time.Month(i), 1
	}
	t := time.Date(y, m, d, 0, 0, 0, 0, c.loc())
	if h := t.Hour(); h != 0 {
		// The change ends the old offset's span (t in the day before) or
		// starts the new one's (t later in the day).
		start, end := t.ZoneBounds()
		if h >= 12 && !end.IsZero() {
			t = end
		} else if h < 12 && !start.IsZero() {
			t = start
		}
	}
	return t.UnixMicro()
}

// Period returns the window that holds now. A midnight that a DST change
// skips starts its day at the first instant the day has.
func (c Calendar) Period(now int64) Period {
	if c.Unit == NoUnit {
		return Period{}
	}
	i := c.index(now)
	p := Period{c.start(i), c.start(i + c.Count)}
	// index is now's local date's unit: the loops move to the window that
	// really holds now should the two ever disagree.
	for now < p.Start {
		i -= c.Count
		p = Period{c.start(i), p.Start}
	}
	for now >= p.End {
		i += c.Count
		p = Period{p.End, c.start(i + c.Count)}
	}
	return p
}

// Span returns the window that holds now and the one after it.
func (c Calendar) Span(now int64) Span {
	if c.Unit == NoUnit {
		return Span{}
	}
	p := c.Period(now)
	return Span{p.Start, p.End, c.Period(p.End).End}
}

// ErrOutsideSpan is the error of a calendar decision whose span holds
// neither the state's period nor now: the store's clock and the clock
// the span was computed from disagree by more than a period.
var ErrOutsideSpan = errors.New("calendar window: the deciding clock's now is in neither period of the span given")

// NewCalendarLimit returns a fixed_window limit of events per calendar
// window cal.
func NewCalendarLimit(events int64, cal Calendar) (Limit, error) {
	if cal.Unit == NoUnit || int(cal.Unit) >= len(maxUnitHours) {
		return Limit{}, fmt.Errorf("window: unknown calendar unit %d", cal.Unit)
	}
	if cal.Count <= 0 {
		return Limit{}, fmt.Errorf("window: a calendar window must be at least one unit, got %s", cal)
	}
	if cal.Count > MaxSpan/(maxUnitHours[cal.Unit]*3600*1e6) {
		return Limit{}, fmt.Errorf("window: must be at most %s, got %s", time.Duration(MaxSpan)*time.Microsecond, cal)
	}
	l, err := NewLimit(FixedWindow, events, cal.Nominal(), 0, 0)
	if err != nil {
		return Limit{}, err
	}
	// The shortest period must still hold a µs per event: a 23-hour day,
	// a 28-day February.
	short := map[Unit]int64{Day: 23, Week: 7*24 - 1, Month: 28*24 - 1}[cal.Unit] * cal.Count * 3600e6
	if short/events == 0 {
		return Limit{}, fmt.Errorf("events: %d per %s is more than one per microsecond, the finest rate Tollgate keeps per key", events, cal)
	}
	l.Calendar = cal
	return l, nil
}
