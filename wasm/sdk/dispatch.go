package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"slices"
	"time"
	"unsafe"

	"github.com/engramkv/engram/wasm/abi"
)

// Defaults the dispatcher applies when the host leaves a choice to the
// plugin.
const (
	// defaultBatch is the scan batch size when the host sends 0.
	defaultBatch = 128
	// defaultMaxResponse is the response cap assumed until INIT says.
	defaultMaxResponse = 64 << 20
)

// dispatcher is the plugin side of kvp_dispatch, independent of wasm so that
// it can be tested natively: it decodes a request, calls the Store, and
// encodes the response into a buffer it reuses across calls.
type dispatcher struct {
	store    Store
	op       abi.Op        // the op being dispatched
	raw      RawDispatcher // store as a RawDispatcher, or nil
	ready    bool
	closed   bool
	manifest abi.Manifest
	maxResp  int

	resp   []byte
	commit abi.CommitRequest
	dups   dupFinder
	// ctx is the context of the request in progress (see requestContext).
	ctx reqCtx

	scans  map[uint64]*scan
	first  scan // the scan being opened, moved to scans if it has more
	nextID uint64
}

// scan is an open iterator and what the dispatcher tracks about it.
type scan struct {
	it Iterator
	// remaining is the pairs the scan may still yield; -1 means no limit.
	remaining int
	// pending holds pairs read from the iterator that did not fit in the
	// previous response, copied because the iterator may reuse them.
	pending []Pair
}

func newDispatcher(s Store) *dispatcher {
	d := &dispatcher{store: s, maxResp: defaultMaxResponse, scans: map[uint64]*scan{}}
	d.raw, _ = s.(RawDispatcher)
	return d
}

// handlers answer each op this SDK knows, indexed by op.
var handlers = [abi.MaxOp + 1]func(*dispatcher, []byte) []byte{
	abi.OpInit:       (*dispatcher).init,
	abi.OpGet:        (*dispatcher).get,
	abi.OpScanOpen:   (*dispatcher).scanOpen,
	abi.OpScanNext:   (*dispatcher).scanNext,
	abi.OpScanClose:  (*dispatcher).scanClose,
	abi.OpCommit:     (*dispatcher).doCommit,
	abi.OpPartitions: (*dispatcher).partitions,
	abi.OpClose:      (*dispatcher).close,
	abi.OpIdle:       (*dispatcher).idle,
	abi.OpSize:       (*dispatcher).size,
	abi.OpReclaim:    (*dispatcher).reclaim,
}

// dispatch handles one request and returns the response, which stays valid
// until the next call.
func (d *dispatcher) dispatch(op abi.Op, req []byte) []byte {
	d.resp = d.resp[:0]
	d.op = op
	if d.closed {
		return d.fail(abi.StatusInvalid, "instance is closed")
	}
	if !d.ready && op != abi.OpInit {
		return d.fail(abi.StatusInvalid, fmt.Sprintf("%v before INIT", op))
	}
	if d.raw != nil && d.ready && op != abi.OpClose {
		if resp, handled := d.raw.Dispatch(op, req); handled {
			return resp
		}
	}
	if op <= abi.MaxOp && handlers[op] != nil {
		return handlers[op](d, req)
	}
	return d.fail(abi.StatusUnsupported, fmt.Sprintf("op %v is not supported by this SDK", op))
}

func (d *dispatcher) fail(st abi.Status, msg string) []byte {
	d.resp = abi.AppendError(d.resp[:0], st, msg)
	return d.resp
}

// unsupported answers an optional op the store does not implement (iface,
// the interface that would).
func (d *dispatcher) unsupported(iface string) []byte {
	return d.fail(abi.StatusUnsupported, fmt.Sprintf("%v: the store does not implement %s", d.op, iface))
}

// decodeEmpty decodes the request of an op whose request is the header
// alone, returning its context, or the response to a malformed one.
func (d *dispatcher) decodeEmpty(req []byte) (context.Context, []byte) {
	var m abi.EmptyRequest
	if err := m.Decode(req); err != nil {
		return nil, d.badRequest(d.op, err)
	}
	return d.requestContext(m.Header), nil
}

func (d *dispatcher) badRequest(op abi.Op, err error) []byte {
	return d.fail(abi.StatusInvalid, fmt.Sprintf("%v: malformed request: %v", op, err))
}

// failErr maps a Store error to its status. A status the op may not answer
// (ErrNotFound outside GET, where the dispatcher answers NOT_FOUND itself,
// or ErrUncertain outside COMMIT) becomes INTERNAL: sent as is, it would be
// a protocol violation, and the host discards an instance that commits one.
func (d *dispatcher) failErr(err error) []byte {
	st := statusOf(err)
	if st == abi.StatusNotFound || (st == abi.StatusUncertain && d.op != abi.OpCommit) {
		return d.fail(abi.StatusInternal, fmt.Sprintf("%v: the store answered %v, which this op cannot: %v", d.op, st, err))
	}
	return d.fail(st, err.Error())
}

// fitResponse turns a response the host would refuse as too long into an
// INTERNAL error naming the size: a value or conflicting value larger than
// the host's max_response cannot be sent, and sending it would crash the
// instance on the host's side.
func (d *dispatcher) fitResponse(what string, n int) []byte {
	if len(d.resp) <= d.maxResp {
		return d.resp
	}
	return d.fail(abi.StatusInternal, fmt.Sprintf("%v: %s of %d bytes does not fit in the host's %d-byte response limit", d.op, what, n, d.maxResp))
}

func statusOf(err error) abi.Status {
	var ne net.Error
	switch {
	case errors.Is(err, ErrNotFound):
		return abi.StatusNotFound
	case errors.Is(err, ErrUncertain):
		return abi.StatusUncertain
	case errors.Is(err, ErrUnsupported):
		return abi.StatusUnsupported
	case errors.Is(err, ErrInvalid):
		return abi.StatusInvalid
	case errors.Is(err, ErrUnavailable):
		return abi.StatusUnavailable
	case errors.Is(err, ErrDeadline), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled), errors.Is(err, os.ErrDeadlineExceeded):
		return abi.StatusDeadline
	case errors.As(err, &ne) && ne.Timeout():
		return abi.StatusDeadline
	}
	return abi.StatusInternal
}

// requestContext returns the context a Store method sees: it reports the
// request's deadline (Deadline) so the method knows how much time it has,
// but it never fires by itself. Nothing could make it fire: no other
// goroutine runs while the instance is blocked in a host call, and a timer
// per request costs the guest microseconds. The host enforces the deadline
// on sockets (see the package documentation).
//
// The context is the dispatcher's own, reused by every request: building
// one per request costs an allocation, about half a microsecond of a Go
// guest's time. Like the byte slices a method receives, it belongs to the
// call; a method that keeps it past its return sees a later request's
// deadline.
func (d *dispatcher) requestContext(h abi.Header) context.Context {
	if h.Deadline == 0 {
		return context.Background()
	}
	d.ctx.deadline = time.Unix(0, h.Deadline)
	return &d.ctx
}

// reqCtx carries a deadline without a timer: Done is nil (it never fires)
// and Err is nil.
type reqCtx struct {
	deadline time.Time
}

func (c *reqCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *reqCtx) Done() <-chan struct{}       { return nil }
func (c *reqCtx) Err() error                  { return nil }
func (c *reqCtx) Value(any) any               { return nil }

func (d *dispatcher) init(req []byte) []byte {
	if d.ready {
		return d.fail(abi.StatusInvalid, "INIT sent twice")
	}
	var m abi.InitRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpInit, err)
	}
	if m.MaxResponse > 0 {
		d.maxResp = int(m.MaxResponse)
	}
	ctx := d.requestContext(m.Header)
	man, err := d.store.Init(ctx, m.Config, HostInfo{
		Instance:    int(m.Instance),
		NetAllowed:  m.HostFlags&abi.HostFlagNet != 0,
		MaxResponse: d.maxResp,
	})
	if err != nil {
		return d.failErr(fmt.Errorf("init: %w", err))
	}
	if man.Name == "" {
		return d.fail(abi.StatusInternal, "init: Manifest.Name is empty")
	}
	if man.Model != ModelSingle && man.Model != ModelPooled {
		return d.fail(abi.StatusInternal, fmt.Sprintf("init: Manifest.Model %v is neither ModelSingle nor ModelPooled", man.Model))
	}
	ops := uint64(abi.RequiredOps) | abi.OpIdle.Bit()
	var features uint64
	if _, ok := d.store.(Partitioner); ok {
		ops |= abi.OpPartitions.Bit()
		features |= abi.FeaturePartitions
	}
	if _, ok := d.store.(Sizer); ok {
		ops |= abi.OpSize.Bit()
	}
	if _, ok := d.store.(Reclaimer); ok {
		ops |= abi.OpReclaim.Bit()
	}
	if man.Durable {
		features |= abi.FeatureDurable
	}
	if man.NativeTTL {
		features |= abi.FeatureNativeTTL
	}
	maxInst := uint32(max(man.MaxInstances, 0))
	if man.Model == ModelSingle {
		maxInst = 1
	}
	d.manifest = abi.Manifest{
		Name:           man.Name,
		Version:        man.Version,
		ABIMinor:       abi.Minor,
		Model:          man.Model,
		MaxInstances:   maxInst,
		Ops:            ops,
		Features:       features,
		MaxCommitOps:   uint32(max(man.MaxCommitOps, 0)),
		MaxCommitBytes: uint32(max(man.MaxCommitBytes, 0)),
		MaxScanBatch:   uint32(max(man.MaxScanBatch, 0)),
	}
	d.ready = true
	d.resp = abi.AppendManifest(d.resp[:0], &d.manifest)
	return d.resp
}

func (d *dispatcher) get(req []byte) []byte {
	var m abi.GetRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpGet, err)
	}
	if len(m.Key) == 0 {
		return d.fail(abi.StatusInvalid, "GET: empty key")
	}
	ctx := d.requestContext(m.Header)
	v, err := d.store.Get(ctx, m.Key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return abi.AppendStatus(d.resp[:0], abi.StatusNotFound)
		}
		return d.failErr(err)
	}
	d.resp = abi.AppendValue(d.resp[:0], v)
	return d.fitResponse("a value", len(v))
}

func (d *dispatcher) scanOpen(req []byte) []byte {
	var m abi.ScanOpenRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpScanOpen, err)
	}
	ctx := d.requestContext(m.Header)
	if len(m.End) > 0 && bytes.Compare(m.Start, m.End) >= 0 {
		// An empty range: answer without bothering the store.
		d.resp = abi.AppendScanOpened(d.resp[:0], 0, nil, false)
		return d.resp
	}
	it, err := d.store.Scan(ctx, ScanOptions{Start: m.Start, End: m.End, Reverse: m.Reverse, Limit: int(min(m.Limit, 1<<62))})
	if err != nil {
		return d.failErr(fmt.Errorf("scan: %w", err))
	}
	// Most scans end in their first batch: track the scan in the
	// dispatcher and allocate it only if it outlives this call.
	d.first = scan{it: it, remaining: -1}
	if m.Limit > 0 {
		d.first.remaining = int(min(m.Limit, 1<<62))
	}
	d.nextID++
	id := d.nextID
	resp, more, err := d.batch(ctx, &d.first, int(m.BatchSize), id, true)
	if err != nil {
		_ = it.Close()
		d.first = scan{}
		return d.failErr(fmt.Errorf("scan: %w", err))
	}
	if more {
		sc := new(scan)
		*sc = d.first
		d.scans[id] = sc
	}
	d.first = scan{}
	return resp
}

func (d *dispatcher) scanNext(req []byte) []byte {
	var m abi.ScanNextRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpScanNext, err)
	}
	sc, ok := d.scans[m.ID]
	if !ok {
		return d.fail(abi.StatusInvalid, fmt.Sprintf("SCAN_NEXT: unknown scan id %d", m.ID))
	}
	ctx := d.requestContext(m.Header)
	resp, more, err := d.batch(ctx, sc, int(m.BatchSize), 0, false)
	if err != nil {
		delete(d.scans, m.ID)
		_ = sc.it.Close()
		return d.failErr(fmt.Errorf("scan: %w", err))
	}
	if !more {
		delete(d.scans, m.ID)
	}
	return resp
}

// scanHead is the room reserved in front of a batch for the response's
// head (status, scan id, pair count: 1 + 10 + 10 bytes at most). The head
// is written once the count is known, right-aligned against the pairs, and
// the response starts where it starts: nothing is moved.
const scanHead = 1 + 2*10

// batch builds an OK response to SCAN_OPEN (withID) or SCAN_NEXT holding
// the scan's next batch. It reports whether the scan may yield more; when
// it returns false the iterator is closed.
func (d *dispatcher) batch(ctx context.Context, sc *scan, want int, id uint64, withID bool) ([]byte, bool, error) {
	d.resp = append(d.resp[:0], make([]byte, scanHead)...)
	count, more, err := d.fill(ctx, sc, want)
	if err != nil {
		return nil, false, err
	}
	if more {
		d.resp = append(d.resp, 1)
	} else {
		d.resp = append(d.resp, 0)
	}
	var h [scanHead]byte
	head := abi.AppendStatus(h[:0], abi.StatusOK)
	if withID {
		head = abi.AppendUvarint(head, id)
	}
	head = abi.AppendUvarint(head, uint64(count))
	start := scanHead - len(head)
	copy(d.resp[start:], head)
	return d.resp[start:], more, nil
}

// fill appends one batch of pairs to d.resp: up to want pairs, fewer only
// when the scan ends or the response would exceed the host's cap. It
// returns the number of pairs and whether the scan may yield more; when
// that is false the iterator is closed.
func (d *dispatcher) fill(ctx context.Context, sc *scan, want int) (int, bool, error) {
	if want <= 0 {
		want = defaultBatch
	}
	if lim := int(d.manifest.MaxScanBatch); lim > 0 {
		want = min(want, lim)
	}
	if sc.remaining >= 0 {
		want = min(want, sc.remaining)
	}
	// The head and the more flag are outside the pairs' budget.
	budget := d.maxResp - scanHead - 1
	count, exhausted, full := 0, false, false
	for len(sc.pending) > 0 && count < want {
		p := &sc.pending[0]
		n := abi.BytesLen(len(p.Key)) + abi.BytesLen(len(p.Value))
		if n > budget {
			full = true
			break
		}
		budget -= n
		d.resp = abi.AppendBytes(abi.AppendBytes(d.resp, p.Key), p.Value)
		count++
		sc.pending = sc.pending[1:]
	}
	for !full && count < want {
		batch, err := sc.it.Next(ctx, want-count)
		if err != nil {
			return 0, false, err
		}
		if len(batch) == 0 {
			exhausted = true
			break
		}
		// Size the pairs that fit, grow the response once, then encode
		// them: per pair, appends cost a capacity check and a call each,
		// which in wasm is most of the encoding.
		fit, size := 0, 0
		for i := range batch {
			n := abi.BytesLen(len(batch[i].Key)) + abi.BytesLen(len(batch[i].Value))
			if count+fit >= want || n > budget-size {
				break
			}
			size += n
			fit++
		}
		d.resp = appendPairs(d.resp, batch[:fit], size)
		budget -= size
		count += fit
		if fit < len(batch) {
			if count == 0 {
				p := &batch[0]
				return 0, false, fmt.Errorf("a pair of %d bytes does not fit in the host's %d-byte response limit", len(p.Key)+len(p.Value), d.maxResp)
			}
			// Keep what did not fit for the next batch; the iterator
			// may reuse its slices, so copy.
			for _, q := range batch[fit:] {
				sc.pending = append(sc.pending, Pair{Key: bytes.Clone(q.Key), Value: bytes.Clone(q.Value)})
			}
			full = true
		}
	}
	if sc.remaining >= 0 {
		sc.remaining -= count
	}
	more := !exhausted && sc.remaining != 0
	if !more && len(sc.pending) == 0 {
		_ = sc.it.Close()
	} else {
		more = true
	}
	return count, more, nil
}

// appendPairs appends pairs encoded as in a batch (key and value, each a
// uvarint length and the bytes); size is their encoded size.
func appendPairs(b []byte, pairs []Pair, size int) []byte {
	off := len(b)
	b = slices.Grow(b, size)[:off+size]
	for i := range pairs {
		off = putBytes(b, off, pairs[i].Key)
		off = putBytes(b, off, pairs[i].Value)
	}
	return b
}

// putBytes writes p with its uvarint length at b[off:], which has room,
// and returns the offset after it.
func putBytes(b []byte, off int, p []byte) int {
	v := uint64(len(p))
	for v >= 0x80 {
		b[off] = byte(v) | 0x80
		v >>= 7
		off++
	}
	b[off] = byte(v)
	return off + 1 + copy(b[off+1:], p)
}

func (d *dispatcher) scanClose(req []byte) []byte {
	var m abi.ScanCloseRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpScanClose, err)
	}
	if sc, ok := d.scans[m.ID]; ok {
		delete(d.scans, m.ID)
		if err := sc.it.Close(); err != nil {
			return d.failErr(fmt.Errorf("close scan: %w", err))
		}
	}
	return abi.AppendOK(d.resp[:0])
}

func (d *dispatcher) doCommit(req []byte) []byte {
	if err := d.commit.Decode(req); err != nil {
		return d.badRequest(abi.OpCommit, err)
	}
	ops := d.commit.Ops
	if len(ops) == 0 {
		return abi.AppendOK(d.resp[:0])
	}
	if msg := d.checkBatch(ops); msg != "" {
		return d.fail(abi.StatusInvalid, "COMMIT: "+msg)
	}
	ctx := d.requestContext(d.commit.Header)
	err := d.store.Commit(ctx, ops)
	if err == nil {
		return abi.AppendOK(d.resp[:0])
	}
	var ce *ConflictError
	if errors.As(err, &ce) {
		if ce.Index < 0 || ce.Index >= len(ops) {
			return d.fail(abi.StatusInternal, fmt.Sprintf("conflict names op %d of a %d-op batch", ce.Index, len(ops)))
		}
		cur := ce.Current
		if !ce.Exists {
			cur = nil
		}
		d.resp = abi.AppendConflict(d.resp[:0], uint32(ce.Index), ce.Exists, cur)
		return d.fitResponse("the conflicting key's current value", len(cur))
	}
	return d.failErr(err)
}

// checkBatch enforces the structural rules the Store may rely on: non-empty
// keys, no key twice. The host checks them too; a plugin must not trust it.
func (d *dispatcher) checkBatch(ops []Op) string {
	for i := range ops {
		if len(ops[i].Key) == 0 {
			return fmt.Sprintf("op %d: empty key", i)
		}
	}
	if j := d.dups.find(ops); j >= 0 {
		return fmt.Sprintf("op %d: key %q appears twice in one batch", j, ops[j].Key)
	}
	return ""
}

// dupFinder finds a key named twice in a batch in linear time, allocating
// nothing once its table has grown: an open-addressing table of key hashes,
// where equal hashes are confirmed by comparing the keys. Comparing every
// pair of keys would be quadratic, and in wasm bytes.Equal is slow enough
// for that to show (DESIGN.md, "Per-call costs in the host and the SDK"); a
// map keyed by string costs as much in hashing and allocation.
type dupFinder struct {
	slots  []int32 // 1 + the index of the op whose key hashed here; 0 = empty
	hashes []uint64
}

// find returns the index of the first op whose key an earlier op already
// named, or -1.
func (f *dupFinder) find(ops []Op) int {
	if len(ops) < 2 {
		return -1
	}
	size := 8
	for size < 2*len(ops) {
		size <<= 1
	}
	if len(f.slots) < size {
		f.slots = make([]int32, size)
		f.hashes = make([]uint64, size)
	}
	slots := f.slots[:size]
	clear(slots)
	mask := uint64(size - 1)
	for i := range ops {
		h := keyHash(ops[i].Key)
		for j := h & mask; ; j = (j + 1) & mask {
			k := slots[j]
			if k == 0 {
				slots[j] = int32(i + 1)
				f.hashes[j] = h
				break
			}
			if f.hashes[j] == h && bytes.Equal(ops[k-1].Key, ops[i].Key) {
				return i
			}
		}
	}
	return -1
}

// keyHash mixes a key eight bytes at a time (the fold of a 64x64-bit
// multiply, as in wyhash). It only has to spread keys over the table: a
// collision costs a comparison, never a wrong answer.
func keyHash(b []byte) uint64 {
	const m1, m2 = 0xa0761d6478bd642f, 0xe7037ed1a0b428db
	h := uint64(len(b)) ^ m1
	p := unsafe.Pointer(unsafe.SliceData(b))
	n := len(b)
	for ; n >= 8; n -= 8 {
		h = mix(h^*(*uint64)(p), m2)
		p = unsafe.Add(p, 8)
	}
	var t uint64
	for i := 0; i < n; i++ {
		t = t<<8 | uint64(*(*byte)(unsafe.Add(p, i)))
	}
	return mix(h^t, m2)
}

func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func (d *dispatcher) partitions(req []byte) []byte {
	var m abi.PartitionsRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpPartitions, err)
	}
	p, ok := d.store.(Partitioner)
	if !ok {
		return d.unsupported("sdk.Partitioner")
	}
	ctx := d.requestContext(m.Header)
	ranges, err := p.Partitions(ctx, m.Start, m.End, int(m.MaxParts))
	if err != nil {
		return d.failErr(fmt.Errorf("partitions: %w", err))
	}
	d.resp = abi.AppendPartitions(d.resp[:0], ranges)
	return d.resp
}

func (d *dispatcher) close(req []byte) []byte {
	ctx, bad := d.decodeEmpty(req)
	if bad != nil {
		return bad
	}
	for id, sc := range d.scans {
		_ = sc.it.Close()
		delete(d.scans, id)
	}
	d.closed = true
	if err := d.store.Close(ctx); err != nil {
		return d.failErr(fmt.Errorf("close: %w", err))
	}
	return abi.AppendOK(d.resp[:0])
}

func (d *dispatcher) idle(req []byte) []byte {
	ctx, bad := d.decodeEmpty(req)
	if bad != nil {
		return bad
	}
	if i, ok := d.store.(Idler); ok {
		if err := i.Idle(ctx); err != nil {
			return d.failErr(fmt.Errorf("idle: %w", err))
		}
	}
	return abi.AppendOK(d.resp[:0])
}
