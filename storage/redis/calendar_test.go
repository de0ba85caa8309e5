package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/caddy-tollgate/tollgate/algorithms"
	"github.com/caddy-tollgate/tollgate/internal/redistest"
	"github.com/caddy-tollgate/tollgate/storage"
	"github.com/caddy-tollgate/tollgate/storage/memory"
)

var calendarZones = []string{"UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe"}

func loadLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func calendarLimit(t testing.TB, events int64, unit algorithms.Unit, count int64, loc *time.Location) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewCalendarLimit(events, algorithms.Calendar{Unit: unit, Count: count, Loc: loc})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// grant is a step of the calendar traces: 'G' grants cost.
const grant op = 'G'

// boundarySteps walks the windows of l from..to: around each window's
// end, a millisecond and a µs before and after it, and random steps
// within (forward, still, now and then backward), with takes, undos,
// peeks and grants of random cost.
func boundarySteps(rng *rand.Rand, l *algorithms.Limit, from, to int64) []step {
	var steps []step
	add := func(now int64) {
		switch r := rng.IntN(20); {
		case r < 12:
			steps = append(steps, T(now, randomCost(rng, l.Capacity())))
		case r < 14:
			steps = append(steps, step{undo, now, randomCost(rng, l.Capacity()), rng.IntN(3)})
		case r < 17:
			steps = append(steps, P(now))
		default:
			steps = append(steps, step{grant, now, rng.Int64N(3 * algorithms.Milli), 0})
		}
	}
	for start := from; start < to; {
		var end int64
		if l.Calendar.Unit != algorithms.NoUnit {
			end = l.Calendar.Period(start).End
		} else {
			end = start - start%l.Window + l.Window
		}
		for i := 0; i < 4; i++ {
			add(start + rng.Int64N(end-start))
		}
		for _, now := range []int64{end - ms, end - ms, end - 1, end, end, end + 1, end + ms, end - 2*ms, end + ms} {
			add(now)
		}
		start = end
	}
	return steps
}

// runCalendarParity runs steps through l in Go and through zl, and fails
// at the first decision that differs.
func runCalendarParity(t *testing.T, zl storage.Limiter, l algorithms.Limit, steps []step) (n tally) {
	t.Helper()
	ctx := context.Background()
	key := "k"
	var state algorithms.State
	var admitted []algorithms.Decision
	for i, st := range steps {
		var want, got algorithms.Decision
		var err error
		ok := true
		switch st.op {
		case take:
			want = l.Take(&state, st.now, st.cost)
			got, err = zl.Take(ctx, key, st.now, st.cost)
			if got.Allowed {
				admitted = append(admitted, got)
				n.allowed++
			} else {
				n.rejected++
			}
		case undo:
			var taken algorithms.Decision
			if k := len(admitted) - 1 - st.ref; k >= 0 {
				taken = admitted[k]
			}
			l.Undo(&state, st.now, st.cost, taken)
			err = zl.Undo(ctx, key, st.now, st.cost, taken)
		case peek:
			// PeekGrant's grant as well: the Lua's and Limit.Granted's.
			c := copyState(state)
			want = l.Peek(&c, st.now, algorithms.Milli)
			var granted int64
			got, granted, ok, err = zl.(storage.GrantPeeker).PeekGrant(ctx, key, st.now)
			if err == nil && !ok {
				n.absent++
				var fresh algorithms.State
				got = l.Peek(&fresh, st.now, algorithms.Milli)
			}
			if g := l.Granted(&state, st.now); err == nil && granted != g {
				t.Fatalf("step %d: %c at %d: granted %d, want %d (Go)", i, st.op, st.now, granted, g)
			}
			if granted > 0 {
				n.granted++
			}
		case grant:
			want, _ = l.Grant(&state, st.now, st.cost)
			got, err = zl.(storage.Granter).Grant(ctx, key, st.now, st.cost)
		}
		if err != nil {
			t.Fatalf("step %d: %c at %d cost %d: %v", i, st.op, st.now, st.cost, err)
		}
		if got != want {
			loc := l.Calendar.Loc
			if loc == nil {
				loc = time.UTC // an epoch window
			}
			t.Fatalf("step %d: %c at %d (%s) cost %d = %+v (ok=%v), want %+v (Go)", i, st.op, st.now,
				time.UnixMicro(st.now).In(loc), st.cost, got, ok, want)
		}
	}
	return n
}

// TestCalendarParity walks calendar windows of days, weeks and months in
// five time zones (two DST changes a year, a half-hour offset, a half-hour
// DST change) over a year and more (a 29th of February) through the Go
// algorithm and its Lua twin, with grants, and the window algorithms'
// grants on epoch windows too (fixed_window, sliding_window and
// sliding_log); through EVALSHA and FCALL. A peek tells the grant
// (PeekGrant) that Limit.Granted tells.
func TestCalendarParity(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []string{"evalsha", "fcall"} {
		s := newTestStore(srv.Client())
		if mode == "fcall" {
			withFunctions(t, s)
		}
		t.Run(mode, func(t *testing.T) {
			for zi, name := range calendarZones {
				loc := loadLoc(t, name)
				from := time.Date(2027, 12, 1, 0, 0, 0, 0, loc).UnixMicro()
				to := time.Date(2029, 1, 10, 0, 0, 0, 0, loc).UnixMicro()
				for _, c := range []struct {
					unit  algorithms.Unit
					count int64
					to    int64
				}{{algorithms.Day, 1, to}, {algorithms.Day, 2, from + 70*24*3600e6}, {algorithms.Week, 1, to}, {algorithms.Month, 1, to}, {algorithms.Month, 3, to}} {
					l := calendarLimit(t, 4, c.unit, c.count, loc)
					rng := rand.New(rand.NewPCG(uint64(zi), uint64(c.unit)*10+uint64(c.count)))
					zname := fmt.Sprintf("%s-%s-%s", mode, name, l.Calendar)
					n := runCalendarParity(t, zoneOf(s, zname, l), l, boundarySteps(rng, &l, from, c.to))
					t.Logf("%s: %+v", zname, n)
					if n.granted == 0 {
						t.Errorf("%s: no peek told a grant", zname)
					}
				}
			}
			for _, l := range []algorithms.Limit{
				mustLimit(t, algorithms.FixedWindow, 4, time.Second, 0, 0),
				mustLimit(t, algorithms.FixedWindow, 7, 13*time.Second, 0, 0),
				mustLimit(t, algorithms.SlidingWindow, 4, time.Second, 0, 0),
				mustLimit(t, algorithms.SlidingWindow, 7, 13*time.Second, 0, 0),
				mustLimit(t, algorithms.SlidingLog, 4, time.Second, 0, 0),
				mustLimit(t, algorithms.SlidingLog, 7, 13*time.Second, 0, 0),
			} {
				rng := rand.New(rand.NewPCG(7, uint64(l.Window)))
				zname := fmt.Sprintf("%s-grant-%s-%d", mode, l.Kind, l.Window)
				n := runCalendarParity(t, zoneOf(s, zname, l), l, boundarySteps(rng, &l, epoch, epoch+300*l.Window))
				t.Logf("%s: %+v", zname, n)
				if n.granted == 0 {
					t.Errorf("%s: no peek told a grant", zname)
				}
			}
		})
	}
}

// TestCalendarSkewedInstances: instances whose own clocks disagree with
// Redis's compute their spans from their clocks, and Redis's clock still
// decides: a request a millisecond before and after midnight counts in
// the right day for an instance an hour ahead or hours behind; an
// instance too far ahead for a fresh key is refused, and writes nothing.
func TestCalendarSkewedInstances(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	berlin := loadLoc(t, "Europe/Berlin")
	l := calendarLimit(t, 2, algorithms.Day, 1, berlin)
	midnight := time.Date(2026, 10, 26, 0, 0, 0, 0, berlin).UnixMicro() // after the 25-hour day
	hour := int64(3600e6)
	ctx := context.Background()
	for _, skew := range []int64{-20 * hour, -5 * hour, -1, 0, 1, hour / 2, hour - 1} {
		s := newTestStore(c)
		s.skew = skew
		z := zoneOf(s, fmt.Sprintf("skew%d", skew), l)
		for i, want := range []bool{true, true, false} {
			d, err := z.Take(ctx, "k", midnight-ms, algorithms.Milli)
			if err != nil || d.Allowed != want || (!d.Allowed && d.Wait != ms) {
				t.Fatalf("skew %d: take %d a ms before midnight: %+v, %v; want allowed=%v", skew, i, d, err, want)
			}
		}
		for i, want := range []bool{true, true, false} {
			d, err := z.Take(ctx, "k", midnight+ms, algorithms.Milli)
			if err != nil || d.Allowed != want {
				t.Fatalf("skew %d: take %d a ms after midnight: %+v, %v; want allowed=%v", skew, i, d, err, want)
			}
			if want && d.Reset != 24*hour-ms {
				t.Fatalf("skew %d: take %d: reset %d, want the day's end", skew, i, d.Reset)
			}
		}
	}
	// Two hours ahead, a fresh key a millisecond before midnight: its
	// span starts at midnight.
	s := newTestStore(c)
	s.skew = 2 * hour
	z := zoneOf(s, "ahead", l)
	if _, err := z.Take(ctx, "k", midnight-ms, algorithms.Milli); err == nil || !strings.Contains(err.Error(), "TOLLGATE_SPAN") {
		t.Fatalf("an instance 2h ahead on a fresh key: %v, want the script's refusal", err)
	}
	if exists(t, c, s.Key("ahead", algorithms.FixedWindow, "k")) {
		t.Fatal("a refused decision wrote the key")
	}
	// Once Redis's clock is in the instance's span, it decides.
	if d, err := z.Take(ctx, "k", midnight+ms, algorithms.Milli); err != nil || !d.Allowed {
		t.Fatalf("after midnight: %+v, %v", d, err)
	}
}

// TestCalendarThreeInstances: three instances whose clocks disagree (one
// 40 minutes ahead of Redis, one 3 hours behind) take concurrently from
// one key while Redis's clock crosses midnight in New York, and then the
// spring DST change: no day ever admits more than its quota, and each
// admits all of it.
func TestCalendarThreeInstances(t *testing.T) {
	srv := redistest.Start(t)
	ny := loadLoc(t, "America/New_York")
	const quota = 50
	l := calendarLimit(t, quota, algorithms.Day, 1, ny)
	hour := int64(3600e6)
	for _, day := range []time.Time{time.Date(2026, 1, 15, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)} {
		midnight := day.UnixMicro()
		var redisNow atomic.Int64
		redisNow.Store(midnight - 2*sec)
		var zones []storage.Limiter
		for i, skew := range []int64{40 * 60 * sec, 0, -3 * hour} {
			s := newTestStore(srv.Client())
			s.skew = skew
			if i == 1 {
				// Pipelined, as the function library's batch: batch.lua.
				s = NewPipelined(srv.Client(), "test:")
				s.callerClock, s.ttlSlack, s.skew = true, testSlack.Milliseconds(), skew
				withFunctions(t, s)
				defer s.Close()
			}
			zones = append(zones, zoneOf(s, "three", l))
		}
		var mu sync.Mutex
		admitted := map[int64]int{}
		var wg sync.WaitGroup
		var stop atomic.Bool
		var made atomic.Int64 // requests made, to hold each clock step for 30
		for _, z := range zones {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					d, err := z.Take(context.Background(), day.Format("k-2006-01-02"), redisNow.Load(), algorithms.Milli)
					made.Add(1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						admitted[l.Calendar.Period(d.At).Start]++
						mu.Unlock()
					}
				}
			}()
		}
		// Redis's clock: 4 seconds across midnight, in 100ms steps, each
		// held while the instances make 30 requests.
		for now := midnight - 2*sec; now <= midnight+2*sec; now += 100 * ms {
			redisNow.Store(now)
			for target := made.Load() + 30; made.Load() < target && !t.Failed(); {
				time.Sleep(100 * time.Microsecond)
			}
		}
		stop.Store(true)
		wg.Wait()
		for start, n := range admitted {
			if n > quota {
				t.Errorf("%s: the day from %s admitted %d, want at most %d", day.Format("2006-01-02"), time.UnixMicro(start).In(ny), n, quota)
			}
		}
		if len(admitted) != 2 || admitted[midnight] != quota {
			t.Errorf("%s: admitted per day %v, want %d in each of two days", day.Format("2006-01-02"), admitted, quota)
		}
	}
}

// TestCalendarTakeAll: a daily and a monthly calendar quota on one key,
// decided together by multi.lua (TakeAll), across days and a month's end
// (in Kolkata), decide as the memory store's TakeAll does: a request
// passes only if both admit it, and a rejected one is charged nowhere.
func TestCalendarTakeAll(t *testing.T) {
	srv := redistest.Start(t)
	kolkata := loadLoc(t, "Asia/Kolkata")
	dayL := calendarLimit(t, 3, algorithms.Day, 1, kolkata)
	monthL := calendarLimit(t, 7, algorithms.Month, 1, kolkata)
	for _, mode := range []string{"evalsha", "fcall"} {
		s := newTestStore(srv.Client())
		if mode == "fcall" {
			withFunctions(t, s)
		}
		rz := []storage.Limiter{zoneOf(s, mode+"-daily", dayL), zoneOf(s, mode+"-monthly", monthL)}
		mz := []*memory.Store{memory.New(storage.Zone{Name: "daily", Limit: dayL}), memory.New(storage.Zone{Name: "monthly", Limit: monthL})}
		start := time.Date(2026, 1, 29, 23, 59, 59, 0, kolkata).UnixMicro()
		rng := rand.New(rand.NewPCG(3, 4))
		admitted := 0
		for i := 0; i < 400; i++ {
			now := start + int64(i)*(6*3600e6/10) + rng.Int64N(ms) // 10 steps per 6 hours
			cost := algorithms.Milli * (1 + rng.Int64N(2))
			want := make([]algorithms.Decision, 2)
			wantRejected := memory.TakeAll(now, []memory.Request{{Store: mz[0], Key: "k", Cost: cost}, {Store: mz[1], Key: "k", Cost: cost}}, want)
			got, rejected, err := s.TakeAll(context.Background(), now, []Request{{Zone: rz[0], Key: "k", Cost: cost}, {Zone: rz[1], Key: "k", Cost: cost}})
			if err != nil {
				t.Fatalf("%s step %d: %v", mode, i, err)
			}
			want[0].Entry, want[1].Entry = 0, 0 // the memory store's entries: Redis keeps none
			if rejected != wantRejected || got[0] != want[0] || got[1] != want[1] {
				t.Fatalf("%s step %d at %s: %d %+v, want %d %+v (memory)", mode, i, time.UnixMicro(now).In(kolkata), rejected, got, wantRejected, want)
			}
			if rejected < 0 {
				admitted++
			}
		}
		if admitted == 0 {
			t.Fatalf("%s: nothing admitted", mode)
		}
	}
}
