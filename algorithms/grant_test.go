package algorithms

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// grantStep is one call of TestGranted: 'G' grants amount, 'T' takes one
// event, 'P' peeks, at start+at; want is what Granted tells at start+at
// after it.
type grantStep struct {
	op     byte
	at     int64
	amount int64
	want   int64
}

// TestGranted: Granted tells the quota granted to the key's window,
// grants added up, until the window that holds it ends (a sliding_log's:
// a window from the last grant), and changes nothing.
func TestGranted(t *testing.T) {
	loc := mustLoc(t, "America/New_York")
	month, _ := NewCalendarLimit(10, Calendar{Month, 1, loc})
	feb := micros(time.Date(2026, 2, 1, 0, 0, 0, 0, loc))
	march := micros(time.Date(2026, 3, 1, 0, 0, 0, 0, loc)) - feb
	hour := int64(time.Hour / time.Microsecond)
	epoch := int64(1_800_000_000) * 1_000_000
	epoch -= epoch % hour
	window := []grantStep{
		{'P', 1, 0, 0}, {'T', 1, 0, 0},
		{'G', 2, 5000, 5000}, {'G', 3, 2500, 7500}, {'T', 4, 0, 7500},
		{'P', hour - 1, 0, 7500},
		{'P', hour, 0, 0}, // the next window: the grant has ended
		{'P', 5, 0, 0},    // a clock that ran backwards finds it ended too
		{'G', hour + 1, 1000, 1000},
		{'P', 3*hour + 1, 0, 0}, // windows later
	}
	cases := []struct {
		name  string
		limit Limit
		start int64
		steps []grantStep
	}{
		{"fixed_window", mustLimit(t, FixedWindow, 10, time.Hour, 0, 0), epoch, window},
		{"sliding_window", mustLimit(t, SlidingWindow, 10, time.Hour, 0, 0), epoch, window},
		{"sliding_log", mustLimit(t, SlidingLog, 10, time.Hour, 0, 0), epoch + 17, []grantStep{
			{'P', 0, 0, 0}, {'T', 0, 0, 0},
			{'G', 10, 5000, 5000}, {'G', 20, 2500, 7500}, // its window: an hour from 20
			{'P', hour + 19, 0, 7500},
			{'T', hour + 19, 0, 7500},
			{'P', hour + 20, 0, 0},
			{'P', 21, 0, 0},
		}},
		{"calendar", month, feb, []grantStep{
			{'T', 10, 0, 0}, {'G', 11, 2000, 2000}, {'G', 12, 500, 2500},
			{'P', march - 1, 0, 2500}, {'P', march, 0, 0},
		}},
		{"token_bucket", mustLimit(t, TokenBucket, 10, time.Hour, 0, 0), epoch, []grantStep{
			{'T', 0, 0, 0}, {'G', 1, 5000, 0}, {'P', 2, 0, 0},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := c.limit
			var s State
			for i, st := range c.steps {
				now := c.start + st.at
				switch st.op {
				case 'G':
					_, err := l.Grant(&s, now, st.amount)
					if !l.Grantable() {
						if err == nil {
							t.Fatalf("step %d: %s took a grant", i, l.Kind)
						}
						break
					}
					if err != nil {
						t.Fatalf("step %d: Grant(%d, %d): %v", i, st.at, st.amount, err)
					}
				case 'T':
					l.Take(&s, now, Milli)
				case 'P':
					l.Peek(&s, now, Milli)
				}
				before := cloneState(s)
				if g := l.Granted(&s, now); g != st.want {
					t.Fatalf("step %d: after %c, Granted(%d) = %d, want %d", i, st.op, st.at, g, st.want)
				}
				if !sameState(s, before) {
					t.Fatalf("step %d: Granted changed the state: %+v, was %+v", i, s, before)
				}
			}
		})
	}
}

// TestGrantedAsPeek: on random walks of takes, undos, grants and peeks,
// forwards, still and backwards, Granted of the state as it is tells the
// grant the state holds once a Peek has brought it up to date, and
// changes nothing.
func TestGrantedAsPeek(t *testing.T) {
	loc := mustLoc(t, "Europe/Berlin")
	day, _ := NewCalendarLimit(5, Calendar{Day, 1, loc})
	for _, l := range []Limit{
		mustLimit(t, FixedWindow, 5, time.Second, 0, 0),
		mustLimit(t, SlidingWindow, 5, time.Second, 0, 0),
		mustLimit(t, SlidingLog, 5, time.Second, 0, 0),
		day,
	} {
		t.Run(l.Kind.String()+l.Calendar.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(l.Window)))
			now := micros(time.Date(2026, 10, 24, 22, 0, 0, 0, loc)) // a DST change ahead
			var s State
			var taken []Decision
			granted := 0
			for i := 0; i < 20000; i++ {
				switch r := rng.IntN(10); {
				case r < 4:
					now += rng.Int64N(l.Window / 3)
				case r < 5:
					now -= rng.Int64N(l.Window / 3)
				}
				before := cloneState(s)
				g := l.Granted(&s, now)
				if !sameState(s, before) {
					t.Fatalf("step %d: Granted changed the state", i)
				}
				p := cloneState(s)
				l.Peek(&p, now, Milli)
				if up := l.granted(&p); up != g {
					t.Fatalf("step %d at %d: Granted = %d, the state brought up to date holds %d; state %+v", i, now, g, up, before)
				}
				if g > 0 {
					granted++
				}
				switch r := rng.IntN(10); {
				case r < 6:
					if d := l.Take(&s, now, rng.Int64N(2*Milli)); d.Allowed {
						taken = append(taken, d)
					}
				case r < 7 && len(taken) > 0:
					l.Undo(&s, now, Milli, taken[rng.IntN(len(taken))])
				case r < 8:
					if _, err := l.Grant(&s, now, rng.Int64N(3*Milli)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if granted < 1000 {
				t.Fatalf("only %d steps found a grant: the walk does not test Granted", granted)
			}
		})
	}
}

// TestGrantedAllocs: Granted allocates nothing.
func TestGrantedAllocs(t *testing.T) {
	l := mustLimit(t, SlidingLog, 100, time.Minute, 0, 0)
	var s State
	now := int64(1_800_000_000_000_000)
	l.Take(&s, now, 3*Milli)
	_, _ = l.Grant(&s, now, 2*Milli)
	var g int64
	if n := testing.AllocsPerRun(1000, func() {
		now++
		g += l.Granted(&s, now)
	}); n != 0 || g == 0 {
		t.Fatalf("Granted allocates %v times per call (granted %d), want 0", n, g)
	}
}

// cloneState returns a copy of s with its own log.
func cloneState(s State) State {
	s.Log = slices.Clone(s.Log)
	return s
}

// sameState reports whether a and b hold the same state.
func sameState(a, b State) bool {
	return a.At == b.At && a.Level == b.Level && a.Prev == b.Prev && a.Head == b.Head && slices.Equal(a.Log, b.Log)
}

// TestGrantedEdges: Granted is 0 from a sliding_log grant's end exactly,
// and from a calendar window's end exactly; and it holds a clock behind
// the log's newest entry at that entry (as logNow does), so that an entry
// seeded past the grant's end ends it.
func TestGrantedEdges(t *testing.T) {
	l := mustLimit(t, SlidingLog, 3, time.Minute, 0, 0)
	var s State
	if _, err := l.Grant(&s, t0, Milli); err != nil {
		t.Fatal(err)
	}
	end := t0 + 60*sec
	if g := l.Granted(&s, end-1); g != Milli {
		t.Fatalf("a µs before the grant's end: Granted %d, want %d", g, Milli)
	}
	if g := l.Granted(&s, end); g != 0 {
		t.Fatalf("at the grant's end: Granted %d, want 0", g)
	}
	l.Seed(&s, Decision{Allowed: true, Remaining: 2, Reset: 60 * sec, At: end + 5}, Milli, true)
	if g := l.Granted(&s, t0+1); g != 0 {
		t.Fatalf("with an entry past the grant's end: Granted %d at t0+1µs, want 0 (the clock held at the entry)", g)
	}
	cal, err := NewCalendarLimit(2, Calendar{Day, 1, time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	d0 := micros(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	var c State
	if _, err := cal.Grant(&c, d0+5, Milli); err != nil {
		t.Fatal(err)
	}
	if g := cal.Granted(&c, d0+86400e6-1); g != Milli {
		t.Fatalf("a µs before the day's end: Granted %d, want %d", g, Milli)
	}
	if g := cal.Granted(&c, d0+86400e6); g != 0 {
		t.Fatalf("at the day's end: Granted %d, want 0", g)
	}
}
