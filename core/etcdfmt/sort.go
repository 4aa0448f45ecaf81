package etcdfmt

import (
	"bufio"
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

const (
	defaultSortMem = 64 << 20
	// sortIndexOverhead is what one buffered row costs besides its encoded
	// bytes: its sortItem, and its two entries of the sort's scratch
	// (radixScratch).
	sortIndexOverhead = 48 + 2*24
	// A merge reads each run through its own buffer; the buffers share
	// the memory limit but never shrink below minRunBuf (tiny buffers make
	// the merge one read call per row) nor grow beyond maxRunBuf (bigger
	// buffers no longer speed up sequential reads).
	minRunBuf = 4 << 10
	maxRunBuf = 1 << 20
	// ctxCheckEvery is how many rows pass between context checks.
	ctxCheckEvery = 1024
)

// Sorter puts entries into revision order using bounded memory: it keeps up
// to memLimit bytes of rows, sorts them, spills each full batch to a run
// file in dir, and merges the runs. A batch is sorted and written while
// the next one fills, so memory holds up to two batches once it spills.
//
// Rows are kept encoded in blocks of bytes rather than as Entry values so
// that a batch costs its bytes plus a small index entry and no allocation
// per row; blocks, unlike one growing buffer, are never copied, and serve
// the next batch after a spill (a doubling buffer was most of what a
// snapshot allocated).
// All runs go to a single spill file, each run a section of it, so a merge
// needs one file descriptor however many runs there are.
//
// A Sorter made by NewKeySorter orders by key instead, and by revision
// among the rows of one key.
//
// A Sorter is not safe for concurrent use.
type Sorter struct {
	dir      string
	memLimit int
	byKey    bool

	blocks [][]byte   // encoded rows of the batch in memory; the last one is filled
	used   int        // bytes of rows in blocks
	items  []sortItem // their revisions and places in blocks

	spill  *os.File
	spillW *bufio.Writer
	spillN int64   // bytes written to spill
	runs   []int64 // start offset of each run in spill; a run ends where the next begins
	// spilling carries the result of the batch being written (spillBatch),
	// nil when none is; spare is the batch written last, whose buffers
	// the next batch reuses.
	spilling chan error
	spare    *Sorter
	// shared is how many leading bytes every key of the batch has in
	// common (a key sorter's: see sortBatch).
	shared int
	// radix is the sort's scratch memory, lent to the batch being
	// written: one batch is sorted at a time.
	radix   *radixScratch
	n       int64
	sealed  bool
	scratch []byte
}

// sortItem locates one encoded row of the in-memory batch, and its key
// (a key sorter compares keys without decoding rows). A key sorter also
// keeps 16 bytes of the key in it, those after the batch's shared prefix:
// most comparisons end there, without a cache miss into the blocks.
type sortItem struct {
	rev            Revision
	block, off     uint32
	keyOff, keyLen uint32
	head           [2]uint64
}

// NewSorter returns a Sorter that spills to dir ("" means os.TempDir()) and
// keeps up to memLimit bytes of rows in memory (<= 0 means 64 MiB).
func NewSorter(dir string, memLimit int) *Sorter {
	if dir == "" {
		dir = os.TempDir()
	}
	if memLimit <= 0 {
		memLimit = defaultSortMem
	}
	return &Sorter{dir: dir, memLimit: memLimit, radix: &radixScratch{}}
}

// NewKeySorter is NewSorter for (key, revision) order. It does not reject
// two rows with the same revision: sorted by key, they need not meet.
func NewKeySorter(dir string, memLimit int) *Sorter {
	s := NewSorter(dir, memLimit)
	s.byKey = true
	return s
}

// compare orders two rows by the sorter's order.
func (s *Sorter) compare(aKey []byte, a Revision, bKey []byte, b Revision) int {
	if s.byKey {
		if c := bytes.Compare(aKey, bKey); c != 0 {
			return c
		}
	}
	switch {
	case a.Less(b):
		return -1
	case b.Less(a):
		return 1
	}
	return 0
}

func (s *Sorter) itemKey(it sortItem) []byte {
	return s.blocks[it.block][it.keyOff : it.keyOff+it.keyLen]
}

// Len returns the number of rows added.
func (s *Sorter) Len() int64 { return s.n }

// Add adds a copy of e (callers may reuse e and its buffers).
func (s *Sorter) Add(e *Entry) error {
	if s.sealed {
		return errors.New("etcdfmt: sort: Add after Each")
	}
	var keyAt int
	s.scratch, keyAt = appendSortRecord(s.scratch[:0], e)
	rec := s.scratch
	if len(s.items) > 0 && s.used+len(rec)+(len(s.items)+1)*sortIndexOverhead > s.memLimit {
		if err := s.spillBatch(); err != nil {
			return err
		}
	}
	if s.byKey {
		s.share(e.KV.Key)
	}
	bi := s.room(len(rec))
	b := s.blocks[bi]
	off := len(b)
	s.items = append(s.items, sortItem{rev: e.Rev, block: uint32(bi), off: uint32(off), keyOff: uint32(off + keyAt), keyLen: uint32(len(e.KV.Key))})
	s.blocks[bi] = append(b, rec...)
	s.used += len(rec)
	s.n++
	return nil
}

// sortBlock is the size of the blocks rows are kept in; a larger row gets
// a block of its own.
const sortBlock = 1 << 20

// room returns the index of a block with room for n more bytes: the last
// one, or a new one after it (a block emptied by a spill is reused).
func (s *Sorter) room(n int) int {
	last := len(s.blocks) - 1
	if last >= 0 && cap(s.blocks[last])-len(s.blocks[last]) >= n {
		return last
	}
	if spare := len(s.blocks); spare < cap(s.blocks) {
		if b := s.blocks[:spare+1][spare]; cap(b) >= n {
			s.blocks = s.blocks[:spare+1]
			return spare
		}
	}
	s.blocks = append(s.blocks, make([]byte, 0, max(n, min(sortBlock, s.memLimit))))
	return len(s.blocks) - 1
}

// share narrows the batch's shared key prefix to the part key has; call it
// before key is added.
func (s *Sorter) share(key []byte) {
	if len(s.items) == 0 {
		s.shared = len(key)
		return
	}
	first := s.itemKey(s.items[0])
	n := min(s.shared, len(key))
	i := 0
	for i < n && first[i] == key[i] {
		i++
	}
	s.shared = i
}

func (s *Sorter) sortBatch() {
	if !s.byKey {
		sortByRevision(s.items, s.radix)
		return
	}
	// Keys of one kind share a long prefix (/registry/pods/...): bytes
	// compared from the start would mostly be equal, and each comparison
	// would read two keys from scattered blocks. A million such keys
	// sorted 1.7 s of CPU in bytes.Compare. The heads compare the first
	// bytes that differ, zero-padded: a shorter key's padding sorts it
	// first, and equal heads fall back to the whole key.
	for i := range s.items {
		it := &s.items[i]
		it.head = keyHead(s.itemKey(*it)[s.shared:])
	}
	sortByHead(s.items, s.radix, func(a, b sortItem) int { return s.compare(s.itemKey(a), a.rev, s.itemKey(b), b.rev) })
}

// keyHead is key's first 16 bytes as two big-endian numbers, zero-padded.
func keyHead(key []byte) [2]uint64 {
	var b [16]byte
	copy(b[:], key)
	return [2]uint64{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// spillBatch sorts the in-memory batch and appends it to the spill file as
// one run.
func (s *Sorter) spillBatch() error {
	if s.spill == nil {
		f, err := os.CreateTemp(s.dir, "engram-sort-*.run")
		if err != nil {
			return fmt.Errorf("etcdfmt: sort: create run file: %w", err)
		}
		s.spill = f
		s.spillW = bufio.NewWriterSize(f, 256<<10)
	}
	if err := s.waitSpill(); err != nil {
		return err
	}
	// The full batch is sorted and written on a goroutine of its own
	// while the next one fills the buffers of the batch spilled before:
	// reading the input and sorting take a core each.
	full := &Sorter{byKey: s.byKey, blocks: s.blocks, items: s.items, shared: s.shared, radix: s.radix}
	// The next batch holds about as many rows: sized from this one, its
	// index is not grown (and copied) from nothing again.
	s.blocks, s.items, s.used = nil, make([]sortItem, 0, len(full.items)), 0
	if sp := s.spare; sp != nil {
		// Its blocks stay allocated, kept past the slice's length for
		// room to find.
		for i := range sp.blocks {
			sp.blocks[i] = sp.blocks[i][:0]
		}
		s.blocks, s.items = sp.blocks[:0], sp.items[:0]
	}
	s.spare = full
	s.runs = append(s.runs, s.spillN)
	done := make(chan error, 1)
	s.spilling = done
	go func() { done <- s.writeRun(full) }()
	return nil
}

// writeRun sorts batch and appends it to the spill file. It runs on its own
// goroutine: it touches only batch, spillW and spillN, which the Sorter
// leaves alone until waitSpill.
func (s *Sorter) writeRun(batch *Sorter) error {
	batch.sortBatch()
	for _, it := range batch.items {
		nn, err := s.spillW.Write(batch.record(it))
		s.spillN += int64(nn)
		if err != nil {
			return fmt.Errorf("etcdfmt: sort: write run: %w", err)
		}
	}
	return nil
}

// waitSpill waits for the batch being written, if any, and returns its
// error.
func (s *Sorter) waitSpill() error {
	if s.spilling == nil {
		return nil
	}
	err := <-s.spilling
	s.spilling = nil
	return err
}

// record returns the encoded row it points at, length prefix included.
func (s *Sorter) record(it sortItem) []byte {
	b := s.blocks[it.block][it.off:]
	n, w := binary.Uvarint(b)
	return b[:w+int(n)]
}

// Each calls fn with every row in (Main, Sub) order (in (Key, Main, Sub)
// order for a key sorter). Call it after the last
// Add; it may be called again, but Add may not. fn must not keep the entry
// or its byte slices after it returns: they are reused for the next row.
// Two rows with the same revision are an error: the input is corrupt.
func (s *Sorter) Each(ctx context.Context, fn func(*Entry) error) error {
	s.sealed = true
	if err := s.waitSpill(); err != nil {
		return err
	}
	// Nothing is added after this: the spare batch's blocks, and those
	// this batch reserved past its last one, would only hold memory
	// through the merge.
	s.spare = nil
	clear(s.blocks[len(s.blocks):cap(s.blocks)])
	s.sortBatch()
	its := []rowIter{&memIter{s: s}}
	if len(s.runs) > 0 {
		if err := s.spillW.Flush(); err != nil {
			return fmt.Errorf("etcdfmt: sort: write run: %w", err)
		}
		// The in-memory batch takes part in the merge as one more run, so
		// the last batch is never written.
		bufSize := min(max(s.memLimit/(len(s.runs)+1), minRunBuf), maxRunBuf)
		for i, start := range s.runs {
			end := s.spillN
			if i+1 < len(s.runs) {
				end = s.runs[i+1]
			}
			r := io.NewSectionReader(s.spill, start, end-start)
			its = append(its, &runIter{r: bufio.NewReaderSize(r, bufSize), name: s.spill.Name()})
		}
	}
	return mergeRows(ctx, s, its, fn)
}

// Close removes the spill file. It is safe to call more than once.
func (s *Sorter) Close() error {
	// A failed write is moot once the run file goes.
	_ = s.waitSpill()
	s.blocks, s.items, s.runs, s.spare = nil, nil, nil, nil
	if s.spill == nil {
		return nil
	}
	f := s.spill
	s.spill, s.spillW = nil, nil
	err := f.Close()
	if rerr := os.Remove(f.Name()); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("etcdfmt: sort: remove run file: %w", err)
	}
	return nil
}

// rowIter yields sorted rows; entry is valid until the next call to next.
type rowIter interface {
	next() (ok bool, err error)
	entry() *Entry
}

type memIter struct {
	s *Sorter
	i int
	e Entry
}

func (m *memIter) next() (bool, error) {
	if m.i >= len(m.s.items) {
		return false, nil
	}
	rec := m.s.record(m.s.items[m.i])
	m.i++
	_, w := binary.Uvarint(rec)
	if err := decodeSortRecord(rec[w:], &m.e); err != nil {
		return false, err
	}
	return true, nil
}

func (m *memIter) entry() *Entry { return &m.e }

type runIter struct {
	r    *bufio.Reader
	name string
	rec  []byte
	e    Entry
}

func (r *runIter) next() (bool, error) {
	n, err := binary.ReadUvarint(r.r)
	if err == io.EOF {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("etcdfmt: sort: read run %s: %w", r.name, err)
	}
	if uint64(cap(r.rec)) < n {
		r.rec = make([]byte, n)
	}
	r.rec = r.rec[:n]
	if _, err := io.ReadFull(r.r, r.rec); err != nil {
		return false, fmt.Errorf("etcdfmt: sort: read run %s: %w", r.name, err)
	}
	if err := decodeSortRecord(r.rec, &r.e); err != nil {
		return false, fmt.Errorf("etcdfmt: sort: read run %s: %w", r.name, err)
	}
	return true, nil
}

func (r *runIter) entry() *Entry { return &r.e }

// iterHeap orders row iterators by their current row, in the sorter's
// order.
type iterHeap struct {
	s   *Sorter
	its []rowIter
}

func (h *iterHeap) Len() int { return len(h.its) }
func (h *iterHeap) Less(i, j int) bool {
	a, b := h.its[i].entry(), h.its[j].entry()
	return h.s.compare(a.KV.Key, a.Rev, b.KV.Key, b.Rev) < 0
}
func (h *iterHeap) Swap(i, j int) { h.its[i], h.its[j] = h.its[j], h.its[i] }
func (h *iterHeap) Push(x any)    { h.its = append(h.its, x.(rowIter)) }
func (h *iterHeap) Pop() any {
	old := h.its
	x := old[len(old)-1]
	h.its = old[:len(old)-1]
	return x
}

// mergeRows is a k-way merge of sorted iterators that also rejects
// duplicate revisions, within one iterator or across several, in
// revision order.
func mergeRows(ctx context.Context, s *Sorter, its []rowIter, fn func(*Entry) error) error {
	h := &iterHeap{s: s, its: make([]rowIter, 0, len(its))}
	for _, it := range its {
		ok, err := it.next()
		if err != nil {
			return err
		}
		if ok {
			h.its = append(h.its, it)
		}
	}
	heap.Init(h)
	var (
		prev    Revision
		prevKey []byte
		count   int
	)
	for h.Len() > 0 {
		if count%ctxCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("etcdfmt: sort: %w", err)
			}
		}
		it := h.its[0]
		e := it.entry()
		if count > 0 && e.Rev == prev && !s.byKey {
			return fmt.Errorf("etcdfmt: sort: revision %d/%d holds two rows, keys %q and %q", e.Rev.Main, e.Rev.Sub, prevKey, e.KV.Key)
		}
		count++
		prev = e.Rev
		prevKey = append(prevKey[:0], e.KV.Key...)
		if err := fn(e); err != nil {
			return err
		}
		ok, err := it.next()
		if err != nil {
			return err
		}
		if ok {
			heap.Fix(h, 0)
		} else {
			heap.Pop(h)
		}
	}
	return nil
}

// Record encoding, after a uvarint length of the rest:
//
//	uvarint main | uvarint sub | flags byte | varint create | varint mod |
//	varint version | varint lease | bytes key | bytes value | bytes unrecognized
//
// where bytes is a uvarint length and the bytes. Revisions are never
// negative (ParseBucketKey rejects them) but the KeyValue fields are only
// int64s, hence signed varints for them.
const (
	flagTombstone = 1 << iota
	flagLatest
)

// appendSortRecord returns dst with e's record appended, and where in the
// record the key starts.
func appendSortRecord(dst []byte, e *Entry) ([]byte, int) {
	var body [5*binary.MaxVarintLen64 + 1 + 2*binary.MaxVarintLen64]byte
	b := body[:0]
	b = binary.AppendUvarint(b, uint64(e.Rev.Main))
	b = binary.AppendUvarint(b, uint64(e.Rev.Sub))
	var flags byte
	if e.Tombstone {
		flags |= flagTombstone
	}
	if e.Latest {
		flags |= flagLatest
	}
	b = append(b, flags)
	b = binary.AppendVarint(b, e.KV.CreateRevision)
	b = binary.AppendVarint(b, e.KV.ModRevision)
	b = binary.AppendVarint(b, e.KV.Version)
	b = binary.AppendVarint(b, e.KV.Lease)
	n := len(b) + uvarintLen(len(e.KV.Key)) + len(e.KV.Key) + uvarintLen(len(e.KV.Value)) + len(e.KV.Value) +
		uvarintLen(len(e.KV.Unknown)) + len(e.KV.Unknown)
	start := len(dst)
	dst = binary.AppendUvarint(dst, uint64(n))
	dst = append(dst, b...)
	keyAt := len(dst) - start + uvarintLen(len(e.KV.Key))
	for _, f := range [...][]byte{e.KV.Key, e.KV.Value, e.KV.Unknown} {
		dst = binary.AppendUvarint(dst, uint64(len(f)))
		dst = append(dst, f...)
	}
	return dst, keyAt
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

var errBadSortRecord = errors.New("etcdfmt: sort: corrupt run record")

// readVarints fills out with the varints at the start of b, each read by
// read (binary.Uvarint or binary.Varint), and returns the rest of b; false
// if b ends or holds a bad varint first.
func readVarints[T int64 | uint64](b []byte, out []T, read func([]byte) (T, int)) ([]byte, bool) {
	for i := range out {
		v, n := read(b)
		if n <= 0 {
			return nil, false
		}
		out[i], b = v, b[n:]
	}
	return b, true
}

// decodeSortRecord decodes a record (without its length prefix) into e.
// e's byte slices alias b.
func decodeSortRecord(b []byte, e *Entry) error {
	var u [2]uint64
	b, ok := readVarints(b, u[:], binary.Uvarint)
	if !ok {
		return errBadSortRecord
	}
	if len(b) == 0 {
		return errBadSortRecord
	}
	flags := b[0]
	b = b[1:]
	var s [4]int64
	if b, ok = readVarints(b, s[:], binary.Varint); !ok {
		return errBadSortRecord
	}
	var f [3][]byte
	for i := range f {
		l, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < l {
			return errBadSortRecord
		}
		if l > 0 {
			f[i] = b[n : n+int(l) : n+int(l)]
		}
		b = b[n+int(l):]
	}
	*e = Entry{
		Rev:       Revision{Main: int64(u[0]), Sub: int64(u[1])},
		Tombstone: flags&flagTombstone != 0,
		Latest:    flags&flagLatest != 0,
	}
	e.KV.Key, e.KV.Value, e.KV.Unknown = f[0], f[1], f[2]
	e.KV.CreateRevision, e.KV.ModRevision, e.KV.Version, e.KV.Lease = s[0], s[1], s[2], s[3]
	return nil
}
