package kv

// Batch builds the pairs of one Iterator.Next. Adaptors copy every pair out
// of engine buffers (the contract gives the slices to the caller), and
// copying each key and value into its own allocation would dominate a scan;
// Batch packs them into a few shared chunks instead, and bounds a batch by
// pair count and bytes the same way in every adaptor.
type Batch struct {
	pairs []Pair
	arena []byte
	want  int
	size  int
}

// Batch sizing shared by the adaptors.
const (
	// DefaultBatchPairs is the batch size when ScanOptions.BatchSize is 0.
	DefaultBatchPairs = 256
	// MaxBatchBytes ends a batch early once its keys and values reach it.
	MaxBatchBytes = 4 << 20
	// arenaChunk is the largest copy buffer allocated at once.
	arenaChunk = 64 << 10
)

// BatchWant returns how many pairs the next batch may hold: the scan's batch
// size hint (DefaultBatchPairs when 0), capped by what Limit leaves after
// yielded pairs.
func BatchWant(opts ScanOptions, yielded int) int {
	n := opts.BatchSize
	if n <= 0 {
		n = DefaultBatchPairs
	}
	if opts.Limit > 0 {
		n = min(n, opts.Limit-yielded)
	}
	return max(n, 0)
}

// NewBatch starts a batch of at most want pairs.
func NewBatch(want int) *Batch {
	return &Batch{pairs: make([]Pair, 0, min(want, DefaultBatchPairs)), want: want}
}

// Full reports whether the batch reached its pair count or byte budget.
func (b *Batch) Full() bool {
	return len(b.pairs) >= b.want || b.size >= MaxBatchBytes
}

// Len returns the number of pairs added.
func (b *Batch) Len() int { return len(b.pairs) }

// Add copies key and value into the batch.
func (b *Batch) Add(key, value []byte) {
	need := len(key) + len(value)
	if cap(b.arena)-len(b.arena) < need {
		// Size the chunk for the rest of the batch, assuming its pairs are
		// like this one, so a one-pair batch allocates one pair.
		b.arena = make([]byte, 0, max(need, min(arenaChunk, need*(b.want-len(b.pairs)))))
	}
	off := len(b.arena)
	b.arena = append(b.arena, key...)
	kEnd := len(b.arena)
	b.arena = append(b.arena, value...)
	// Full slice expressions keep a caller's append from running into the
	// neighbouring pair.
	b.pairs = append(b.pairs, Pair{Key: b.arena[off:kEnd:kEnd], Value: b.arena[kEnd:len(b.arena):len(b.arena)]})
	b.size += need
}

// Pairs returns the batch.
func (b *Batch) Pairs() []Pair { return b.pairs }
