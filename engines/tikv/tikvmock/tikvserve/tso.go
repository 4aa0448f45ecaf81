package tikvserve

import (
	"sync"
	"time"
)

// logicalBits is the width of a TSO's logical part (PD's and client-go's).
const logicalBits = 18

// oracle is PD's timestamp oracle: strictly increasing timestamps, the
// physical part in milliseconds of wall time. The mock's PD client cannot
// serve it: a TSO request asks for Count timestamps at once and the client
// takes the Count logical values ending at the one answered, so they must
// be contiguous, which the mock's one-at-a-time GetTS does not promise.
// It survives Stop and Start, so timestamps never go back across a
// restart of the fake.
type oracle struct {
	mu       sync.Mutex
	physical int64
	logical  int64 // the last logical value handed out at physical
}

// next reserves count timestamps and returns the physical part and the
// last logical value of the range.
func (o *oracle) next(count int64) (physical, logical int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if now := time.Now().UnixMilli(); now > o.physical {
		o.physical, o.logical = now, 0
	}
	if o.logical+count >= 1<<logicalBits {
		// The logical space of this millisecond is spent: borrow the
		// next one, as PD does.
		o.physical++
		o.logical = 0
	}
	o.logical += count
	return o.physical, o.logical
}
