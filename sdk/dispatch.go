package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/engramkv/engram/abi"
)

// Defaults the dispatcher applies when the host leaves a choice to the
// plugin.
const (
	// defaultBatch is the scan batch size when the host sends 0.
	defaultBatch = 128
	// defaultMaxResponse is the response cap assumed until INIT says.
	defaultMaxResponse = 64 << 20
	// smallBatch is the batch size up to which duplicate keys are found
	// by comparing pairs instead of a map.
	smallBatch = 16
)

// dispatcher is the plugin side of kvp_dispatch, independent of wasm so that
// it can be tested natively: it decodes a request, calls the Store, and
// encodes the response into a buffer it reuses across calls.
type dispatcher struct {
	store    Store
	ready    bool
	closed   bool
	manifest abi.Manifest
	maxResp  int

	resp   []byte
	commit abi.CommitRequest
	ops    []Op
	seen   map[string]struct{}

	scans  map[uint64]*scan
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
	return &dispatcher{store: s, maxResp: defaultMaxResponse, scans: map[uint64]*scan{}}
}

// dispatch handles one request and returns the response, which stays valid
// until the next call.
func (d *dispatcher) dispatch(op abi.Op, req []byte) []byte {
	d.resp = d.resp[:0]
	if d.closed {
		return d.fail(abi.StatusInvalid, "instance is closed")
	}
	if !d.ready && op != abi.OpInit {
		return d.fail(abi.StatusInvalid, fmt.Sprintf("%v before INIT", op))
	}
	if raw, ok := d.store.(RawDispatcher); ok && d.ready && op != abi.OpClose {
		if resp, handled := raw.Dispatch(op, req); handled {
			return resp
		}
	}
	switch op {
	case abi.OpInit:
		return d.init(req)
	case abi.OpGet:
		return d.get(req)
	case abi.OpScanOpen:
		return d.scanOpen(req)
	case abi.OpScanNext:
		return d.scanNext(req)
	case abi.OpScanClose:
		return d.scanClose(req)
	case abi.OpCommit:
		return d.doCommit(req)
	case abi.OpPartitions:
		return d.partitions(req)
	case abi.OpClose:
		return d.close(req)
	case abi.OpIdle:
		return d.idle(req)
	}
	return d.fail(abi.StatusUnsupported, fmt.Sprintf("op %v is not supported by this SDK", op))
}

func (d *dispatcher) fail(st abi.Status, msg string) []byte {
	d.resp = abi.AppendError(d.resp[:0], st, msg)
	return d.resp
}

func (d *dispatcher) badRequest(op abi.Op, err error) []byte {
	return d.fail(abi.StatusInvalid, fmt.Sprintf("%v: malformed request: %v", op, err))
}

// failErr maps a Store error to its status.
func (d *dispatcher) failErr(err error) []byte {
	return d.fail(statusOf(err), err.Error())
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
func requestContext(h abi.Header) (context.Context, context.CancelFunc) {
	if h.Deadline == 0 {
		return context.Background(), noop
	}
	return deadlineCtx{Context: context.Background(), d: time.Unix(0, h.Deadline)}, noop
}

func noop() {}

// deadlineCtx carries a deadline without a timer.
type deadlineCtx struct {
	context.Context
	d time.Time
}

func (c deadlineCtx) Deadline() (time.Time, bool) { return c.d, true }

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
	ctx, cancel := requestContext(m.Header)
	defer cancel()
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
	ctx, cancel := requestContext(m.Header)
	defer cancel()
	v, err := d.store.Get(ctx, m.Key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return abi.AppendStatus(d.resp[:0], abi.StatusNotFound)
		}
		return d.failErr(err)
	}
	d.resp = abi.AppendValue(d.resp[:0], v)
	return d.resp
}

func (d *dispatcher) scanOpen(req []byte) []byte {
	var m abi.ScanOpenRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpScanOpen, err)
	}
	ctx, cancel := requestContext(m.Header)
	defer cancel()
	if len(m.End) > 0 && bytes.Compare(m.Start, m.End) >= 0 {
		// An empty range: answer without bothering the store.
		d.resp = abi.AppendScanOpened(d.resp[:0], 0, nil, false)
		return d.resp
	}
	it, err := d.store.Scan(ctx, ScanOptions{Start: m.Start, End: m.End, Reverse: m.Reverse, Limit: int(min(m.Limit, 1<<62))})
	if err != nil {
		return d.failErr(fmt.Errorf("scan: %w", err))
	}
	sc := &scan{it: it, remaining: -1}
	if m.Limit > 0 {
		sc.remaining = int(min(m.Limit, 1<<62))
	}
	d.nextID++
	id := d.nextID
	d.resp = abi.AppendUvarint(abi.AppendStatus(d.resp[:0], abi.StatusOK), id)
	more, err := d.fill(ctx, sc, int(m.BatchSize))
	if err != nil {
		_ = it.Close()
		return d.failErr(fmt.Errorf("scan: %w", err))
	}
	if more {
		d.scans[id] = sc
	}
	return d.resp
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
	ctx, cancel := requestContext(m.Header)
	defer cancel()
	d.resp = abi.AppendStatus(d.resp[:0], abi.StatusOK)
	more, err := d.fill(ctx, sc, int(m.BatchSize))
	if err != nil {
		delete(d.scans, m.ID)
		_ = sc.it.Close()
		return d.failErr(fmt.Errorf("scan: %w", err))
	}
	if !more {
		delete(d.scans, m.ID)
	}
	return d.resp
}

// fill appends one batch to d.resp: up to want pairs, fewer only when the
// scan ends or the response would exceed the host's cap. It reports whether
// the scan may yield more; when it returns false the iterator is closed.
func (d *dispatcher) fill(ctx context.Context, sc *scan, want int) (bool, error) {
	if want <= 0 {
		want = defaultBatch
	}
	if lim := int(d.manifest.MaxScanBatch); lim > 0 {
		want = min(want, lim)
	}
	if sc.remaining >= 0 {
		want = min(want, sc.remaining)
	}
	// Reserve room for the count (at most 10 bytes) and the more flag:
	// pairs are encoded after a placeholder and the count is patched in.
	head := len(d.resp)
	d.resp = append(d.resp, make([]byte, 10)...)
	budget := d.maxResp - len(d.resp) - 1
	count, exhausted, full := 0, false, false
	add := func(p Pair) bool {
		n := abi.BytesLen(len(p.Key)) + abi.BytesLen(len(p.Value))
		if n > budget {
			return false
		}
		budget -= n
		d.resp = abi.AppendBytes(d.resp, p.Key)
		d.resp = abi.AppendBytes(d.resp, p.Value)
		count++
		return true
	}
	for len(sc.pending) > 0 && count < want {
		if !add(sc.pending[0]) {
			full = true
			break
		}
		sc.pending = sc.pending[1:]
	}
	for !full && count < want {
		batch, err := sc.it.Next(ctx, want-count)
		if err != nil {
			return false, err
		}
		if len(batch) == 0 {
			exhausted = true
			break
		}
		for i, p := range batch {
			if count < want && add(p) {
				continue
			}
			if count == 0 {
				return false, fmt.Errorf("a pair of %d bytes does not fit in the host's %d-byte response limit", len(p.Key)+len(p.Value), d.maxResp)
			}
			// Keep what did not fit for the next batch; the iterator
			// may reuse its slices, so copy.
			for _, q := range batch[i:] {
				sc.pending = append(sc.pending, Pair{Key: bytes.Clone(q.Key), Value: bytes.Clone(q.Value)})
			}
			full = true
			break
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
	// Patch the count in: move the pairs down over the unused part of the
	// placeholder.
	var cnt [10]byte
	c := abi.AppendUvarint(cnt[:0], uint64(count))
	copy(d.resp[head:], c)
	n := copy(d.resp[head+len(c):], d.resp[head+10:])
	d.resp = d.resp[:head+len(c)+n]
	if more {
		d.resp = append(d.resp, 1)
	} else {
		d.resp = append(d.resp, 0)
	}
	return more, nil
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
	ctx, cancel := requestContext(d.commit.Header)
	defer cancel()
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
		return d.resp
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
	if len(ops) <= smallBatch {
		for i := range ops {
			for j := i + 1; j < len(ops); j++ {
				if bytes.Equal(ops[i].Key, ops[j].Key) {
					return fmt.Sprintf("op %d: key %q appears twice in one batch", j, ops[j].Key)
				}
			}
		}
		return ""
	}
	if d.seen == nil {
		d.seen = make(map[string]struct{}, len(ops))
	}
	defer clear(d.seen)
	for i := range ops {
		if _, dup := d.seen[string(ops[i].Key)]; dup {
			return fmt.Sprintf("op %d: key %q appears twice in one batch", i, ops[i].Key)
		}
		d.seen[string(ops[i].Key)] = struct{}{}
	}
	return ""
}

func (d *dispatcher) partitions(req []byte) []byte {
	var m abi.PartitionsRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpPartitions, err)
	}
	p, ok := d.store.(Partitioner)
	if !ok {
		return d.fail(abi.StatusUnsupported, "PARTITIONS: the store does not implement sdk.Partitioner")
	}
	ctx, cancel := requestContext(m.Header)
	defer cancel()
	ranges, err := p.Partitions(ctx, m.Start, m.End, int(m.MaxParts))
	if err != nil {
		return d.failErr(fmt.Errorf("partitions: %w", err))
	}
	d.resp = abi.AppendPartitions(d.resp[:0], ranges)
	return d.resp
}

func (d *dispatcher) close(req []byte) []byte {
	var m abi.EmptyRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpClose, err)
	}
	ctx, cancel := requestContext(m.Header)
	defer cancel()
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
	var m abi.EmptyRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpIdle, err)
	}
	if i, ok := d.store.(Idler); ok {
		ctx, cancel := requestContext(m.Header)
		defer cancel()
		if err := i.Idle(ctx); err != nil {
			return d.failErr(fmt.Errorf("idle: %w", err))
		}
	}
	return abi.AppendOK(d.resp[:0])
}
