package algorithms

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
	_ "time/tzdata" // the tests' zones, whatever the machine has
)

// zones are the time zones the calendar tests walk: one without DST, two
// with it (an hour, on different dates), one with a half-hour offset and
// one whose DST change is half an hour.
var zones = []string{"UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe"}

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func micros(tm time.Time) int64 { return tm.UnixMicro() }

// TestCalendarPeriods walks two years of windows of each unit in each
// zone: every window starts where the last ended, at a local midnight, on
// a Monday (weeks) or the 1st (months), and lasts its calendar length.
func TestCalendarPeriods(t *testing.T) {
	for _, name := range zones {
		loc := mustLoc(t, name)
		for _, cal := range []Calendar{{Day, 1, loc}, {Day, 2, loc}, {Week, 1, loc}, {Week, 2, loc}, {Month, 1, loc}, {Month, 3, loc}} {
			t.Run(name+"/"+cal.String(), func(t *testing.T) {
				from := micros(time.Date(2025, 12, 20, 13, 0, 0, 0, loc))
				p := cal.Period(from)
				if !(p.Start <= from && from < p.End) {
					t.Fatalf("Period(%d) = %v does not hold it", from, p)
				}
				for i := 0; i < 800 && p.Start < micros(time.Date(2028, 1, 1, 0, 0, 0, 0, loc)); i++ {
					s, e := time.UnixMicro(p.Start).In(loc), time.UnixMicro(p.End).In(loc)
					if s.Hour() != 0 || s.Minute() != 0 || s.Second() != 0 {
						t.Fatalf("window %d starts at %s, not a local midnight", i, s)
					}
					want := s.AddDate(0, 0, int(cal.Count))
					switch cal.Unit {
					case Week:
						if s.Weekday() != time.Monday {
							t.Fatalf("window %d starts on %s", i, s.Weekday())
						}
						want = s.AddDate(0, 0, 7*int(cal.Count))
					case Month:
						if s.Day() != 1 || (int(s.Month())-1)%int(cal.Count) != 0 {
							t.Fatalf("window %d starts on %s", i, s)
						}
						want = s.AddDate(0, int(cal.Count), 0)
					}
					if !e.Equal(want) {
						t.Fatalf("window %d: [%s, %s), want the end %s", i, s, e, want)
					}
					// Its last µs and its first belong to it; the next µs
					// does not.
					for _, now := range []int64{p.Start, p.End - 1, (p.Start + p.End) / 2} {
						if got := cal.Period(now); got != p {
							t.Fatalf("Period(%s) = %v, want %v", time.UnixMicro(now).In(loc), got, p)
						}
					}
					if sp := cal.Span(p.End - 1); sp.Mid != p.End || sp.Start != p.Start || sp.End != cal.Period(p.End).End {
						t.Fatalf("Span(%d) = %v", p.End-1, sp)
					}
					next := cal.Period(p.End)
					if next.Start != p.End {
						t.Fatalf("window %d ends at %d, the next starts at %d", i, p.End, next.Start)
					}
					p = next
				}
			})
		}
	}
}

// TestCalendarStrings: a calendar window's String and Nominal, and the
// empty string and 0 for no calendar or a unit past the known ones.
func TestCalendarStrings(t *testing.T) {
	for _, c := range []struct {
		cal     Calendar
		str     string
		nominal time.Duration
	}{
		{Calendar{Day, 1, nil}, "1d", 24 * time.Hour},
		{Calendar{Week, 2, nil}, "2w", 14 * 24 * time.Hour},
		{Calendar{Month, 3, nil}, "3mo", 90 * 24 * time.Hour},
		{Calendar{}, "", 0},
		{Calendar{Month + 1, 1, nil}, "", 0},
	} {
		if got := c.cal.String(); got != c.str {
			t.Errorf("%+v.String() = %q, want %q", c.cal, got, c.str)
		}
		if got := c.cal.Nominal(); got != c.nominal {
			t.Errorf("%+v.Nominal() = %s, want %s", c.cal, got, c.nominal)
		}
	}
}

// TestFloorDiv: floorDiv is a/b rounded toward minus infinity, as
// math.Floor of the quotient (exact for these values), for negative and
// positive a.
func TestFloorDiv(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 3))
	for i := 0; i < 20000; i++ {
		a, b := rng.Int64N(2_000_001)-1_000_000, 1+rng.Int64N(20)
		if i < 200 {
			a = int64(i) - 100
		}
		if got, want := floorDiv(a, b), int64(math.Floor(float64(a)/float64(b))); got != want {
			t.Fatalf("floorDiv(%d, %d) = %d, want %d", a, b, got, want)
		}
	}
}

// TestCalendarModel: Period against a plain model of its definition, for
// windows of 1 to 7 days, weeks and months in each zone, at random times
// from 1969 to 2100: units numbered from the epoch's own (1970-01-01, the
// week of Monday 1969-12-29, January 1970), a window the Count units
// from a multiple of Count, found by stepping from an estimate; and
// index, the unit Period starts from, is that window's.
func TestCalendarModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 4))
	from := time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	to := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	n := 300
	if testing.Short() || raceOn || mutationOn {
		n = 60
	}
	// America/Santiago skips its midnight at the start of DST (clocks
	// from 00:00 to 01:00), and time.Date places that midnight in the day
	// before (23:00 of the old offset): there the day starts at the
	// change, and the times are drawn within two hours of such a
	// midnight.
	santiago := mustLoc(t, "America/Santiago")
	var skips []int64
	for d := 0; d < 365*30; d++ {
		if m := time.Date(2000, 1, 1+d, 0, 0, 0, 0, santiago); m.Day() != time.Date(2000, 1, 1+d, 12, 0, 0, 0, time.UTC).Day() {
			skips = append(skips, m.UnixMicro())
		}
	}
	for _, name := range append(zones, "America/Santiago") {
		loc := mustLoc(t, name)
		for _, unit := range []Unit{Day, Week, Month} {
			for count := int64(1); count <= 7; count++ {
				cal := Calendar{unit, count, loc}
				// unitStart is the first instant whose local date is the
				// unit's first: its midnight, or where a DST change skips
				// it, the change (found a minute at a time).
				unitStart := func(u int64) int64 {
					var t time.Time
					switch unit {
					case Day:
						t = time.Date(1970, 1, 1+int(u), 0, 0, 0, 0, time.UTC)
					case Week:
						t = time.Date(1969, 12, 29+7*int(u), 0, 0, 0, 0, time.UTC)
					default:
						t = time.Date(1970, 1+time.Month(u), 1, 0, 0, 0, 0, time.UTC)
					}
					y, m, d := t.Date()
					on := func(t time.Time) bool {
						ly, lm, ld := t.In(loc).Date()
						return ly == y && lm == m && ld == d
					}
					t = time.Date(y, m, d, 0, 0, 0, 0, loc)
					for !on(t) {
						t = t.Add(time.Minute)
					}
					for on(t.Add(-time.Minute)) {
						t = t.Add(-time.Minute)
					}
					return t.UnixMicro()
				}
				for j := range n {
					now := from + rng.Int64N(to-from)
					if name == "America/Santiago" {
						now = skips[rng.IntN(len(skips))] + rng.Int64N(4*3600e6) - 2*3600e6
						if j%4 == 0 { // the placed midnight itself
							now = skips[rng.IntN(len(skips))]
						}
					}
					k := now / int64(cal.Nominal()/time.Microsecond) * count // an estimate, a multiple of count
					for unitStart(k) > now {
						k -= count
					}
					for unitStart(k+count) <= now {
						k += count
					}
					// index, Period's first estimate, is exact: the unit of
					// now's local date (the loops after it only correct a
					// midnight that time.Date placed in the day before).
					if got := cal.index(now); got != k && name != "America/Santiago" {
						t.Fatalf("%s %s: index(%s) = %d, want %d", name, cal, time.UnixMicro(now).In(loc), got, k)
					}
					want := Period{unitStart(k), unitStart(k + count)}
					if got := cal.Period(now); got != want {
						t.Fatalf("%s %s: Period(%s) = [%s, %s), want [%s, %s)", name, cal, time.UnixMicro(now).In(loc),
							time.UnixMicro(got.Start).In(loc), time.UnixMicro(got.End).In(loc),
							time.UnixMicro(want.Start).In(loc), time.UnixMicro(want.End).In(loc))
					}
				}
			}
		}
	}
}

// TestNewCalendarLimitEdges: NewCalendarLimit's bounds at their edges:
// the most units a window may hold (its longest length within MaxSpan:
// days of 25 hours, weeks of 169, months of 745) and the most events its
// shortest period holds at one a µs (a day of 23 hours, a week of 167),
// accepted, and one more refused with the whole error.
func TestNewCalendarLimitEdges(t *testing.T) {
	for _, c := range []struct {
		events int64
		cal    Calendar
	}{
		{1, Calendar{Day, 12509, nil}},
		{1, Calendar{Week, 1850, nil}},
		{1, Calendar{Month, 419, nil}},
		{82_800_000_000, Calendar{Day, 1, nil}},
		{601_200_000_000, Calendar{Week, 1, nil}},
		{MaxEvents, Calendar{Month, 1, nil}},
	} {
		if _, err := NewCalendarLimit(c.events, c.cal); err != nil {
			t.Errorf("NewCalendarLimit(%d, %s): %v, want accepted", c.events, c.cal, err)
		}
	}
	for _, c := range []struct {
		events int64
		cal    Calendar
		want   string
	}{
		{1, Calendar{Day, 12510, nil}, "window: must be at most 312749h58m26.842624s, got 12510d"},
		{1, Calendar{Week, 1851, nil}, "window: must be at most 312749h58m26.842624s, got 1851w"},
		{1, Calendar{Month, 420, nil}, "window: must be at most 312749h58m26.842624s, got 420mo"},
		{1, Calendar{Day, 0, nil}, "window: a calendar window must be at least one unit, got 0d"},
		{1, Calendar{Month + 1, 1, nil}, "window: unknown calendar unit 4"},
		{1, Calendar{}, "window: unknown calendar unit 0"},
		{82_800_000_001, Calendar{Day, 1, nil}, "events: 82800000001 per 1d is more than one per microsecond, the finest rate Tollgate keeps per key"},
		{601_200_000_001, Calendar{Week, 1, nil}, "events: 601200000001 per 1w is more than one per microsecond, the finest rate Tollgate keeps per key"},
	} {
		if _, err := NewCalendarLimit(c.events, c.cal); err == nil || err.Error() != c.want {
			t.Errorf("NewCalendarLimit(%d, %+v) = %v, want %q", c.events, c.cal, err, c.want)
		}
	}
}

// TestCalendarDSTDays: the days of a DST change are whole days of 23 and
// 25 hours, and February is 28 or 29 days.
func TestCalendarDSTDays(t *testing.T) {
	ny, berlin, lh := mustLoc(t, "America/New_York"), mustLoc(t, "Europe/Berlin"), mustLoc(t, "Australia/Lord_Howe")
	cases := []struct {
		cal  Calendar
		at   time.Time
		want time.Duration
	}{
		{Calendar{Day, 1, ny}, time.Date(2026, 3, 8, 12, 0, 0, 0, ny), 23 * time.Hour},
		{Calendar{Day, 1, ny}, time.Date(2026, 11, 1, 12, 0, 0, 0, ny), 25 * time.Hour},
		{Calendar{Day, 1, berlin}, time.Date(2026, 3, 29, 12, 0, 0, 0, berlin), 23 * time.Hour},
		{Calendar{Day, 1, berlin}, time.Date(2026, 10, 25, 12, 0, 0, 0, berlin), 25 * time.Hour},
		{Calendar{Day, 1, lh}, time.Date(2026, 4, 5, 12, 0, 0, 0, lh), 24*time.Hour + 30*time.Minute},
		{Calendar{Week, 1, berlin}, time.Date(2026, 3, 29, 12, 0, 0, 0, berlin), 7*24*time.Hour - time.Hour},
		{Calendar{Month, 1, berlin}, time.Date(2028, 2, 29, 23, 59, 59, 0, berlin), 29 * 24 * time.Hour},
		{Calendar{Month, 1, berlin}, time.Date(2027, 2, 28, 23, 59, 59, 0, berlin), 28 * 24 * time.Hour},
		{Calendar{Month, 1, berlin}, time.Date(2026, 3, 31, 23, 0, 0, 0, berlin), 31*24*time.Hour - time.Hour},
	}
	for i, c := range cases {
		p := c.cal.Period(micros(c.at))
		if got := time.Duration(p.End-p.Start) * time.Microsecond; got != c.want {
			t.Errorf("case %d: the %s window holding %s lasts %s, want %s", i, c.cal, c.at, got, c.want)
		}
	}
}

// TestCalendarWindow walks a fixed_window of 3 events a day in each zone
// with a fake clock, a millisecond before and after each midnight, for
// 400 days (two DST changes, a 29th of February): each day admits 3, the
// 4th waits exactly until local midnight.
func TestCalendarWindow(t *testing.T) {
	for _, name := range zones {
		loc := mustLoc(t, name)
		l, err := NewCalendarLimit(3, Calendar{Day, 1, loc})
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			var s State
			day := time.Date(2027, 12, 31, 0, 0, 0, 0, loc)
			for i := 0; i < 400; i++ {
				next := time.Date(day.Year(), day.Month(), day.Day()+1, 0, 0, 0, 0, loc)
				mid := micros(next) - int64(time.Millisecond/time.Microsecond)
				for k := int64(0); k < 3; k++ {
					d := l.Take(&s, mid-10_000_000+k, Milli)
					if !d.Allowed || d.Remaining != 2-k || d.Reset != micros(next)-(mid-10_000_000+k) {
						t.Fatalf("%s: take %d 10s before midnight: %+v", next, k, d)
					}
				}
				if d := l.Take(&s, mid, Milli); d.Allowed || d.Wait != 1000 || d.Reset != 1000 {
					t.Fatalf("%s: a millisecond before midnight: %+v, want a wait of 1000µs", next, d)
				}
				if d := l.Take(&s, micros(next)+1000, Milli); !d.Allowed || d.Remaining != 2 {
					t.Fatalf("%s: a millisecond after midnight: %+v", next, d)
				}
				s = State{At: s.At, Prev: s.Prev, Level: 3 * Milli} // the day after's quota, all spent
				if d := l.Peek(&s, micros(next)+2000, Milli); d.Allowed || d.Wait != micros(time.Date(next.Year(), next.Month(), next.Day()+1, 0, 0, 0, 0, loc))-micros(next)-2000 {
					t.Fatalf("%s: a full day waits until the next midnight: %+v", next, d)
				}
				s = State{}
				day = next
			}
		})
	}
}

// TestCalendarReset: a request at 23:59:30 is told 30 seconds.
func TestCalendarReset(t *testing.T) {
	loc := mustLoc(t, "Asia/Kolkata")
	l, err := NewCalendarLimit(1, Calendar{Day, 1, loc})
	if err != nil {
		t.Fatal(err)
	}
	var s State
	now := micros(time.Date(2026, 5, 4, 23, 59, 30, 0, loc))
	if d := l.Take(&s, now, Milli); !d.Allowed || d.Reset != 30_000_000 {
		t.Fatalf("first: %+v", d)
	}
	if d := l.Take(&s, now, Milli); d.Allowed || d.Wait != 30_000_000 {
		t.Fatalf("second: %+v, want a wait of 30s", d)
	}
}

// TestCalendarSpan: a span computed on another clock still decides in the
// period that holds the deciding clock's now, and refuses when it holds
// neither that nor the state's window.
func TestCalendarSpan(t *testing.T) {
	loc := mustLoc(t, "Europe/Berlin")
	cal := Calendar{Day, 1, loc}
	l, err := NewCalendarLimit(2, cal)
	if err != nil {
		t.Fatal(err)
	}
	midnight := micros(time.Date(2026, 10, 26, 0, 0, 0, 0, loc))
	hour := int64(3600e6)
	var s State
	// The instance's clock is an hour behind: its span holds the day
	// before and this one.
	sp := cal.Span(midnight - hour + 5)
	for i := 0; i < 2; i++ {
		if d, err := l.TakeIn(&s, sp, midnight+5, Milli); err != nil || !d.Allowed {
			t.Fatalf("take %d: %+v, %v", i, d, err)
		}
	}
	if s.At != midnight {
		t.Fatalf("counted in the window from %d, want %d", s.At, midnight)
	}
	if d, _ := l.TakeIn(&s, sp, midnight+6, Milli); d.Allowed {
		t.Fatalf("third: %+v", d)
	}
	// An instance a day and more ahead: the state's window still holds
	// now, so its span is not needed.
	ahead := cal.Span(midnight + 30*hour)
	if d, err := l.TakeIn(&s, ahead, midnight+7, Milli); err != nil || d.Allowed {
		t.Fatalf("ahead, within the state's window: %+v, %v", d, err)
	}
	// A fresh key: neither period holds now.
	var fresh State
	if _, err := l.TakeIn(&fresh, ahead, midnight+7, Milli); !errors.Is(err, ErrOutsideSpan) {
		t.Fatalf("fresh key, span a day ahead: %v, want ErrOutsideSpan", err)
	}
	if fresh.At != 0 || fresh.Prev != 0 || fresh.Level != 0 {
		t.Fatalf("a refused decision changed the state: %+v", fresh)
	}
}

// TestCalendarSpanEdges: TakeIn at the edges of the state's window and
// of the span given: a span's first µs and its second period's first µs
// are its own, its end and the state's window end are not.
func TestCalendarSpanEdges(t *testing.T) {
	cal := Calendar{Day, 1, time.UTC}
	l, err := NewCalendarLimit(2, cal)
	if err != nil {
		t.Fatal(err)
	}
	const day = 86400e6
	d0 := micros(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	d1, d2, d3 := d0+day, d0+2*day, d0+3*day
	sp1 := cal.Span(d1) // [d1, d2) and [d2, d3)
	for _, c := range []struct {
		name      string
		state     int64 // a take at this time first, if not 0
		sp        Span
		now       int64
		outside   bool
		at, reset int64 // the window counted in, and Reset
	}{
		{"the state's window end, the span after it", d0 + 5, cal.Span(d2), d1, true, 0, 0},
		{"the span's first µs", 0, sp1, d1, false, d1, day},
		{"the span's second period's first µs", 0, sp1, d2, false, d2, day},
		{"the span's last µs", 0, sp1, d3 - 1, false, d2, 1},
		{"the span's end", 0, sp1, d3, true, 0, 0},
		{"within the state's window, the span after it", d0 + 5, cal.Span(d2), d1 - 1, false, d0, 1},
	} {
		var s State
		if c.state != 0 {
			if _, err := l.TakeIn(&s, cal.Span(c.state), c.state, Milli); err != nil {
				t.Fatal(err)
			}
		}
		d, err := l.TakeIn(&s, c.sp, c.now, Milli)
		if c.outside {
			if !errors.Is(err, ErrOutsideSpan) {
				t.Errorf("%s: TakeIn = %+v, %v, want ErrOutsideSpan", c.name, d, err)
			}
			continue
		}
		if err != nil || !d.Allowed || s.At != c.at || d.Reset != c.reset {
			t.Errorf("%s: TakeIn = %+v, %v, counted in the window from %d; want admitted in the window from %d, Reset %d", c.name, d, err, s.At, c.at, c.reset)
		}
	}
}

// TestGrant: a grant adds to the window it is given in, adds up, and ends
// with the window, for fixed_window (epoch and calendar); the other
// algorithms refuse it.
func TestGrant(t *testing.T) {
	loc := mustLoc(t, "America/New_York")
	cal, _ := NewCalendarLimit(10, Calendar{Month, 1, loc})
	limits := map[string]Limit{
		"fixed_window": mustLimit(t, FixedWindow, 10, time.Hour, 0, 0),
		"calendar":     cal,
	}
	for name, l := range limits {
		t.Run(name, func(t *testing.T) {
			now := micros(time.Date(2026, 2, 10, 5, 0, 0, 0, loc))
			now -= now % l.Window // the start of an epoch window
			if l.Calendar.Unit != NoUnit {
				now = cal.Calendar.Period(now).Start
			}
			var s State
			admitted := func(at int64) int {
				n := 0
				for l.Take(&s, at, Milli).Allowed {
					n++
				}
				return n
			}
			if n := admitted(now + 1); n != 10 {
				t.Fatalf("before a grant: %d admitted, want 10", n)
			}
			d, err := l.Grant(&s, now+2, 5*Milli)
			if err != nil || !d.Allowed || d.Remaining != 5 {
				t.Fatalf("grant 5: %+v, %v", d, err)
			}
			if _, err := l.Grant(&s, now+3, 2500); err != nil {
				t.Fatal(err)
			}
			if n := admitted(now + 4); n != 7 {
				t.Fatalf("after grants of 5 and 2.5: %d more admitted, want 7", n)
			}
			if d := l.Peek(&s, now+4, 500); !d.Allowed {
				t.Fatalf("the half event granted: %+v", d)
			}
			// The next window: the grant has ended.
			end := now + l.Window
			if l.Calendar.Unit != NoUnit {
				end = cal.Calendar.Period(now).End
			}
			if n := admitted(end); n != 10 {
				t.Fatalf("the next window: %d admitted, want 10", n)
			}
		})
	}
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket} {
		l := mustLimit(t, kind, 10, time.Hour, 0, 0)
		var s State
		if _, err := l.Grant(&s, t0, Milli); !errors.Is(err, ErrNoGrant) {
			t.Fatalf("%v grant: %v, want ErrNoGrant", kind, err)
		}
	}
}

// takeUpTo takes events of cost 1 at at until one is refused, at most n,
// and returns how many were admitted.
func takeUpTo(l *Limit, s *State, at int64, n int) int {
	k := 0
	for k < n && l.Take(s, at, Milli).Allowed {
		k++
	}
	return k
}

// TestGrantSlidingWindow: a sliding_window's grant raises its window's
// limit by the amount, ends with the window, and what it admitted does
// not weigh on the next window: only the window's count beyond the grant
// does.
func TestGrantSlidingWindow(t *testing.T) {
	l := mustLimit(t, SlidingWindow, 10, time.Hour, 0, 0)
	w := l.Window
	start := micros(time.Date(2026, 2, 10, 5, 0, 0, 0, time.UTC))
	start -= start % w
	var s State
	take := func(at int64, n int) int { return takeUpTo(&l, &s, at, n) }
	if n := take(start+1, 100); n != 10 {
		t.Fatalf("before a grant: %d admitted, want 10", n)
	}
	d, err := l.Grant(&s, start+2, 5*Milli)
	if err != nil || !d.Allowed || d.Remaining != 5 || d.Reset != w-2+w {
		t.Fatalf("grant 5 after 10 taken: %+v, %v; want 5 remaining, reset when the count beyond the grant has slid out", d, err)
	}
	if n := take(start+3, 100); n != 5 {
		t.Fatalf("after a grant of 5: %d more admitted, want 5", n)
	}
	// The next window weighs 15 - 5 = 10: at its middle, 5.
	if n := take(start+w+w/2, 100); n != 5 {
		t.Fatalf("middle of the next window: %d admitted, want 5 (the grant's 5 do not weigh)", n)
	}

	// A grant barely used: 6 taken of 10 + 5; the next window weighs 1.
	s = State{}
	start += 10 * w
	take(start+1, 3)
	if _, err := l.Grant(&s, start+2, 5*Milli); err != nil {
		t.Fatal(err)
	}
	take(start+3, 3)
	if d := l.Peek(&s, start+w-1, Milli); !d.Allowed || d.Remaining != 9 || d.Reset != 1+w {
		t.Fatalf("last µs of the granted window, 6 taken of 15: %+v, want 9 remaining and fresh when the 1 beyond the grant has slid out", d)
	}
	if n := take(start+w+w/2, 100); n != 9 {
		t.Fatalf("middle of the next window: %d admitted, want 9 (weighs ceil(1/2))", n)
	}
	// A grant after a window without one: the previous window's weight
	// still counts against the granted window.
	if _, err := l.Grant(&s, start+w+w/2, 2*Milli); err != nil {
		t.Fatal(err)
	}
	if n := take(start+w+w/2, 100); n != 2 {
		t.Fatalf("grant of 2 in a full window: %d admitted, want 2", n)
	}
	// Grants add up, to MaxGrant.
	if _, err := l.Grant(&s, start+w+w/2, MaxGrant); err != nil {
		t.Fatal(err)
	}
	if d := l.Peek(&s, start+w+w/2, Milli); d.Remaining != (MaxGrant-2*Milli)/Milli {
		t.Fatalf("grants past MaxGrant: %+v", d)
	}
}

// TestGrantSlidingLog: a sliding_log's grant lets its log hold the grant's
// whole events more for a window from the grant on; a later grant adds
// and starts that window anew; when it ends the log counts N again, its
// entries still in the window included, and a rejection's wait accounts
// for the grant's end.
func TestGrantSlidingLog(t *testing.T) {
	l := mustLimit(t, SlidingLog, 3, time.Minute, 0, 0)
	w := l.Window
	now := int64(1_800_000_000_000_000)
	var s State
	take := func(at int64, n int) int { return takeUpTo(&l, &s, at, n) }
	if n := take(now, 10); n != 3 {
		t.Fatalf("before a grant: %d admitted, want 3", n)
	}
	d, err := l.Grant(&s, now+w/2, 2500) // 2.5: two whole events
	if err != nil || d.Remaining != 2 || d.Reset != w {
		t.Fatalf("grant 2.5: %+v, %v; want 2 remaining, fresh when the grant ends", d, err)
	}
	if n := take(now+w/2, 10); n != 2 {
		t.Fatalf("after a grant of 2.5: %d admitted, want 2", n)
	}
	if _, err := l.Grant(&s, now+w/2+1, 500); err != nil { // 2.5 + 0.5: three
		t.Fatal(err)
	}
	if n := take(now+w/2+1, 10); n != 1 {
		t.Fatalf("after grants adding up to 3: %d more admitted, want 1", n)
	}
	// The first 3 leave the window at now+w; the grant lasts until
	// now+w/2+1+w. With 3 taken at w/2 and the grant of 3: room for 3.
	if n := take(now+w, 10); n != 3 {
		t.Fatalf("when the first entries left: %d admitted, want 3", n)
	}
	// Full (6 in the log, 3 + 3); the grant ends at now+3w/2+1, when the
	// log still holds the 3 taken at now+w: a request then waits for them.
	d = l.Peek(&s, now+w+1, Milli)
	if d.Allowed || d.Wait != w/2-1 {
		t.Fatalf("full with the grant: %+v, want a wait until the entries of now+w/2 leave, within the grant", d)
	}
	// A grant that ends before the oldest entry leaves: a request waits
	// until the log holds fewer than N.
	s = State{}
	if _, err := l.Grant(&s, now, 3*Milli); err != nil {
		t.Fatal(err)
	}
	take(now+1, 3)
	take(now+w/2, 3)
	d = l.Peek(&s, now+w/2+1, Milli)
	if d.Allowed || d.Wait != w-1 {
		t.Fatalf("full, the grant ending first: %+v, want a wait until the entries of now+w/2 leave", d)
	}
	// After the grant: N again.
	s = State{}
	if _, err := l.Grant(&s, now, 3*Milli); err != nil {
		t.Fatal(err)
	}
	if n := take(now+1, 10); n != 6 {
		t.Fatalf("a fresh key with a grant of 3: %d admitted, want 6", n)
	}
	if n := take(now+w, 10); n != 0 {
		t.Fatalf("the grant has ended, 6 entries in the window: %d admitted, want 0", n)
	}
	if d := l.Peek(&s, now+w, Milli); d.Remaining != 0 || d.Wait != 1 {
		t.Fatalf("6 entries of a limit of 3: %+v, want 0 remaining (not -3) and a wait of 1 µs", d)
	}
	if n := take(now+w+1, 10); n != 3 {
		t.Fatalf("the entries have left: %d admitted, want 3", n)
	}
	if _, err := l.Grant(&s, now, MaxGrant); err != nil {
		t.Fatal(err)
	}
	if l.granted(&s) != MaxLogGrant {
		t.Fatalf("a sliding_log grant past MaxLogGrant: %d", l.granted(&s))
	}
}

// TestGrantLogNeverPasses: random takes, give-backs and grants on a
// sliding_log; at every admission the log's events in the window are at
// most N and the whole events of the grant then lasting, and a
// rejection's wait is exact: a peek then fits, one µs earlier does not.
func TestGrantLogNeverPasses(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	l := mustLimit(t, SlidingLog, 6, 10*time.Second, 0, 0)
	w := l.Window
	var s State
	var times []int64 // admitted events, one time each
	var grant, until int64
	now := int64(1_800_000_000_000_000)
	for i := 0; i < 30000; i++ {
		now += r.Int64N(w / 6)
		if now >= until {
			grant = 0
		}
		if r.IntN(25) == 0 {
			g := r.Int64N(4 * Milli)
			if _, err := l.Grant(&s, now, g); err != nil {
				t.Fatal(err)
			}
			grant, until = grant+g, now+w
			continue
		}
		cost := r.Int64N(3 * Milli)
		k := int(ceilDiv(cost, Milli))
		d := l.Take(&s, now, cost)
		if !d.Allowed {
			c := s
			c.Log = append([]int64(nil), s.Log...)
			if p := l.Peek(&c, now+d.Wait, cost); !p.Allowed {
				t.Fatalf("step %d: rejected with wait %d, then %+v", i, d.Wait, p)
			}
			c = s
			c.Log = append([]int64(nil), s.Log...)
			if d.Wait > 1 {
				if p := l.Peek(&c, now+d.Wait-1, cost); p.Allowed {
					t.Fatalf("step %d: cost %d rejected at %d with wait %d, allowed a µs earlier; grant %d until %d; state %+v", i, cost, now, d.Wait, grant, until, s)
				}
			}
			continue
		}
		for j := 0; j < k; j++ {
			times = append(times, now)
		}
		in := 0
		for _, at := range times {
			if at > now-w {
				in++
			}
		}
		if int64(in) > l.Events+grant/Milli {
			t.Fatalf("step %d: %d events in the window, limit %d and a grant of %d milli", i, in, l.Events, grant)
		}
	}
}

// TestGrantUndoKeepsIt: a give-back to the previous window does not
// touch the current window's grant, and one to the granted window gives
// the cost back within it.
func TestGrantUndoKeepsIt(t *testing.T) {
	l := mustLimit(t, SlidingWindow, 4, time.Minute, 0, 0)
	w := l.Window
	var s State
	old := l.Take(&s, 10*w+1, Milli)
	if _, err := l.Grant(&s, 11*w+1, 3*Milli); err != nil {
		t.Fatal(err)
	}
	l.Undo(&s, 11*w+2, Milli, old)
	if d := l.Peek(&s, 11*w+2, Milli); d.Remaining != 7 {
		t.Fatalf("after a give-back to the previous window: %+v, want 4 + 3 remaining", d)
	}
	now := l.Take(&s, 11*w+3, 2*Milli)
	l.Undo(&s, 11*w+4, 2*Milli, now)
	if d := l.Peek(&s, 11*w+4, Milli); d.Remaining != 7 {
		t.Fatalf("after a give-back to the granted window: %+v, want 7 remaining", d)
	}
}

// TestGrantNeverPasses: random takes and grants; in no window does a
// fixed_window admit more than its events and what was granted in it.
func TestGrantNeverPasses(t *testing.T) {
	loc := mustLoc(t, "Europe/Berlin")
	cal, _ := NewCalendarLimit(5, Calendar{Day, 1, loc})
	r := rand.New(rand.NewPCG(1, 2))
	for _, l := range []Limit{mustLimit(t, FixedWindow, 5, time.Hour, 0, 0), cal} {
		var s State
		admitted, granted := map[int64]int64{}, map[int64]int64{}
		now := micros(time.Date(2026, 3, 20, 0, 0, 0, 0, loc))
		for i := 0; i < 20000; i++ {
			now += r.Int64N(int64(2 * time.Hour / time.Microsecond / 10))
			win := now - now%l.Window
			if l.Calendar.Unit != NoUnit {
				win = l.Calendar.Period(now).Start
			}
			if r.IntN(20) == 0 {
				g := r.Int64N(3000)
				if _, err := l.Grant(&s, now, g); err != nil {
					t.Fatal(err)
				}
				granted[win] += g
				continue
			}
			cost := r.Int64N(2000)
			if l.Take(&s, now, cost).Allowed {
				admitted[win] += cost
			}
		}
		for w, a := range admitted {
			if a > l.Events*Milli+granted[w] {
				t.Fatalf("%s window %d admitted %d milli, granted %d", fmt.Sprint(l.Calendar), w, a, granted[w])
			}
		}
	}
}

// TestGrantSlidingNeverPasses: random takes, give-backs and grants on a
// sliding_window; every admission keeps the definition with grants: the
// previous window's count beyond its grant, weighted by the overlap, plus
// this window's count, is at most the limit plus this window's grants so
// far (the weight compared exactly, as carried*(W-e) against room*W).
func TestGrantSlidingNeverPasses(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, l := range []Limit{
		mustLimit(t, SlidingWindow, 5, time.Hour, 0, 0),
		mustLimit(t, SlidingWindow, 40, 7*time.Second, 0, 0),
	} {
		var s State
		w := l.Window
		type win struct{ admitted, granted int64 }
		wins := map[int64]*win{}
		at := func(start int64) *win {
			if wins[start] == nil {
				wins[start] = &win{}
			}
			return wins[start]
		}
		var taken []Decision
		var costs []int64
		now := int64(1_800_000_000_000_000)
		for i := 0; i < 50000; i++ {
			now += r.Int64N(w / 8)
			start := now - now%w
			switch k := r.IntN(40); {
			case k == 0:
				g := r.Int64N(4 * Milli)
				if _, err := l.Grant(&s, now, g); err != nil {
					t.Fatal(err)
				}
				at(start).granted += g
				continue
			case k < 4 && len(taken) > 0:
				j := r.IntN(len(taken))
				d, c := taken[j], costs[j]
				taken, costs = append(taken[:j], taken[j+1:]...), append(costs[:j], costs[j+1:]...)
				l.Undo(&s, now, c, d)
				if ds := d.At - d.At%w; ds >= start-w { // still counted: given back
					at(ds).admitted -= c
				}
				continue
			}
			cost := r.Int64N(2 * Milli)
			d := l.Take(&s, now, cost)
			if !d.Allowed {
				continue
			}
			cur := at(start)
			cur.admitted += cost
			taken, costs = append(taken, d), append(costs, cost)
			var carried int64
			if p := wins[start-w]; p != nil {
				carried = max(0, p.admitted-p.granted)
			}
			room := l.Events*Milli + cur.granted - cur.admitted
			// carried * (W - e) / W <= room, with the weight rounded up.
			if room < 0 || mulCmp(carried, w-(now-start), room, w) > 0 {
				t.Fatalf("%v: step %d at +%d µs in its window: admitted %d milli with %d granted, the previous window's %d beyond its grant weighing %d/%d: past the limit %d",
					l.Window, i, now-start, cur.admitted, cur.granted, carried, w-(now-start), w, l.Events*Milli)
			}
		}
	}
}

// TestSeedCalendar: a copy seeded from a calendar window's decision counts
// in the same period, and keeps a grant as room.
func TestSeedCalendar(t *testing.T) {
	loc := mustLoc(t, "Asia/Kolkata")
	l, _ := NewCalendarLimit(4, Calendar{Week, 1, loc})
	now := micros(time.Date(2026, 6, 3, 10, 0, 0, 0, loc))
	var real State
	l.Take(&real, now, 3*Milli)
	_, _ = l.Grant(&real, now, 2*Milli)
	d := l.Take(&real, now, Milli)
	var cp State
	l.Seed(&cp, d, Milli, true)
	p := l.Calendar.Period(now)
	if cp.At != p.Start || cp.Prev != p.End {
		t.Fatalf("seeded window [%d, %d), want %v", cp.At, cp.Prev, p)
	}
	for i := 0; i < 2; i++ {
		a, b := l.Take(&real, now+1, Milli), l.Take(&cp, now+1, Milli)
		if a.Allowed != b.Allowed || a.Remaining != b.Remaining || a.Reset != b.Reset {
			t.Fatalf("take %d: real %+v, copy %+v", i, a, b)
		}
	}
}

// TestCalendarAllocs: a calendar window's decision, with its span
// computed in its time zone, allocates nothing.
func TestCalendarAllocs(t *testing.T) {
	l, _ := NewCalendarLimit(1000, Calendar{Month, 1, mustLoc(t, "Europe/Berlin")})
	var s State
	now := micros(time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC))
	if n := testing.AllocsPerRun(1000, func() {
		now += 3600e6
		l.Take(&s, now, Milli)
		_, _ = l.Grant(&s, now, Milli)
	}); n != 0 {
		t.Fatalf("Take and Grant allocate %v times per call, want 0", n)
	}
}
