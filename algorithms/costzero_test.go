package algorithms

import (
	"reflect"
	"testing"
	"time"
)

// TestCostZero pins what docs/reference.md says of a cost of 0: it takes
// nothing, and is admitted unless the key is over its limit. At the
// limit (a request of the smallest cost refused) it is admitted and
// leaves the state as it was; over it (a settlement's excess owed, which
// a sliding_log cannot hold) it is refused, until the key is back within
// its limit.
func TestCostZero(t *testing.T) {
	const now = int64(1_767_225_600_000_000)
	for _, kind := range []Kind{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog} {
		t.Run(kind.String(), func(t *testing.T) {
			l := mustLimit(t, kind, 4, time.Hour, 0, 0)
			s := NewState(&l)
			for i := 0; l.Take(&s, now, Milli).Allowed; i++ {
				if i > 10 {
					t.Fatal("4 an hour admitted more than 10 at once")
				}
			}
			before := s
			before.Log = append([]int64(nil), s.Log...)
			if d := l.Take(&s, now, 0); !d.Allowed {
				t.Fatalf("at the limit, a cost of 0 refused: %+v", d)
			}
			if !reflect.DeepEqual(s, before) {
				t.Fatalf("a cost of 0 changed the state: %+v, was %+v", s, before)
			}
			l.Owe(&s, now, 3*Milli)
			d := l.Take(&s, now+1, 0)
			if kind == SlidingLog {
				if !d.Allowed {
					t.Fatalf("a sliding_log holds no excess, yet a cost of 0 was refused: %+v", d)
				}
				return
			}
			if d.Allowed {
				t.Fatalf("over the limit (an excess owed), a cost of 0 admitted: %+v", d)
			}
			if d := l.Take(&s, now+time.Hour.Microseconds()*2, 0); !d.Allowed {
				t.Fatalf("two windows on, a cost of 0 refused: %+v", d)
			}
		})
	}
}
