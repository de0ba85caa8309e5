package algorithms

// Mutants no test can kill (scripts/mutation.sh ./algorithms lists them
// as LIVED): each changes no decision, for the reason given. Lines as of
// the commit that wrote this note; the mutation is gremlins'.
//
//   - window.go:174 `prev <= 0` to `prev < 0`, and `toNext <= 0` to
//     `toNext < 0`: at 0 the product is 0, and the division gives 0.
//   - window.go:208 `room >= 0` to `room > 0`: at room 0 the next
//     window's branch waits W - e plus decayed(limit - cost, limit - cost,
//     0) = 0, as decayed(prev, 0, e+1) - e does (the weight is 0 only at
//     the window's end).
//   - window.go:211 `e+1` to `e-1`: the request was refused at e, so it
//     does not fit at e or before (the weight never grows with e'); the
//     search from e-1 ends where the search from e+1 does.
//   - window.go:256 `s.Head > 0` to `>= 0`: at 0, max(0, 0 - cost) is 0.
//   - window.go:278 `g > 0` to `g >= 0`: with no whole event granted,
//     now + wait is the entry's end, and max(s.At, the same entry's end)
//     is that end whenever now + wait >= s.At.
//   - window.go:322 `s.Prev > 0` to `>= 0`: with Prev 0 the grant's end
//     At is read nowhere (every reader asks Prev > 0 first), so zeroing
//     it changes nothing.
//   - window.go:365 `c > minLog` to `c >= minLog`: a ring of minLog
//     halves to max(minLog, c/2) = minLog, itself.
//   - limit.go:187 `scale < MaxScale` to `<=`: w/events >= 1, so at
//     scale 1024 w*scale/events >= 1024 >= precision and the loop has
//     stopped on its first condition.
//   - limit.go:197 `unit/scale` to `unit*scale`: a burst's refill passes
//     MaxSpan only at scale 1 (at a finer tick Unit is under 2001 ticks
//     and Burst at most 2^40: Tau under 2^51 <= MaxSpan * Scale), where
//     both are unit.
//   - limit.go:236 `math.Abs(m-r) > r*0x1p-50` to `>=`: equal only
//     where m is r, whole, and math.Ceil(m) is r too.
//   - limit.go:460 and :463, floorMicros's shift: for ticks >= 0 and a
//     power of two (every Scale NewLimit makes; 1 for the zero Limit)
//     the shift and the division give the same, so each mutant of the
//     choice between them (`ticks >= 0` to `> 0` or `< 0`, `== 0` to
//     `!= 0`, `sc-1` to `sc+1`) and of the division no valid Limit
//     reaches (`/` to `*`) decides the same; no tick count is negative.
//   - limit.go:468 `ticks <= 0` to `ticks < 0`: 0 ticks round up to
//     (Scale-1)/Scale, 0 µs.
//   - bucket.go:51 `l.MaxDelay > 0` to `>= 0`: the case is reached with
//     over > 0, and a MaxDelay of 0 is 0 ticks: over <= 0 fails.
//   - bucket.go:85 `elapsed >= l.micros(inc)` to `>`: at elapsed ==
//     micros(inc), ticks(elapsed) >= inc and the charge gives back
//     max(0, inc - ticks(elapsed)) = 0 either way.
//   - calendar.go:154 `now < p.Start` to `<=`: at now == p.Start the loop
//     steps back a window and the next loop steps forward to the same.
//   - calendar.go:160 `i + c.Count` to `i - c.Count`: since start places
//     a skipped midnight at the DST change, index and start agree in the
//     zones tested and the loop does not run; it stays as a guard should
//     they ever disagree.
//   - calendar.go:197 Month's `28*24 - 1` to `28*24 + 1` (and `-1` to
//     `+1`): a month of 671 hours holds 2.4e12 µs, more than MaxEvents,
//     which NewLimit refuses first: the events bound never decides.
//   - seed.go:45 `n.Level > s.Level` to `>=`: equal, the copy is set to
//     what it holds.
//   - seed.go:149 `d.Reset <= 0` to `< 0`: a sliding_window decision of
//     Reset 0 tells both windows empty: seedUsed is 0 and the merge
//     keeps s as it is.
//   - seed.go:167 `left <= 0` to `left < 0`: at 0 the quotient is 0.
//   - seed.go:153 `s.Prev > s.Head` to `>=`: with Prev == Head the
//     block sets Prev to max(Head, a bound below Prev): Prev again.
//   - seed.go:189 `s.Prev > 0` to `>= 0`: with Prev 0, n grows by 0.
//   - seed.go:200 `s.entry(pos-1) > d.At` to `>=`: entries of one time
//     are interchangeable; d.At goes before or after its equals.
//   - lease.go:115 `want <= 0` to `want < 0`: LeaseSize(0, room) is 0,
//     below MinQuotaLease: no lease either way.
//   - seed.go:203 `over > 0` to `over >= 0`: at 0 nothing is dropped
//     and k is kept.
//   - seed.go:222 `<= now-l.Window` to `<`: an entry exactly W old at
//     d.At is kept, but every decision reads the log at d.At or later
//     (logNow holds the clock at its newest entry) and drops it first.
//   - seed.go:246 `strikes > 0` to `>= 0`: no strikes set Level 0, which
//     reads as no strike window; `d.Reset > 0` to `>= 0`: an admitting
//     ban decision with strikes has Reset > 0 (banned sets it).
//   - seed.go:229 `s.Level > 0` to `>= 0`: every caller asks at most
//     Level entries dropped (k <= Level), so the loop ends on k first.
//   - seed.go:254 `s.Level > 0` to `>= 0`: a ban's state has Prev 0
//     whenever its Level is 0 (Strike and seedBan set a strike window's
//     end only with strikes, and clear both together), so clearing both
//     at Level 0 changes nothing.
//   - settle.go:54 `actual < reserved` to `<=`, and :56 `actual >
//     reserved` to `>=`: equal, the undo or debt is of 0.
//   - settle.go:70 `x <= 0` to `x < 0`: owing 0 brings the state up to
//     date with now (no decision changes) and adds 0.
//   - settle.go:79 `s.At-now > MaxSpan*4` to `>=`: a TAT 4 MaxSpan ahead
//     is a debt above OwedCap, which owe leaves as it is.
//   - settle.go:105 `cost <= 0` to `cost < 0`: a cost of 0 owes inc(0) =
//     0, or 0 for a window.
//   - adaptive.go:378 `cand < s.Baseline` to `<=`, and :381
//     `cand < s.epochLo` to `<=`: equal, the field is set to what it
//     holds.
//   - adaptive.go:398 `g < 1` to `g <= 1`: at g == 1 the branch sets g
//     to 1.
//   - adaptive.go:214 `c.Percentile > 0` to `>= 0`, and :218
//     `c.Smoothing > 0` to `>= 0`: 0 is the default's (NewAdaptive
//     fills it in before the checks), never checked.
//
// Mutants that make a test hang (a loop that no longer ends or advances:
// roll's window start, decayed's search, slidingLog's and
// slidingLogUndo's loops, floorDiv, the calendar's starts and index
// offsets that put a period decades away) are TIMED OUT: the test does
// not pass, and the mutant counts neither killed nor lived.
